"""Trust metrics against hand-computed cases, scikit-learn and literal ports of the reference loops."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import logsumexp, softmax
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

from pipeline.core import metrics as M
from pipeline.core.counts import counts_metrics
from pipeline.report.baselines import BASELINES, LOGIT_BASELINES, available, baseline_scores

# A small case worked out by hand (docs/METRICS.md uses the same numbers).
P6 = np.array([0.9, 0.8, 0.7, 0.6, 0.4, 0.3])
C6 = np.array([1, 1, 0, 1, 0, 0])


def random_case(seed: int, n: int = 3000, acc: float = 0.8, decimals: int | None = None):
    rng = np.random.default_rng(seed)
    correct = rng.random(n) < acc
    conf = 1 / (1 + np.exp(-(rng.normal(size=n) + 1.5 * correct)))
    if decimals is not None:  # coarse values -> many ties
        conf = np.round(conf, decimals)
    return conf.astype(np.float32), correct


# ----------------------------------------------------------------------- reference loops --
def pt_fpr95_loop(p, correct):
    """The authors' (ConfidNet's) loop, verbatim in logic; None where their code would crash."""
    accurate, errors = correct == 1, correct == 0
    for delta in np.arange(p.min(), p.max(), (p.max() - p.min()) / 10000):
        tpr = len(p[accurate & (p >= delta)]) / len(p[accurate])
        if 0.95 + 0.0005 >= tpr >= 0.95 - 0.0005:
            return len(p[errors & (p >= delta)]) / len(p[errors])
    return None


def fd_rc_loop(conf, correct, generalized=False):
    """fd-shifts' selective/generalized risk-coverage loop (one point per distinct confidence)."""
    residuals = 1 - correct.astype(float)
    idx = np.argsort(conf, kind="stable")
    res, c = residuals[idx], conf[idx]
    n = len(res)
    err_sum, cov = res.sum(), n
    coverages, risks = [1.0], [err_sum / n]
    for i in range(n - 1):
        cov -= 1
        err_sum -= res[i]
        if c[i] != c[i + 1]:
            coverages.append(cov / n)
            risks.append(err_sum / (n if generalized else cov))
    coverages.append(0.0)
    risks.append(0.0 if generalized else risks[-1])
    x, y = np.array(coverages), np.array(risks)
    return float(-np.sum(np.diff(x) * (y[1:] + y[:-1]) / 2))


# ------------------------------------------------------------------------ hand-computed --
def test_hand_computed_small_case():
    assert M.auc(P6, C6) == pytest.approx(8 / 9)
    assert M.aupr_success(P6, C6) == pytest.approx(11 / 12)
    assert M.aupr_error(P6, C6, "paper") == pytest.approx(37 / 90)
    assert M.aupr_error(P6, C6, "standard") == pytest.approx(11 / 12)
    assert M.tpr(P6, C6) == 1.0
    assert M.tnr(P6, C6) == pytest.approx(2 / 3)
    assert M.tnr(P6, C6, threshold=0.1) == 0.0
    assert M.aurc(P6, C6) == pytest.approx(37 / 180)
    assert M.augrc(P6, C6) == pytest.approx(11 / 72)
    assert M.eaurc(P6, C6) == pytest.approx(37 / 180 - (0.5 + 0.5 * math.log(0.5)))
    assert M.fpr_at_95tpr(P6, C6, "standard") == pytest.approx(1 / 3)
    # TPR jumps 2/3 -> 1: no grid threshold inside [0.9495, 0.9505]; the nearest (TPR 1 at
    # the lowest threshold) is used and flagged, where the authors' code would crash.
    value, details = M.fpr_at_95tpr(P6, C6, "paper", return_details=True)
    assert (value, details["tpr"], details["fallback"]) == (1.0, 1.0, True)
    assert pt_fpr95_loop(P6, C6) is None


