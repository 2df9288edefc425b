"""Exact Euclidean nearest neighbours per class, the search under TrustScore (``trustscore.py``).

Jiang et al. (NeurIPS 2018), as their reference code google/TrustScore computes it:

* density filter of class c: each training row's radius is the distance to its k-th nearest
  neighbour among the rows of class c, the row itself counted as the first (the reference
  queries a KDTree of the class with the class's own rows, k neighbours, last column); the rows
  kept are those with radius <= np.percentile(radii, (1 - alpha) * 100) (numpy's default linear
  interpolation, as the reference).  alpha = 0 keeps every row (the 100th percentile is the
  largest radius), so no radius is computed then.
* a query x with predicted class y: d(x, nearest kept row of the closest class c != y) /
  (d(x, nearest kept row of y) + 1e-12), the reference's ``min_dist``.

The search: squared distances |q|^2 - 2 q.x + |x|^2 from matrix products in float64, class by
class (each class's kept rows one block, so the per-class minimum is a plain row minimum), query
chunks bounded in memory.  The expansion loses the exact zero of a duplicate (a residue of
~1e-16 |x|^2 whose root would then divide the score), so every distance that enters a number
(each radius, each query's two distances) is recomputed directly, sqrt(sum((a - b)^2)), from the
rows the search chose: duplicates and ties give the values of the definition exactly.

``device="cpu"``: numpy (BLAS).  Any other device (``cuda``, ``cuda:1``): torch, imported only
then (the report stays torch-free by default), float64 on the device; ImageNet's 50,000 x
1.28M x 2,048 search is ~2.6e14 flops, hours on two CPU cores, seconds on an H100's FP64 units.
"""
from __future__ import annotations

import numpy as np

from cache.errors import TrustOraclesError

MIN_DIST = 1e-12            # the reference's min_dist: a query on a kept row of its class
CPU_BLOCK_BYTES = 32 << 20   # one float64 distance block (query chunk x class rows)
DEVICE_BLOCK_BYTES = 2 << 30


class KnnError(TrustOraclesError, ValueError):
    """The device cannot be used; ``str(err)`` says why and what to pass instead."""


class _Numpy:
    block = CPU_BLOCK_BYTES

    def put(self, a: np.ndarray):
        return np.asarray(a, dtype=np.float64)

    def sqnorm(self, a):
        return np.einsum("ij,ij->i", a, a)

    def partial(self, q2, x, xn):
        """|x|^2 - 2 q.x from q2 = -2 q (exact: a power of 2): the squared distance less
        |q|^2, which no row minimum needs."""
        g = q2 @ x.T
        g += xn[None, :]
        return g

    def itself_first(self, d, start: int) -> None:
        """Row i of the block is row start + i of the class: its own column ranks first."""
        rows = np.arange(len(d))
        d[rows, rows + start] = -np.inf

    def row_min(self, d):
        i = d.argmin(axis=1)
        return d[np.arange(len(d)), i], i

    def row_kth(self, d, k: int):
        return np.argpartition(d, k - 1, axis=1)[:, k - 1]

    def host(self, a) -> np.ndarray:
        return np.asarray(a)


class _Torch:
    block = DEVICE_BLOCK_BYTES

    def __init__(self, device: str):
        try:
            import torch
        except ImportError:
            raise KnnError(f"--knn-device {device}: torch is not installed; use --knn-device "
                           "cpu") from None
        self.torch = torch
        try:
            self.device = torch.device(device)
            torch.empty(1, device=self.device)
        except (RuntimeError, AssertionError) as err:
            raise KnnError(f"--knn-device {device}: torch cannot use it ({err}); use "
                           "--knn-device cpu") from None

    def put(self, a: np.ndarray):
        return self.torch.as_tensor(np.ascontiguousarray(a)).to(self.device, self.torch.float64)

    def sqnorm(self, a):
        return (a * a).sum(1)

    def partial(self, q2, x, xn):
        return self.torch.addmm(xn[None, :], q2, x.T)

    def itself_first(self, d, start: int) -> None:
        rows = self.torch.arange(len(d), device=self.device)
        d[rows, rows + start] = -float("inf")

    def row_min(self, d):
        return d.min(dim=1)

    def row_kth(self, d, k: int):
        return self.torch.kthvalue(d, k, dim=1).indices

    def host(self, a) -> np.ndarray:
        return a.cpu().numpy()


def backend(device: str = "cpu"):
    """The search's array library for ``device`` (KnnError when torch cannot use it)."""
    return _Numpy() if device == "cpu" else _Torch(device)


