"""Whether two versions of the code give the same outputs: every command's --help, report.json,
and the scores of every run two artifacts roots share.

    python bench/same_outputs.py help OUT [--code DIR]          # --help of every command
    python bench/same_outputs.py report ROOT OUT [--code DIR]   # cli.py report on ROOT's runs
    python bench/same_outputs.py report ROOT OUT --as-written   # the report ROOT/report holds
    python bench/same_outputs.py compare A B                    # two snapshots (help, report)
    python bench/same_outputs.py runs ROOT_A ROOT_B             # runs of the same name

``--code`` is the repository whose ``cli.py`` runs (default: this one), e.g. a worktree of the
commit before a refactor.  ``report`` runs ``cli.py report --runs-root ROOT/runs --out OUT/report
--no-ci`` (``--ci``: with intervals and verdicts) and keeps its report.json in OUT, the artifacts
root (and ``--also`` roots, e.g. where copied runs were trained) replaced by a token.
``compare`` prints every help text that differs (as a unified diff) and, for report.json,
whether it is the same but for the report's creation time and the times it measured (``MEASURED``:
inference and TrustScore seconds), else each differing JSON path.  ``runs`` compares
the run directories two roots share by name (their group hash: the same settings): each output
file's columns bit for bit and the training loss of every log.jsonl step; a measured time is no
output.  Exit status 1 when anything differs, so a refactor can be gated on it.
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cache.outputs import read_outputs  # noqa: E402
from cache.runs import RunDir  # noqa: E402

COMMANDS = ("extract", "train-oracle", "predict", "sweep", "report", "fit-classifier",
            "import-weights", "attack", "corrupt", "demo")
VOLATILE = {"created"}        # report.json keys that name when it was made
MEASURED = {"model_ms_per_img", "wall_ms_per_img", "fit_s", "score_s"}   # wall-clock times


def cli(code: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "cli.py", *args], cwd=code, capture_output=True,
                          text=True, env={**os.environ, "COLUMNS": "80"})
    if done.returncode != 0:
        raise SystemExit(f"cli.py {' '.join(args)} in {code}: exit {done.returncode}\n"
                         f"{done.stderr[-2000:]}")
    return done.stdout


def snapshot_help(code: Path, out: Path) -> None:
    (out / "help").mkdir(parents=True, exist_ok=True)
    (out / "help" / "cli.txt").write_text(cli(code, "--help"))
    for command in COMMANDS:
        (out / "help" / f"{command}.txt").write_text(cli(code, command, "--help"))


def snapshot_report(code: Path, root: Path, out: Path, ci: bool, as_written: bool,
                    also: list[Path]) -> None:
    made = root / "report"
    if not as_written:
        made = out / "report"
        cli(code, "report", "--runs-root", str(root.resolve() / "runs"), "--out", str(made.resolve()),
            *([] if ci else ["--no-ci"]))
    text = (made / "report.json").read_text()
    for r in (root, *also):
        text = text.replace(str(r.resolve()), "<ROOT>")
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(text)


def json_diff(a, b, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if (k in VOLATILE and not path) or k in MEASURED:
                continue
            if k not in a or k not in b:
                out.append(f"{path}/{k}: only in {'B' if k not in a else 'A'}")
            else:
                out += json_diff(a[k], b[k], f"{path}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in json_diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {json.dumps(a)[:80]} != {json.dumps(b)[:80]}"]


def compare(a: Path, b: Path) -> int:
    bad = 0
    for old in sorted((a / "help").glob("*.txt")) if (b / "help").is_dir() else ():
        new = b / "help" / old.name
        if not new.exists() or old.read_text() != new.read_text():
            bad += 1
            lines = difflib.unified_diff(old.read_text().splitlines(),
                                         new.read_text().splitlines() if new.exists() else [],
                                         f"A/{old.name}", f"B/{old.name}", lineterm="", n=1)
            print("\n".join(lines))
    if (a / "report.json").exists() and (b / "report.json").exists():
        ra, rb = (json.loads((p / "report.json").read_text()) for p in (a, b))
        diffs = json_diff(ra, rb)
        print(f"report.json: {'identical' if not diffs else f'{len(diffs)} differences'} "
              f"(left out: {sorted(VOLATILE)}, the measured times {sorted(MEASURED)})")
        print("\n".join(diffs[:40]))
        bad += bool(diffs)
    return bad


def compare_runs(a: Path, b: Path) -> int:
    names = sorted({p.name for p in (a / "runs").iterdir()} & {p.name for p in (b / "runs").iterdir()})
    bad = 0
    for name in names:
        ra, rb = RunDir(a / "runs" / name), RunDir(b / "runs" / name)
        tags, other = sorted(ra.record().outputs), set(rb.record().outputs)
        for tag in tags:        # run.json's paths are as typed: the folder's own files instead
            ca = read_outputs(ra.output(tag)).columns
            cb = read_outputs(rb.output(tag)).columns if tag in other else {}
            differ = [k for k in ca if k not in cb or not np.array_equal(ca[k], cb[k])]
            if differ:
                bad += 1
                print(f"{name}: output {tag}: columns {differ} differ")
        if _losses(ra) != _losses(rb):
            bad += 1
            print(f"{name}: the training losses of its log differ")
    print(f"runs: {len(names)} shared by name, {bad} differing file(s)")
    return bad


def _losses(run: RunDir) -> list:
    return [(e["step"], e["loss"]) for e in run.log_entries() if "loss" in e]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    h = sub.add_parser("help")
    h.add_argument("out", type=Path)
    r = sub.add_parser("report")
    r.add_argument("root", type=Path)
    r.add_argument("out", type=Path)
    r.add_argument("--ci", action="store_true")
    r.add_argument("--as-written", action="store_true")
    r.add_argument("--also", type=Path, action="append", default=[])
    for p in (h, r):
        p.add_argument("--code", type=Path, default=ROOT)
    for name in ("compare", "runs"):
        c = sub.add_parser(name)
        c.add_argument("a", type=Path)
        c.add_argument("b", type=Path)
    args = ap.parse_args()
    if args.what == "help":
        snapshot_help(args.code, args.out)
    elif args.what == "report":
        snapshot_report(args.code, args.root, args.out, args.ci, args.as_written, args.also)
    else:
        sys.exit(1 if (compare if args.what == "compare" else compare_runs)(args.a, args.b) else 0)


if __name__ == "__main__":
    main()
