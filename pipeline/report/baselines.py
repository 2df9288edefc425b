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
* ``ts``       temperature-scaled MSP (Guo et al., ICML 2017): MSP of logits / T
* ``pnorm``    MaxLogit-pNorm (Cattelan & Silva, UAI 2024): max_k (z_k - mean z) / ||z - mean z||_p
  T and p are fitted on held-out rows of the classifier's training cache (``calibrate.py``), never
  on the evaluated split; they arrive here as ``params = {"ts": T, "pnorm": p}``.

Logits arrive as float16 (N, K) from the classifier cache; they are processed in float32 chunks of
about 8M values, so a 1.28M x 1000 split never needs a full float32 copy.
"""
from __future__ import annotations

import numpy as np


FITTED = ("ts", "pnorm")
BASELINES = ("mcp", "entropy", "maxlogit", "energy", "doctor") + FITTED
BASELINE_LABELS = {"mcp": "MCP", "entropy": "Neg. entropy", "maxlogit": "Max logit",
                   "energy": "Energy", "doctor": "DOCTOR (D_alpha)", "ts": "MSP (temp. scaled)",
                   "pnorm": "MaxLogit-pNorm"}
# Scores in [0, 1] get TPR/TNR at 0.5; the others have no natural threshold.
PROBABILITY_SCORES = ("mcp", "doctor", "ts")
# Scores that estimate P(correct), so ECE applies (DOCTOR's sum p^2 does not).
CALIBRATED_SCORES = ("mcp", "ts")
CHUNK_ELEMENTS = 8_388_608   # logits per float32 chunk (32 MB): 8,192 rows at K = 1,000


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


def pnorm_chunk(logits: np.ndarray, p) -> np.ndarray:
    """MaxLogit-pNorm of one chunk in float32 (``calibrate.pnorm_scores`` is the float64 form
    used to choose p): max_k (z_k - mean z) / ||z - mean z||_p; p = "MSP" gives the MSP."""
    if p == "MSP":
        return scores_chunk(logits, 1.0, ("mcp",))["mcp"]
    z = logits.astype(np.float32)
    z -= z.mean(axis=1, keepdims=True)
    if p == 0:
        norm = np.count_nonzero(z, axis=1).astype(np.float32)
    elif p == 2:
        norm = np.sqrt(np.einsum("ij,ij->i", z, z))
    else:
        norm = _power(np.abs(z), int(p)).sum(axis=1) ** np.float32(1.0 / p)
    return z.max(axis=1) / np.maximum(norm, np.float32(1e-12))


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


def baseline_scores(logits: np.ndarray, temperature: float = 1.0, chunk_rows: int | None = None,
                    names: tuple[str, ...] | None = None,
                    params: dict | None = None) -> dict[str, np.ndarray]:
    """Scores ``names`` for ``logits`` (N, K) -> {name: (N,)}; the fitted ones need their
    parameter in ``params`` ({"ts": T, "pnorm": p}).  Default: every score that can be computed
    (the fitted ones only with their parameter)."""
    params = params or {}
    if names is None:
        names = tuple(n for n in BASELINES if n not in FITTED or params.get(n) is not None)
    logits = np.asarray(logits)
    if logits.ndim != 2 or logits.shape[1] < 2:
        raise ValueError(f"expected logits of shape (N, K) with K >= 2, got {logits.shape}")
    unknown = sorted(set(names) - set(BASELINES))
    if unknown:
        raise ValueError(f"unknown baseline(s) {unknown}; known: {BASELINES}")
    missing = [n for n in names if n in FITTED and params.get(n) is None]
    if missing:
        raise ValueError(f"baseline(s) {missing} need their fitted parameter")
    plain = tuple(n for n in names if n not in FITTED)
    out = {name: np.empty(len(logits), np.float32) for name in names}
    chunk_rows = chunk_rows or max(1024, CHUNK_ELEMENTS // logits.shape[1])
    for start in range(0, len(logits), chunk_rows):
        chunk = logits[start:start + chunk_rows]
        finite = np.isfinite(chunk).all(axis=1)
        if not finite.all():
            row = start + int(np.flatnonzero(~finite)[0])
            raise ValueError(f"logits hold inf/NaN ({int((~finite).sum())} row(s) in rows "
                             f"{start}..{start + len(chunk) - 1}, first at row {row})")
        part = scores_chunk(chunk, temperature, plain) if plain else {}
        if "ts" in names:
            part["ts"] = scores_chunk(chunk, params["ts"], ("mcp",))["mcp"]
        if "pnorm" in names:
            part["pnorm"] = (part.get("mcp") if params["pnorm"] == "MSP" and "mcp" in part
                             else pnorm_chunk(chunk, params["pnorm"]))
        for name in names:
            out[name][start:start + len(chunk)] = part[name]
    return out
