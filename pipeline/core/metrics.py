"""Trustworthiness metrics: pure numpy functions of ``(confidence, correct)`` arrays.

    from pipeline.core.metrics import evaluate
    evaluate(confidence, correct, definition="paper", tnr_threshold=1 / 1000)["values"]

Two definitions exist (docs/METRICS.md has them side by side):

* ``paper``: what the authors' code computes (luoyan407/predict_trustworthiness, taken from
  ConfidNet): FPR-95%-TPR on a grid of 10,000 thresholds with the TPR window [0.9495, 0.9505],
  AUPR-Error = AP of the errors scored by the confidence itself (NOT negated, so lower is better),
  TCP's TNR threshold 1/K (chosen by the caller through ``tnr_threshold``).
* ``standard``: FPR at the first ROC point with TPR >= 0.9495 (exact, fd-shifts), AUPR-Error scored
  by the negated confidence (higher is better), plus AURC, E-AURC and AUGRC with ties grouped.

Every metric sorts the rows once (``rank``, ``ranked.py``) and is then O(number of distinct
confidences): no Python loop over thresholds, no O(n^2).  The rank metrics (AUC, AUPR, the standard
FPR-95%-TPR, AURC, E-AURC, AUGRC) are thin wrappers over the one vectorised implementation,
``pipeline.core.counts.counts_metrics``, applied to the tie groups' counts; what is only here is
the paper's grid FPR-95%-TPR, TPR/TNR at a threshold and the risk-coverage curve itself.  A metric
that does not exist for the input (one class only) raises ``UndefinedMetric`` with the reason;
``evaluate`` records the reason instead of a value, so a report never shows a silent NaN.
"""
from __future__ import annotations

import numpy as np

from cache.errors import TrustOraclesError
from pipeline.core.catalog import DEFINITIONS, names
from pipeline.core.counts import level_metrics, optimal_aurc as _optimal_aurc, tpr95_level
# the one sort (ranked.py): check_inputs, Ranked, rank and group_counts stay importable from here,
# where the report, the API and the tests take them with the metrics
from pipeline.core.ranked import Ranked, check_inputs, group_counts, rank  # noqa: F401

# what ``evaluate`` computes for each definition (pipeline/core/catalog.py)
PAPER_METRICS = names("paper", "scalar")
STANDARD_METRICS = names("standard", "scalar")
GRID_SIZE = 10_000                         # thresholds of the paper's FPR-95%-TPR grid
TPR_WINDOW = (0.95 - 0.0005, 0.95 + 0.0005)  # exactly the authors' expression (0.9495, 0.95049..)


class UndefinedMetric(TrustOraclesError, ValueError):
    """The metric does not exist for this input; ``str(err)`` says why.  The input is the user's
    data, so a user error where it escapes; ``evaluate`` records the reason instead."""


def _ranked(confidence, correct) -> Ranked:
    return confidence if isinstance(confidence, Ranked) else rank(confidence, correct)


def _require(r: Ranked, metric: str, pos: bool = True, neg: bool = True) -> None:
    if pos and r.n_pos == 0:
        raise UndefinedMetric(f"{metric} is undefined: no correct predictions in the split")
    if neg and r.n_neg == 0:
        raise UndefinedMetric(f"{metric} is undefined: no incorrect predictions in the split")


def _counted(r: Ranked, name: str) -> float:
    """One metric of ``counts_metrics`` on the split's tie groups."""
    return float(level_metrics(r.levels, (name,))[name])


def auc(confidence, correct=None) -> float:
    """Area under the ROC curve of correct (positive) vs incorrect, scored by confidence.

    ``confidence`` (n,) floats or a ``Ranked``; ``correct`` (n,) bool.  Equals
    ``sklearn.metrics.roc_auc_score(correct, confidence)``; ties count one half.
    """
    r = _ranked(confidence, correct)
    _require(r, "AUC")
    return _counted(r, "auc")