def test_paper_grid_window_hit_by_hand():
    # 20 correct rows at 0.05..1.0 and 4 errors: TPR = 19/20 = 0.95 for thresholds in (0.05, 0.10]
    pos = np.arange(1, 21) / 20
    conf = np.r_[pos, [0.02, 0.07, 0.5, 0.99]]
    correct = np.r_[np.ones(20), np.zeros(4)]
    value, details = M.fpr_at_95tpr(conf, correct, return_details=True)
    assert not details["fallback"] and details["tpr"] == 0.95
    assert 0.05 < details["threshold"] <= 0.07 and value == pytest.approx(3 / 4)
    assert pt_fpr95_loop(conf, correct) == value


# ------------------------------------------------------------------ against references --
@pytest.mark.parametrize("seed,decimals", [(0, None), (1, 2), (2, 3), (3, 1)])
def test_against_sklearn(seed, decimals):
    conf, correct = random_case(seed, decimals=decimals)
    assert M.auc(conf, correct) == pytest.approx(roc_auc_score(correct, conf), abs=1e-12)
    assert M.aupr_success(conf, correct) == pytest.approx(
        average_precision_score(correct, conf), abs=1e-12)
    assert M.aupr_error(conf, correct, "paper") == pytest.approx(
        average_precision_score(~correct, conf), abs=1e-12)
    assert M.aupr_error(conf, correct, "standard") == pytest.approx(
        average_precision_score(~correct, -conf), abs=1e-12)
    fpr, tpr, _ = roc_curve(correct, conf, drop_intermediate=False)
    assert M.fpr_at_95tpr(conf, correct, "standard") == pytest.approx(fpr[tpr >= 0.9495].min())
    assert M.tpr(conf, correct) == np.mean(conf[correct] > 0.5)
    assert M.tnr(conf, correct, 0.1) == np.mean(conf[~correct] < np.float32(0.1))


@pytest.mark.parametrize("seed,decimals", [(0, None), (4, 2), (5, 3), (6, 4), (7, None)])
def test_paper_fpr95_matches_the_authors_loop(seed, decimals):
    conf, correct = random_case(seed, n=2000, decimals=decimals)
    value, details = M.fpr_at_95tpr(conf, correct, "paper", return_details=True)
    reference = pt_fpr95_loop(conf, correct)
    if reference is None:
        assert details["fallback"]
    else:
        assert not details["fallback"] and value == reference


@pytest.mark.parametrize("seed,decimals", [(0, None), (1, 2), (2, 1)])
def test_risk_coverage_against_fd_shifts_loop(seed, decimals):
    conf, correct = random_case(seed, n=800, decimals=decimals)
    assert M.aurc(conf, correct) == pytest.approx(fd_rc_loop(conf, correct), abs=1e-12)
    assert M.augrc(conf, correct) == pytest.approx(fd_rc_loop(conf, correct, True), abs=1e-12)
    err = 1 - correct.mean()
    assert M.eaurc(conf, correct) == pytest.approx(
        fd_rc_loop(conf, correct) - (err + (1 - err) * math.log(1 - err)), abs=1e-12)


def test_perfect_ranking_reaches_the_optimum():
    conf, correct = random_case(3, n=4000)
    perfect = correct + np.linspace(0, 0.5, len(correct))  # every correct above every error
    assert M.auc(perfect, correct) == 1.0
    assert M.eaurc(perfect, correct) == pytest.approx(0.0, abs=2e-3)
    assert M.augrc(perfect, correct) == pytest.approx(0.5 * (1 - correct.mean()) ** 2, abs=1e-3)


# -------------------------------------------------------------- paper vs standard --------
def test_paper_and_standard_differ_exactly_where_documented():
    conf, correct = random_case(8, decimals=3)
    paper = M.evaluate(conf, correct, "paper", tnr_threshold=0.1)["values"]
    standard = M.evaluate(conf, correct, "standard")["values"]
    assert set(standard) - set(paper) == {"aurc", "eaurc", "augrc"}
    for name in ("aupr_succ", "auc", "tpr"):
        assert paper[name] == standard[name]
    assert paper["tnr"] == M.tnr(conf, correct, 0.1) != standard["tnr"] == M.tnr(conf, correct)
    assert paper["aupr_err"] == pytest.approx(average_precision_score(~correct, conf))
    assert standard["aupr_err"] == pytest.approx(average_precision_score(~correct, -conf))
    assert paper["aupr_err"] < 0.5 < standard["aupr_err"]  # the paper's is lower-is-better


