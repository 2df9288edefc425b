"""bench/bench_head.py runs (CPU, small sizes) and prints what the GPU run reports."""
from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest

from conftest import ROOT


@pytest.mark.slow  # ~10 s on a quiet 2-core machine, 30 s on a busy one
def test_bench_head_quick_runs(tmp_path):
    out = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_head.py"), "--quick",
                           "--rows", "3000", "--val-rows", "500", "--grid", "2", "--dims", "32",
                           "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "UnverifiedCacheWarning" not in proc.stderr      # its caches are checksummed
    assert "one run (load" in proc.stdout and "full fine-tune" not in proc.stdout
    assert "2x2 alpha grid (4 heads, one bank)" in proc.stdout
    doc = json.loads(out.read_text())
    one = doc["dims"]["32"]["one_run"]
    assert one["steps"] == (3000 - 150) // 40 and one["heads"] == 1 and one["total_s"] > 0
    assert doc["dims"]["32"]["grid"]["heads"] == 4
    # which step ran (on the CPU the eager one; a graphed run's eager twin only on a GPU)
    assert "step: eager (the device is cpu" in proc.stdout and "eager step (--cuda-graph off)" \
        not in proc.stdout
    assert one["step_path"] == {"mode": "eager", "requested": "auto",
                                "reason": "the device is cpu (CUDA graphs need a CUDA device)"}
    assert doc["dims"]["32"]["eager"] == {"one_run": None, "grid": None}


def test_bench_head_writes_checksummed_caches(tmp_path):
    """Its synthetic caches carry what extract records (each shard's size, hash and column
    hashes): read without the "unverified cache" note, and a damaged shard is found."""
    from bench.bench_head import write_feature_cache
    from cache.reader import ClassifierCache, UnverifiedCacheWarning

    path = tmp_path / "d8" / "train"
    write_feature_cache(path, 250, 8, seed=0, shard=100)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnverifiedCacheWarning)
        cache = ClassifierCache.open(path)
    assert cache.has_checksums and cache.problems(full=True) == {}
    shard = path / cache.manifest["shards"][1]["file"]
    raw = bytearray(shard.read_bytes())
    raw[-100] ^= 0xFF
    shard.write_bytes(bytes(raw))
    assert list(cache.problems(full=True)) == [shard.name]


def test_bench_bank_host_runs_and_prints_the_logs_digest():
    import subprocess
    import sys

    from conftest import ROOT
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_bank_host.py"), "--rows",
                           "3000", "--grid", "2"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "x 4 heads" in done.stdout and "sha256" in done.stdout
