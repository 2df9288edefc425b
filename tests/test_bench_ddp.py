"""bench/bench_ddp.py's CPU-checkable parts (its figures need GPUs: docs/PERFORMANCE.md)."""
from __future__ import annotations

import json
import subprocess
import sys

from bench.bench_ddp import model_options
from conftest import ROOT


def test_the_models_get_the_trees_classes_listed_in_output_order(tmp_path):
    for wnid in ("n02", "n01", "n03"):
        (tmp_path / "train" / wnid).mkdir(parents=True)
    opts = model_options(tmp_path)
    assert opts[:2] == ["--random-init", "--model-kwargs"]
    assert json.loads(opts[2]) == {"num_classes": 3}
    assert (tmp_path / "classes.txt").read_text().split() == ["n01", "n02", "n03"]


def test_more_gpus_than_the_machine_has_are_refused_in_one_line():
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_ddp.py"), "--gpus", "64"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "--gpus 64 but" in done.stderr
    assert "Traceback" not in done.stderr
