"""The test behind a verdict, on per-resample values: the three-level bootstrap's replicates of a
difference, its two-sided p-value and Holm's adjustment within a family.  What is compared and
what a verdict says is ``verdicts.py``'s; the Python API's ``compare`` tests with the same
functions, so its p-values are the report's.

Replicates (``hierarchical``): a three-level bootstrap (Saravanan, Berman and Sober, 2020) -- per
replicate, the fits drawn with replacement, then within each fit each side's seeds, then the rows
(the report's row resample of the same index, shared by every score of a split: paired).  With one
fit and one seed per side it is the row bootstrap.  With 2-5 seeds or fits the upper levels take
few distinct values: their intervals are coarse.

P-values (``p_value``) are two-sided; ``holm`` adjusts a family's by Holm's step-down method
(Holm 1979), which controls the family-wise error.  Torch-free.
"""
from __future__ import annotations

import numpy as np


def hierarchical(a: dict[str, np.ndarray], b: dict[str, np.ndarray],
                 rng: np.random.Generator) -> np.ndarray:
    """Replicates (R,) of mean_f [mean over a's seeds - mean over b's seeds] of fit f, fits and
    each side's seeds drawn with replacement per replicate, replicate r on row resample r.
    ``a``, ``b``: {fit: (seeds, R) per-resample values}, the same fits."""
    fits = sorted(a)
    r = next(iter(a.values())).shape[1]
    cols = np.arange(r)[:, None]
    per_fit = np.empty((len(fits), r))
    for j, fit in enumerate(fits):
        means = []
        for side in (a[fit], b[fit]):
            seeds = rng.integers(0, side.shape[0], (r, side.shape[0]))
            means.append(side[seeds, cols].mean(axis=1))
        per_fit[j] = means[0] - means[1]
    drawn = rng.integers(0, len(fits), (r, len(fits)))
    return per_fit[drawn, cols].mean(axis=1)


def p_value(replicates: np.ndarray) -> float | None:
    """Two-sided bootstrap p-value of "the difference is 0": twice the smaller tail, each tail
    counted with the replicate at 0 and one added (never 0 from finitely many replicates)."""
    x = replicates[np.isfinite(replicates)]
    if not len(x):
        return None
    tail = min((x <= 0).sum(), (x >= 0).sum())
    return float(min(1.0, 2 * (tail + 1) / (len(x) + 1)))


def holm(p: list[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (None stays None; the others form the family)."""
    idx = sorted((v, i) for i, v in enumerate(p) if v is not None)
    out: list[float | None] = [None] * len(p)
    running, m = 0.0, len(idx)
    for rank, (v, i) in enumerate(idx):
        running = max(running, min(1.0, (m - rank) * v))
        out[i] = running
    return out
