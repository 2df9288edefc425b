"""``DIR/.lock`` on a folder shared by several hosts (a cluster's file system), hosts simulated by
the host name a process records: processes racing for one run or cache directory get it once,
the others are told who holds it; a lock of another host is never taken over, its message names
it and the fix (cache/lock.py)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cache.lock import DirLock
from cache.runs import RunError, RunLock
from cache.schema import CacheError

ROOT = Path(__file__).resolve().parents[1]
# a process on "host" NAME: takes DIR's lock (a run directory's), reports, holds it for HOLD s
RACER = """
import socket, sys, time
sys.path.insert(0, {root!r})
socket.gethostname = lambda: sys.argv[2]
from cache.runs import RunError, RunLock
time.sleep(max(0.0, float(sys.argv[4]) - time.time()))     # start together
try:
    with RunLock(sys.argv[1]):
        print("took", flush=True)
        time.sleep(float(sys.argv[3]))
except RunError as err:
    print("refused:", err, flush=True)
"""


def racers(folder: Path, hosts: list[str], hold: float) -> list[str]:
    import time
    start = time.time() + 3.0
    procs = [subprocess.Popen([sys.executable, "-c", RACER.format(root=str(ROOT)), str(folder),
                               host, str(hold), str(start)], stdout=subprocess.PIPE, text=True)
             for host in hosts]
    return [p.communicate(timeout=120)[0].strip() for p in procs]


def test_processes_of_several_hosts_racing_for_one_folder_get_it_once(tmp_path):
    said = racers(tmp_path / "run", [f"node-{i}" for i in range(6)], hold=4.0)
    took = [s for s in said if s == "took"]
    refused = [s for s in said if s.startswith("refused:")]
    assert len(took) == 1 and len(refused) == 5, said
    winner = next(f"node-{i}" for i, s in enumerate(said) if s == "took")
    for s in refused:
        assert f"is in use by another process (pid " in s and f"on host {winner}" in s, s
        assert "never taken over from here" in s
    assert not (tmp_path / "run" / ".lock").exists()       # released by the winner


def test_a_lock_left_by_another_host_is_never_taken_over(tmp_path, monkeypatch):
    """A process of node-a killed with its lock held (its job's node went down): node-b cannot
    see whether it still runs, so it refuses, naming the owner and the fix; on node-a, where the
    pid is seen to be gone, the lock is taken over."""
    folder = tmp_path / "cache"
    folder.mkdir()
    (folder / ".lock").write_text(json.dumps({"pid": 2 ** 22 + 17, "host": "node-a"}))
    monkeypatch.setattr("socket.gethostname", lambda: "node-b")
    with pytest.raises(CacheError, match=r"in use by another process \(pid 4194321 on host "
                                         r"node-a; another host than this one \(node-b\).*never "
                                         r"taken over from here\); wait for it, or delete "
                                         r".*cache/\.lock if that process is gone"):
        DirLock(folder).__enter__()
    with pytest.raises(RunError, match="on host node-a"):
        RunLock(folder).__enter__()
    assert json.loads((folder / ".lock").read_text())["host"] == "node-a"     # untouched
    monkeypatch.setattr("socket.gethostname", lambda: "node-a")
    with DirLock(folder):
        assert json.loads((folder / ".lock").read_text())["host"] == "node-a"
    assert not (folder / ".lock").exists()
