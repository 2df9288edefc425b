"""Selective-classification metrics beyond the paper: e-AUGRC, working points, ECE, and every
rank metric computed from per-threshold counts, vectorised over leading axes.

    from pipeline.core.selective import evaluate_selective
    evaluate_selective(rank(conf, correct), conf, correct, probability=True)["values"]

* e-AUGRC (Traub et al., NeurIPS 2024): AUGRC minus the AUGRC of a perfect ranking, err^2 / 2.
* Working points on the selective risk-coverage curve (ties grouped: a threshold keeps or rejects
  a whole tie group, so only the group boundaries are reachable):
  - ``risk@covC``: selective risk at the HIGHEST threshold whose coverage is >= C% (the fewest
    rows one must keep to cover C%);
  - ``cov@riskR``: the LARGEST coverage among the thresholds whose selective risk is <= R%, 0
    when even the most confident group is riskier (rejecting everything is the only way).
* ECE (Guo et al. 2017), 15 equal-width bins on [0, 1], bin = min(floor(15 p), 14):
  sum over bins of |sum(p - correct)| / n.  Only for scores that estimate P(correct).

``counts_metrics`` is the one implementation of the count-based formulas: the point estimates
here apply it to a split's tie groups, the bootstrap (pipeline.report.bootstrap) to resampled
counts of shape (resamples, levels).  Pure numpy.
"""
from __future__ import annotations

import numpy as np

from pipeline.core.metrics import Ranked, UndefinedMetric, rank

COVERAGES = (80, 90, 95)                 # percent: selective risk at these coverages
RISKS = (1, 5, 10)                       # percent: coverage at these selective risks
WORKING_POINTS = tuple(f"risk@cov{c}" for c in COVERAGES) + tuple(f"cov@risk{r}" for r in RISKS)
SELECTIVE_METRICS = ("eaugrc",) + WORKING_POINTS + ("ece",)
ECE_BINS = 15
# count-based names: the standard definitions, plus the paper's AUPR-Error (scored by p itself)
COUNT_METRICS = ("auc", "aupr_succ", "aupr_err", "aupr_err_paper", "fpr95", "aurc", "eaurc",
                 "augrc", "eaugrc") + WORKING_POINTS
NOT_A_PROBABILITY = "ECE is undefined for this score: it is not an estimate of P(correct)"


def group_counts(r: Ranked) -> tuple[np.ndarray, np.ndarray]:
    """Correct / incorrect rows in each tie group, DESCENDING confidence: (T,), (T,)."""
    return np.diff(r.tp, prepend=0), np.diff(r.fp, prepend=0)


