"""bench/bench_train.py runs (CPU, tiny models) and prints its table; the grid projection and the
memory table need CUDA and are exercised on a GPU (docs/PERFORMANCE.md)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT


@pytest.mark.slow  # ~15 s on a quiet 2-core machine
def test_bench_train_tiny_runs(tmp_path):
    out = tmp_path / "train.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_train.py"), "--tiny",
                           "--models", "resnet10t", "--images", "48", "--steps", "1", "--warmup",
                           "1", "--workers", "0", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "| resnet10t | eager | 16: " in proc.stdout
    res = json.loads(out.read_text())["results"]["resnet10t"]
    assert res["steps"]["paper"]["eager"]["e2e"] > 0 and res["fill_batch"] == 16
    assert res["train_gflop_per_img"] > 0 and res["authors"]["e2e"] > 0
