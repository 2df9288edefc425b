"""Fitting the two post-hoc baselines that have a parameter, on held-out rows (pure numpy).

* Temperature scaling (Guo et al., ICML 2017): T > 0 minimising the mean negative log-likelihood
  of softmax(z / T) against the labels.  With beta = 1 / T the NLL is convex in beta (logsumexp is
  convex, the label term linear), so a safeguarded Newton iteration on beta finds THE minimum;
  the score is then the MSP of z / T.
* MaxLogit-pNorm (Cattelan & Silva, UAI 2024; their code lfpc/FixSelectiveClassification):
  score = max_k (z_k - mean z) / ||z - mean z||_p.  p is chosen on the held-out rows from
  {0, 1, ..., 9} by the lowest AURC, and falls back to MSP when no p beats MSP's AURC (both as in
  their ``optimize.p``).  p = 0 divides by the number of non-zero centred logits, as torch's
  0-"norm" does in their code: the ranking of the centred max logit.

* REL-U (Dadalto et al., arXiv 2306.01710; their code edadaltocg/relative-uncertainty): a C x C
  matrix D learned in closed form from the softmax outputs p of the correct (+) and incorrect (-)
  rows, D = -(1 - lambda) mean_+ p p^T + lambda mean_- p p^T, kept below its diagonal and
  mirrored (zero diagonal, symmetric), negative entries set to 0, all-zero replaced by the Gini
  matrix (ones off the diagonal), divided by its Frobenius norm; the uncertainty of a row is
  p^T D p.  lambda = 0.5, softmax temperature 1 and no input perturbation (their defaults; they
  also grid-search T and a perturbation on their validation rows).

The scores fitted on (MSP, MaxLogit-pNorm's grid, the softmax) are the float64 forms of
``pipeline.core.logits``.  Too few rows, or rows of one kind only (every prediction right, or
every one wrong), raise ``FitError`` with the counts; the report records the reason instead of a
number.
"""
from __future__ import annotations

import numpy as np

from cache.errors import TrustOraclesError
from pipeline.core.logits import FIT_CHUNK, msp64, pnorm_grid, softmax64
from pipeline.core.metrics import aurc
from pipeline.core.presets import MIN_HELDOUT_PER_KIND, MIN_HELDOUT_ROWS

P_GRID = tuple(range(10))
RELU_LAMBDA = 0.5
# the minimum train-oracle warns about (one number for both: presets.MIN_HELDOUT_ROWS)
MIN_FIT_ROWS = MIN_HELDOUT_ROWS
MIN_PER_KIND = MIN_HELDOUT_PER_KIND      # correct and incorrect fit rows each
CHUNK = FIT_CHUNK


class FitError(TrustOraclesError, ValueError):
    """T or p cannot be fitted on these rows; ``str(err)`` says why.  The rows are the user's
    data, so a user error where it escapes; the report and ``fit_posthoc`` record the reason."""


def check_fit_rows(logits: np.ndarray, labels: np.ndarray, what: str) -> np.ndarray:
    """Validate (m, K) logits and (m,) labels; returns the (m,) correctness of the argmax."""
    logits, labels = np.asarray(logits), np.asarray(labels)
    if logits.ndim != 2 or logits.shape[1] < 2 or labels.shape != (len(logits),):
        raise FitError(f"{what}: expected logits (m, K >= 2) and labels (m,), got "
                       f"{logits.shape} and {labels.shape}")
    if not np.isfinite(logits).all():
        raise FitError(f"{what}: the fit rows' logits hold inf/NaN")
    if labels.min(initial=0) < 0 or labels.max(initial=0) >= logits.shape[1]:
        raise FitError(f"{what}: labels outside 0..{logits.shape[1] - 1}")
    correct = logits.argmax(1) == labels
    n_ok, n_bad = int(correct.sum()), int((~correct).sum())
    if len(labels) < MIN_FIT_ROWS or min(n_ok, n_bad) < MIN_PER_KIND:
        raise FitError(f"{what}: {len(labels)} held-out row(s), {n_ok} correct and {n_bad} "
                       f"incorrect; fitting needs at least {MIN_FIT_ROWS} rows with at least "
                       f"{MIN_PER_KIND} of each (hold out more rows: train-oracle --val-fraction)")
    return correct


