"""How long `cli.py <command> --help` takes, against the interpreter starting click alone.

    python bench/bench_cli_help.py            # best of 5 per command
    python bench/bench_cli_help.py --repeats 1

Each figure is a fresh process (what a user waits for).  The baseline is `python -c "import
click"` measured in the same run; the ratio says what the project adds on top.  Target: every
command under 1 s on the development machine (2 cores); tests/test_layout.py checks the cause
(no torch, timm, torchvision or matplotlib import before a command runs).

Prints one ``BENCH_CLI_HELP {json}`` line.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ("", "extract", "train-oracle", "predict", "sweep", "report", "fit-classifier",
            "attack", "corrupt", "demo")


def best_of(argv: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(argv, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    base = best_of([sys.executable, "-c", "import click"], args.repeats)
    result = {"baseline_import_click_s": round(base, 3)}
    for command in COMMANDS:
        argv = [sys.executable, str(ROOT / "cli.py"), *([command] if command else []), "--help"]
        t = best_of(argv, args.repeats)
        result[command or "cli"] = {"s": round(t, 3), "ratio_to_baseline": round(t / base, 2)}
        print(f"{command or 'cli.py':15s} --help  {t:6.3f} s  ({t / base:4.1f}x import click)")
    worst = max(v["s"] for k, v in result.items() if isinstance(v, dict))
    print(f"slowest {worst:.3f} s ({'under' if worst < 1 else 'OVER'} the 1 s target)")
    print("BENCH_CLI_HELP " + json.dumps(result))


if __name__ == "__main__":
    main()
