"""bench/bench_report.py's memory figure (issue 19): the peak of a command's whole process tree."""
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
