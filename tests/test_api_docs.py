"""docs/API.md runs as written: every ```python block, in order, in one namespace.  The first
block (the demo's paths) is replaced by the same names pointing at a small study built here: a
colour tree, its tiny-ViT cache with features, and a fine-tuned run that scored its val split."""
from __future__ import annotations

import contextlib
import io
import re

import pytest

from conftest import ROOT
from oracle_fixtures import (CLASSIFIER, TINY_VIT_KWARGS, extract, run_cli, train_args,
                             write_colour_tree)


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "API.md").read_text(), re.S)


def study_setup(base) -> str:
    """The first block's names, for the study in ``base``."""
    data = write_colour_tree(base / "colours", {"train": 16, "val": 90})
    extract(data, base / "cache", extra=("--features",))
    run_cli(train_args(data, base / "cache", base / "run", "--lr", 0.05, "--val-fraction", 0.25,
                       "--batch-size", 4))
    options = dict(data=str(data), cache=str(base / "cache"), classifier=CLASSIFIER,
                   random_init=True, model_kwargs={**TINY_VIT_KWARGS, "num_classes": 3},
                   head_only=True, batch_size=8, epochs=1, progress=False,
                   runs_root=str(base / "runs"))
    return (f"from pathlib import Path\n"
            f"root = Path({str(base)!r})\n"
            f"cache_dir = root / 'cache' / {CLASSIFIER!r} / 'val'\n"
            f"run_dir = root / 'run'\n"
            f"split = 'val'\n"
            f"images = sorted((root / 'colours' / 'val').rglob('*.JPEG'))[:16]\n"
            f"train_options = {options!r}\n")


def test_every_block_of_the_api_docs_runs(tmp_path, monkeypatch, restore_registry):
    found = blocks()
    assert len(found) >= 8 and found[1].startswith("# setup"), "docs/API.md's layout changed"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    printed = io.StringIO()
    setup = study_setup(tmp_path)
    for i, block in enumerate([found[0], setup, *found[2:]]):
        with contextlib.redirect_stdout(printed):
            try:
                exec(compile(block, f"docs/API.md block {i}", "exec"), namespace)
            except Exception as err:      # name the block that failed
                pytest.fail(f"docs/API.md block {i} raised {type(err).__name__}: {err}\n{block}")
    out = printed.getvalue()
    assert "custom:squared-hinge" in out and "favours" in out and "head AUC" in out, out
    assert "hinge Hinge (head-only)" in out and namespace["hinge"].status == "complete"
    assert namespace["result"].status == "complete" and namespace["mine"].status == "complete"