def counts_metrics(pos, neg, names=COUNT_METRICS, dtype=np.float64) -> dict[str, np.ndarray]:
    """Rank metrics from counts of correct (``pos``) and incorrect (``neg``) rows per threshold
    level, levels in DESCENDING confidence along the last axis: arrays (..., T) -> {name: (...)}.

    A level acts as one tie group.  Empty levels (zero counts) are allowed (resamples).  A
    metric that does not exist for the counts (no correct or no incorrect rows) is NaN.
    ``dtype`` float32 halves the memory traffic for large batches (counts stay exact below 2^24;
    the metrics carry ~1e-6 relative rounding, far below a bootstrap interval's resolution).
    """
    pos = np.asarray(pos, dtype=dtype)
    neg = np.asarray(neg, dtype=dtype)
    tp, fp = np.cumsum(pos, -1), np.cumsum(neg, -1)
    n_pos, n_neg = tp[..., -1], fp[..., -1]
    n = n_pos + n_neg
    tp_prev, fp_prev = tp - pos, fp - neg
    kept, kept_prev = tp + fp, tp_prev + fp_prev
    out = {}
    with np.errstate(invalid="ignore", divide="ignore"):
        both = (n_pos > 0) & (n_neg > 0)
        nan = np.where(both, 1.0, np.nan)
        if "auc" in names:   # every (correct, incorrect) pair ordered right; ties count 1/2
            out["auc"] = (neg * (tp_prev + 0.5 * pos)).sum(-1) / (n_pos * n_neg) * nan
        if "aupr_succ" in names:   # scikit-learn's AP: recall steps x precision at the step
            precision = tp / np.maximum(kept, 1)
            out["aupr_succ"] = (pos * precision).sum(-1) / n_pos * nan
        if "aupr_err" in names:    # errors as positives, scored by -p: visited from the bottom
            err_le, cor_le = n_neg[..., None] - fp_prev, n_pos[..., None] - tp_prev
            out["aupr_err"] = (neg * err_le / np.maximum(err_le + cor_le, 1)).sum(-1) / n_neg * nan
        if "aupr_err_paper" in names:  # errors as positives, scored by p itself (authors' code)
            out["aupr_err_paper"] = (neg * fp / np.maximum(kept, 1)).sum(-1) / n_neg * nan
        if "fpr95" in names:       # first threshold (descending) with TPR >= 0.9495
            k = np.argmax(tp >= 0.9495 * n_pos[..., None], axis=-1)
            out["fpr95"] = np.take_along_axis(fp, k[..., None], -1)[..., 0] / n_neg * nan
        width = (pos + neg) / n[..., None]
        risk = fp / np.maximum(kept, 1)
        # the curve starts at coverage 0 with the risk of the first non-empty level (fd-shifts)
        risk_prev = np.where(kept_prev > 0, fp_prev / np.maximum(kept_prev, 1), risk)
        aurc = (width * (risk + risk_prev)).sum(-1) * 0.5
        augrc = (width * (fp + fp_prev)).sum(-1) * 0.5 / n
        err = n_neg / n
        if "aurc" in names:
            out["aurc"] = aurc
        if "eaurc" in names:
            out["eaurc"] = aurc - np.where(err >= 1, 1.0, err + (1 - err) * np.log1p(-err))
        if "augrc" in names:
            out["augrc"] = augrc
        if "eaugrc" in names:
            out["eaugrc"] = augrc - 0.5 * err * err
        # Working points.  Coverage kept/n and risk fp/kept are correctly rounded quotients of
        # integers below 2^53, as are c/100 and r/100, and distinct such fractions differ by far
        # more than a rounding error: the float comparisons below are exact.
        coverage = kept / n[..., None]
        for c in COVERAGES:
            if f"risk@cov{c}" in names:   # first level (descending) covering c%
                k = np.argmax(coverage >= c / 100, axis=-1)
                out[f"risk@cov{c}"] = np.take_along_axis(risk, k[..., None], -1)[..., 0]
        last = kept.shape[-1] - 1
        for r_ in RISKS:
            if f"cov@risk{r_}" in names:  # kept grows along the levels: the LAST level at <= r%
                ok = (risk <= r_ / 100)[..., ::-1]
                k = last - np.argmax(ok, axis=-1)
                cov = np.take_along_axis(coverage, k[..., None], -1)[..., 0]
                out[f"cov@risk{r_}"] = np.where(ok.any(-1), cov, 0.0)
    return out


def _counts(confidence, correct) -> tuple[Ranked, np.ndarray, np.ndarray]:
    r = confidence if isinstance(confidence, Ranked) else rank(confidence, correct)
    return (r, *group_counts(r))


def eaugrc(confidence, correct=None) -> float:
    """AUGRC - err^2 / 2 (the AUGRC of a perfect ranking of the same predictions), >= 0."""
    r, pos, neg = _counts(confidence, correct)
    return float(counts_metrics(pos, neg, ("eaugrc",))["eaugrc"])


