"""The one sort every trust metric reads: rows ranked by confidence, ties grouped into one
threshold, with the counts of correct and incorrect rows above each (``Ranked``, ``rank``).

Sorting once makes every metric of ``metrics.py`` O(number of distinct confidences) afterwards, and
the caller may pass a ``Ranked`` instead of the arrays to share the sort between metrics.  Pure
numpy; ``check_inputs`` is the one validation of ``(confidence, correct)``.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from pipeline.core.counts import Levels


def check_inputs(confidence, correct) -> tuple[np.ndarray, np.ndarray]:
    """Validate and convert: ``confidence`` (n,) finite floats, ``correct`` (n,) of {0, 1}/bool.

    Returns ``(confidence, correct)`` as (n,) floating and (n,) bool arrays.  Raises ValueError
    naming the first offending row.
    """
    conf = np.asarray(confidence)
    corr = np.asarray(correct)
    if conf.ndim != 1 or corr.ndim != 1 or conf.shape != corr.shape:
        raise ValueError(f"expected confidence and correct of the same shape (n,), got "
                         f"{conf.shape} and {corr.shape}")
    if conf.shape[0] == 0:
        raise ValueError("expected at least one row, got empty arrays")
    if not np.issubdtype(conf.dtype, np.floating):
        conf = conf.astype(np.float64)
    bad = ~np.isfinite(conf)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise ValueError(f"confidence must be finite: {int(bad.sum())} non-finite value(s), first "
                         f"at row {first} ({conf[first]!r})")
    if corr.dtype != np.bool_:
        off = (corr != 0) & (corr != 1)
        if off.any():
            first = int(np.flatnonzero(off)[0])
            raise ValueError(f"correct must hold 0/1 values, row {first} holds {corr[first]!r}")
        corr = corr.astype(bool)
    return conf, corr


@dataclass(frozen=True)
class Ranked:
    """Rows sorted once by confidence and grouped by distinct value (ties form one threshold).

    ``thresholds`` (T,) distinct confidences, DESCENDING; ``tp`` / ``fp`` (T,) number of correct /
    incorrect rows with confidence >= threshold; ``pos`` / ``neg`` ascending confidences of the
    correct / incorrect rows.
    """
    thresholds: np.ndarray
    tp: np.ndarray
    fp: np.ndarray
    pos: np.ndarray
    neg: np.ndarray

    @property
    def n_pos(self) -> int:
        return len(self.pos)

    @property
    def n_neg(self) -> int:
        return len(self.neg)

    @property
    def n(self) -> int:
        return len(self.pos) + len(self.neg)

    @cached_property      # computed once: every metric of the split reads it
    def levels(self) -> Levels:
        """The tie groups' counts, cumulated, for ``pipeline.core.counts``."""
        return Levels.of(*group_counts(self))


def rank(confidence, correct) -> Ranked:
    """Sort ``confidence`` (n,) once and accumulate the counts every metric needs."""
    conf, corr = check_inputs(confidence, correct)
    order = np.argsort(conf)
    s, c = conf[order], corr[order]
    n, n_pos = len(s), int(c.sum())
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])       # ascending tie groups
    pos_below = np.r_[0, np.cumsum(c, dtype=np.int64)][starts]  # correct rows below each group
    tp = (n_pos - pos_below)[::-1]
    fp = (n - starts)[::-1] - tp
    return Ranked(s[starts][::-1], tp, fp, s[c], s[~c])


def group_counts(r: Ranked) -> tuple[np.ndarray, np.ndarray]:
    """Correct / incorrect rows in each tie group, DESCENDING confidence: (T,), (T,)."""
    return np.diff(r.tp, prepend=0), np.diff(r.fp, prepend=0)
