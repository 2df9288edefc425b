"""One version for a release: pyproject.toml's, exposed as ``trust_oracles.__version__`` from the
installed package's metadata and repeated in CITATION.cff, which cites the paper the project
implements."""
from __future__ import annotations

import re

import pytest

from conftest import ROOT


def _pyproject_version() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    return re.search(r'(?m)^version = "([^"]+)"$', text).group(1)


def test_the_package_exposes_its_version():
    import importlib.metadata

    import trust_oracles

    try:
        installed = importlib.metadata.version("trust-oracles")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("trust-oracles is not installed")
    assert trust_oracles.__version__ == installed == _pyproject_version()


def test_citation_cff_names_the_version_and_the_paper():
    yaml = pytest.importorskip("yaml")
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0"
    assert str(cff["version"]) == _pyproject_version()
    paper = cff["preferred-citation"]
    assert paper["title"] == "Learning to Predict Trustworthiness with Steep Slope Loss"
    assert [a["family-names"] for a in paper["authors"]] == ["Luo", "Wong", "Kankanhalli", "Zhao"]
    assert paper["year"] == 2021
