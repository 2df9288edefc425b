"""Bootstrap intervals: reproducible under a seed, exact per resample where the scheme is the row
bootstrap, covering the full-sample value, close to the row bootstrap where rows are grouped."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline.core import metrics as M
from pipeline.core.selective import ece, evaluate_selective
from pipeline.report import bootstrap as B
from pipeline.report.scoring import score_summary
from pipeline.report.separability import separability_all

THR = {"paper": 0.5, "standard": 0.5}


def case(n, seed=0, acc=0.83):
    rng = np.random.default_rng(seed)
    correct = rng.random(n) < acc
    conf = 1 / (1 + np.exp(-(rng.normal(size=n) + 1.3 * correct)))
    return conf.astype(np.float32), correct


def exact_values(conf, correct):
    s = score_summary(conf, correct, THR, histogram=False)
    values = {d: dict(s["metrics"][d]["values"]) for d in ("paper", "standard")}
    values["standard"].update(evaluate_selective(M.rank(conf, correct), conf, correct, True)["values"])
    return values


def test_small_n_is_the_row_bootstrap_exactly():
    """n <= 512: every group is one row and no confidence level is merged, so each resample's
    values equal the metrics of the rows it drew (np.repeat by the counts); rank metrics are
    computed in float32 there (1e-6)."""
    conf, correct = case(500)
    spec = B.BootstrapSpec(resamples=40)
    boot = B.bootstrap_score(conf, correct, spec, exact_values(conf, correct), THR, True)
    group, w = B.resample_plan(len(conf), spec)
    assert np.array_equal(group, np.arange(500)) and (w.sum(1) == 500).all()
    for i in range(0, 40, 7):
        rows = np.repeat(np.arange(500), w[i].astype(int))
        c, k = conf[rows], correct[rows]
        sep = separability_all(c, k)
        assert boot["standard"]["auc"][i] == pytest.approx(M.auc(c, k), abs=1e-6)
        assert boot["standard"]["aurc"][i] == pytest.approx(M.aurc(c, k), abs=1e-6)
        assert boot["standard"]["fpr95"][i] == pytest.approx(
            M.fpr_at_95tpr(c, k, definition="standard"), abs=1e-6)
        assert boot["paper"]["aupr_err"][i] == pytest.approx(M.aupr_error(c, k), abs=1e-6)
        assert boot["standard"]["ece"][i] == pytest.approx(ece(c, k), abs=1e-12)
        assert boot["standard"]["acc"][i] == pytest.approx(k.mean(), abs=1e-12)
        assert boot["paper"]["tnr"][i] == pytest.approx(M.tnr(c, k, 0.5), abs=1e-12)
        for d in ("paper", "standard"):
            assert boot[d]["kl"][i] == pytest.approx(sep[d]["values"]["kl"], rel=1e-9)
            assert boot[d]["bhattacharyya"][i] == pytest.approx(
                sep[d]["values"]["bhattacharyya"], rel=1e-9)


def test_reproducible_under_a_seed_and_covering_the_full_sample_value():
    conf, correct = case(5000, seed=1)
    exact = exact_values(conf, correct)
    spec = B.BootstrapSpec(resamples=300, seed=7)
    a = B.bootstrap_score(conf, correct, spec, exact, THR, True)
    B.resample_plan.cache_clear()
    b = B.bootstrap_score(conf, correct, spec, exact, THR, True)
    c = B.bootstrap_score(conf, correct, B.BootstrapSpec(resamples=300, seed=8), exact, THR, True)
    assert all(np.array_equal(a[d][m], b[d][m], equal_nan=True) for d in a for m in a[d])
    assert not np.array_equal(a["standard"]["auc"], c["standard"]["auc"])
    counts = (int(correct.sum()), int((~correct).sum()))
    for d in a:
        for name, samples in a[d].items():
            value = exact[d].get(name, correct.mean() if name == "acc" else None)
            ci = B.interval(samples, value, name, counts)
            assert ci["undefined"] is None, (d, name)
            assert ci["low"] <= value <= ci["high"], (d, name, ci, value)


def test_grouped_rows_match_the_row_bootstrap():
    """n > 512 (rows dealt into 512 groups, scores merged into 512 levels): the interval
    ends agree with a brute-force row bootstrap to a fraction of the interval's width (two row
    bootstraps with different seeds differ by about 0.05 of it)."""
    conf, correct = case(20_000, seed=2)
    exact = exact_values(conf, correct)
    spec = B.BootstrapSpec(resamples=400, seed=3)
    grouped = B.bootstrap_score(conf, correct, spec, exact, THR, True)["standard"]
    rng = np.random.default_rng(11)
    rows = {name: [] for name in ("auc", "aurc", "augrc", "risk@cov95", "cov@risk5", "fpr95")}
    for _ in range(400):
        idx = rng.integers(0, len(conf), len(conf))
        c, k = conf[idx], correct[idx]
        r = M.rank(c, k)
        sel = evaluate_selective(r, c, k, False)["values"]
        for name, value in (("auc", M.auc(r)), ("aurc", M.aurc(r)), ("augrc", M.augrc(r)),
                            ("fpr95", M.fpr_at_95tpr(r, definition="standard")),
                            ("risk@cov95", sel["risk@cov95"]), ("cov@risk5", sel["cov@risk5"])):
            rows[name].append(value)
    for name, values in rows.items():
        lo, hi = np.percentile(values, [2.5, 97.5])
        glo, ghi = np.percentile(grouped[name], [2.5, 97.5])
        width = hi - lo
        assert abs(glo - lo) < 0.25 * width and abs(ghi - hi) < 0.25 * width, (name, lo, hi, glo, ghi)


def test_undefined_intervals_say_why():
    conf, correct = case(300)
    correct[:] = True
    correct[5] = False                      # one incorrect row only
    ci = B.interval(np.full(10, 0.5), 0.5, "auc", (299, 1))
    assert ci["undefined"] and "fewer than two incorrect rows" in ci["undefined"]
    ci = B.interval(np.r_[np.full(90, 0.5), np.full(10, np.nan)], 0.5, "auc", (200, 5))
    assert ci["undefined"] and "10 of 100 resamples" in ci["undefined"]
    ci = B.interval(np.r_[np.full(99, 0.5), np.nan], 0.5, "auc", (200, 5))
    assert ci["undefined"] is None and "1 of 100 resamples left out" in ci["note"]
    assert B.interval(None, None, "auc", (5, 5), reason="why")["undefined"] == "why"
