"""The head-only loop's host work with a bank of many heads and their logs written, on the CPU
(what a `cli.py sweep` of 100 points pays besides its training steps).

    python bench/bench_bank_host.py                  # 100 SS heads, 40,000 rows, D = 32

A synthetic feature cache (bench/bench_head.py's writer), one epoch at batch 40 with 30% of the
rows held out and validated 4 times, each head's log.jsonl written as `train-oracle` writes it.
Prints the wall time of `train_heads` and a digest of the logs without their img/s (a timing), so
two commits can be compared: equal digests = the same logs.  The training steps are tiny (D = 32)
so that the loop's own work -- logging every step of every head, scoring every head at each
validation -- is what is timed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_head import optim, write_feature_cache  # noqa: E402
from cache.reader import ClassifierCache  # noqa: E402
from cache.runs import RunDir  # noqa: E402
from pipeline.core.losses import Context, get  # noqa: E402
from pipeline.oracle.headonly.bank import train_heads  # noqa: E402
from pipeline.oracle.headonly.features import load_table  # noqa: E402
from pipeline.oracle.loop.log import StepLog  # noqa: E402
from pipeline.oracle.loop.state import LoopSettings  # noqa: E402
from pipeline.oracle.settings.sampler import StepSchedule, carve_rows  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=40_000)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--grid", type=int, default=10, help="alpha values per axis (heads = N x N)")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_bank_host_"))
    try:
        write_feature_cache(work / "train", a.rows, a.dim, seed=1, shard=20_000)
        cache = ClassifierCache.open(work / "train")
        t = cache.load(["valid", "correct", "p_true", "correct_flip", "p_true_flip"])
        table = load_table(cache, SimpleNamespace(cache=cache), t, True, torch.device("cpu"))
        rows, val = carve_rows(np.flatnonzero(t["valid"]), 0.3, None, 0)
        schedule = StepSchedule(rows, 40, 1, 0, True)
        losses = [get("ss").resolve({"alpha_pos": p, "alpha_neg": n}, Context((1.0, 3.0)), None)
                  for p in np.linspace(0.5, 5, a.grid) for n in np.linspace(1, 10, a.grid)]
        logs = [StepLog(RunDir(work / f"run{i}"), None, True) for i in range(len(losses))]
        total = schedule.total_steps
        settings = LoopSettings(total, 40, 10, max(1, total // 4), None, None, False, "bench")
        t0 = time.perf_counter()
        train_heads(table, schedule, losses, optim(total), val, 0.0, settings, logs)
        wall = time.perf_counter() - t0
        digest = hashlib.sha256()
        for i in range(len(losses)):
            for line in RunDir(work / f"run{i}").log_entries():
                line.pop("img_per_s", None)
                digest.update(json.dumps(line, sort_keys=True).encode())
        print(f"bench_bank_host: {total} steps x {len(losses)} heads, {len(val):,} held-out rows, "
              f"logs written: {wall:.2f} s; logs without img/s: sha256 {digest.hexdigest()[:16]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
