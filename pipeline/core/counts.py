"""Every rank metric from counts of correct and incorrect rows per confidence level: the ONE
implementation, vectorised over leading axes.

    counts_metrics(pos, neg)["auc"]     # pos, neg: (..., T) counts, levels in DESCENDING confidence

A level acts as one tie group: the scalar metrics of ``pipeline.core.metrics`` (auc, aupr_*,
fpr_at_95tpr, aurc, eaurc, augrc) and the working points and e-AUGRC of
``pipeline.core.selective`` apply it to a split's tie groups (1-D counts); the bootstrap
(``pipeline.report.bootstrap``) to resampled counts of shape (resamples, levels), where a level
may be empty.  The formulas are those of the scalar definitions, in the same operations and order
(trapezoids over the ROC and risk-coverage points, scikit-learn's average precision), so a
split's point estimates do not depend on whether they came from here or from a row-based loop.
Pure numpy, no project imports.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

STANDARD_TPR_LEVEL = 0.9495               # fd-shifts: first ROC point with TPR >= 0.9495
COVERAGES = (80, 90, 95)                 # percent: selective risk at these coverages
RISKS = (1, 5, 10)                       # percent: coverage at these selective risks
WORKING_POINTS = tuple(f"risk@cov{c}" for c in COVERAGES) + tuple(f"cov@risk{r}" for r in RISKS)
# the standard definitions, plus the paper's AUPR-Error (scored by p itself)
COUNT_METRICS = ("auc", "aupr_succ", "aupr_err", "aupr_err_paper", "fpr95", "aurc", "eaurc",
                 "augrc", "eaugrc") + WORKING_POINTS


@dataclass(frozen=True)
class Levels:
    """Cumulative counts at each level (descending confidence): ``tp`` / ``fp`` correct /
    incorrect rows at or above it, ``*_prev`` strictly above it; totals over the last axis."""
    pos: np.ndarray
    neg: np.ndarray
    tp: np.ndarray
    fp: np.ndarray
    tp_prev: np.ndarray
    fp_prev: np.ndarray
    n_pos: np.ndarray
    n_neg: np.ndarray
    n: np.ndarray

    @classmethod
    def of(cls, pos, neg, dtype=np.float64) -> "Levels":
        pos, neg = np.asarray(pos, dtype=dtype), np.asarray(neg, dtype=dtype)
        tp, fp = np.cumsum(pos, -1), np.cumsum(neg, -1)
        return cls(pos, neg, tp, fp, tp - pos, fp - neg, tp[..., -1], fp[..., -1],
                   tp[..., -1] + fp[..., -1])

    # computed once: several metrics of one call read them (cached_property writes __dict__)
    @cached_property
    def kept(self) -> np.ndarray:
        return self.tp + self.fp

    @cached_property
    def coverage(self) -> np.ndarray:
        return self.kept / self.n[..., None]

    @cached_property
    def kept_or_1(self) -> np.ndarray:
        """``kept``, 1 at an empty level: a quotient over it is then 0, not NaN."""
        return np.maximum(self.kept, 1)

    @cached_property
    def risk(self) -> np.ndarray:
        """Selective risk of the rows kept at each level (0 where none is: an empty level)."""
        return self.fp / self.kept_or_1


# The curves start at the origin: a point 0 before the first level.  ``_step`` and ``_pairs`` give
# diff(r_[0, a]) and the sums of neighbours of r_[0, a] without building r_[0, a] (the report
# calls this for every resample of every score): a[0] - 0 and a[0] + 0 are a[0] exactly.  They
# work on the flattened array (one contiguous pass, several times faster than row by row) and
# then put back the first column, which the flat pass took from the previous row.
def _with_previous(a: np.ndarray, op) -> np.ndarray:
    """op(a[k], a[k - 1]) along the last axis, with a[0] where a[-1] would be 0."""
    a = np.ascontiguousarray(a)
    out = np.empty_like(a)
    flat, into = a.reshape(-1), out.reshape(-1)
    op(flat[1:], flat[:-1], out=into[1:])
    out[..., 0] = a[..., 0]
    return out


def _step(a: np.ndarray) -> np.ndarray:
    """a[k] - a[k - 1], with 0 standing for a[-1]."""
    return _with_previous(a, np.subtract)


def _pairs(a: np.ndarray) -> np.ndarray:
    """a[k] + a[k - 1], with 0 standing for a[-1]."""
    return _with_previous(a, np.add)


def _trapezoid(y_pairs: np.ndarray, x_step: np.ndarray) -> np.ndarray:
    """Trapezoids: sum of (x_k - x_{k-1}) (y_k + y_{k-1}) / 2 (``x_step``, ``y_pairs``, which
    is overwritten: a temporary of the caller)."""
    area = np.multiply(x_step, y_pairs, out=y_pairs)
    area *= 0.5
    return np.sum(area, axis=-1)


def _average_precision(hits: np.ndarray, total: np.ndarray, n_hits: np.ndarray) -> np.ndarray:
    """scikit-learn's AP: sum over thresholds of (R_k - R_{k-1}) * P_k with P_k = hits / total
    (``total`` >= 1), cumulative counts in the order the thresholds are visited (an empty level
    adds nothing: its recall step is 0)."""
    terms = _step(hits / n_hits[..., None])
    terms *= hits / total
    return np.sum(terms, axis=-1)


def optimal_aurc(error_rate):
    """AURC of a perfect ranking with this error rate: err + (1 - err) ln(1 - err) (limit 1)."""
    err = np.asarray(error_rate, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(err >= 1, 1.0, err + (1.0 - err) * np.log1p(-err))


def tpr95_level(tp, n_pos) -> np.ndarray:
    """The first level (descending) whose TPR reaches ``STANDARD_TPR_LEVEL``: TPR rises along
    the levels, so this is the lowest FPR among the ROC points with TPR >= 0.9495."""
    tp = np.asarray(tp)
    return np.argmax(tp / np.asarray(n_pos)[..., None] >= STANDARD_TPR_LEVEL, axis=-1)


def coverage_level(lv: Levels, coverage: float) -> np.ndarray:
    """The first level (descending) keeping >= ``coverage`` percent of the rows.  Coverage
    kept/n and c/100 are correctly rounded quotients of integers below 2^53, and distinct such
    fractions differ by far more than a rounding error: the float comparison is exact."""
    return np.argmax(lv.coverage >= coverage / 100, axis=-1)


def risk_level(lv: Levels, risk: float) -> tuple[np.ndarray, np.ndarray]:
    """(the LAST level whose selective risk is <= ``risk`` percent, whether any is): kept grows
    along the levels, so it has the largest coverage among them."""
    ok = (lv.risk <= risk / 100)[..., ::-1]
    return lv.pos.shape[-1] - 1 - np.argmax(ok, axis=-1), ok.any(-1)


def _at(a: np.ndarray, k: np.ndarray) -> np.ndarray:
    return np.take_along_axis(a, np.asarray(k)[..., None], -1)[..., 0]


def counts_metrics(pos, neg, names=COUNT_METRICS, dtype=np.float64) -> dict[str, np.ndarray]:
    """Rank metrics from counts of correct (``pos``) and incorrect (``neg``) rows per threshold
    level, levels in DESCENDING confidence along the last axis: arrays (..., T) -> {name: (...)}.

    Empty levels (zero counts) are allowed (resamples).  A metric that does not exist for the
    counts (no correct or no incorrect rows) is NaN.  ``dtype`` float32 halves the memory
    traffic for large batches (counts stay exact below 2^24; the metrics carry ~1e-6 relative
    rounding, far below a bootstrap interval's resolution)."""
    return level_metrics(Levels.of(pos, neg, dtype), names)


def level_metrics(lv: Levels, names=COUNT_METRICS) -> dict[str, np.ndarray]:
    """``counts_metrics`` of counts already cumulated (a split's ``Ranked.levels``, which the
    scalar metrics of one split share instead of cumulating them again for each)."""
    out = {}
    with np.errstate(invalid="ignore", divide="ignore"):
        out.update(_ranking(lv, names))
        out.update(_curves(lv, names))
        out.update(_working_points(lv, names))
    return out


def _ranking(lv: Levels, names) -> dict:
    """AUC, AUPR-Success, AUPR-Error (both) and FPR-95%-TPR: NaN without both classes."""
    out = {}
    nan = np.where((lv.n_pos > 0) & (lv.n_neg > 0), 1.0, np.nan)
    if "auc" in names:       # trapezoids over the ROC points; ties give the diagonal (count 1/2)
        tpr, fpr = lv.tp / lv.n_pos[..., None], lv.fp / lv.n_neg[..., None]
        out["auc"] = _trapezoid(_pairs(tpr), _step(fpr)) * nan
    if "aupr_succ" in names:
        out["aupr_succ"] = _average_precision(lv.tp, lv.kept_or_1, lv.n_pos) * nan
    if "aupr_err" in names:  # errors as positives, scored by -p: levels visited from the bottom
        # (contiguous copies: element-wise work on reversed views is several times slower)
        err_le = np.ascontiguousarray((lv.n_neg[..., None] - lv.fp_prev)[..., ::-1])
        cor_le = np.ascontiguousarray((lv.n_pos[..., None] - lv.tp_prev)[..., ::-1])
        out["aupr_err"] = _average_precision(err_le, np.maximum(err_le + cor_le, 1),
                                             lv.n_neg) * nan
    if "aupr_err_paper" in names:   # errors as positives, scored by p itself (authors' code)
        out["aupr_err_paper"] = _average_precision(lv.fp, lv.kept_or_1, lv.n_neg) * nan
    if "fpr95" in names:
        out["fpr95"] = _at(lv.fp, tpr95_level(lv.tp, lv.n_pos)) / lv.n_neg * nan
    return out


def _curves(lv: Levels, names) -> dict:
    """Areas under the selective and generalized risk-coverage curves (trapezoids, one point per
    level) and their excess over a perfect ranking; defined with one class too."""
    out, wanted = {}, {"aurc", "eaurc", "augrc", "eaugrc"} & set(names)
    if not wanted:
        return out
    step = _step(lv.coverage)
    if {"aurc", "eaurc"} & wanted:
        # the curve starts at coverage 0 with the risk of the first non-empty level (fd-shifts):
        # a level with no row above it pairs its own risk with itself; empty levels have width 0
        kept_prev = lv.tp_prev + lv.fp_prev
        risk = lv.risk
        risk_prev = np.where(kept_prev > 0, lv.fp_prev / np.maximum(kept_prev, 1), risk)
        aurc = _trapezoid(np.add(risk, risk_prev, out=risk_prev), step)
        out["aurc"] = aurc
        out["eaurc"] = aurc - optimal_aurc(lv.n_neg / lv.n)
    if {"augrc", "eaugrc"} & wanted:
        augrc = _trapezoid(_pairs(lv.fp / lv.n[..., None]), step)
        err = lv.n_neg / lv.n
        out["augrc"] = augrc
        out["eaugrc"] = augrc - 0.5 * err * err
    return {k: v for k, v in out.items() if k in wanted}


def _working_points(lv: Levels, names) -> dict:
    out = {}
    for c in COVERAGES:
        if f"risk@cov{c}" in names:
            out[f"risk@cov{c}"] = _at(lv.risk, coverage_level(lv, c))
    for r in RISKS:
        if f"cov@risk{r}" in names:
            k, any_ok = risk_level(lv, r)
            out[f"cov@risk{r}"] = np.where(any_ok, _at(lv.coverage, k), 0.0)
    return out
