"""Several GPUs of one host through the command line: extraction and oracle training under
``torchrun`` against one GPU, in the same run.

    python bench/bench_ddp.py --gpus 2                    # ResNet-50 and ViT-B/16@384
    python bench/bench_ddp.py --gpus 4 --models resnet --images 32000
    python bench/bench_ddp.py --gpus 2 --eager            # + the eager DDP step beside the graph
    python bench/bench_ddp.py --gpus 2 --decode gpu --extract-only   # JPEGs decoded on each GPU

Per model (oracle and classifier of the same architecture, as <RSN,RSN> / <ViT,ViT>; random init,
so no hub is needed: speed does not depend on the weights), on --images ImageNet-shaped JPEGs
(bench/make_jpegs.py) or --data:

  extract  ``cli.py extract --split train --flip-view`` in one process, then under
           ``torchrun --nproc-per-node N``: the steady img/s extract records (after its first
           batch) and the ratio.
  train    ``cli.py train-oracle`` (SS, bf16, one epoch, 5% held out) at one GPU x batch 40
           (graphed), N GPUs x 40 per GPU (global batch 40 N) and N GPUs at the paper's global
           batch 40 (40 / N per GPU): the median of the logged img/s windows (the first window,
           with the capture, left out), the step path run.json records, and the ratio against
           one GPU.  ``--eager`` adds each N-GPU point with ``--cuda-graph off``.

Targets: >= 1.8x one GPU at 40 per GPU on 2 GPUs; faster than one GPU at the
paper's global batch; extraction >= 1.8x on 2.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cache.reader import ClassifierCache  # noqa: E402
from cache.runs import RunDir  # noqa: E402

CLI = str(ROOT / "cli.py")


def launcher(gpus: int, port: int) -> list[str]:
    if gpus == 1:
        return [sys.executable, CLI]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            str(gpus), "--master-port", str(port), CLI]


def call(cmd: list, log: Path) -> float:
    """Run one command (output to ``log``); its wall seconds.  A failure stops the benchmark
    with the command's last lines."""
    t0 = time.perf_counter()
    with open(log, "w") as out:
        done = subprocess.run([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT,
                              env={**os.environ, "OMP_NUM_THREADS": "4"})
    if done.returncode:
        sys.exit(f"bench_ddp: {' '.join(map(str, cmd[-12:]))} failed:\n"
                 + "\n".join(log.read_text().splitlines()[-20:]))
    return time.perf_counter() - t0


def model_options(data: Path) -> list[str]:
    """Random init over the tree's own classes: right on ~1/K of the rows (train-oracle refuses a
    split a 1000-way random classifier gets all wrong); fewer than 1,000 wnid folders are
    listed in classes.txt, the classifier's output order."""
    classes = sorted(p.name for p in (data / "train").iterdir() if p.is_dir())
    if len(classes) != 1000 and not (data / "classes.txt").exists():
        (data / "classes.txt").write_text("\n".join(classes) + "\n")
    return ["--random-init", "--model-kwargs", json.dumps({"num_classes": len(classes)})]


def extract(model: str, data: Path, out: Path, gpus: int, opts: list, decode: str,
            work: Path) -> dict:
    """``opts``: the options every command of the benchmark shares (models, --compile);
    ``decode``: extract's --decode (the training commands read the cache, not JPEGs)."""
    cmd = [*launcher(gpus, 29600 + gpus), "extract", "--classifier", model, *opts,
           "--data", data, "--out", out, "--split", "train", "--split", "val", "--flip-view",
           "--decode", decode, "--precision", "bf16", "--no-progress"]
    wall = call(cmd, work / f"extract-{model}-{gpus}.log")
    summary = ClassifierCache.open(out / model / "train").manifest["summary"]
    # extract's manifests before steady_rows existed held rank 0's steady rate alone
    scope = "all processes" if "steady_rows" in summary else "rank 0 only"
    return {"gpus": gpus, "wall_s": round(wall, 1), "rows": summary["computed_rows"],
            "img_per_s": summary["img_per_s"], "steady_img_per_s": summary["steady_img_per_s"],
            "steady_scope": scope}


def train(model: str, data: Path, cache: Path, run: Path, gpus: int, batch: int, graph: str,
          opts: list, work: Path) -> dict:
    cmd = [*launcher(gpus, 29700 + gpus), "train-oracle", "--classifier", model, "--oracle",
           model, *opts, "--data", data, "--cache", cache, "--out", run, "--loss", "ss",
           "--batch-size", batch, "--epochs", 1, "--precision", "bf16", "--log-every", 10,
           "--cuda-graph", graph, "--no-progress", "--eval-split", "val"]
    wall = call(cmd, work / f"train-{model}-{gpus}-{batch}-{graph}.log")
    rd = RunDir(run)
    rates = [e["img_per_s"] for e in rd.log_entries() if "img_per_s" in e][1:]
    return {"gpus": gpus, "global_batch": batch, "per_gpu_batch": batch // gpus,
            "requested": graph, "step_path": rd.read()["step_path"]["mode"],
            "img_per_s": round(float(np.median(rates)), 1) if rates else None,
            "windows": len(rates), "wall_s": round(wall, 1)}


def bench_model(model: str, data: Path, a, work: Path) -> dict:
    opts = [*model_options(data), *(["--compile"] if a.compile else [])]
    one = extract(model, data, work / f"cache1-{a.decode}", 1, opts, a.decode, work)
    many = extract(model, data, work / f"cache{a.gpus}-{a.decode}", a.gpus, opts, a.decode, work)
    points = [] if a.extract_only else [(1, 40, "auto"), (a.gpus, 40 * a.gpus, "auto"),
                                        (a.gpus, 40, "auto")]
    if a.eager and points:
        points += [(a.gpus, 40 * a.gpus, "off"), (a.gpus, 40, "off")]
    runs = [train(model, data, work / f"cache1-{a.decode}", work / f"run-{model}-{g}-{b}-{m}",
                  g, b, m, opts, work) for g, b, m in points]
    base = runs[0]["img_per_s"] if runs else None
    for r in runs:
        r["vs_one_gpu"] = round(r["img_per_s"] / base, 2) if base and r["img_per_s"] else None
    return {"extract": {"one": one, "many": many, "ratio": round(
        many["steady_img_per_s"] / one["steady_img_per_s"], 2)}, "train": runs}


def generated(data: Path, images: int) -> Path:
    """``images`` training JPEGs (and 1/40 as many for val) in ``data``, generated once per
    --workdir: a second benchmark there (another --decode) reads the same files."""
    from bench.make_jpegs import generate
    done = data / "generated.json"
    if done.exists() and json.loads(done.read_text()).get("train") == images:
        return data
    shutil.rmtree(data, ignore_errors=True)
    info = generate(data, images, max(200, images // 40), classes=10, seed=0,
                    procs=max(1, (os.cpu_count() or 2) - 1))
    done.write_text(json.dumps(info))
    return data


def command(argv: list[str]) -> str:
    """The command line that reproduces the figures: without where it wrote them (--json,
    --workdir, given as ``--opt value`` or ``--opt=value``)."""
    kept, args = [], iter(argv)
    for arg in args:
        name = arg.split("=")[0]
        if name in ("--json", "--workdir"):
            if "=" not in arg:
                next(args, None)        # its value
            continue
        kept.append(arg)
    return " ".join(["python bench/bench_ddp.py", *kept])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--models", default="resnet,vit", help="presets: resnet (ResNet-50), vit "
                    "(ViT-B/16@384)")
    ap.add_argument("--images", type=int, default=16000, help="training JPEGs to generate")
    ap.add_argument("--data", type=Path, default=None, help="an ImageFolder root instead")
    ap.add_argument("--compile", action="store_true", help="--compile for extract and train")
    ap.add_argument("--eager", action="store_true", help="also the eager DDP step")
    ap.add_argument("--decode", default="cpu", choices=("cpu", "gpu", "mixed", "hw", "hw-mixed"),
                    help="extract's --decode: where the JPEGs are decoded (gpu: on each "
                    "process's own device, so the host's cores stop bounding the extraction)")
    ap.add_argument("--extract-only", action="store_true", help="extraction alone, no "
                    "training points")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    import torch
    if torch.cuda.device_count() < a.gpus:
        sys.exit(f"bench_ddp: --gpus {a.gpus} but {torch.cuda.device_count()} CUDA device(s)")
    work = a.workdir or Path(tempfile.mkdtemp(prefix="bench_ddp_"))
    work.mkdir(parents=True, exist_ok=True)
    data = a.data or generated(work / "jpegs", a.images)
    report = {"device": torch.cuda.get_device_name(0), "gpus": a.gpus, "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d"), "images": a.images, "compile": a.compile,
              "decode": a.decode, "cpus": os.cpu_count(),
              "command": command(sys.argv[1:]), "models": {}}
    print(f"bench_ddp: {a.gpus}x {report['device']}, torch {torch.__version__}, "
          f"{a.images:,} training JPEGs, --decode {a.decode}, bf16"
          f"{', --compile' if a.compile else ''}")
    for model in a.models.split(","):
        res = report["models"][model] = bench_model(model, data, a, work)
        ex = res["extract"]
        print(f"\n{model}: extract train+flip {ex['one']['steady_img_per_s']} img/s on 1 GPU, "
              f"{ex['many']['steady_img_per_s']} on {a.gpus}: {ex['ratio']}x")
        for r in res["train"]:
            print(f"  train {r['gpus']} GPU(s) x {r['per_gpu_batch']} (global {r['global_batch']}"
                  f", {r['step_path']}): {r['img_per_s']} img/s, {r['vs_one_gpu']}x one GPU")
        if a.json:
            a.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