def exact_distances(a: np.ndarray, b: np.ndarray, chunk: int = 65_536) -> np.ndarray:
    """Row-wise Euclidean distances of two (m, D) arrays, directly, in float64."""
    out = np.empty(len(a))
    for s in range(0, len(a), chunk):
        diff = a[s:s + chunk].astype(np.float64) - b[s:s + chunk].astype(np.float64)
        out[s:s + chunk] = np.sqrt(np.einsum("ij,ij->i", diff, diff))
    return out


def _chunk_rows(xp, n_cols: int) -> int:
    return max(1, xp.block // (8 * max(1, n_cols)))


def knn_radii(x: np.ndarray, k: int, xp=None) -> np.ndarray:
    """Each row's distance to its k-th nearest row of ``x`` (itself the first), (n,) float64."""
    xp = xp or _Numpy()
    n = len(x)
    if not 1 <= k <= n:
        raise ValueError(f"k = {k} with {n} row(s)")
    dev = xp.put(x)
    xn, q2 = xp.sqnorm(dev), -2.0 * dev
    picked = np.empty(n, np.int64)
    step = _chunk_rows(xp, n)
    for s in range(0, n, step):
        d = xp.partial(q2[s:s + step], dev, xn)
        xp.itself_first(d, s)     # as the reference's query of the class's own tree
        picked[s:s + step] = xp.host(xp.row_kth(d, k))
    return exact_distances(x, x[picked])


def kept_rows(x: np.ndarray, k: int, alpha: float, xp=None) -> np.ndarray:
    """Indices of the rows of one class that the density filter keeps (sorted)."""
    if alpha == 0.0:
        return np.arange(len(x))       # every radius <= the largest one
    radii = knn_radii(x, k, xp)
    return np.flatnonzero(radii <= np.percentile(radii, (1.0 - alpha) * 100.0))


def nearest_per_class(queries: np.ndarray, pred: np.ndarray, kept: np.ndarray,
                      offsets: np.ndarray, xp=None) -> tuple[np.ndarray, np.ndarray]:
    """For each query: (the row of ``kept`` nearest to it in its predicted class, the nearest
    row of any other class); ``kept`` holds the classes' kept rows in class order, class c at
    ``offsets[c]:offsets[c + 1]``.  A tie of two classes goes to the first (same distance)."""
    xp = xp or _Numpy()
    nq = len(queries)
    q2 = -2.0 * xp.put(queries)
    own = np.full(nq, -1, np.int64)
    other = np.full(nq, -1, np.int64)
    best = np.full(nq, np.inf)
    for c in range(len(offsets) - 1):
        if offsets[c + 1] == offsets[c]:
            continue           # a class held out of the classifier's fit: no training row
        x = xp.put(kept[offsets[c]:offsets[c + 1]])
        xn = xp.sqnorm(x)
        step = _chunk_rows(xp, len(x))
        for s in range(0, nq, step):
            value, index = xp.row_min(xp.partial(q2[s:s + step], x, xn))
            value, index = xp.host(value), xp.host(index) + offsets[c]
            mine = pred[s:s + step] == c
            own[s:s + step][mine] = index[mine]
            closer = ~mine & (value < best[s:s + step])
            best[s:s + step][closer] = value[closer]
            other[s:s + step][closer] = index[closer]
    return own, other


def trust_ratio(queries: np.ndarray, pred: np.ndarray, kept: np.ndarray, offsets: np.ndarray,
                xp=None) -> np.ndarray:
    """TrustScore of each query given its predicted class and the classes' kept rows (as
    ``nearest_per_class`` takes them), (nq,) float64."""
    own, other = nearest_per_class(queries, pred, kept, offsets, xp)
    return (exact_distances(queries, kept[other])
            / (exact_distances(queries, kept[own]) + MIN_DIST))


def kept_sets(features: np.ndarray, labels: np.ndarray, num_classes: int, k: int, alpha: float,
              xp=None) -> tuple[np.ndarray, np.ndarray]:
    """The density-filtered rows of every class, stacked in class order, and their offsets
    (class c at ``offsets[c]:offsets[c + 1]``).  Every class needs at least k rows (the caller
    says which class lacks them), except a class the classifier held out of its fit, which has
    none and is never predicted (pipeline/data/newclass.py): its set is empty."""
    order = []
    for c in range(num_classes):
        rows = np.flatnonzero(labels == c)
        order.append(rows[kept_rows(features[rows], k, alpha, xp)] if len(rows) else rows)
    offsets = np.cumsum([0] + [len(rows) for rows in order])
    return features[np.concatenate(order)], offsets
