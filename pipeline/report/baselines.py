"""Post-hoc confidence scores computed from a classifier's logits alone (no oracle, no training).

Every score is "higher = more likely correct", so the trust metrics apply unchanged:

* ``mcp``      max softmax probability (Hendrycks & Gimpel, ICLR 2017)
* ``entropy``  negative entropy of the softmax, sum_k p_k log p_k
* ``maxlogit`` the largest logit (Hendrycks et al. 2022)
* ``energy``   negative free energy, T * logsumexp(logits / T) with T = 1 (Liu et al. 2020)
* ``doctor``   DOCTOR (Granese et al., NeurIPS 2021), the D_alpha form: g(x) = sum_k p_k^2 and the
  detector D_alpha(x) = (1 - g(x)) / g(x) flags an error when large.  D_alpha is a decreasing
  function of g, so we report g itself (in [1/K, 1]) as the confidence: every ranking metric is
  identical and TPR/TNR at 0.5 mean D_alpha < 1 / > 1.  Temperature T = 1 and NO input
  perturbation (epsilon = 0): the perturbation needs gradients through the model, and the report
  stage has no model in memory.

Logits arrive as float16 (N, K) from the classifier cache; they are processed in float32 chunks
so a 1.28M x 1000 split never needs a full float32 copy.
"""
from __future__ import annotations

import numpy as np

BASELINES = ("mcp", "entropy", "maxlogit", "energy", "doctor")
BASELINE_LABELS = {"mcp": "MCP", "entropy": "Neg. entropy", "maxlogit": "Max logit",
                   "energy": "Energy", "doctor": "DOCTOR (D_alpha)"}
# Scores in [0, 1] get TPR/TNR at 0.5; the others have no natural threshold.
PROBABILITY_SCORES = ("mcp", "doctor")
CHUNK_ROWS = 65_536


def scores_chunk(logits: np.ndarray, temperature: float = 1.0,
                 names: tuple[str, ...] = BASELINES) -> dict[str, np.ndarray]:
    """Baseline scores ``names`` of one chunk of ``logits`` (m, K) -> {name: (m,) float32}.

    One exp pass serves every score: with zm = z - max z and e = exp(zm), S = sum e,
    MCP = 1/S (the max of e is exp(0) = 1), sum p log p = sum(e zm)/S - log S,
    sum p^2 = sum(e^2)/S^2, logsumexp z = max z + log S."""
    z = logits.astype(np.float32)
    if temperature != 1.0:
        z /= np.float32(temperature)
    m = z.max(axis=1)
    out = {"maxlogit": logits.max(axis=1).astype(np.float32)} if "maxlogit" in names else {}
    if set(names) <= {"maxlogit"}:
        return out
    z -= m[:, None]
    e = np.exp(z)
    total = e.sum(axis=1)
    log_total = np.log(total)
    if "mcp" in names:
        out["mcp"] = 1.0 / total
    if "entropy" in names:
        out["entropy"] = np.einsum("ij,ij->i", e, z) / total - log_total
    if "doctor" in names:
        out["doctor"] = np.einsum("ij,ij->i", e, e) / (total * total)
    if "energy" in names:
        out["energy"] = np.float32(temperature) * (m + log_total)
    return out


def baseline_scores(logits: np.ndarray, temperature: float = 1.0, chunk_rows: int = CHUNK_ROWS,
                    names: tuple[str, ...] = BASELINES) -> dict[str, np.ndarray]:
    """Scores ``names`` (default all of ``BASELINES``) for ``logits`` (N, K) -> {name: (N,)}."""
    logits = np.asarray(logits)
    if logits.ndim != 2 or logits.shape[1] < 2:
        raise ValueError(f"expected logits of shape (N, K) with K >= 2, got {logits.shape}")
    unknown = sorted(set(names) - set(BASELINES))
    if unknown:
        raise ValueError(f"unknown baseline(s) {unknown}; known: {BASELINES}")
    out = {name: np.empty(len(logits), np.float32) for name in names}
    for start in range(0, len(logits), chunk_rows):
        chunk = logits[start:start + chunk_rows]
        finite = np.isfinite(chunk).all(axis=1)
        if not finite.all():
            row = start + int(np.flatnonzero(~finite)[0])
            raise ValueError(f"logits hold inf/NaN ({int((~finite).sum())} row(s) in rows "
                             f"{start}..{start + len(chunk) - 1}, first at row {row})")
        part = scores_chunk(chunk, temperature, names)
        for name in names:
            out[name][start:start + len(chunk)] = part[name]
    return out
