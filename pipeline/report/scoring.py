"""Every number the report shows for one split of one score: both metric definitions (the
standard one with e-AUGRC, working points and ECE), separability, bootstrap intervals, the
risk-coverage curve (thinned for plotting) and the TP/FP/TN/FN histograms; beside them, typed,
the per-resample values (``ScoreSummary.resamples``)."""
from __future__ import annotations

import numpy as np

from pipeline.core.catalog import log_name
from pipeline.core.metrics import (DEFINITIONS, PAPER_METRICS, STANDARD_METRICS, Ranked, aurc,
                                   evaluate, fpr_at_95tpr, rank, risk_coverage_curve)
from pipeline.core.selective import SELECTIVE_METRICS, evaluate_selective
from pipeline.report.bootstrap import (CI_LEVEL, NO_CI, BootstrapSpec, Resamples, bootstrap_score,
                                        interval)
from pipeline.report.separability import SEPARABILITY_METRICS, separability_all

HIST_BINS = 50
CURVE_POINTS = 400
NO_THRESHOLD = "{name} is undefined for an unbounded score: it has no natural threshold"


class ScoreSummary(dict):
    """A worker's result for one score on one split: the dict is what report.json's
    "evaluations" holds (the workers add their labels to it); ``resamples``, an attribute and
    not a key so that no writer of the dict sees it, its per-resample values (None without a
    bootstrap).  A copy made with ``{**summary}`` or ``dict(summary)`` has no ``resamples``:
    copy with ``with_items``.  Pickles with both (the workers run in processes)."""
    resamples: Resamples | None

    def __init__(self, items: dict, resamples: Resamples | None = None):
        super().__init__(items)
        self.resamples = resamples

    def with_items(self, **items) -> ScoreSummary:
        """A copy with ``items`` added or replaced, the same ``resamples`` beside it."""
        return ScoreSummary({**self, **items}, self.resamples)

    def resampled(self, definition: str, metric: str) -> np.ndarray | None:
        """The per-resample values (R,) of one metric; None without them."""
        return None if self.resamples is None else self.resamples.of(definition, metric)


def score_summary(conf: np.ndarray, correct: np.ndarray, tnr_thresholds: dict[str, float],
                  histogram: bool = True, rates: bool = True, probability: bool = True,
                  bootstrap: BootstrapSpec | None = None) -> ScoreSummary:
    """``conf`` (n,) finite, ``correct`` (n,) bool -> {"valid_rows", "accuracy", "tnr_threshold",
    "metrics": {definition: {"values", "undefined", "notes"}}, "fits", "rc", "hist", "ci"}.

    ``tnr_thresholds`` maps each definition to its TNR threshold (1/K for TCP in ``paper``).
    ``rates=False`` reports TPR/TNR as undefined (scores without a natural threshold);
    ``probability=False`` ECE (scores that do not estimate P(correct)).  With ``bootstrap``:
    "ci" = {definition: {metric: interval}} (accuracy as "acc") and ``.resamples`` the
    per-resample values the report combines over seeds and between scores."""
    r = rank(conf, correct)
    metrics, fits = score_metrics(r, conf, correct, tnr_thresholds, rates, probability)
    result = {"valid_rows": int(len(conf)), log_name("acc"): float(correct.mean()),
              "class_counts": [int(correct.sum()), int((~correct).sum())],
              "tnr_threshold": dict(tnr_thresholds), "metrics": metrics, "fits": fits,
              "rc": thin_curve(*risk_coverage_curve(r), aurc=aurc(r)),
              "hist": histograms(conf, correct, tnr_thresholds["paper"],
                                 tpr95=_tpr95_threshold(r)) if histogram else None}
    if bootstrap is None:
        return ScoreSummary(result)
    resamples, result["ci"] = intervals(conf, correct, metrics, tnr_thresholds, probability,
                                        bootstrap)
    return ScoreSummary(result, resamples)


