"""Stands in for `python` and `torchrun` while tests/test_runbook.py runs docs/IMAGENET.md.

    runbook_shim.py cli.py COMMAND ARGS...                        # python cli.py ...
    runbook_shim.py --torchrun [torchrun options] cli.py COMMAND ARGS...

The runbook's commands run unchanged, with three substitutions a CPU test machine needs:
* `cli.py` is the repository's cli.py (the script runs in a temporary directory);
* `torchrun --nproc-per-node N` becomes 2 CPU processes (gloo) under torch.distributed.run;
* `extract` / `train-oracle` / `attack` naming a preset model without `--weights` (a hub download) get
  `--weights $RUNBOOK_TINY/<name>.pth`: a tiny project checkpoint of that name (no network);
* `train-oracle` without `--epochs` gets `--epochs 1`, and without `--batch-size` gets
  `--batch-size 40`, the paper's: the tiny tree's 3 steps would otherwise be raised to 100, and
  its batch lowered, by the small-run rules (presets.MIN_TRAIN_STEPS, MIN_STEPS_PER_EPOCH).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INJECT = {"extract": "--classifier", "train-oracle": "--oracle", "attack": "--classifier"}


def option(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def with_offline_weights(args: list[str]) -> list[str]:
    """``args`` = [COMMAND, ...]; adds the tiny checkpoint of the named preset model."""
    command = args[0]
    if command not in INJECT or "--weights" in args:
        return args
    name = option(args, INJECT[command]) or option(args, "--classifier") or "vit"
    return [*args, "--weights", str(Path(os.environ["RUNBOOK_TINY"]) / f"{name}.pth")]


def main(argv: list[str]) -> int:
    env = {**os.environ}
    launcher = [sys.executable]
    if argv and argv[0] == "--torchrun":
        argv = argv[1:]
        while argv and not argv[0].endswith(".py"):   # drop torchrun's own options
            argv = argv[1:]
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node", "2"]
        env["OMP_NUM_THREADS"] = "1"
    if not argv or argv[0] != "cli.py":
        print(f"runbook_shim: the runbook may only run cli.py, got {argv[:3]}", file=sys.stderr)
        return 2
    args = with_offline_weights(argv[1:])
    if args[0] == "train-oracle" and "--epochs" not in args:
        args += ["--epochs", "1"]
    if args[0] == "train-oracle" and "--batch-size" not in args:
        args += ["--batch-size", "40"]
    if args[0] in ("extract", "train-oracle", "predict", "attack"):
        args.append("--no-progress")
    print("+", " ".join(argv), flush=True)
    return subprocess.run([*launcher, str(ROOT / "cli.py"), *args], env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
