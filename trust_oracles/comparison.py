"""Paired comparisons of two confidence scores of the same rows, as the report's comparisons
compute them (``pipeline.report.compare``): both scores see the same bootstrap resamples, so what
the rows have in common cancels.

    compare(score_a, score_b, correct)["auc"].favours        # "a", "b" or None
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from pipeline.core.catalog import CATALOG, names
from pipeline.report.bootstrap import NO_CI
from pipeline.report.compare import VERSUS_METRICS, paired_interval
from trust_oracles.errors import received
from trust_oracles.evaluation import (DEFAULT_RESAMPLES, Interval, _check_options, _summary,
                                      check_scores)

__all__ = ["COMPARED_METRICS", "Comparison", "Difference", "compare"]

COMPARED_METRICS = tuple(name for name, _, _ in VERSUS_METRICS)   # the report's: auc, aurc, augrc


@dataclass(frozen=True)
class Difference:
    """One metric of a paired comparison: ``delta`` = ``a`` - ``b`` (None when either is
    undefined) and its paired bootstrap ``interval``.  ``favours``: "a" or "b" when the interval
    excludes 0 on that side of the metric's direction (``higher_is_better``, from the catalog;
    None for TPR, which has none), else None."""
    metric: str
    definition: str
    a: float | None
    b: float | None
    delta: float | None
    interval: Interval
    higher_is_better: bool | None
    favours: str | None

    @property
    def excludes_zero(self) -> bool | None:
        """Whether the interval excludes 0; None when there is no interval."""
        if not self.interval.defined:
            return None
        return self.interval.low > 0 or self.interval.high < 0


@dataclass(frozen=True)
class Comparison(Mapping):
    """What ``compare`` returns: a mapping {metric name: Difference}, and the settings."""
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


def compare(score_a, score_b, correct, *, metrics: Sequence[str] = COMPARED_METRICS,
            definition: str = "standard", tnr_threshold: float = 0.5,
            resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
            confidence_level: float = 0.95) -> Comparison:
    """Paired bootstrap differences a - b of two scores of the same rows, as the report's
    comparisons (report.json ``splits[].comparisons`` and ``versus_baselines``) compute them:
    both scores see the same resamples, so what the rows have in common cancels.

    Parameters
    ----------
    score_a, score_b : array-like, shape (N,)
        Two scores of the same rows (finite reals, higher = more trusted).
    correct : array-like, shape (N,)
        bool or 0/1: the classifier's correctness on those rows.
    metrics : sequence of str
        Catalog names of ``definition``; default the report's AUC, AURC and AUGRC.
    definition : {"standard", "paper"}
    tnr_threshold : float
        The paper definition's TNR threshold, as in ``evaluate``.
    resamples, seed, confidence_level
        The bootstrap, as in ``evaluate`` (the report's defaults: 1000, 0, 0.95).

    Returns
    -------
    Comparison
        ``cmp[name]``: a ``Difference`` (``delta``, ``interval``, ``excludes_zero``, ``favours``).
    """
    _check_options(definition, resamples, seed, confidence_level, tnr_threshold)
    if definition == "both" or resamples is None:
        raise received("definition and resamples", f"{definition!r} and {resamples!r}",
                        "'standard' or 'paper' and an integer >= 1")
    if isinstance(metrics, str) or not metrics or set(metrics) - set(names(definition)):
        raise received("metrics", repr(metrics), f"a non-empty sequence of names of the "
                        f"{definition} definition: {list(names(definition))}")
    a, correct = check_scores(score_a, correct, "score_a")
    b, _ = check_scores(score_b, correct, "score_b")
    (ma, sa, _), (mb, sb, _) = (
        _summary(s, correct, tnr_threshold, True, True, resamples, seed, confidence_level)
        for s in (a, b))
    ma, mb, sa, sb = ma[definition], mb[definition], sa[definition], sb[definition]
    counts = (int(correct.sum()), int((~correct).sum()))
    out = {}
    for name in metrics:
        va, vb = ma["values"][name], mb["values"][name]
        delta = None if va is None or vb is None else va - vb
        reason = (ma["undefined"].get(name) or mb["undefined"].get(name)
                  or NO_CI.get((definition, name)))
        header = getattr(CATALOG[name], definition)
        higher = True if "↑" in header else False if "↓" in header else None
        ci, side = paired_interval(delta, sa.get(name), sb.get(name), name, counts,
                                   higher is not False, reason, 100.0 * confidence_level)
        favours = {1: "a", -1: "b"}.get(side) if higher is not None else None
        out[name] = Difference(name, definition, va, vb, delta, Interval(**ci), higher, favours)
    return Comparison(out, definition, len(correct), int(resamples), int(seed),
                      float(confidence_level))