def score_metrics(r: Ranked, conf: np.ndarray, correct: np.ndarray,
                  tnr_thresholds: dict[str, float], rates: bool = True,
                  probability: bool = True) -> tuple[dict, dict]:
    """Every metric of both definitions but accuracy for one split of one score: the values the
    report stores (``score_summary``) and the public API returns (trust_oracles.evaluation).

    ``r`` = ``rank(conf, correct)`` (shared with the caller's curve); the other arguments as in
    ``score_summary``.  Returns ({definition: {"values", "undefined", "notes"}}, Gaussian fits)."""
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
        if definition == "standard":
            sel = evaluate_selective(r, conf, correct, probability)
            for key in ("values", "undefined", "notes"):
                out[key].update(sel[key])
        metrics[definition] = out
        fits = sep["fits"]
    return metrics, fits


def undefined_summary(correct: np.ndarray, reason: str) -> ScoreSummary:
    """A score that could not be computed (an unfitted baseline): every metric undefined, with
    the reason, beside the real accuracy."""
    names = {"paper": PAPER_METRICS + SEPARABILITY_METRICS,
             "standard": STANDARD_METRICS + SELECTIVE_METRICS + SEPARABILITY_METRICS}
    metrics = {d: {"values": dict.fromkeys(names[d]), "undefined": dict.fromkeys(names[d], reason),
                   "notes": {}} for d in DEFINITIONS}
    ci = {d: {n: {"low": None, "high": None, "resamples": 0, "undefined": reason, "note": None}
              for n in ("acc", *names[d])} for d in DEFINITIONS}
    return ScoreSummary({"valid_rows": int(len(correct)),
                         log_name("acc"): float(np.mean(correct)),
                         "class_counts": [int(np.sum(correct)), int(np.sum(~correct))],
                         "tnr_threshold": {"paper": 0.5, "standard": 0.5}, "metrics": metrics,
                         "fits": {}, "rc": None, "hist": None, "ci": ci})


def intervals(conf, correct, metrics: dict, thresholds: dict, probability: bool,
              spec: BootstrapSpec, level: float = CI_LEVEL) -> tuple[Resamples, dict]:
    """Per-resample values and ``level``% intervals of every metric of both definitions."""
    exact = {d: metrics[d]["values"] for d in DEFINITIONS}
    boot = bootstrap_score(conf, correct, spec, exact, thresholds, probability)
    counts = (int(correct.sum()), int((~correct).sum()))
    ci = {}
    for d in DEFINITIONS:
        values = {"acc": float(correct.mean()), **metrics[d]["values"]}
        ci[d] = {name: interval(boot[d].get(name), value, name, counts,
                                reason=metrics[d]["undefined"].get(name) or NO_CI.get((d, name)),
                                level=level)
                 for name, value in values.items()}
    return Resamples(boot), ci


def _tpr95_threshold(r) -> float | None:
    """The working point marked on the histograms: the threshold where 95% of the correct rows
    are accepted (the standard FPR-95%-TPR's threshold)."""
    if r.n_pos == 0 or r.n_neg == 0:
        return None
    return fpr_at_95tpr(r, definition="standard", return_details=True)[1]["threshold"]


def thin_curve(coverage: np.ndarray, risk: np.ndarray, aurc: float,
               points: int = CURVE_POINTS) -> dict:
    """At most ``points`` + 2 points of the curve, evenly spaced in coverage, ends kept."""
    idx = np.unique(np.r_[0, np.searchsorted(coverage, np.linspace(0, 1, points)),
                          len(coverage) - 1].clip(0, len(coverage) - 1))
    return {"coverage": coverage[idx].tolist(), "risk": risk[idx].tolist(), "aurc": aurc}


def histograms(conf: np.ndarray, correct: np.ndarray, tnr_threshold: float,
               tpr_threshold: float = 0.5, tpr95: float | None = None) -> dict:
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
            "thresholds": {"positive": float(tpr_threshold), "negative": float(tnr_threshold),
                           "tpr95": tpr95}}
