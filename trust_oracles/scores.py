"""What a trust oracle says about N inputs (``Scores``), built from one scored batch.

``TrustOracle.score``, ``score_images`` and ``score_files`` (trust_oracles.oracles) all return
``Scores``; ``scores_from`` turns the scoring step's columns into one.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.oracle.deploy.images import confidence_of

__all__ = ["Scores", "scores_from"]


@dataclass(frozen=True, eq=False)     # arrays: no elementwise ==
class Scores:
    """What the oracle says about N inputs, in the order they were given.

    Attributes
    ----------
    confidence : ndarray (N,) float32
        sigmoid(z): the oracle's confidence that the classifier's answer is right.
    z : ndarray (N,) float32
        The oracle head's output.
    trust : ndarray (N,) bool
        ``confidence >= threshold``.
    threshold : float
        The threshold used.
    valid : ndarray (N,) bool
        False for a file ``score_files(..., skip_bad=True)`` could not use; its ``z``,
        ``confidence`` and ``msp`` are NaN, ``pred`` -1 and ``trust`` False.
    pred : ndarray (N,) int64 or None
        The classifier's class; None for ``score(x)`` without logits.
    msp : ndarray (N,) float32 or None
        The classifier's maximum softmax probability (float32 softmax); None likewise.
    """

    confidence: np.ndarray
    z: np.ndarray
    trust: np.ndarray
    threshold: float
    valid: np.ndarray
    pred: np.ndarray | None = None
    msp: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.z)


def scores_from(out: dict, threshold: float, pixels: bool) -> Scores:
    """``out``'s rows (checked finite) as Scores; rows not ``valid`` hold NaN / -1."""
    valid = out["valid"]
    z = np.where(valid, out["z"], np.nan).astype(np.float32)
    confidence = np.where(valid, confidence_of(out["z"]), np.nan).astype(np.float32)
    return Scores(confidence=confidence, z=z, trust=valid & (confidence >= threshold),
                  threshold=float(threshold), valid=valid,
                  pred=np.where(valid, out["pred"], -1) if pixels else None,
                  msp=np.where(valid, out["msp"], np.nan).astype(np.float32)
                  if pixels else None)