def selective_risk_at_coverage(confidence, correct=None, coverage: int = 95,
                               return_details: bool = False):
    """Selective risk (errors / kept) at the highest threshold keeping >= ``coverage`` percent
    of the rows (ties grouped).  Returns the risk, or ``(risk, details)`` with the threshold and
    the coverage actually reached."""
    r, pos, neg = _counts(confidence, correct)
    if coverage not in COVERAGES and not 0 < coverage <= 100:
        raise ValueError(f"coverage must be a percentage in (0, 100], got {coverage!r}")
    kept = np.cumsum(pos + neg)
    k = int(np.argmax(kept * 100 >= coverage * r.n))
    value = float(np.cumsum(neg)[k] / kept[k])
    details = {"threshold": float(r.thresholds[k]), "coverage": float(kept[k] / r.n)}
    return (value, details) if return_details else value


def coverage_at_risk(confidence, correct=None, risk: int = 5, return_details: bool = False):
    """The largest coverage among the thresholds whose selective risk is <= ``risk`` percent
    (ties grouped); 0 when the most confident group alone exceeds it."""
    r, pos, neg = _counts(confidence, correct)
    if not 0 <= risk <= 100:
        raise ValueError(f"risk must be a percentage in [0, 100], got {risk!r}")
    kept, fp = np.cumsum(pos + neg), np.cumsum(neg)
    ok = np.flatnonzero(fp * 100 <= risk * kept)
    if len(ok) == 0:
        value, details = 0.0, {"threshold": None, "risk": None}
    else:
        k = int(ok[np.argmax(kept[ok])])
        value = float(kept[k] / r.n)
        details = {"threshold": float(r.thresholds[k]), "risk": float(fp[k] / kept[k])}
    return (value, details) if return_details else value


def ece(confidence, correct, bins: int = ECE_BINS) -> float:
    """Expected calibration error of ``confidence`` (n,) in [0, 1] as P(correct): equal-width
    bins, bin = min(floor(bins * p), bins - 1); sum over bins of |sum(p - correct)| / n."""
    conf = np.asarray(confidence, dtype=np.float64)
    corr = np.asarray(correct, dtype=np.float64)
    if conf.shape != corr.shape or conf.ndim != 1 or len(conf) == 0:
        raise ValueError(f"expected confidence and correct of the same shape (n,), got "
                         f"{conf.shape} and {corr.shape}")
    if conf.min() < 0 or conf.max() > 1:
        raise UndefinedMetric(f"ECE is undefined: the confidences leave [0, 1] (min "
                              f"{conf.min():.6g}, max {conf.max():.6g})")
    b = ece_bins(conf, bins)
    gap = np.bincount(b, weights=conf - corr, minlength=bins)
    return float(np.abs(gap).sum() / len(conf))


def ece_bins(conf: np.ndarray, bins: int = ECE_BINS) -> np.ndarray:
    return np.minimum((np.asarray(conf, dtype=np.float64) * bins).astype(np.int64), bins - 1)


def evaluate_selective(r: Ranked, confidence, correct, probability: bool) -> dict:
    """``evaluate``-style dict of ``SELECTIVE_METRICS`` for one split (fractions in [0, 1])."""
    pos, neg = group_counts(r)
    values = {k: float(v) for k, v in counts_metrics(pos, neg, SELECTIVE_METRICS).items()}
    out: dict = {"values": values, "undefined": {}, "notes": {}}
    for c in COVERAGES:
        _, d = selective_risk_at_coverage(r, coverage=c, return_details=True)
        if d["coverage"] > c / 100 + 0.005:
            out["notes"][f"risk@cov{c}"] = (f"ties: the nearest threshold keeps "
                                            f"{100 * d['coverage']:.2f}% of the rows")
    if not probability:
        out["values"]["ece"] = None
        out["undefined"]["ece"] = NOT_A_PROBABILITY
    else:
        try:
            out["values"]["ece"] = ece(confidence, correct)
        except UndefinedMetric as err:
            out["values"]["ece"] = None
            out["undefined"]["ece"] = str(err)
    return out
