"""Paired comparisons of two confidence scores of the same rows, as the report's comparisons
compute them (``pipeline.report.compare``, ``pipeline.report.verdicts``): both scores see the same
bootstrap resamples, so what the rows have in common cancels; several seeds (and classifier fits)
are resampled too.

    compare(score_a, score_b, correct)["auc"].favours        # "a", "b" or None
    compare(ss_seeds, ce_seeds, correct)["augrc"].p          # (S, N) arrays: seeds resampled too
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from pipeline.core.catalog import higher_is_better, names
from pipeline.report.bootstrap import NO_CI
from pipeline.report.compare import VERSUS_METRICS, paired_interval
from pipeline.report.significance import hierarchical, p_value
from trust_oracles.errors import received
from trust_oracles.evaluation import (DEFAULT_RESAMPLES, Interval, _check_options, _summary,
                                      check_scores)

__all__ = ["COMPARED_METRICS", "Comparison", "Difference", "compare"]

COMPARED_METRICS = tuple(name for name, _ in VERSUS_METRICS)   # the report's: auc, aurc, augrc


@dataclass(frozen=True)
class Difference:
    """One metric of a paired comparison (``compare``).

    Attributes
    ----------
    metric, definition : str
        The catalog's name of the metric, and its definition ("standard" or "paper").
    a, b : float or None
        The metric of each score (with several seeds or fits, the means over them); None where
        undefined.
    delta : float or None
        ``a`` - ``b`` (None when either is undefined).
    interval : Interval
        Its paired bootstrap interval.
    higher_is_better : bool or None
        The metric's direction, from the catalog (None for TPR, which has none).
    favours : {"a", "b"} or None
        The side the interval favours when it excludes 0, else None.
    p : float or None
        The two-sided bootstrap p-value of "no difference".
    covers : str
        The sources of variance the interval resamples: "rows", "seeds, rows" or "fits, seeds,
        rows".
    """
    metric: str
    definition: str
    a: float | None
    b: float | None
    delta: float | None
    interval: Interval
    higher_is_better: bool | None
    favours: str | None
    p: float | None = None
    covers: str = "rows"

    @property
    def excludes_zero(self) -> bool | None:
        """Whether the interval excludes 0; None when there is no interval."""
        if not self.interval.defined:
            return None
        return self.interval.low > 0 or self.interval.high < 0


@dataclass(frozen=True)
class Comparison(Mapping):
    """What ``compare`` returns: a mapping {metric name: Difference}, and the settings.

    Attributes
    ----------
    differences : dict of str to Difference
        What ``cmp[name]`` reads.
    definition : str
    n : int
        Rows compared (over every fit).
    resamples, seed : int
    confidence_level : float
    """
    differences: dict[str, Difference]
    definition: str
    n: int
    resamples: int
    seed: int
    confidence_level: float

    def __getitem__(self, name: str) -> Difference:
        if name not in self.differences:
            raise KeyError(f"{name!r} was not compared; compared: {list(self.differences)}")
        return self.differences[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.differences)

    def __len__(self) -> int:
        return len(self.differences)


def compare(score_a: ArrayLike | Sequence[ArrayLike], score_b: ArrayLike | Sequence[ArrayLike],
            correct: ArrayLike | Sequence[ArrayLike], *, metrics: Sequence[str] = COMPARED_METRICS,
            definition: str = "standard", tnr_threshold: float = 0.5,
            resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
            confidence_level: float = 0.95) -> Comparison:
    """Paired bootstrap differences a - b of two scores of the same rows, as the report computes
    them: both scores see the same resamples of the rows, so what the rows have in common cancels.
    With several seeds, and several classifier fits, a - b is the mean over fits of the seed means'
    difference, and the interval resamples the fits, then each side's seeds, then the rows (the
    report's verdicts, ``pipeline.report.verdicts``; docs/METRICS.md, "Verdicts").

    Parameters
    ----------
    score_a, score_b : array-like, shape (N,) or (S, N); or a sequence of them, one per fit
        Scores of the same rows (finite reals, higher = more trusted): one run, or S seeds of a
        recipe (S may differ between a and b).  Several classifier fits: a list with one
        (N_f,) or (S_f, N_f) array per fit, for a and for b alike.
    correct : array-like, shape (N,); or a sequence of them, one per fit
        bool or 0/1: the classifier's correctness on those rows.
    metrics : sequence of str
        Catalog names of ``definition``; default the report's AUC, AURC and AUGRC.
    definition : {"standard", "paper"}
    tnr_threshold : float
        The paper definition's TNR threshold, as in ``evaluate``.
    resamples, seed : int
        The bootstrap, as in ``evaluate`` (the report's defaults: 1000, 0).
    confidence_level : float
        Of the intervals, as in ``evaluate`` (the report's defaults: 1000, 0, 0.95).

    Returns
    -------
    Comparison
        ``cmp[name]``: a ``Difference`` (``delta``, ``interval``, ``excludes_zero``, ``favours``,
        ``p``: the two-sided bootstrap p-value; ``covers``: "rows", "seeds, rows" or "fits,
        seeds, rows").  One comparison is not corrected for others: the report's verdicts apply
        Holm's method within each question.
    """
    _check_options(definition, resamples, seed, confidence_level, tnr_threshold)
    if definition == "both" or resamples is None:
        raise received("definition and resamples", f"{definition!r} and {resamples!r}",
                        "'standard' or 'paper' and an integer >= 1")
    if isinstance(metrics, str) or not metrics or set(metrics) - set(names(definition)):
        raise received("metrics", repr(metrics), f"a non-empty sequence of names of the "
                        f"{definition} definition: {list(names(definition))}")
    fits = _fits(score_a, score_b, correct)
    summary = [[[_summary(s, c, tnr_threshold, True, True, resamples, seed, confidence_level)
                 for s in side] for side in (a, b)] for a, b, c in fits]
    counts = tuple(min(int(f(c).sum()) for _, _, c in fits) for f in (lambda c: c, np.logical_not))
    levels = (["fits"] if len(fits) > 1 else []) + \
        (["seeds"] if any(len(side) > 1 for a, b, _ in fits for side in (a, b)) else []) + ["rows"]
    out = {name: _difference(name, definition, summary, counts, ", ".join(levels),
                             confidence_level, seed) for name in metrics}
    return Comparison(out, definition, sum(len(c) for _, _, c in fits), int(resamples), int(seed),
                      float(confidence_level))


def _fits(score_a, score_b, correct) -> list[tuple[list, list, np.ndarray]]:
    """[(a's seeds, b's seeds, correct)] per fit, each score checked against its ``correct``."""
    several = isinstance(correct, (list, tuple)) and len(correct) > 0 and \
        np.ndim(correct[0]) == 1
    per = (score_a, score_b, correct) if several else ([score_a], [score_b], [correct])
    if not all(isinstance(x, (list, tuple)) for x in per[:2]) or \
            len({len(x) for x in per}) != 1:
        raise received("score_a, score_b and correct", "sequences of different lengths or kinds",
                       "one array each, or one per classifier fit in each (the same number)")
    fits = []
    for f, (a, b, c) in enumerate(zip(*per)):
        sides = []
        for name, x in (("score_a", a), ("score_b", b)):
            rows = np.asarray(x)
            seeds = rows[None] if rows.ndim == 1 else rows
            if seeds.ndim != 2 or not len(seeds):
                raise received(name + (f"[{f}]" if several else ""), f"shape {rows.shape}",
                               "(N,) for one run or (S, N) for S seeds")
            sides.append([check_scores(s, c, name)[0] for s in seeds])
        fits.append((*sides, check_scores(sides[0][0], c, "score_a")[1]))
    return fits


def _difference(name: str, definition: str, summary: list, counts: tuple[int, int],
                covers: str, confidence_level: float, seed: int) -> Difference:
    """a - b of ``name`` over the fits' seeds (``summary``[fit][side][seed] = ``_summary``)."""
    point = [[[m[definition]["values"][name] for m, _, _ in side] for side in fit]
             for fit in summary]
    reason = next((m[definition]["undefined"].get(name) for fit in summary for side in fit
                   for m, _, _ in side if m[definition]["undefined"].get(name)),
                  NO_CI.get((definition, name)))
    higher = higher_is_better(name, definition)
    va, vb = (None if any(v is None for f in point for v in f[i]) else
              float(np.mean([np.mean(f[i]) for f in point])) for i in (0, 1))
    delta = None if va is None or vb is None else \
        float(np.mean([np.mean(f[0]) - np.mean(f[1]) for f in point]))
    reps = None
    if not reason and delta is not None:
        boots = [{str(j): np.stack([bt.of(definition, name) for _, bt, _ in fit[i]])
                  for j, fit in enumerate(summary)} for i in (0, 1)]
        reps = hierarchical(*boots, np.random.default_rng([seed, 1]))
    ci, side = paired_interval(delta, reps, None if reps is None else np.zeros_like(reps), name,
                               counts, higher is not False, reason, 100.0 * confidence_level)
    favours = {1: "a", -1: "b"}.get(side) if higher is not None else None
    return Difference(name, definition, va, vb, delta, Interval(**ci), higher, favours,
                      None if reps is None else p_value(reps), covers)
