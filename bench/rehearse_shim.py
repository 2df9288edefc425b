"""Stands in for `python` and `torchrun` while bench/rehearse_imagenet.py runs docs/IMAGENET.md,
and measures each cli.py command it runs.

    rehearse_shim.py cli.py COMMAND ARGS...                        # python cli.py ...
    rehearse_shim.py --torchrun [torchrun options] cli.py ARGS...  # torchrun, options kept

The commands run as written, with what a rehearsal without the model hub needs added:
* a model named without `--weights` (`extract`, `attack`: the classifier; `train-oracle`,
  `sweep`: the oracle) gets `--random-init`, or with REHEARSE_TINY=DIR `--weights DIR/<name>.pth`
  (tiny stand-ins, CPU tests); speed does not depend on the weights;
* `attack` gets `--max-samples $REHEARSE_ATTACK_ROWS` (a slice of val);
* a fine-tuned `train-oracle` gets `--max-samples $REHEARSE_TRAIN_ROWS` when set (a slice of
  train; its rate is scaled to the full split by rows);
* tiny: `train-oracle`/`sweep` get `--epochs 1 --batch-size 40` (as tests/runbook_shim.py);
* `--no-progress` where the command has it.
Per command it appends one JSON line to $REHEARSE_LOG: argv, exit status, wall seconds, peak
RSS and PSS of the process tree (bench/proctree.py, sampled every 0.1 s; the PSS sum counts a
page shared by forked workers once), peak GPU memory (nvidia-smi's
memory.used summed over the GPUs, polled every 0.5 s, minus its value before the command: every
process on the GPUs counts) and the bytes the command added under $REHEARSE_DISK_ROOT; for a
fine-tuned `train-oracle`, the run's own training rate (the median img/s of its log's windows,
the first left out: capture and warm-up), so that the projection scales training alone by rows.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.proctree import PeakTreeRSS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODEL_OPTION = {"extract": "--classifier", "attack": "--classifier",
                "train-oracle": "--oracle", "sweep": "--oracle"}
NO_PROGRESS = ("extract", "train-oracle", "predict", "attack")


def option(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def added_options(args: list[str], env: dict) -> list[str]:
    command, extra = args[0], []
    if command in MODEL_OPTION and "--weights" not in args and "--random-init" not in args:
        name = option(args, MODEL_OPTION[command]) or option(args, "--classifier") or "vit"
        tiny = env.get("REHEARSE_TINY")
        extra += ["--weights", str(Path(tiny) / f"{name}.pth")] if tiny else ["--random-init"]
    if command == "attack" and env.get("REHEARSE_ATTACK_ROWS"):
        extra += ["--max-samples", env["REHEARSE_ATTACK_ROWS"]]
    if command == "train-oracle" and "--head-only" not in args and env.get("REHEARSE_TRAIN_ROWS"):
        extra += ["--max-samples", env["REHEARSE_TRAIN_ROWS"]]
    if env.get("REHEARSE_TINY") and command in ("train-oracle", "sweep"):
        for name, value in (("--epochs", "1"), ("--batch-size", "40")):
            extra += [name, value] if name not in args else []
    if command in NO_PROGRESS:
        extra.append("--no-progress")
    return extra


def train_rate(args: list[str], since: float) -> float | None:
    """The median logged img/s of the run a fine-tuned train-oracle wrote (its log.jsonl modified
    after ``since``), the first window left out; None when there is none."""
    from cache.runlog import read_log
    from cache.runs import LOG_FILE
    root = option(args, "--runs-root")
    if args[0] != "train-oracle" or "--head-only" in args or not root:
        return None
    logs = [p for p in Path(root).glob(f"*/{LOG_FILE}") if p.stat().st_mtime >= since]
    if not logs:
        return None
    rates = [e["img_per_s"] for _, e in read_log(max(logs, key=lambda p: p.stat().st_mtime))
             if e.get("img_per_s")]
    rates = rates[1:] if len(rates) > 1 else rates
    return float(sorted(rates)[len(rates) // 2]) if rates else None


def tree_bytes(root: str | None) -> int:
    total = 0
    for folder, _, files in os.walk(root or os.devnull):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                pass                        # removed meanwhile
    return total


class GpuPeak:
    """Peak of nvidia-smi's memory.used (all GPUs, MiB summed) above its value at the start."""

    def __init__(self):
        self.tool = shutil.which("nvidia-smi")
        self.base = self.peak = self.read()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def read(self) -> int | None:
        if not self.tool:
            return None
        try:
            out = subprocess.run([self.tool, "--query-gpu=memory.used", "--format=csv,noheader,"
                                  "nounits"], capture_output=True, text=True, timeout=10).stdout
            return sum(int(v) for v in out.split())
        except (OSError, ValueError, subprocess.SubprocessError):
            return None

    def _poll(self) -> None:
        while not self._stop.wait(0.5):
            value = self.read()
            if value is not None and self.peak is not None:
                self.peak = max(self.peak, value)

    def __enter__(self):
        if self.tool:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self.tool:
            self._thread.join()

    def bytes(self) -> int | None:
        return None if self.base is None else (self.peak - self.base) * 2**20


def main(argv: list[str]) -> int:
    env = {**os.environ}
    launcher = [sys.executable]
    if argv and argv[0] == "--torchrun":
        options = []
        argv = argv[1:]
        while argv and not argv[0].endswith(".py"):
            options.append(argv.pop(0))
        launcher = [sys.executable, "-m", "torch.distributed.run", *options]
    if not argv or argv[0] != "cli.py":
        print(f"rehearse_shim: the runbook may only run cli.py, got {argv[:3]}", file=sys.stderr)
        return 2
    args = [*argv[1:], *added_options(argv[1:], env)]
    print("+", " ".join(argv), flush=True)
    disk_before, start = tree_bytes(env.get("REHEARSE_DISK_ROOT")), time.perf_counter()
    started = time.time()
    with GpuPeak() as gpu:
        proc = subprocess.Popen([*launcher, str(ROOT / "cli.py"), *args], env=env)
        with PeakTreeRSS(proc.pid, interval=0.1) as rss:
            rc = proc.wait()
    record = {"argv": argv[1:], "launcher": launcher[1:], "rc": rc,
              "wall_s": time.perf_counter() - start, "rss_peak_bytes": rss.bytes,
              "pss_peak_bytes": rss.pss_bytes,
              "gpu_peak_bytes": gpu.bytes(),
              "disk_bytes": tree_bytes(env.get("REHEARSE_DISK_ROOT")) - disk_before,
              "train_img_per_s": train_rate(args, started) if rc == 0 else None}
    if env.get("REHEARSE_LOG"):
        with open(env["REHEARSE_LOG"], "a") as fh:
            fh.write(json.dumps(record) + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
