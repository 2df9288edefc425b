"""Gaussian separability (paper Table A4): Bhattacharyya and both KL forms."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from pipeline.report.separability import (averaged_kl, bhattacharyya, gaussian_fit, kl_gaussian,
                                          separability)


def test_identical_gaussians():
    assert bhattacharyya(0.3, 0.1, 0.3, 0.1) == 0.0
    assert averaged_kl(0.3, 0.1, 0.3, 0.1, "standard") == 0.0
    # the authors' formula lacks the factor 2: identical Gaussians give 1 - 1/2 = 0.5, which is
    # why the paper's CE rows sit just above 0.5 (0.5139 for <ViT, ViT>)
    assert averaged_kl(0.3, 0.1, 0.3, 0.1, "paper") == 0.5


def test_hand_computed_values():
    # N1 = N(0, 1), N2 = N(1, 2^2)
    ln2 = math.log(2)
    assert kl_gaussian(0, 1, 1, 2, "standard") == pytest.approx(ln2 + 2 / 8 - 0.5)
    assert kl_gaussian(1, 2, 0, 1, "standard") == pytest.approx(-ln2 + 5 / 2 - 0.5)
    assert kl_gaussian(0, 1, 1, 2, "paper") == pytest.approx(ln2 + 2 / 4 - 0.5)
    assert kl_gaussian(1, 2, 0, 1, "paper") == pytest.approx(-ln2 + 5 - 0.5)
    assert averaged_kl(0, 1, 1, 2, "standard") == pytest.approx(0.875)
    assert averaged_kl(0, 1, 1, 2, "paper") == pytest.approx(2.25)
    assert bhattacharyya(0, 1, 1, 2) == pytest.approx(0.25 * math.log(6.25 / 4) + 0.25 / 5)


@pytest.mark.parametrize("mu1,s1,mu2,s2", [(0.8, 0.1, 0.4, 0.2), (0.2, 0.05, 0.25, 0.3),
                                           (-1.0, 2.0, 3.0, 0.5)])
def test_against_numerical_integration(mu1, s1, mu2, s2):
    p, q = stats.norm(mu1, s1), stats.norm(mu2, s2)
    lo, hi = min(mu1 - 12 * s1, mu2 - 12 * s2), max(mu1 + 12 * s1, mu2 + 12 * s2)
    kl_pq = integrate.quad(lambda x: p.pdf(x) * (p.logpdf(x) - q.logpdf(x)), lo, hi, limit=200)[0]
    kl_qp = integrate.quad(lambda x: q.pdf(x) * (q.logpdf(x) - p.logpdf(x)), lo, hi, limit=200)[0]
    bc = integrate.quad(lambda x: np.sqrt(p.pdf(x) * q.pdf(x)), lo, hi, limit=200)[0]
    assert kl_gaussian(mu1, s1, mu2, s2, "standard") == pytest.approx(kl_pq, rel=1e-6)
    assert averaged_kl(mu1, s1, mu2, s2, "standard") == pytest.approx((kl_pq + kl_qp) / 2, rel=1e-6)
    assert bhattacharyya(mu1, s1, mu2, s2) == pytest.approx(-math.log(bc), rel=1e-6)


def test_paper_kl_minus_correct_kl_is_the_missing_half():
    mu1, s1, mu2, s2 = 0.7, 0.15, 0.45, 0.25
    diff = kl_gaussian(mu1, s1, mu2, s2, "paper") - kl_gaussian(mu1, s1, mu2, s2, "standard")
    assert diff == pytest.approx((s1 ** 2 + (mu1 - mu2) ** 2) / (2 * s2 ** 2))


def test_separability_uses_unbiased_std_and_both_groups():
    rng = np.random.default_rng(0)
    pos, neg = rng.normal(0.8, 0.1, 500), rng.normal(0.5, 0.2, 120)
    conf = np.r_[pos, neg]
    correct = np.r_[np.ones(500, bool), np.zeros(120, bool)]
    out = separability(conf, correct, "standard")
    assert out["fits"]["correct"]["std"] == pytest.approx(np.std(pos, ddof=1))
    assert out["fits"]["incorrect"]["std"] == pytest.approx(np.std(neg, ddof=1))
    expected = bhattacharyya(pos.mean(), pos.std(ddof=1), neg.mean(), neg.std(ddof=1))
    assert out["values"]["bhattacharyya"] == pytest.approx(expected)
    paper = separability(conf, correct, "paper")
    assert paper["values"]["bhattacharyya"] == out["values"]["bhattacharyya"]
    assert paper["values"]["kl"] > out["values"]["kl"]
    # affine invariance (moment-based): the same distances for 3p + 2
    again = separability(3 * conf + 2, correct, "standard")["values"]
    assert again["kl"] == pytest.approx(out["values"]["kl"])
    assert again["bhattacharyya"] == pytest.approx(out["values"]["bhattacharyya"])


@pytest.mark.parametrize("conf,correct,reason", [
    (np.array([0.9, 0.8, 0.7, 0.2]), np.array([1, 1, 1, 0]), "at least 2 rows"),
    (np.array([0.9, 0.8, 0.7, 0.2]), np.array([1, 1, 1, 1]), "no incorrect predictions in the split"),
    (np.array([0.9, 0.9, 0.9, 0.2, 0.1]), np.array([1, 1, 1, 0, 0]), "zero variance"),
])
def test_degenerate_groups_are_undefined_with_reason(conf, correct, reason):
    out = separability(conf, correct)
    assert out["values"] == {"kl": None, "bhattacharyya": None}
    assert all(reason in text for text in out["undefined"].values())


def test_gaussian_fit_and_input_errors():
    assert gaussian_fit(np.array([1.0, 3.0])) == (2.0, pytest.approx(math.sqrt(2)))
    with pytest.raises(ValueError, match="non-finite"):
        separability(np.array([0.1, np.nan, 0.3, 0.4]), np.array([1, 1, 0, 0]))
    with pytest.raises(ValueError, match="definition"):
        kl_gaussian(0, 1, 0, 1, "other")


def test_distances_take_arrays_element_wise():
    """The bootstrap applies the same functions to arrays of fits: element i equals the scalar
    call on fit i, bit for bit, and a scalar call still returns a float."""
    rng = np.random.default_rng(4)
    mu1, mu2 = rng.normal(size=50), rng.normal(size=50)
    s1, s2 = rng.uniform(0.1, 2, 50), rng.uniform(0.1, 2, 50)
    b = bhattacharyya(mu1, s1, mu2, s2)
    kl = {d: averaged_kl(mu1, s1, mu2, s2, d) for d in ("paper", "standard")}
    for i in range(50):
        args = (float(mu1[i]), float(s1[i]), float(mu2[i]), float(s2[i]))
        assert b[i] == bhattacharyya(*args)
        assert all(kl[d][i] == averaged_kl(*args, d) for d in kl)
    assert type(bhattacharyya(0.0, 1.0, 1.0, 2.0)) is float
    assert type(kl_gaussian(0.0, 1.0, 1.0, 2.0)) is float