def test_fpr95_paper_takes_the_first_grid_threshold_standard_the_exact_roc_point():
    # 10,000 correct rows evenly spread, 2,000 errors interleaved: several ROC points lie inside
    # the TPR window.  The grid (ascending) stops at the first TPR <= 0.9505; the ROC definition
    # takes the lowest FPR with TPR >= 0.9495, so it accepts ~10 fewer correct rows and errors.
    conf = np.r_[np.linspace(0, 1, 10_000), np.linspace(0.00005, 0.99995, 2_000)]
    correct = np.r_[np.ones(10_000, bool), np.zeros(2_000, bool)]
    paper, pd = M.fpr_at_95tpr(conf, correct, "paper", return_details=True)
    standard, sd = M.fpr_at_95tpr(conf, correct, "standard", return_details=True)
    assert TPR_IN_WINDOW(pd["tpr"]) and TPR_IN_WINDOW(sd["tpr"]) and pd["tpr"] > sd["tpr"]
    assert paper > standard and paper - standard == pytest.approx(2 / 2000, abs=1e-3)


def TPR_IN_WINDOW(tpr):
    return 0.9495 <= tpr <= 0.9505


# ----------------------------------------------------------------------- degenerate --------
def test_all_correct_and_none_correct_are_undefined_with_reasons():
    conf = np.linspace(0.1, 0.9, 50)
    for correct, missing in ((np.ones(50, bool), "no incorrect"), (np.zeros(50, bool), "no correct")):
        for definition in M.DEFINITIONS:
            out = M.evaluate(conf, correct, definition)
            undefined = set(out["undefined"])
            assert {"fpr95", "aupr_err", "aupr_succ", "auc"} <= undefined
            assert all(missing in out["undefined"][k] for k in undefined)
            assert all(out["values"][k] is None for k in undefined)
            assert all(isinstance(v, float) for k, v in out["values"].items() if k not in undefined)
        with pytest.raises(M.UndefinedMetric, match=missing):
            M.auc(conf, correct)
    assert M.tpr(conf, np.ones(50)) == pytest.approx(np.mean(conf > 0.5))
    assert "tnr" in M.evaluate(conf, np.ones(50))["undefined"]
    assert "tpr" in M.evaluate(conf, np.zeros(50))["undefined"]
    assert M.aurc(conf, np.ones(50)) == 0 and M.eaurc(conf, np.ones(50)) == 0
    assert M.aurc(conf, np.zeros(50)) == 1 and M.eaurc(conf, np.zeros(50)) == 0


def test_constant_confidence():
    correct = np.r_[np.ones(30, bool), np.zeros(10, bool)]
    conf = np.full(40, 0.7, np.float32)
    assert M.auc(conf, correct) == 0.5
    assert M.aupr_success(conf, correct) == pytest.approx(0.75)
    assert M.aupr_error(conf, correct, "paper") == M.aupr_error(conf, correct, "standard") == 0.25
    assert M.fpr_at_95tpr(conf, correct, "standard") == 1.0
    value, details = M.fpr_at_95tpr(conf, correct, "paper", return_details=True)
    assert value == 1.0 and details["fallback"] and details["threshold"] == pytest.approx(0.7)
    assert M.aurc(conf, correct) == pytest.approx(0.25)
    assert M.augrc(conf, correct) == pytest.approx(0.125)


def test_ties_are_grouped_whatever_the_row_order():
    conf = np.array([0.5, 0.5, 0.5, 0.5, 0.9, 0.1])
    a = np.array([1, 1, 0, 0, 1, 0])
    b = np.array([0, 0, 1, 1, 1, 0])  # same rows, tied block reordered
    for f in (M.auc, M.aupr_success, M.aurc, M.augrc):
        assert f(conf, a) == f(conf, b)
    # the tied block enters at once: coverage 1/6 -> 5/6 in one step with risk 2/5
    cov, risk = M.risk_coverage_curve(conf, a)
    assert np.allclose(cov, [0, 1 / 6, 5 / 6, 1]) and np.allclose(risk, [0, 0, 2 / 5, 1 / 2])


