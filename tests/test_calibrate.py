"""Temperature scaling and MaxLogit-pNorm: the fitted values against direct computations."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize_scalar
from scipy.special import logsumexp

from pipeline.core import logits as L
from pipeline.core.metrics import aurc
from pipeline.report import calibrate as C


def logits_case(seed=0, m=3000, k=10, boost=2.5, scale=2.0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, m)
    z = rng.normal(size=(m, k)) * scale
    z[np.arange(m), labels] += boost
    return z.astype(np.float16), labels


def test_temperature_equals_direct_nll_minimisation():
    z, labels = logits_case()
    fit = C.fit_temperature(z, labels)
    x = z.astype(np.float64)
    nll = lambda t: np.mean(logsumexp(x / t, axis=1) - x[np.arange(len(x)), labels] / t)  # noqa
    direct = minimize_scalar(nll, bounds=(0.05, 20), method="bounded", options={"xatol": 1e-10})
    assert fit["temperature"] == pytest.approx(direct.x, rel=1e-6)
    assert fit["nll"] == pytest.approx(direct.fun, rel=1e-12)
    assert fit["nll_at_1"] == pytest.approx(nll(1.0), rel=1e-12)
    assert fit["rows"] == len(labels)
    # over-confident logits (x 3) need a larger temperature, by the same factor
    assert C.fit_temperature(x * 3, labels)["temperature"] == pytest.approx(3 * fit["temperature"],
                                                                             rel=1e-6)


def test_temperature_refuses_one_kind_and_too_few_rows():
    z, labels = logits_case(m=500)
    with pytest.raises(C.FitError, match="at least 100 rows"):
        C.fit_temperature(z[:50], labels[:50])
    right = z.argmax(1)                    # every prediction correct
    with pytest.raises(C.FitError, match=r"500 correct and 0 incorrect"):
        C.fit_temperature(z, right)
    with pytest.raises(C.FitError, match=r"expected logits"):
        C.fit_temperature(z[:, :1], labels)


def literal_pnorm(z, p):
    """Cattelan & Silva's formula written row by row."""
    out = []
    for row in np.asarray(z, dtype=np.float64):
        c = row - row.mean()
        norm = np.count_nonzero(c) if p == 0 else (np.abs(c) ** p).sum() ** (1 / p)
        out.append(c.max() / norm)
    return np.array(out)


@pytest.mark.parametrize("p", [0, 1, 2, 3, 7])
def test_pnorm_equals_the_paper_formula(p):
    z, _ = logits_case(m=300)
    assert np.allclose(L.pnorm64(z, p), literal_pnorm(z, p), rtol=1e-12)
    assert np.allclose(L.pnorm64(z, "MSP"), L.msp64(z))


def test_pnorm_picks_the_lowest_aurc_or_falls_back_to_msp():
    z, labels = logits_case(seed=1)
    # a "broken" estimator: scale each row's logits by a factor unrelated to correctness, which
    # MSP suffers from and the p-norm normalisation removes
    rng = np.random.default_rng(5)
    broken = z.astype(np.float64) * rng.uniform(0.2, 5.0, size=(len(z), 1))
    fit = C.fit_pnorm(broken, labels)
    correct = broken.argmax(1) == labels
    grid = {str(p): aurc(literal_pnorm(broken, p), correct) for p in C.P_GRID}
    grid["MSP"] = aurc(L.msp64(broken), correct)
    assert fit["aurc_grid"] == pytest.approx(grid)
    assert fit["p"] != "MSP" and fit["aurc"] == min(grid.values()) < grid["MSP"]
    # well-behaved logits where MSP is already best: the fallback is kept
    rng = np.random.default_rng(2)
    labels = rng.integers(0, 5, 2000)
    good = rng.normal(size=(2000, 5))
    margin = rng.normal(size=2000) * 2
    good[np.arange(2000), labels] += margin            # confident exactly when right
    res = C.fit_pnorm(good, labels)
    assert res["aurc"] == min(res["aurc_grid"].values())
    if res["p"] == "MSP":
        assert all(v >= res["aurc"] for v in res["aurc_grid"].values())


def test_pnorm_refuses_one_kind():
    z, _ = logits_case(m=400)
    with pytest.raises(C.FitError, match="0 incorrect"):
        C.fit_pnorm(z, z.argmax(1))


def test_report_scores_agree_with_the_fitted_forms():
    """The report scores in float32 chunks (baselines.py); p is chosen on the float64 forms."""
    from pipeline.report.baselines import baseline_scores
    z, _ = logits_case(m=500)
    for p in (*C.P_GRID, "MSP"):
        got = baseline_scores(z, names=("pnorm", "ts"), params={"pnorm": p, "ts": 1.7},
                              chunk_rows=128)
        assert np.allclose(got["pnorm"], L.pnorm64(z, p), rtol=1e-5, atol=1e-7), p
        assert np.allclose(got["ts"], L.msp64(z, 1.7), rtol=1e-5, atol=1e-7)
