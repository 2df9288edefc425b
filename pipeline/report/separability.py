"""Separability of the confidences of correct vs incorrect predictions (paper Table A4).

Gaussian fits N1(mu1, s1^2) to the correct rows and N2(mu2, s2^2) to the incorrect rows, with the
UNBIASED standard deviation (``torch.std`` in the authors' code, ddof=1 here), then

* Bhattacharyya distance  d_B = 1/4 ln(1/4 (s1^2/s2^2 + s2^2/s1^2 + 2)) + 1/4 (mu1-mu2)^2/(s1^2+s2^2)
* KL divergence averaged over both directions, (d(1,2) + d(2,1)) / 2, where
  - ``paper``:    d(1,2) = ln(s2/s1) + (s1^2 + (mu1-mu2)^2) / s2^2     - 1/2  (the authors' code: the
                  factor 2 of the denominator is missing, so identical Gaussians give 0.5, not 0)
  - ``standard``: d(1,2) = ln(s2/s1) + (s1^2 + (mu1-mu2)^2) / (2 s2^2) - 1/2  (the correct KL)

Pure numpy; importable without the rest of the pipeline.  Both distances are invariant under
affine maps of the confidence (not under other monotone maps: they are moment-based).  The
distance functions take floats or arrays (element-wise): the bootstrap (bootstrap.py) applies
the same functions to the Gaussian fits of every resample, so each formula exists once.
"""
from __future__ import annotations

import numpy as np

from pipeline.core.catalog import names
from pipeline.core.metrics import UndefinedMetric, check_inputs

SEPARABILITY_METRICS = names("paper", "separability")
NAMES = {"kl": "KL", "bhattacharyya": "Bhattacharyya distance"}


def gaussian_fit(values: np.ndarray, what: str = "values") -> tuple[float, float]:
    """Mean and unbiased standard deviation of ``values`` (m,); needs m >= 2 and a spread."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) == 0:
        raise UndefinedMetric(f"no {what} in the split to fit a Gaussian to")
    if len(values) < 2:
        raise UndefinedMetric(f"a Gaussian fit of the {what} needs at least 2 rows, the split has "
                              f"{len(values)}")
    mu, sigma = float(values.mean()), float(values.std(ddof=1))
    if not sigma > 0:
        raise UndefinedMetric(f"the {what} all have the same confidence ({mu:.6g}): zero "
                              "variance, the Gaussian fit is degenerate")
    return mu, sigma


def _value(x):
    """A float for float inputs, the array for array inputs."""
    return float(x) if np.ndim(x) == 0 else x


def bhattacharyya(mu1, s1, mu2, s2):
    """Bhattacharyya distance between N(mu1, s1^2) and N(mu2, s2^2); 0 for identical Gaussians.
    Floats or arrays (element-wise)."""
    v1, v2 = s1 * s1, s2 * s2
    return _value(0.25 * np.log(0.25 * (v1 / v2 + v2 / v1 + 2.0))
                  + 0.25 * (mu1 - mu2) ** 2 / (v1 + v2))


def kl_gaussian(mu1, s1, mu2, s2, definition: str = "standard"):
    """KL(N1 || N2), ``standard`` (correct) or ``paper`` (the authors' formula without the 2).
    Floats or arrays (element-wise)."""
    if definition not in ("paper", "standard"):
        raise ValueError(f"definition must be 'paper' or 'standard', got {definition!r}")
    denom = s2 * s2 * (1.0 if definition == "paper" else 2.0)
    return _value(np.log(s2 / s1) + (s1 * s1 + (mu1 - mu2) ** 2) / denom - 0.5)


def averaged_kl(mu1, s1, mu2, s2, definition: str = "standard"):
    """(KL(N1||N2) + KL(N2||N1)) / 2, the paper's symmetrised divergence."""
    return 0.5 * (kl_gaussian(mu1, s1, mu2, s2, definition) + kl_gaussian(mu2, s2, mu1, s1, definition))


def separability(confidence, correct, definition: str = "paper") -> dict:
    """Averaged KL (of ``definition``) and Bhattacharyya distance for one split.

    ``confidence`` (n,) floats, ``correct`` (n,) bool.  Returns the ``evaluate``-style dict
    ``{"values": {"kl", "bhattacharyya"}, "undefined": {...}, "notes": {}, "fits": {...}}`` where
    both values are None (with the reason) if either group cannot be fitted.
    """
    return separability_all(confidence, correct, (definition,))[definition]


def separability_all(confidence, correct, definitions=("paper", "standard")) -> dict[str, dict]:
    """``separability`` for several definitions from one pair of Gaussian fits."""
    conf, corr = check_inputs(confidence, correct)
    try:
        mu1, s1 = gaussian_fit(conf[corr], "correct predictions")
        mu2, s2 = gaussian_fit(conf[~corr], "incorrect predictions")
    except UndefinedMetric as err:
        return {d: {"values": dict.fromkeys(SEPARABILITY_METRICS), "notes": {}, "fits": {},
                    "undefined": {n: f"{NAMES[n]} is undefined: {err}" for n in SEPARABILITY_METRICS}}
                for d in definitions}
    fits = {"correct": {"mean": mu1, "std": s1}, "incorrect": {"mean": mu2, "std": s2}}
    b = bhattacharyya(mu1, s1, mu2, s2)
    return {d: {"values": {"kl": averaged_kl(mu1, s1, mu2, s2, d), "bhattacharyya": b},
                "undefined": {}, "notes": {}, "fits": fits} for d in definitions}