@pytest.mark.parametrize("bad,match", [
    (np.array([0.2, np.nan, 0.3]), "non-finite value.*first at row 1"),
    (np.array([0.2, np.inf, 0.3]), "non-finite"),
])
def test_nan_or_inf_confidence_is_an_error(bad, match):
    with pytest.raises(ValueError, match=match):
        M.evaluate(bad, np.array([1, 0, 1]))


def test_input_checks():
    with pytest.raises(ValueError, match="same shape"):
        M.auc(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="empty"):
        M.evaluate(np.zeros(0), np.zeros(0))
    with pytest.raises(ValueError, match="0/1.*row 2"):
        M.auc(np.zeros(3), np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="definition"):
        M.evaluate(P6, C6, "fancy")


# ---------------------------------------------------------------------- invariances --------
def test_row_order_invariance():
    conf, correct = random_case(9, decimals=2)
    perm = np.random.default_rng(0).permutation(len(conf))
    for definition in M.DEFINITIONS:
        assert M.evaluate(conf, correct, definition) == M.evaluate(conf[perm], correct[perm],
                                                                   definition)


@pytest.mark.parametrize("transform", [
    lambda p: np.log(p / (1 - p)), lambda p: p ** 3, lambda p: np.exp(5 * p), lambda p: 3 * p - 7])
def test_monotone_transform_invariance(transform):
    conf, correct = random_case(10)
    conf = conf.astype(np.float64)
    other = transform(conf)
    for f in (M.auc, M.aupr_success, M.aurc, M.augrc, M.eaurc):
        assert f(other, correct) == pytest.approx(f(conf, correct), abs=1e-12)
    for definition in M.DEFINITIONS:
        assert M.aupr_error(other, correct, definition) == pytest.approx(
            M.aupr_error(conf, correct, definition), abs=1e-12)
    assert M.fpr_at_95tpr(other, correct, "standard") == M.fpr_at_95tpr(conf, correct, "standard")


def test_paper_fpr95_is_invariant_under_increasing_affine_maps():
    conf, correct = random_case(11)
    conf = conf.astype(np.float64)
    base = M.fpr_at_95tpr(conf, correct, "paper")
    assert M.fpr_at_95tpr(2 * conf + 1, correct, "paper") == pytest.approx(base, abs=1e-3)
    # The grid is linear in the confidence, so a non-linear map moves it: the exact ROC value
    # stays, the grid value may change (docs/METRICS.md).  Here the fallback path shows it.
    # TPR is 0.95 only for thresholds in (0, 1e-6]: narrower than the grid step 1e-4.
    conf = np.r_[0.0, 1e-6, np.linspace(0.5, 1, 18), 0.3]
    correct = np.r_[np.ones(20, bool), False]
    assert M.fpr_at_95tpr(conf, correct, "paper", return_details=True)[1]["fallback"]
    stretched = np.sqrt(conf)  # increasing; the interval becomes (0, 1e-3]: the grid hits it
    assert not M.fpr_at_95tpr(stretched, correct, "paper", return_details=True)[1]["fallback"]
    assert M.fpr_at_95tpr(stretched, correct, "standard") == M.fpr_at_95tpr(conf, correct,
                                                                            "standard")


def test_ranked_is_shared_and_equal_to_direct_calls():
    conf, correct = random_case(12, decimals=3)
    r = M.rank(conf, correct)
    assert M.auc(r) == M.auc(conf, correct)
    assert M.evaluate(r, definition="standard") == M.evaluate(conf, correct, "standard")


