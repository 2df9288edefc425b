"""Selective-classification metrics beyond the paper: e-AUGRC, working points and ECE.

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

e-AUGRC and the working points are computed by ``pipeline.core.counts`` (the one implementation
of every count-based metric, also used by the bootstrap); the functions here wrap it for one
split and add the threshold and coverage actually reached.  ECE has no count form.  Pure numpy.
"""
from __future__ import annotations

import numpy as np

from pipeline.core.counts import (COUNT_METRICS, COVERAGES, RISKS, WORKING_POINTS,  # noqa: F401
                                  Levels, counts_metrics, coverage_level, level_metrics,
                                  risk_level)
from pipeline.core.catalog import names
from pipeline.core.metrics import Ranked, UndefinedMetric, group_counts, rank

# what ``evaluate_selective`` adds to the standard set (pipeline/core/catalog.py)
SELECTIVE_METRICS = names("standard", "counts", "ece")
ECE_BINS = 15
NOT_A_PROBABILITY = "ECE is undefined for this score: it is not an estimate of P(correct)"


def _counts(confidence, correct) -> tuple[Ranked, np.ndarray, np.ndarray]:
    r = confidence if isinstance(confidence, Ranked) else rank(confidence, correct)
    return (r, *group_counts(r))


def _levels(r: Ranked) -> Levels:
    return r.levels


def eaugrc(confidence, correct=None) -> float:
    """AUGRC - err^2 / 2 (the AUGRC of a perfect ranking of the same predictions), >= 0."""
    r, _, _ = _counts(confidence, correct)
    return float(level_metrics(r.levels, ("eaugrc",))["eaugrc"])


def selective_risk_at_coverage(confidence, correct=None, coverage: int = 95,
                               return_details: bool = False):
    """Selective risk (errors / kept) at the highest threshold keeping >= ``coverage`` percent
    of the rows (ties grouped).  Returns the risk, or ``(risk, details)`` with the threshold and
    the coverage actually reached."""
    r = confidence if isinstance(confidence, Ranked) else rank(confidence, correct)
    if coverage not in COVERAGES and not 0 < coverage <= 100:
        raise ValueError(f"coverage must be a percentage in (0, 100], got {coverage!r}")
    lv = _levels(r)
    k = int(coverage_level(lv, coverage))
    value = float(lv.risk[k])
    details = {"threshold": float(r.thresholds[k]), "coverage": float(lv.coverage[k])}
    return (value, details) if return_details else value


def coverage_at_risk(confidence, correct=None, risk: int = 5, return_details: bool = False):
    """The largest coverage among the thresholds whose selective risk is <= ``risk`` percent
    (ties grouped); 0 when the most confident group alone exceeds it."""
    r = confidence if isinstance(confidence, Ranked) else rank(confidence, correct)
    if not 0 <= risk <= 100:
        raise ValueError(f"risk must be a percentage in [0, 100], got {risk!r}")
    lv = _levels(r)
    k, any_ok = risk_level(lv, risk)
    if not any_ok:
        value, details = 0.0, {"threshold": None, "risk": None}
    else:
        k = int(k)
        value = float(lv.coverage[k])
        details = {"threshold": float(r.thresholds[k]), "risk": float(lv.risk[k])}
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
    values = {k: float(v) for k, v in level_metrics(r.levels, SELECTIVE_METRICS).items()}
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
