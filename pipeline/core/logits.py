"""Statistics of a classifier's logits in numpy, written once: the report's post-hoc baselines
(``pipeline.report.baselines``), their fits (``pipeline.report.calibrate``) and the reference of
the oracle's stacked inputs (``pipeline.oracle.nets.heads.logit_stats``, the same statistics in
torch on the training device, tested equal to ``logit_stats`` here).  No torch: ``cli.py report``
loads none.

Two precisions, each kept where its numbers come from:

* float32, for scoring (``Softmax``, ``pnorm``, ``logit_stats``): a 1.28M x 1000 split is scored
  in float32 chunks, and report.json's baseline scores are these functions' float32 values.
* float64, for fitting (``msp64``, ``pnorm64``, ``pnorm_grid``, ``softmax64``): T, p and REL-U's
  matrix are chosen on held-out rows in float64, as calibrate.py always did.

The two are not merged on purpose: each is the computation the outputs were made with, and its
rounding (float32 repeated squaring here, float64 running products there) is part of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

# The statistics of ``logit_stats``, in its column order (the oracle's stacked inputs).
STATS = ("msp", "max_logit", "margin", "neg_entropy", "energy", "pnorm2")
FIT_CHUNK = 16_384           # rows per float64 chunk of the fitting forms
PNORM_EPS = 1e-12            # their clamp_min(eps): all-equal logits divide by it, not by 0


@dataclass(frozen=True)
class Softmax:
    """Softmax quantities of z / T in float32 that several scores share: zm = z / T - m
    (m = max z / T), e = exp(zm), S = sum e.  Then MSP = 1/S (the max of e is exp(0) = 1),
    sum p log p = sum(e zm)/S - log S, sum p^2 = sum(e^2)/S^2, logsumexp(z / T) = m + log S."""
    zm: np.ndarray
    e: np.ndarray
    m: np.ndarray
    total: np.ndarray
    log_total: np.ndarray

    @classmethod
    def of(cls, logits: np.ndarray, temperature: float = 1.0) -> "Softmax":
        """One exp pass over (m, K) logits (float16 or float32) in float32."""
        z = logits.astype(np.float32)
        if temperature != 1.0:
            z /= np.float32(temperature)
        m = z.max(axis=1)
        z -= m[:, None]
        e = np.exp(z)
        total = e.sum(axis=1)
        return cls(z, e, m, total, np.log(total))

    def msp(self) -> np.ndarray:
        """Max softmax probability."""
        return 1.0 / self.total

    def neg_entropy(self) -> np.ndarray:
        """sum_k p_k log p_k."""
        return np.einsum("ij,ij->i", self.e, self.zm) / self.total - self.log_total

    def sum_squares(self) -> np.ndarray:
        """sum_k p_k^2 (DOCTOR's g)."""
        return np.einsum("ij,ij->i", self.e, self.e) / (self.total * self.total)

    def energy(self) -> np.ndarray:
        """Negative free energy T * logsumexp(z / T), at T = 1."""
        return self.m + self.log_total

    def probs(self) -> np.ndarray:
        """The softmax itself, (m, K)."""
        return self.e / self.total[:, None]


def pnorm(logits: np.ndarray, p) -> np.ndarray:
    """MaxLogit-pNorm of (m, K) logits in float32: max_k (z_k - mean z) / ||z - mean z||_p;
    p = "MSP" gives the MSP, p = 0 divides by the count of non-zero centred logits."""
    if p == "MSP":
        return Softmax.of(logits).msp()
    z = logits.astype(np.float32)
    z -= z.mean(axis=1, keepdims=True)
    if p == 0:
        norm = np.count_nonzero(z, axis=1).astype(np.float32)
    elif p == 2:
        norm = np.sqrt(np.einsum("ij,ij->i", z, z))
    else:
        norm = _power(np.abs(z), int(p)).sum(axis=1) ** np.float32(1.0 / p)
    return z.max(axis=1) / np.maximum(norm, np.float32(PNORM_EPS))


def _power(a: np.ndarray, p: int) -> np.ndarray:
    """a ** p for a positive integer p by repeated squaring (float pow is ~10x slower)."""
    out, base = None, a
    while p:
        if p & 1:
            out = base.copy() if out is None else out * base
        p >>= 1
        if p:
            base = base * base
    return out


def top_two(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The largest and second-largest logit of each row (the largest twice for K = 1)."""
    z = logits.astype(np.float32)
    if z.shape[1] < 2:
        return z[:, 0], z[:, 0]
    part = np.partition(z, z.shape[1] - 2, axis=1)
    return part[:, -1], part[:, -2]


def logit_stats(logits: np.ndarray) -> np.ndarray:
    """(B, K) logits -> (B, len(STATS)) float32, the statistics of ``STATS``: MSP, max logit,
    margin (top-1 - top-2 logit), sum p log p, logsumexp(z), MaxLogit-pNorm at p = 2.  Rounded to
    float16 first, as the classifier cache stores logits (what the torch form does too)."""
    z = np.asarray(logits).astype(np.float16)
    s = Softmax.of(z)
    first, second = top_two(z)
    return np.stack([s.msp(), first, first - second, s.neg_entropy(), s.energy(), pnorm(z, 2)],
                    axis=1).astype(np.float32)


# ------------------------------------------------------------------------ float64, fitting --
def chunked64(fn: Callable[[np.ndarray], np.ndarray], logits: np.ndarray) -> np.ndarray:
    """``fn`` over float64 chunks of ``FIT_CHUNK`` rows, concatenated."""
    return np.concatenate([fn(np.asarray(logits[a:a + FIT_CHUNK], dtype=np.float64))
                           for a in range(0, len(logits), FIT_CHUNK)])


def softmax64(z: np.ndarray) -> np.ndarray:
    """The softmax of one float64 chunk."""
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def msp64(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Max softmax probability of logits / T, (m, K) -> (m,) float64."""
    def one(z):
        z = z / temperature
        return 1.0 / np.exp(z - z.max(1, keepdims=True)).sum(1)
    return chunked64(one, logits)


def pnorm64(logits: np.ndarray, p) -> np.ndarray:
    """MaxLogit-pNorm in float64, (m, K) -> (m,); p = "MSP" gives the MSP (the fallback)."""
    if p == "MSP":
        return msp64(logits)
    return chunked64(lambda z: pnorm_grid(z, (p,))[p], logits)


def pnorm_grid(z: np.ndarray, ps: Iterable[int]) -> dict:
    """{p: score} of one float64 chunk for integer ``ps``, |z|^p by running products."""
    z = z - z.mean(1, keepdims=True)
    top, a = z.max(1), np.abs(z)
    out, power, have = {}, None, 0
    for p in sorted(ps):
        if p == 0:
            norm = np.count_nonzero(z, axis=1).astype(np.float64)
        else:
            while have < p:
                power = a.copy() if power is None else np.multiply(power, a, out=power)
                have += 1
            norm = power.sum(1) ** (1.0 / p)
        out[p] = top / np.maximum(norm, PNORM_EPS)
    return out
