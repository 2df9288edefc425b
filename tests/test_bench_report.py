"""bench/bench_report.py's memory figure: the peak of a command's whole process tree."""
from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT

# a child that starts a grandchild holding 300 MiB (pages touched) while the child holds little
GRANDCHILD = "b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096]); import time; time.sleep(1.5)"
CHILD = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {GRANDCHILD!r}], check=True)"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sampled through /proc")
def test_peak_tree_rss_counts_grandchildren():
    sys.path.insert(0, str(ROOT))
    from bench.proctree import PeakTreeRSS

    proc = subprocess.Popen([sys.executable, "-c", CHILD])
    with PeakTreeRSS(proc.pid, interval=0.02) as peak:
        assert proc.wait(timeout=60) == 0
    assert peak.processes >= 2 and peak.samples > 10
    assert 300 * 2**20 <= peak.bytes < 1024 * 2**20


# a parent touching 300 MiB, then three forked children sleeping on the same (shared) pages
FORKS = """import os, time
b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096])
pids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        time.sleep(1.5); os._exit(0)
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sampled through /proc")
def test_forked_workers_sharing_pages_count_them_once_in_the_pss_sum():
    """The RSS sum counts the parent's 300 MiB in every fork (an upper bound); the PSS sum
    divides each shared page among its processes, so the tree holds ~300 MiB in total."""
    sys.path.insert(0, str(ROOT))
    from bench.proctree import PeakTreeRSS, pss

    if pss(__import__("os").getpid()) is None:
        pytest.skip("this kernel gives no /proc/PID/smaps_rollup")
    proc = subprocess.Popen([sys.executable, "-c", FORKS])
    with PeakTreeRSS(proc.pid, interval=0.02) as peak:
        assert proc.wait(timeout=60) == 0
    assert peak.processes >= 4
    assert peak.bytes >= 4 * 300 * 2**20                     # counted once per process
    assert 300 * 2**20 <= peak.pss_bytes < 600 * 2**20      # counted once in total
