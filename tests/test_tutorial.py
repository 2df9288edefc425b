"""docs/tutorial.ipynb runs as written, on a small synthetic study (bench/synthetic_runs.py: the
project's own writers of caches and runs) instead of the demo's artifacts, which it is pointed at
through TRUST_ORACLES_STUDY: from the runs and caches to the figure answering "does SS beat the
softmax (MCP)?", through the public API alone."""
from __future__ import annotations

import ast
import os

import pytest

from conftest import ROOT

NOTEBOOK = ROOT / "docs" / "tutorial.ipynb"
KERNEL = "trust-oracles-tutorial"


def _need(module: str):
    # the test extra (nbformat, nbclient, ipykernel) is installed by `make install`, so CI runs it
    if os.environ.get("CI"):
        return __import__(module)
    return pytest.importorskip(module, reason="the test extra: pip install -e '.[test]'")


def _code(nb) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "code"]


def test_the_tutorial_uses_only_the_public_api():
    nbformat = _need("nbformat")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    first_party = ("cache", "pipeline", "bench", "cli", "trust_oracles.")
    for source in _code(nb):
        for node in ast.walk(ast.parse(source)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not [m for m in mods if m.startswith(first_party) or m == "cache"], \
                f"docs/tutorial.ipynb imports {mods}: only `trust_oracles` is its API"


def test_the_tutorial_runs_on_a_synthetic_study(tmp_path, monkeypatch):
    nbformat, nbclient = _need("nbformat"), _need("nbclient")
    _need("ipykernel")
    from bench.synthetic_runs import write_study

    write_study(tmp_path / "study", n=1500, pairs=(("vit", "vit"), ("resnet", "resnet")),
                losses=("ce", "ss"), seeds=(0, 1), held_out=None)
    monkeypatch.setenv("TRUST_ORACLES_STUDY", str(tmp_path / "study"))
    monkeypatch.setenv("TRUST_ORACLES_RESAMPLES", "100")
    # a kernel of this interpreter, whatever kernels the user's Jupyter knows
    from ipykernel.kernelspec import write_kernel_spec
    write_kernel_spec(tmp_path / "jupyter" / "kernels" / KERNEL)
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=120, kernel_name=KERNEL,
                            resources={"metadata": {"path": str(ROOT)}}).execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.outputs if o.output_type == "stream")
    assert "('vit', 'vit', 'fine-tuned') 2 seed(s)" in text, text
    assert "SS beats MCP in" in text and "of 4 comparisons" in text, text
    assert any(o.output_type == "display_data" and "image/png" in o.get("data", {})
               for c in nb.cells if c.cell_type == "code" for o in c.outputs), "no figure"
