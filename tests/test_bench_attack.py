"""bench/bench_attack.py runs (CPU, tiny model): ReColorAdv's exact iteration count, PGD's 10
steps, and the images/s the GPU runbook reads."""
from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT


def test_quick_run_times_both_attacks(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "bench/bench_attack.py", "--quick", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "img/s at 300 it" in proc.stdout
    results = {r["attack"]: r for r in json.loads(out.read_text())["results"]}
    assert results["recoloradv"]["iterations"] == 3 and results["pgd_linf"]["iterations"] == 10
    assert all(r["images"] == 8 and r["img_per_s"] > 0 and r["max_change"] > 0
               for r in results.values())
