"""Every number the report shows for one split of one score: both metric definitions,
separability, the risk-coverage curve (thinned for plotting) and the TP/FP/TN/FN histograms."""
from __future__ import annotations

import numpy as np

from pipeline.core.metrics import DEFINITIONS, aurc, evaluate, rank, risk_coverage_curve
from pipeline.report.separability import separability_all

HIST_BINS = 50
CURVE_POINTS = 400
NO_THRESHOLD = "{name} is undefined for an unbounded score: it has no natural threshold"


def score_summary(conf: np.ndarray, correct: np.ndarray, tnr_thresholds: dict[str, float],
                  histogram: bool = True, rates: bool = True) -> dict:
    """``conf`` (n,) finite, ``correct`` (n,) bool -> {"valid_rows", "accuracy", "tnr_threshold",
    "metrics": {definition: {"values", "undefined", "notes"}}, "fits", "rc", "hist"}.

    ``tnr_thresholds`` maps each definition to its TNR threshold (1/K for TCP in ``paper``).
    ``rates=False`` reports TPR/TNR as undefined (scores without a natural threshold)."""
    r = rank(conf, correct)
    metrics, fits = {}, {}
    separation = separability_all(conf, correct, DEFINITIONS)
    for definition in DEFINITIONS:
        out = evaluate(r, definition=definition, tnr_threshold=tnr_thresholds[definition])
        sep = separation[definition]
        for key in ("values", "undefined", "notes"):
            out[key].update(sep[key])
        if not rates:
            for name in ("tpr", "tnr"):
                out["values"][name] = None
                out["undefined"][name] = NO_THRESHOLD.format(name=name.upper())
        metrics[definition] = out
        fits = sep["fits"]
    return {"valid_rows": int(len(conf)), "accuracy": float(correct.mean()),
            "tnr_threshold": dict(tnr_thresholds), "metrics": metrics, "fits": fits,
            "rc": thin_curve(*risk_coverage_curve(r), aurc=aurc(r)),
            "hist": histograms(conf, correct, tnr_thresholds["paper"]) if histogram else None}


def thin_curve(coverage: np.ndarray, risk: np.ndarray, aurc: float,
               points: int = CURVE_POINTS) -> dict:
    """At most ``points`` + 2 points of the curve, evenly spaced in coverage, ends kept."""
    idx = np.unique(np.r_[0, np.searchsorted(coverage, np.linspace(0, 1, points)),
                          len(coverage) - 1].clip(0, len(coverage) - 1))
    return {"coverage": coverage[idx].tolist(), "risk": risk[idx].tolist(), "aurc": aurc}


def histograms(conf: np.ndarray, correct: np.ndarray, tnr_threshold: float,
               tpr_threshold: float = 0.5) -> dict:
    """Counts of TP / FN (correct rows above / not above the positive threshold) and TN / FP
    (incorrect rows below / not below the negative threshold) on 50 equal bins over [0, 1]
    (values outside are clipped into the end bins); thresholds are compared in the confidence's
    own precision, as the metrics do."""
    t_pos = np.asarray(tpr_threshold, dtype=conf.dtype)
    t_neg = np.asarray(tnr_threshold, dtype=conf.dtype)
    accepted, rejected = conf > t_pos, conf < t_neg
    # category 0..3 = TP, FN, TN, FP; one bincount instead of four sorting np.histogram calls
    category = np.where(correct, np.where(accepted, 0, 1), np.where(rejected, 2, 3))
    bins = np.clip((conf * HIST_BINS).astype(np.int64), 0, HIST_BINS - 1)  # [0, 1]; 1.0 -> last
    counts = np.bincount(category * HIST_BINS + bins, minlength=4 * HIST_BINS).reshape(4, -1)
    return {"edges": np.linspace(0.0, 1.0, HIST_BINS + 1).tolist(),
            "counts": {k: counts[i].tolist() for i, k in enumerate(("TP", "FN", "TN", "FP"))},
            "thresholds": {"positive": float(tpr_threshold), "negative": float(tnr_threshold)}}