def aupr_success(confidence, correct=None) -> float:
    """AP with the correct predictions as positives: ``average_precision_score(correct, p)``.

    Undefined with one class only (with no errors it would be 1 whatever the confidences)."""
    r = _ranked(confidence, correct)
    _require(r, "AUPR-Success")
    return _counted(r, "aupr_succ")


def aupr_error(confidence, correct=None, definition: str = "paper") -> float:
    """AP with the incorrect predictions as positives.

    ``paper``: scored by the confidence itself, ``average_precision_score(1 - correct, p)`` as
    the authors' code does: LOWER is better.  ``standard``: scored by ``-p`` (ConfidNet,
    fd-shifts): higher is better.  Both are computed from the one sort.
    """
    _check_definition(definition)
    r = _ranked(confidence, correct)
    _require(r, "AUPR-Error")
    return _counted(r, "aupr_err_paper" if definition == "paper" else "aupr_err")


def fpr_at_95tpr(confidence, correct=None, definition: str = "paper",
                 return_details: bool = False):
    """False positive rate (incorrect rows accepted) where the TPR (correct rows accepted) is 95%.

    ``paper``: the authors' grid ``np.arange(min p, max p, (max p - min p) / 10000)``; the first
    threshold d (ascending) whose TPR = mean(p[correct] >= d) lies in [0.9495, 0.9505] gives
    FPR = mean(p[~correct] >= d).  Where no grid threshold falls in the window the authors' code
    crashes; we take the grid threshold whose TPR is NEAREST to 0.95 (the first on ties) and flag
    it (``details["fallback"] = True``).  A constant confidence gives the one-point grid [min p].
    ``standard``: min FPR over the exact ROC points with TPR >= 0.9495 (fd-shifts).

    Returns the FPR, or ``(fpr, details)`` with the threshold and the TPR actually reached.
    """
    _check_definition(definition)
    r = _ranked(confidence, correct)
    _require(r, "FPR-95%-TPR")
    if definition == "standard":
        k = int(tpr95_level(r.tp, r.n_pos))
        details = {"threshold": float(r.thresholds[k]), "tpr": float(r.tp[k] / r.n_pos),
                   "fallback": False}
        value = _counted(r, "fpr95")
    else:
        value, details = _fpr_grid(r)
    return (value, details) if return_details else value


def _fpr_grid(r: Ranked) -> tuple[float, dict]:
    lo, hi = r.thresholds[-1], r.thresholds[0]  # numpy scalars of the input dtype, as in PT
    grid = (np.arange(lo, hi, (hi - lo) / GRID_SIZE, dtype=np.float64) if hi > lo
            else np.array([lo], dtype=np.float64))
    tpr = (r.n_pos - np.searchsorted(r.pos, grid, side="left")) / r.n_pos
    inside = np.flatnonzero((tpr >= TPR_WINDOW[0]) & (tpr <= TPR_WINDOW[1]))
    fallback = len(inside) == 0
    k = int(np.argmin(np.abs(tpr - 0.95))) if fallback else int(inside[0])
    fpr = (r.n_neg - np.searchsorted(r.neg, grid[k], side="left")) / r.n_neg
    return float(fpr), {"threshold": float(grid[k]), "tpr": float(tpr[k]), "fallback": fallback}


def tpr(confidence, correct=None, threshold: float = 0.5) -> float:
    """Share of correct rows with confidence > ``threshold`` (strict, as the authors' code)."""
    r = _ranked(confidence, correct)
    _require(r, "TPR", neg=False)
    t = np.asarray(threshold, dtype=r.pos.dtype)  # compared in the confidence's own precision
    return float((r.n_pos - np.searchsorted(r.pos, t, side="right")) / r.n_pos)


def tnr(confidence, correct=None, threshold: float = 0.5) -> float:
    """Share of incorrect rows with confidence < ``threshold`` (strict).  The paper uses 1/K for
    TCP (its confidence regresses the true-class probability), 0.5 for every other loss."""
    r = _ranked(confidence, correct)
    _require(r, "TNR", pos=False)
    t = np.asarray(threshold, dtype=r.neg.dtype)
    return float(np.searchsorted(r.neg, t, side="left") / r.n_neg)


