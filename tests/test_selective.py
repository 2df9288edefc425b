"""e-AUGRC, working points and ECE against hand-computed values (with ties), and the count-based
formulas against the row-based implementations of pipeline.core.metrics."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline.core import metrics as M
from pipeline.core import selective as S

# Worked out by hand in docs/METRICS.md ("Working points"): 10 rows, ties at 0.9, 0.8 and 0.6.
# Tie groups (descending): 0.95 {1 correct}, 0.9 {2 correct}, 0.8 {1 correct, 1 wrong},
# 0.6 {1 correct, 1 wrong}, 0.5 {1 correct}, 0.3 {1 wrong}, 0.1 {1 wrong}
P10 = np.array([0.95, 0.9, 0.9, 0.8, 0.8, 0.6, 0.6, 0.5, 0.3, 0.1])
C10 = np.array([1, 1, 1, 1, 0, 1, 0, 1, 0, 0], dtype=bool)
# kept 1, 3, 5, 7, 8, 9, 10; errors 0, 0, 1, 2, 2, 3, 4; selective risk 0, 0, .2, 2/7, .25, 1/3, .4


def test_working_points_by_hand_with_ties():
    risk = lambda c: S.selective_risk_at_coverage(P10, C10, coverage=c)      # noqa: E731
    assert risk(80) == pytest.approx(0.25)          # 8 rows kept
    assert risk(90) == pytest.approx(1 / 3)         # 9 rows
    assert risk(95) == pytest.approx(0.4)           # 9.5 rows needed -> all 10
    assert risk(50) == pytest.approx(0.2)           # exactly 5 rows
    value, details = S.selective_risk_at_coverage(P10, C10, coverage=60, return_details=True)
    assert value == pytest.approx(2 / 7)            # 6 rows needed; the 0.6 tie forces 7
    assert details == {"threshold": pytest.approx(0.6), "coverage": pytest.approx(0.7)}
    cov = lambda r: S.coverage_at_risk(P10, C10, risk=r)                      # noqa: E731
    assert cov(1) == cov(5) == cov(10) == pytest.approx(0.3)   # risk 0 up to 3 rows, then 0.2
    assert cov(20) == pytest.approx(0.5)            # risk exactly 1/5 counts (<=)
    assert cov(25) == pytest.approx(0.8)            # 2/8 exactly; 2/7 > 25% does not matter
    assert cov(40) == pytest.approx(1.0)
    # the most confident group is wrong: nothing can be kept at 10% risk
    assert S.coverage_at_risk(np.array([0.9, 0.5, 0.4]), np.array([0, 1, 1]), risk=10) == 0.0


def test_eaugrc_and_ece_by_hand():
    # generalized risk at coverage .1 .3 .5 .7 .8 .9 1.0 = 0 0 .1 .2 .2 .3 .4 -> AUGRC 0.12
    assert M.augrc(P10, C10) == pytest.approx(0.12)
    assert S.eaugrc(P10, C10) == pytest.approx(0.12 - 0.5 * 0.4 ** 2)
    # bins (15): .95->14, .9->13, .8->12, .6->9, .5->7, .3->4, .1->1; gaps -.05 -.2 .6 .2 -.5 .3 .1
    assert S.ece(P10, C10) == pytest.approx(1.95 / 10)
    perfect = np.r_[np.full(8, 0.9), np.full(2, 0.1)]
    assert S.eaugrc(perfect, np.r_[np.ones(8), np.zeros(2)].astype(bool)) == pytest.approx(0.0)


def brute_working_points(conf, correct):
    """Literal loops over the distinct thresholds (ties kept together)."""
    out = {}
    ts = np.unique(conf)[::-1]
    kept = np.array([(conf >= t).sum() for t in ts])
    errs = np.array([((conf >= t) & ~correct).sum() for t in ts])
    n = len(conf)
    for c in S.COVERAGES:
        k = next(i for i in range(len(ts)) if kept[i] / n >= c / 100 - 1e-12)
        out[f"risk@cov{c}"] = errs[k] / kept[k]
    for r in S.RISKS:
        ok = [kept[i] / n for i in range(len(ts)) if errs[i] / kept[i] <= r / 100 + 1e-12]
        out[f"cov@risk{r}"] = max(ok, default=0.0)
    return out


@pytest.mark.parametrize("decimals", [None, 2, 1])
def test_counts_metrics_equal_row_based_metrics(decimals):
    rng = np.random.default_rng(3)
    correct = rng.random(2000) < 0.85
    conf = 1 / (1 + np.exp(-(rng.normal(size=2000) + 2.0 * correct)))
    if decimals:
        conf = np.round(conf, decimals)
    r = M.rank(conf, correct)
    got = S.counts_metrics(*S.group_counts(r))
    ref = {"auc": M.auc(r), "aupr_succ": M.aupr_success(r),
           "aupr_err": M.aupr_error(r, definition="standard"),
           "aupr_err_paper": M.aupr_error(r, definition="paper"),
           "fpr95": M.fpr_at_95tpr(r, definition="standard"), "aurc": M.aurc(r),
           "eaurc": M.eaurc(r), "augrc": M.augrc(r),
           "eaugrc": M.augrc(r) - 0.5 * (~correct).mean() ** 2, **brute_working_points(conf, correct)}
    for name, value in ref.items():
        assert got[name] == pytest.approx(value, abs=1e-12), name


def test_counts_metrics_vectorised_and_empty_levels():
    """Leading axes are independent problems; empty levels (zero counts) change nothing."""
    r = M.rank(P10, C10)
    pos, neg = S.group_counts(r)
    single = S.counts_metrics(pos, neg)
    gap = lambda a: np.insert(np.insert(a, 0, 0), 3, 0).astype(float)     # noqa: E731
    both = S.counts_metrics(np.stack([gap(pos), gap(pos)]), np.stack([gap(neg), gap(neg)]))
    for name, value in single.items():
        assert np.allclose(both[name], value), name
    none = S.counts_metrics(np.array([3.0, 2.0]), np.array([0.0, 0.0]))
    assert np.isnan(none["auc"]) and np.isnan(none["fpr95"]) and none["aurc"] == 0.0


def test_evaluate_selective_records_reasons():
    r = M.rank(P10, C10)
    out = S.evaluate_selective(r, P10, C10, probability=False)
    assert out["values"]["ece"] is None and "not an estimate of P(correct)" in out["undefined"]["ece"]
    assert set(out["values"]) == set(S.SELECTIVE_METRICS)
    out = S.evaluate_selective(r, P10, C10, probability=True)
    assert out["values"]["ece"] == pytest.approx(0.195)
    wrong_first = M.rank(np.array([0.9, 0.5, 0.4]), np.array([0, 1, 1]))
    out = S.evaluate_selective(wrong_first, [0.9, 0.5, 0.4], [0, 1, 1], True)
    assert out["values"]["cov@risk1"] == 0.0 and not out["undefined"]   # defined: keep nothing
    with pytest.raises(M.UndefinedMetric, match="leave"):
        S.ece(np.array([1.5, 0.2]), np.array([1, 0]))