# ------------------------------------------------------------------------ baselines --------
def test_baseline_scores_against_scipy():
    rng = np.random.default_rng(0)
    logits = (rng.normal(size=(3000, 7)) * 4).astype(np.float16)
    s = baseline_scores(logits, chunk_rows=1000, params={"ts": 2.0, "pnorm": 2})  # several chunks
    x = logits.astype(np.float64)
    p = softmax(x, axis=1)
    # every baseline from logits whose parameter was given (REL-U's matrix was not);
    # MC-Dropout's read other columns
    assert set(s) == {n for n in available(LOGIT_BASELINES, ["logits"]) if n != "relu"}
    assert np.allclose(s["ts"], softmax(x / 2.0, axis=1).max(1), atol=1e-6)
    centred = x - x.mean(1, keepdims=True)
    assert np.allclose(s["pnorm"], centred.max(1) / np.linalg.norm(centred, axis=1), atol=1e-6)
    assert np.allclose(s["mcp"], p.max(1), atol=1e-6)
    assert np.allclose(s["entropy"], (p * np.log(p)).sum(1), atol=1e-5)
    assert np.allclose(s["maxlogit"], x.max(1))
    assert np.allclose(s["energy"], logsumexp(x, axis=1), atol=1e-5)
    assert np.allclose(s["doctor"], (p ** 2).sum(1), atol=1e-6)
    # DOCTOR's detector D_alpha = (1 - g) / g ranks exactly opposite to g: same AUC
    correct = rng.random(3000) < 0.7
    d_alpha = (1 - s["doctor"].astype(np.float64)) / s["doctor"]
    assert M.auc(s["doctor"], correct) == pytest.approx(M.auc(-d_alpha, correct), abs=1e-12)


def test_baseline_scores_reject_bad_logits():
    logits = np.zeros((5, 3), np.float16)
    logits[3, 1] = np.inf
    with pytest.raises(ValueError, match="first at row 3"):
        baseline_scores(logits)
    with pytest.raises(ValueError, match=r"\(N, K\)"):
        baseline_scores(np.zeros(5))
    with pytest.raises(ValueError, match="fitted parameter"):
        baseline_scores(np.ones((5, 3)), names=("ts",))


# --------------------------------------------- one implementation: core/counts.py ---------
SCALAR_OF_COUNT = {"auc": M.auc, "aupr_succ": M.aupr_success,
                   "aupr_err": lambda r: M.aupr_error(r, definition="standard"),
                   "aupr_err_paper": lambda r: M.aupr_error(r, definition="paper"),
                   "fpr95": lambda r: M.fpr_at_95tpr(r, definition="standard"),
                   "aurc": M.aurc, "eaurc": M.eaurc, "augrc": M.augrc}


@pytest.mark.parametrize("decimals", [None, 2])
def test_scalar_metrics_are_the_vectorised_ones(decimals):
    """Every scalar rank metric IS counts_metrics on the split's tie groups (bit for bit), and
    counts_metrics over a batch of problems gives each problem's own value."""
    cases = [random_case(s, n=1500, acc=0.75, decimals=decimals) for s in (5, 6)]
    ranked = [M.rank(conf, correct) for conf, correct in cases]
    for r in ranked:
        got = counts_metrics(*M.group_counts(r))
        for name, scalar in SCALAR_OF_COUNT.items():
            assert scalar(r) == float(got[name]), name
    width = max(len(r.tp) for r in ranked)
    pad = lambda a: np.pad(a, (0, width - len(a)))          # noqa: E731 (empty levels)
    batch = counts_metrics(np.stack([pad(M.group_counts(r)[0]) for r in ranked]),
                           np.stack([pad(M.group_counts(r)[1]) for r in ranked]))
    for i, r in enumerate(ranked):
        for name, scalar in SCALAR_OF_COUNT.items():
            assert batch[name][i] == pytest.approx(scalar(r), abs=1e-15), name


def test_scalar_metrics_keep_their_undefined_reasons():
    r = M.rank(np.array([0.2, 0.7, 0.9]), np.array([1, 1, 1]))
    for name in ("auc", "aupr_succ", "aupr_err", "aupr_err_paper", "fpr95"):
        with pytest.raises(M.UndefinedMetric, match="no incorrect predictions in the split"):
            SCALAR_OF_COUNT[name](r)
    assert M.aurc(r) == 0.0 and M.eaurc(r) == 0.0       # defined with one class
