"""bench/bench_inference.py runs (CPU, tiny model) and reports classifier vs oracle ms/img."""
from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT


def test_quick_run_prints_both_and_the_ratio(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "bench/bench_inference.py", "--quick", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "oracle" in proc.stdout and "classifier" in proc.stdout and "ratio" in proc.stdout
    results = json.loads(out.read_text())["results"]
    assert {r["role"] for r in results} == {"classifier", "oracle"}
    assert all(r["model_ms_per_img"] > 0 and r["timed_images"] == 3 * 8 for r in results)
