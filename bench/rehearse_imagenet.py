"""Rehearse docs/IMAGENET.md on this machine at a chosen scale, measure every step, and project
each to full ImageNet and to the paper's grid.

    python bench/rehearse_imagenet.py --out /scratch/rehearsal --keep       # 100k/10k, GPU
    python bench/rehearse_imagenet.py --out R --launch "torchrun --standalone --nproc-per-node 2"
    python bench/rehearse_imagenet.py --out R --tiny --train 300 --val 60 --classes 10  # CPU test

1. An ImageNet-layout tree (bench/rehearse_data.py): --train/--val distinct JPEGs over --classes
   real wnids, labelled with the runbook's classifiers' own predictions on --right of the rows.
2. The runbook's ```bash blocks AS WRITTEN (bench/runbook.py parses them, as tests/test_runbook.py
   does), the settings block's variables set for a smaller grid (one seed, SS, no broadcast runs,
   one corruption; --set VAR=VALUE changes any), each cli.py command through
   bench/rehearse_shim.py (random-init presets, or tiny stand-ins with --tiny; an attack slice of
   --attack-rows; fine-tuned runs on --train-rows rows) which measures it.
3. Per step (commands grouped by step and model): wall time, rows/s, peak RSS of the process tree,
   peak GPU memory (nvidia-smi), bytes written, and the step at ImageNet scale (1,281,167 train /
   50,000 val; the scaling rule is in the JSON); the paper's grid from those.  Written to --json
   (default <out>/rehearsal.json) with the device, date, torch and sizes; a table is printed.
   `python bench/runbook_table.py` turns a committed copy into the runbook's time table.
Runbook sections run (--steps): extract (1), train (2), report (3), corrupt (4), attack (6),
head-only (8), and stylized (7, not by default); section 5 needs weight files and is not run.
The runbook's outputs start afresh each time (a resumed step would time its skip), unless
--continue runs further --steps after an earlier --keep call (e.g. two device commands of under
10 minutes each); the generated tree is reused by a later call with the same settings, refused
with other ones.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import rehearse_plan as plan  # noqa: E402
from bench.runbook import bash_blocks, section, shell_script  # noqa: E402

SECTIONS = {"extract": "1", "train": "2", "report": "3", "corrupt": "4", "attack": "6",
            "stylized": "7", "head-only": "8"}
DEFAULT_STEPS = "extract,train,report,corrupt,attack,head-only"
NEEDS = {"train": {"extract"}, "report": {"extract", "train"}, "corrupt": {"extract", "train"},
         "attack": {"extract", "train"}, "stylized": {"extract", "train"}}
GRID = {"CLASSIFIERS": "vit resnet", "ORACLES": "vit resnet", "SEEDS": "0", "LOSSES": "ss",
        "BROADCAST_LOSSES": "", "CORRUPTIONS_C": "defocus_blur", "PREP": "paper"}
SETTINGS, DATA, RUNBOOK, LOG = "rehearsal-settings.json", "imagenet", "runbook", "commands.jsonl"
OWN = {SETTINGS, DATA, RUNBOOK, LOG, "rehearsal.json", "runbook.log", "tiny", "runbook.sh",
       "staging"}
TINY = {"vit": ("vit_tiny_patch16_224", {"img_size": 32, "patch_size": 8, "depth": 2,
                                          "embed_dim": 48, "num_heads": 2}, (0.5,) * 3),
        "resnet": ("resnet10t", {}, (0.45,) * 3)}


class Refused(Exception):
    """A user's mistake: one message, exit 1, nothing generated."""


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, help="the rehearsal's folder (required unless --replan)")
    p.add_argument("--train", type=int, default=100_000)
    p.add_argument("--val", type=int, default=10_000)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--right", type=float, default=0.9, help="share of rows labelled with a "
                   "classifier's prediction, the classifiers taking turns (each of n is right on "
                   ">= right/n); the other rows fill the --classes folders (rehearse_data.py)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--attack-rows", type=int, default=300)
    p.add_argument("--train-rows", type=int, default=20_000, help="rows per fine-tuned run "
                   "(train-oracle --max-samples; 0: the whole split)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    p.add_argument("--steps", default=DEFAULT_STEPS, help=f"of {','.join(SECTIONS)}")
    p.add_argument("--launch", default="python", help="the runbook's LAUNCH")
    p.add_argument("--set", action="append", default=[], metavar="VAR=VALUE",
                   help="a settings-block variable (e.g. ORACLES=vit)")
    p.add_argument("--tiny", action="store_true", help="tiny models (CPU test)")
    p.add_argument("--keep", action="store_true", help="keep the JPEGs and the runbook's outputs")
    p.add_argument("--continue", dest="cont", action="store_true", help="run --steps after those "
                   "of an earlier --keep call with the same settings (one JSON for all of them)")
    p.add_argument("--procs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--replan", type=Path, default=None, metavar="JSON", help="re-project a "
                   "stored rehearsal's measurements with this version's model (rewrites it)")
    p.add_argument("--train-bench", type=Path, default=None, metavar="JSON", help="with --replan: "
                   "bench_train.py's JSON, the training rate of fine-tuned runs whose commands "
                   "recorded none")
    a = p.parse_args(argv)
    if a.out is None and a.replan is None:
        p.error("--out is required (or --replan JSON)")
    return a


def settings(a: argparse.Namespace) -> dict:
    steps = [s.strip() for s in a.steps.split(",") if s.strip()]
    unknown = [s for s in steps if s not in SECTIONS]
    if unknown:
        raise Refused(f"--steps {','.join(unknown)}: unknown; choose from {','.join(SECTIONS)}")
    grid = dict(GRID)
    for item in a.set:
        name, sep, value = item.partition("=")
        if not sep or name not in GRID:
            raise Refused(f"--set {item}: expected VAR=VALUE with VAR one of {', '.join(GRID)}")
        grid[name] = value
    if a.classes < 2 or a.train < 1 or a.val < 1 or not 0 <= a.right <= 1:
        raise Refused("--classes must be >= 2, --train/--val >= 1, --right in [0, 1]")
    return {"train": a.train, "val": a.val, "classes": a.classes, "right": a.right,
            "seed": a.seed, "attack_rows": a.attack_rows, "train_rows": a.train_rows,
            "tiny": a.tiny, "grid": grid, "launch": a.launch, "steps": steps}


def check_steps(s: dict, done: list[str]) -> None:
    """Each step's earlier sections run in this call or (--continue) in the earlier ones."""
    again = sorted(set(s["steps"]) & set(done))
    if again:
        raise Refused(f"--continue --steps {','.join(again)}: run before in this --out (a re-run "
                      "would time the runbook skipping its complete work); leave them out")
    for step in s["steps"]:
        missing = NEEDS.get(step, set()) - set(s["steps"]) - set(done)
        if missing:
            raise Refused(f"--steps {step} needs {','.join(sorted(missing))} (the runbook's "
                          "earlier sections) in this call, or before it with --keep and then "
                          "--continue: add them")


def claim(out: Path, s: dict, cont: bool) -> bool:
    """Check --out before anything is written; True when its generated tree can be reused."""
    record = out / SETTINGS
    old = json.loads(record.read_text()) if record.is_file() else None
    if cont and (old is None or not (out / RUNBOOK).is_dir()):
        raise Refused(f"--continue: --out {out} holds no kept rehearsal (run one with --keep)")
    check_steps(s, old.get("done", []) if cont else [])
    if cont:
        s["done"] = old.get("done", [])
    if old is not None:
        data_keys = ("train", "val", "classes", "right", "seed", "tiny")   # what the tree depends on
        diff = [f"{k} {old.get(k)} (now {s[k]})" for k in data_keys if old.get(k) != s[k]]
        diff += [f"{k} {old['grid'].get(k)!r} (now {s['grid'][k]!r})" for k in ("CLASSIFIERS", "PREP")
                 if old.get("grid", {}).get(k) != s["grid"][k]]
        if diff:
            raise Refused(f"--out {out} holds a rehearsal with other settings: {', '.join(diff)}; "
                          "use the same settings to reuse its images, or another --out")
        return (out / DATA / ".complete").is_file()
    foreign = [p.name for p in out.iterdir() if p.name not in OWN] if out.is_dir() else []
    if foreign:
        raise Refused(f"--out {out} is not empty and holds no rehearsal ({', '.join(foreign[:3])}"
                      "): choose a new or empty folder")
    return False


def check_disk(out: Path, s: dict, reuse: bool) -> dict:
    need = plan.disk_needed(s)
    total = need["total"] - (need["jpegs"] if reuse else 0)
    where, free = plan.free_bytes(out)
    if free < total:
        parts = ", ".join(f"{k} {v / 1e9:.2f} GB" for k, v in need.items() if k != "total")
        raise Refused(f"--out {out}: the rehearsal needs ~{total / 1e9:.2f} GB ({parts}, +10%) "
                      f"but {where} has {free / 1e9:.2f} GB free; free space there, choose an "
                      "--out on a larger disk, or lower --train/--val")
    return need


def tiny_checkpoints(folder: Path) -> Path:
    from pipeline.classifier.fit import save_checkpoint
    from pipeline.core.models import DataConfig, ModelSpec, build_model
    folder.mkdir(parents=True, exist_ok=True)
    for name, (model, kwargs, mean) in TINY.items():
        spec = ModelSpec(model, {**kwargs, "num_classes": 1000}, None, True)
        data_cfg = DataConfig((3, 32, 32), "bilinear", 1.0, "center", mean, (0.25,) * 3)
        save_checkpoint(folder / f"{name}.pth", build_model(spec, seed=0), spec, data_cfg,
                        {"note": "tiny stand-in for a rehearsal on the CPU"})
    return folder


def make_data(out: Path, s: dict, a, env: dict, reuse: bool) -> dict:
    from bench.rehearse_data import generate, rate_probe, record
    data = out / DATA
    if reuse:
        info = json.loads((data / ".complete").read_text())
        print(f"reusing the {info['images']:,} JPEGs of {data} (same settings)")
        return info
    shutil.rmtree(data, ignore_errors=True)          # a tree without .complete is ours, partial
    images, rate = s["train"] + s["val"], rate_probe()
    print(f"generating {images:,} JPEGs on {a.procs} processes: ~{images / rate / a.procs / 60:.1f}"
          f" min at {rate:.0f} img/s per process measured now, then one extract per classifier "
          "to label them", flush=True)
    info = generate(data, s, a.procs, env)
    record(data, info)
    print(f"accuracy of the classifiers on the labels: {info['accuracy']}")
    return info


def shim_env(out: Path, s: dict, a, tiny: Path | None) -> dict:
    # the repository first, the caller's PYTHONPATH kept (packages installed with --target)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "REHEARSE_DISK_ROOT": str(out / RUNBOOK), "PYTHONPATH": path,
           "REHEARSE_ATTACK_ROWS": str(s["attack_rows"]),
           "REHEARSE_TRAIN_ROWS": str(s["train_rows"] or "")}
    env.pop("REHEARSE_LOG", None)
    if tiny:
        env["REHEARSE_TINY"] = str(tiny)
    if a.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def run_runbook(out: Path, s: dict, env: dict) -> tuple[int, list[dict]]:
    runbook, log = out / RUNBOOK, out / LOG
    if "done" not in s:          # afresh, but after --continue: a resumed step would time its skip
        shutil.rmtree(runbook, ignore_errors=True)
        log.unlink(missing_ok=True)
    wanted = {SECTIONS[name] for name in s["steps"]}
    body = "\n".join(code for heading, code in bash_blocks()[1:] if section(heading) in wanted)
    overrides = {"IMAGENET": out / DATA, "IMAGENET_C": runbook / "imagenet-c-local",
                 "STYLIZED": out / DATA, "OUT": runbook, "LAUNCH": s["launch"], **s["grid"]}
    script = out / "runbook.sh"
    script.write_text(shell_script(body, overrides, sys.executable, ROOT / "bench" /
                                   "rehearse_shim.py"))
    env = {**env, "REHEARSE_LOG": str(log)}
    with open(out / "runbook.log", "w") as fh:
        proc = subprocess.Popen(["bash", str(script)], cwd=out, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for line in proc.stdout:
            fh.write(line)
            if line.startswith("+ "):
                print(f"[{time.strftime('%H:%M:%S')}] {line.rstrip()}", flush=True)
        rc = proc.wait()
    records = [json.loads(x) for x in log.read_text().splitlines()] if log.is_file() else []
    return rc, records


def environment(device: str) -> dict:
    import torch
    name = (torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "cpu")
    return {"device": device, "device_name": name,
            "gpus": torch.cuda.device_count() if device == "cuda" else 0,
            "cpus": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def replan(path: Path, bench: Path | None) -> int:
    try:
        result = plan.replan_files(path, bench)
    except ValueError as err:                  # a file that is not what --replan reads
        print(f"error: {err}", file=sys.stderr)
        return 1
    path.write_text(json.dumps(result, indent=2))
    print(plan.table(result))
    print(f"\nrewrote {path}")
    return 0


def main(argv=None) -> int:
    a = parse(argv)
    if a.replan:
        return replan(a.replan, a.train_bench)
    try:
        s = settings(a)
        out = a.out.resolve()
        reuse = claim(out, s, a.cont)
        need = check_disk(out, s, reuse)
    except Refused as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    import torch
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    out.mkdir(parents=True, exist_ok=True)
    (out / SETTINGS).write_text(json.dumps(s, indent=2))
    env = shim_env(out, s, a, tiny_checkpoints(out / "tiny") if s["tiny"] else None)
    info = make_data(out, s, a, env, reuse)
    rc, records = run_runbook(out, s, env)
    if rc == 0:
        s["done"] = s.get("done", []) + s["steps"]
        (out / SETTINGS).write_text(json.dumps(s, indent=2))
    measured = plan.steps([r for r in records if r["rc"] == 0], s) if records else []
    result = {"status": "complete" if rc == 0 else "failed",
              "command": shlex.join(["python", "bench/rehearse_imagenet.py", *sys.argv[1:]]),
              "environment": environment(device),
              "settings": s, "generation": info, "disk_estimate_bytes": need,
              "sources": {"rss": "bench/proctree.py: the command's process tree, every 0.1 s "
                          "(RSS summed: an upper bound; PSS summed: shared pages once)",
                          "gpu": "nvidia-smi memory.used, all GPUs, every 0.5 s, minus before",
                          "disk": "bytes added under the runbook's OUT by the command"},
              "steps": measured, "grid": plan.grid(measured), "commands": records}
    path = a.json or out / "rehearsal.json"
    path.write_text(json.dumps(result, indent=2))
    if measured:
        print(plan.table(result))
    if not a.keep:
        for name in (DATA, RUNBOOK, "tiny", SETTINGS):
            target = out / name
            shutil.rmtree(target, ignore_errors=True) if target.is_dir() else \
                target.unlink(missing_ok=True)
    if rc != 0:
        failed = next((" ".join(r["argv"]) for r in records if r["rc"]), "its shell")
        print(f"error: the runbook stopped (exit {rc}) at `cli.py {failed}`; its output: "
              f"{out / 'runbook.log'}; what was measured before: {path}", file=sys.stderr)
        return 1
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
