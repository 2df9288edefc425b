"""The logit statistics are written once in numpy (pipeline.core.logits) and once in torch for the
training device (pipeline.oracle.nets.heads.logit_stats, ConfidNet's stacked inputs): the numpy
form against the formulas in float64, the torch form against the numpy form to float32 rounding,
and the report's baselines against the numpy form bit for bit."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.core import logits as L
from pipeline.oracle.nets.heads import logit_stats as torch_stats
from pipeline.report.baselines import baseline_scores

# Torch and numpy round differently (log_softmax and logsumexp against one exp pass with
# sum p log p = sum(e zm)/S - log S; other summation orders over the K classes), so the two agree
# to float32 rounding, not bit for bit.  Each statistic is a reduction over K float32 terms of
# size at most |z| + log K; a reduction of K = 1000 terms is off by a few tens of float32's eps
# (1.19e-7) times that size at most.  ATOL (84 eps) covers the statistics near 0 (the entropy of
# a confident row, the centred pNorm); RTOL (8 eps) the large ones (energy, the max logit at
# |z| ~ 100).  Measured on these cases, on a CPU and on an H200: 1.4e-6 at most (negative entropy,
# K = 1000), 1e-6 (pNorm on CUDA), energy within one ulp; the max logit and the margin are
# selections of float16 values, hence exact.  Constant logits give pNorm 0 on both, on CUDA too,
# where the mean of K equal values can be an ulp off (heads.logit_stats tests the range).
RTOL, ATOL = 1e-6, 1e-5
EXACT = ("max_logit", "margin")


def logit_cases():
    rng = np.random.default_rng(0)
    for k, scale in ((2, 3.0), (3, 1.0), (10, 4.0), (100, 5.0), (1000, 8.0), (1000, 20.0)):
        z = (rng.normal(size=(600, k)) * scale).astype(np.float16)
        z[0] = z[0, 0]                       # constant logits: pNorm 0, MSP 1/K
        z[1] = 0
        yield z


def reference_stats(logits: np.ndarray) -> np.ndarray:
    """The statistics of STATS written as their formulas, in float64."""
    z = logits.astype(np.float64)
    e = np.exp(z - z.max(1, keepdims=True))
    p = e / e.sum(1, keepdims=True)
    top = np.sort(z, axis=1)[:, ::-1]
    c = z - z.mean(1, keepdims=True)
    norm = np.linalg.norm(c, axis=1)
    return np.stack([p.max(1), top[:, 0], top[:, 0] - top[:, 1], (p * np.log(p)).sum(1),
                     np.log(e.sum(1)) + z.max(1),
                     np.where(norm > 0, c.max(1) / np.maximum(norm, 1e-300), 0.0)], axis=1)


def devices() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("case", range(6))
def test_numpy_stats_are_the_formulas(case):
    z = list(logit_cases())[case]
    got = L.logit_stats(z)
    assert got.dtype == np.float32 and got.shape == (len(z), len(L.STATS))
    np.testing.assert_allclose(got, reference_stats(z), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("device", devices())
def test_torch_stats_equal_the_numpy_stats_to_float32_rounding(device):
    for z in logit_cases():
        ours = L.logit_stats(z)
        theirs = torch_stats(torch.from_numpy(z).to(device)).cpu().numpy()
        assert theirs.dtype == np.float32 and theirs.shape == ours.shape
        for i, name in enumerate(L.STATS):
            if name in EXACT:
                np.testing.assert_array_equal(theirs[:, i], ours[:, i], err_msg=name)
            else:
                np.testing.assert_allclose(theirs[:, i], ours[:, i], rtol=RTOL, atol=ATOL,
                                           err_msg=f"{name}, K = {z.shape[1]}")
        assert theirs[0, L.STATS.index("pnorm2")] == ours[0, L.STATS.index("pnorm2")] == 0


def test_both_forms_round_the_logits_to_float16_first():
    """A cached row (float16) and the same image's fresh float32 logits give the same stats."""
    z32 = np.random.default_rng(1).normal(size=(200, 10)).astype(np.float32) * 3
    z16 = z32.astype(np.float16)
    np.testing.assert_array_equal(L.logit_stats(z32), L.logit_stats(z16))
    np.testing.assert_array_equal(torch_stats(torch.from_numpy(z32)).numpy(),
                                  torch_stats(torch.from_numpy(z16)).numpy())


def test_the_report_baselines_are_the_same_statistics_bit_for_bit():
    """MCP, negative entropy, max logit, energy and MaxLogit-pNorm (p = 2) of the report are the
    numpy statistics: one computation, whichever reads it."""
    column = {"mcp": "msp", "entropy": "neg_entropy", "maxlogit": "max_logit",
              "energy": "energy", "pnorm": "pnorm2"}
    for z in logit_cases():
        stats = L.logit_stats(z)
        scores = baseline_scores(z, names=tuple(column), params={"pnorm": 2})
        for name, stat in column.items():
            np.testing.assert_array_equal(scores[name], stats[:, L.STATS.index(stat)],
                                          err_msg=name)
