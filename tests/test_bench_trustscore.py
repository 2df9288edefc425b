"""bench/bench_trustscore.py runs (CPU, small sizes) and prints what the GPU run reports."""
from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT


def test_bench_trustscore_small_runs(tmp_path):
    out = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_trustscore.py"),
                           "--rows", "3000", "--dim", "16", "--classes", "5", "--queries", "400",
                           "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "TrustScore, 3,000 training rows x 16 features, 5 classes, 400 queries" in proc.stdout
    fig = json.loads(out.read_text())
    assert fig["alpha"] == 0.1 and 0 < fig["kept_rows"] < 3000
    assert fig["fit_s"] > 0 and fig["score_s"] > 0 and "check" not in fig     # CPU: no check