def _nll_derivatives(z: np.ndarray, labels: np.ndarray, beta: float) -> tuple[float, float, float]:
    """Mean NLL of softmax(beta z) and its first two derivatives in beta, chunked in float64."""
    nll = g = h = 0.0
    for a in range(0, len(z), CHUNK):
        zc = z[a:a + CHUNK].astype(np.float64)
        s = beta * zc
        m = s.max(1, keepdims=True)
        e = np.exp(s - m)
        tot = e.sum(1)
        p = e / tot[:, None]
        zy = zc[np.arange(len(zc)), labels[a:a + CHUNK]]
        ez = (p * zc).sum(1)
        nll += float((m[:, 0] + np.log(tot) - beta * zy).sum())
        g += float((ez - zy).sum())
        h += float(((p * zc * zc).sum(1) - ez * ez).sum())
    n = len(z)
    return nll / n, g / n, h / n


def fit_temperature(logits: np.ndarray, labels: np.ndarray, what: str = "fit rows") -> dict:
    """T minimising the NLL of softmax(logits / T) -> {"temperature", "nll", "nll_at_1", "rows"}."""
    check_fit_rows(logits, labels, what)
    labels = np.asarray(labels, dtype=np.int64)
    _, g0, _ = _nll_derivatives(logits, labels, 0.0)
    if g0 >= 0:
        raise FitError(f"{what}: on average the labels' logits are not above the mean logit, so "
                       "the NLL has no minimum at a positive temperature")
    # Newton on beta from beta = 1 (T = 1), kept inside a bracket [lo, hi] of the root of the
    # derivative: the derivative is negative at 0 and increasing (convexity)
    lo, hi, beta = 0.0, None, 1.0
    for _ in range(200):
        _, g, h = _nll_derivatives(logits, labels, beta)
        step = beta - g / h if h > 0 else None
        if g == 0 or (step is not None and abs(step - beta) <= 1e-12 * beta):
            break                                    # converged: keep this beta
        if g < 0:
            lo = beta
        else:
            hi = beta
        if hi is None:                               # no upper bound yet: grow
            beta = step if step is not None and step > beta else beta * 2.0
            if beta > 1e6:
                raise FitError(f"{what}: the NLL keeps falling as T -> 0 (almost every "
                               "held-out prediction is right and confident); no finite T")
            continue
        beta = step if step is not None and lo < step < hi else 0.5 * (lo + hi)
        if hi - lo <= 1e-12 * hi:
            break
    return {"temperature": 1.0 / beta, "nll": _nll_derivatives(logits, labels, beta)[0],
            "nll_at_1": _nll_derivatives(logits, labels, 1.0)[0], "rows": int(len(labels))}


def fit_pnorm(logits: np.ndarray, labels: np.ndarray, what: str = "fit rows") -> dict:
    """p in ``P_GRID`` with the lowest AURC on the rows, else "MSP" (no p beats it)."""
    correct = check_fit_rows(logits, labels, what)
    best_p, best = "MSP", aurc(msp64(logits), correct)
    grid = {"MSP": best}
    parts = [pnorm_grid(np.asarray(logits[a:a + CHUNK], dtype=np.float64), P_GRID)
             for a in range(0, len(logits), CHUNK)]
    for p in P_GRID:
        value = aurc(np.concatenate([part[p] for part in parts]), correct)
        grid[str(p)] = value
        if value < best:             # strictly lower, as their optimize.p
            best_p, best = p, value
    return {"p": best_p, "aurc": best, "aurc_grid": grid, "rows": int(len(labels))}


def fit_relu(logits: np.ndarray, labels: np.ndarray, what: str = "fit rows",
             lbd: float = RELU_LAMBDA) -> dict:
    """REL-U's matrix D (K, K) float64 on the rows -> {"matrix", "lambda", "gini", "rows"}.
    The sums of p p^T are accumulated chunk by chunk: ImageNet's 64,058 held-out rows x 1,000
    classes would be 0.5 GB of float64 softmax at once."""
    correct = check_fit_rows(logits, labels, what)
    k = logits.shape[1]
    right, wrong = np.zeros((k, k)), np.zeros((k, k))
    for a in range(0, len(logits), CHUNK):
        p = softmax64(np.asarray(logits[a:a + CHUNK], dtype=np.float64))
        ok = correct[a:a + CHUNK]
        right += p[ok].T @ p[ok]
        wrong += p[~ok].T @ p[~ok]
    n_right = int(correct.sum())
    d = -(1.0 - lbd) * right / n_right + lbd * wrong / (len(correct) - n_right)
    d = np.tril(d, -1)
    d = np.maximum(d + d.T, 0.0)
    gini = not (d > 0).any()
    if gini:                     # their fallback: every off-diagonal pair weighs the same
        d = 1.0 - np.eye(len(d))
    return {"matrix": d / np.linalg.norm(d), "lambda": lbd, "gini": gini,
            "rows": int(len(labels))}