def risk_coverage_curve(confidence, correct=None, generalized: bool = False
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Risk-coverage points, ascending coverage, ties grouped (one point per distinct confidence).

    Keeping the rows with confidence >= t: coverage = kept / n; selective risk = errors among kept
    / kept; generalized risk = errors among kept / n.  The curve starts at coverage 0 with the
    risk of the most confident group (selective) or 0 (generalized), as in fd-shifts.
    Returns ``(coverage, risk)``, each (T + 1,).
    """
    r = _ranked(confidence, correct)
    kept = (r.tp + r.fp).astype(np.float64)
    risk = r.fp / (np.full_like(kept, r.n) if generalized else kept)
    return np.r_[0.0, kept / r.n], np.r_[0.0 if generalized else risk[0], risk]


def aurc(confidence, correct=None) -> float:
    """Area under the selective risk-coverage curve (trapezoids, ties grouped; lower is better).
    Returned in [0, 1]; fd-shifts displays it x1000."""
    return _counted(_ranked(confidence, correct), "aurc")


def augrc(confidence, correct=None) -> float:
    """Area under the generalized risk-coverage curve (Traub et al. 2024), in [0, 1]."""
    return _counted(_ranked(confidence, correct), "augrc")


def optimal_aurc(error_rate: float) -> float:
    """AURC of a perfect ranking with this error rate: err + (1 - err) ln(1 - err) (limit 1)."""
    return float(_optimal_aurc(float(error_rate)))


def eaurc(confidence, correct=None) -> float:
    """Excess AURC = AURC - optimal_aurc(error rate).  Slightly negative values are possible:
    the closed-form optimum is the continuous limit (fd-shifts uses the same)."""
    return _counted(_ranked(confidence, correct), "eaurc")


def _check_definition(definition: str) -> None:
    if definition not in DEFINITIONS:
        raise ValueError(f"definition must be one of {DEFINITIONS}, got {definition!r}")


def evaluate(confidence, correct=None, definition: str = "paper", tnr_threshold: float = 0.5,
             tpr_threshold: float = 0.5) -> dict:
    """Every metric of ``definition`` for one split, as fractions in [0, 1].

    Returns ``{"values": {name: float | None}, "undefined": {name: reason}, "notes": {name:
    text}}`` with names ``PAPER_METRICS`` or ``STANDARD_METRICS``; a metric is None exactly when
    it is undefined, and the reason says why.  ``confidence`` may be a ``Ranked`` to share the sort.
    """
    _check_definition(definition)
    r = _ranked(confidence, correct)
    funcs = {
        "fpr95": lambda: fpr_at_95tpr(r, definition=definition, return_details=True),
        "aupr_err": lambda: aupr_error(r, definition=definition),
        "aupr_succ": lambda: aupr_success(r),
        "auc": lambda: auc(r),
        "tpr": lambda: tpr(r, threshold=tpr_threshold),
        "tnr": lambda: tnr(r, threshold=tnr_threshold),
        "aurc": lambda: aurc(r), "eaurc": lambda: eaurc(r), "augrc": lambda: augrc(r),
    }
    names = PAPER_METRICS if definition == "paper" else STANDARD_METRICS
    out: dict = {"values": {}, "undefined": {}, "notes": {}}
    for name in names:
        try:
            value = funcs[name]()
        except UndefinedMetric as err:
            out["values"][name] = None
            out["undefined"][name] = str(err)
            continue
        if name == "fpr95":
            value, details = value
            if details["fallback"]:
                out["notes"][name] = (
                    f"no grid threshold reaches a TPR in [0.9495, 0.9505]; the nearest "
                    f"(threshold {details['threshold']:.6g}, TPR {details['tpr']:.4f}) was used")
        out["values"][name] = value
    return out
