"""Bootstrap confidence intervals over rows: seeded, vectorised, paired across scores.

How a resample is drawn.  The rows of a split (in global-index order) are dealt once, by a seeded
permutation, into G = min(n, 512) groups of equal size (+-1 row); a resample draws G groups with
replacement.  With n <= 512 every group is one row: the ordinary row bootstrap.  Above that it is
a bootstrap over a random partition of the rows (for independent rows it has the same limiting
distribution as the row bootstrap; tests/test_bootstrap.py compares the two intervals).  The
draws depend only on (seed, n), so every score evaluated on the same rows (every run and every
post-hoc baseline of one classifier cache and split) sees the SAME resamples: differences between
scores and means over seeds are bootstrapped paired, by combining per-resample values.

Why groups: a resample is then a (resamples x G) count matrix W, and every statistic that is a
sum over rows becomes W @ (per-group sums), one matrix product, instead of a pass over
resamples x n rows (1,000 x 50,000 per score would take seconds per score).  Linear statistics
(accuracy, TPR, TNR, the Gaussian fits of the separability, ECE's per-bin gaps) are exact under
this scheme.  Rank metrics (AUC, AUPR, FPR-95%-TPR, AURC, AUGRC, working points) need counts per
threshold: each score's tie groups are merged into at most 512 levels of equal row count (ties
never split), the per-group counts of (level, correct) go through the same product, and the
metrics are computed from the counts (``counts_metrics``); the resampled values are shifted by
(exact value - value on the merged levels) so the interval is centred on the exact metric.  With
at most 512 distinct confidences nothing is merged.  Measured against a brute-force row
bootstrap (50,000 rows, 1,000 resamples): interval ends within 0.1 of the interval's width,
where two row bootstraps with different seeds differ by up to 0.08 (docs/METRICS.md).

Interval: the 2.5 and 97.5 percentiles of the resampled values (percentile bootstrap).  Resamples
where a metric does not exist (no correct or no incorrect row drawn) are left out and counted;
with fewer than two rows of the class a metric needs, or more than 5% of the resamples left out,
the interval is recorded as undefined with the reason.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from pipeline.core.catalog import CATALOG
from pipeline.core.counts import COUNT_METRICS, counts_metrics
from pipeline.core.selective import ECE_BINS, ece_bins
from pipeline.report.separability import averaged_kl, bhattacharyya

CI_LEVEL = 95.0
MAX_LEFT_OUT = 0.05
RANK_METRICS = {"paper": {"auc": "auc", "aupr_succ": "aupr_succ", "aupr_err": "aupr_err_paper"},
                "standard": {m: m for m in COUNT_METRICS if m != "aupr_err_paper"}}
NO_CI = {("paper", "fpr95"): "no bootstrap interval for the paper's grid FPR-95%-TPR (its 10,000 "
                             "thresholds move with each resample's extreme confidences); the "
                             "standard FPR-95%-TPR has one"}
NEEDS = {name: m.needs for name, m in CATALOG.items()}


@dataclass(frozen=True)
class BootstrapSpec:
    resamples: int = 1000
    seed: int = 0
    groups: int = 512
    levels: int = 512


@dataclass(frozen=True)
class Resamples:
    """One score's per-resample values on one split (``bootstrap_score``): {definition:
    {metric: (resamples,) float64, NaN where undefined}}; a metric without an exact value has
    none.  The report combines them over seeds and between scores (compare.py, verdicts.py),
    which the same resamples of a split make paired; they never reach report.json (a thousand
    values per metric and run)."""
    values: dict[str, dict[str, np.ndarray]]

    def of(self, definition: str, metric: str) -> np.ndarray | None:
        """The values of ``metric`` in ``definition``; None where it has none."""
        return self.values.get(definition, {}).get(metric)


@lru_cache(maxsize=8)
def resample_plan(n: int, spec: BootstrapSpec) -> tuple[np.ndarray, np.ndarray]:
    """(group of each row (n,), counts W (resamples, G) float32) for ``n`` rows; see the module
    docstring.  Cached: every score of a split in this process reuses it."""
    g = min(n, spec.groups)
    if g == n:
        group = np.arange(n)
    else:
        group = np.random.default_rng([spec.seed, n, 0]).permutation(n) % g
    draws = np.random.default_rng([spec.seed, n, 1]).integers(0, g, (spec.resamples, g))
    offsets = (np.arange(spec.resamples) * g)[:, None]
    w = np.bincount((draws + offsets).ravel(), minlength=spec.resamples * g)
    return group, w.reshape(spec.resamples, g).astype(np.float32)


def score_levels(conf: np.ndarray, max_levels: int) -> tuple[np.ndarray, int]:
    """Level of each row (0 = most confident) merging tie groups into <= ``max_levels`` levels of
    about equal row count; ties always share a level."""
    n = len(conf)
    order = np.argsort(-conf, kind="stable")
    s = conf[order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    if len(starts) <= max_levels:
        level_of_group = np.arange(len(starts))
    else:
        level_of_group = np.unique((starts * max_levels) // n, return_inverse=True)[1]
    level = np.empty(n, np.int64)
    level[order] = np.repeat(level_of_group, np.diff(np.r_[starts, n]))
    return level, int(level_of_group[-1]) + 1


def bootstrap_score(conf: np.ndarray, correct: np.ndarray, spec: BootstrapSpec, exact: dict,
                    thresholds: dict, probability: bool) -> dict:
    """Per-resample values of every metric of both definitions for one score on one split.

    ``conf`` (n,) and ``correct`` (n,) in the rows' global-index order; ``exact`` {definition:
    {metric: full-sample value or None}}; ``thresholds`` {definition: TNR threshold} (TPR at 0.5).
    Returns {definition: {metric: (resamples,) float64, NaN where undefined}}.
    """
    conf = np.asarray(conf, dtype=np.float64)
    correct = np.asarray(correct, dtype=bool)
    n = len(conf)
    group, w = resample_plan(n, spec)
    g = w.shape[1]
    level, n_levels = score_levels(conf, spec.levels)
    # per group: counts of correct rows by level, then of incorrect rows (contiguous halves)
    cells = np.bincount(group * 2 * n_levels + (~correct) * n_levels + level,
                        minlength=g * 2 * n_levels).reshape(g, 2 * n_levels)
    counts = w @ cells.astype(np.float32)          # exact: integers below 2^24
    ranked = counts_metrics(counts[:, :n_levels], counts[:, n_levels:], dtype=np.float32)
    merged = counts_metrics(np.bincount(level[correct], minlength=n_levels),
                            np.bincount(level[~correct], minlength=n_levels))
    lin = _linear(conf, correct, group, g, w, thresholds, probability)
    out: dict = {}
    for d in ("paper", "standard"):
        vals = {}
        for name, source in RANK_METRICS[d].items():
            full = exact[d].get(name)
            if full is not None:   # centre on the exact value (no shift when nothing merged)
                vals[name] = ranked[source] + (full - float(merged[source]))
        vals.update(lin[d])
        out[d] = vals
    return out


def _linear(conf, correct, group, g, w, thresholds, probability) -> dict:
    """Statistics that are sums over rows: exact under group resampling."""
    centred = conf - conf.mean()          # variances are shift-invariant; fewer digits lost
    pos, neg = correct.astype(np.float64), (~correct).astype(np.float64)
    # one per-row column per sum a statistic needs, summed per group, then per resample
    cols = {"pos": pos, "neg": neg, "tp": pos * (conf > 0.5),
            "tn_paper": neg * (conf < thresholds["paper"]),
            "tn_standard": neg * (conf < thresholds["standard"]),
            "pos_x": pos * centred, "pos_xx": pos * centred ** 2,
            "neg_x": neg * centred, "neg_xx": neg * centred ** 2}
    if probability:
        b = ece_bins(conf, ECE_BINS)
        cols.update({f"gap{k}": (b == k) * (conf - pos) for k in range(ECE_BINS)})
    sums = np.stack([np.bincount(group, weights=c, minlength=g) for c in cols.values()], axis=1)
    s = dict(zip(cols, (w.astype(np.float64) @ sums).T))
    p, q = s["pos"], s["neg"]
    with np.errstate(invalid="ignore", divide="ignore"):
        mu1, mu2 = s["pos_x"] / p, s["neg_x"] / q
        sd1 = np.sqrt((s["pos_xx"] - p * mu1 ** 2) / (p - 1))
        sd2 = np.sqrt((s["neg_xx"] - q * mu2 ** 2) / (q - 1))
        ok = (p > 1) & (q > 1) & (sd1 > 0) & (sd2 > 0)
        s1, s2 = np.where(ok, sd1, np.nan), np.where(ok, sd2, np.nan)
        # separability.py's distances, applied to every resample's Gaussian fits
        common = {"acc": p / (p + q), "tpr": s["tp"] / p,
                  "bhattacharyya": bhattacharyya(mu1, s1, mu2, s2)}
        out = {}
        for d in ("paper", "standard"):
            out[d] = {**common, "tnr": s[f"tn_{d}"] / q, "kl": averaged_kl(mu1, s1, mu2, s2, d)}
        if probability:     # ECE belongs to the standard set
            gaps = np.stack([s[f"gap{k}"] for k in range(ECE_BINS)], axis=1)
            out["standard"]["ece"] = np.abs(gaps).sum(1) / (p + q)
        return out


def interval(samples: np.ndarray | None, value: float | None, name: str, counts: tuple[int, int],
             reason: str | None = None, level: float = CI_LEVEL) -> dict:
    """The ``level``% percentile interval of ``samples`` for a metric whose full-sample value is
    ``value``; ``counts`` = (correct rows, incorrect rows) of the split.  Undefined (with the
    reason) when the metric is, when a class it needs has fewer than 2 rows, or when > 5% of
    resamples fail."""
    def undefined(why):
        return {"low": None, "high": None, "resamples": 0, "undefined": why, "note": None}
    if reason or value is None or samples is None:
        return undefined(reason or "the metric itself is undefined on this split")
    need = NEEDS.get(name)
    few = [k for k, c, what in (("pos", counts[0], "correct"), ("neg", counts[1], "incorrect"))
           if need in (k, "both") and c < 2]
    if few:
        which = " and ".join({"pos": "correct", "neg": "incorrect"}[k] for k in few)
        return undefined(f"fewer than two {which} rows in the split: no bootstrap interval")
    finite = samples[np.isfinite(samples)]
    left_out = len(samples) - len(finite)
    if left_out > MAX_LEFT_OUT * len(samples):
        return undefined(f"{left_out} of {len(samples)} resamples drew too few correct or "
                         "incorrect rows for this metric")
    half = (100.0 - level) / 2
    low, high = np.percentile(finite, [half, 100.0 - half])
    note = (f"{left_out} of {len(samples)} resamples left out (too few correct or incorrect "
            "rows drawn)") if left_out else None
    return {"low": float(low), "high": float(high), "resamples": int(len(finite)),
            "undefined": None, "note": note}
