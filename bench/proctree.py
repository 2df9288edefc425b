"""Peak resident memory of a command and every process it starts, sampled while it runs (Linux).

``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`` is the largest single descendant's peak, not
what is resident at once: `cli.py report`'s joblib workers (separate interpreters, loky) run beside
their parent.  So the tree is sampled every ``interval`` seconds through /proc: the RSS of the
process and all its descendants (children of children too) summed, the peak sum kept.  Pages
shared between the processes (the same libraries) count once per process, so the sum is an upper
bound of the memory the tree needs; a spike shorter than ``interval`` can be missed, which is why
the exact single-process ``ru_maxrss`` is printed beside it.  Beside the RSS sum, the PSS sum
(``/proc/PID/smaps_rollup``, Linux >= 4.14: each shared page divided among the processes mapping
it) is what the tree holds at once: DataLoader workers forked from a parent that loaded torch
and CUDA count each of those pages once in total instead of once per worker.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")
PROC = Path("/proc")


def _children() -> dict[int, list[int]]:
    """{parent pid: [child pids]} of every process visible now."""
    kids: dict[int, list[int]] = {}
    for entry in os.scandir(PROC):
        if not entry.name.isdigit():
            continue
        try:
            stat = (PROC / entry.name / "stat").read_bytes()
        except OSError:          # it ended meanwhile
            continue
        ppid = int(stat[stat.rfind(b")") + 2:].split()[1])      # the name may hold spaces
        kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def pss(pid: int) -> int | None:
    """Proportional set size in bytes (None where the kernel gives no smaps_rollup)."""
    try:
        for line in (PROC / str(pid) / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass                     # it ended meanwhile, or this kernel has no smaps_rollup
    return None


def tree_rss(pid: int, with_pss: bool = False) -> tuple[int, int, int | None]:
    """(summed RSS in bytes, number of processes, summed PSS in bytes or None) of ``pid`` and its
    descendants; PSS only ``with_pss`` (a process that ended meanwhile, or a zombie, adds 0)."""
    kids, todo, total, count, prop = _children(), [pid], 0, 0, 0
    while todo:
        p = todo.pop()
        try:
            total += int((PROC / str(p) / "statm").read_text().split()[1]) * PAGE
            count += 1
        except (OSError, IndexError, ValueError):
            pass                 # it ended meanwhile: nothing left to count
        else:
            prop += (pss(p) or 0) if with_pss else 0
        todo += kids.get(p, [])
    return total, count, prop if with_pss else None


class PeakTreeRSS:
    """``with PeakTreeRSS(proc.pid) as peak: proc.wait()`` -> ``peak.bytes``, ``peak.processes``."""

    def __init__(self, pid: int, interval: float = 0.05):
        self.pid, self.interval = pid, interval
        self.bytes, self.processes, self.samples = 0, 0, 0
        # None: this kernel gives no smaps_rollup (asked of this process, which surely lives)
        self.pss_bytes: int | None = 0 if pss(os.getpid()) is not None else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            rss, count, prop = tree_rss(self.pid, with_pss=self.pss_bytes is not None)
            self.bytes, self.processes = max(self.bytes, rss), max(self.processes, count)
            if prop is not None:
                self.pss_bytes = max(self.pss_bytes, prop)
            self.samples += 1
            self._stop.wait(self.interval)

    def __enter__(self) -> "PeakTreeRSS":
        if not PROC.is_dir():
            raise RuntimeError("peak memory of a process tree is sampled through /proc (Linux)")
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
