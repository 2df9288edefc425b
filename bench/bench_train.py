"""Benchmark of stage-2 oracle training: the step eager and CUDA-graphed, the authors' style, peak
memory and the paper's grid projected from what was measured, all in the same run.

    python bench/bench_train.py                          # CUDA: ViT-B/16@224, @384, ResNet-50
    python bench/bench_train.py --data /jpegs            # an ImageNet-shaped JPEG folder
    python bench/bench_train.py --models resnet50 --fill-batch 512 --steps 60
    python bench/bench_train.py --tiny                   # CPU smoke run (tiny models, ~1 min)

--data takes any ImageFolder root (ROOT/train/<class>/*.JPEG, e.g. from bench/make_jpegs.py);
without it, bench/make_jpegs.py generates --images JPEGs into a temporary folder.  Models are
random-init (no hub needed): speed does not depend on the weights.

Measured per model (the oracle and the classifier share the architecture, as <ViT,ViT>/<RSN,RSN>),
at a GPU-filling batch (256; halved until it fits) and at the paper's batch of 40:
  eager / graph  the project's training step (pipeline.oracle.finetune.step.train_step, and the same
              step captured in one CUDA graph, pipeline.oracle.finetune.graph): targets from RAM (no
              classifier), uint8 loader, normalise + flip on the device, bf16, channels_last;
              "e2e" with the loader, "resident" on one batch already on the device
  authors     the authors' style at batch 40: PIL decode + Resize((s,s)) + flip + float
              normalise in the workers, fp32, the frozen classifier's forward every step
  infer       bf16 inference of the classifier (extraction, validation and scoring cost)
  memory      peak GPU memory of the step per (batch, precision, path), and the largest batch
              that fits a 40 GB card (fitted from two batch sizes, then verified by training at it
              with the process limited to 40 GB)
The ratio batch-40 img/s / fill-batch img/s is printed per path (the goal: >= 0.8 graphed).
The projection is the paper's grid with the presets' models: 4 <O,C> pairs of {ViT-B/16@384,
ResNet-50@224} x 4 losses = 16 one-epoch runs over ImageNet train (1,281,167 images, 5% held
out and validated 4 times) plus scoring val (50,000), one GPU, plus one extraction of train
(+ its flipped view) and val per classifier; beside it the authors' style at batch 40.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.grid_hours import N_TRAIN, N_VAL, grid_parts  # noqa: E402
from bench.train_parts import (PRESET_MODELS, TINY, authors_step, classifier_infer,  # noqa: E402
                               fast_objects, forward_flops, make_jpegs, random_resident,
                               random_targets, spec, timed)
from pipeline.core.timing import device_name  # noqa: E402
from pipeline.data.images import ImageRows, ResizeCrop  # noqa: E402
from pipeline.data.loader import default_workers, make_loader  # noqa: E402
from pipeline.data.sources import list_split  # noqa: E402
from pipeline.oracle.finetune.graph import choose_step  # noqa: E402
from pipeline.oracle.settings.sampler import (StepSchedule, loader_batches,  # noqa: E402
                                              micro_slices)

GB40 = 40 * 1000**3          # an A100-40GB: 40 GB of device memory
BF16_PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}   # dense, datasheets


def bench_step(ms, samples, batch: int, path: str, precision: str, a, device) -> dict:
    """img/s of the step with its loader (e2e) and on a resident batch, and its peak memory."""
    objs, data_cfg = fast_objects(ms, device, precision, compile_=path == "compiled")
    step_fn, record = choose_step(objs, "off" if path == "eager" else "on", 1)
    n, total = len(samples), a.warmup + a.steps
    if n < batch:
        raise SystemExit(f"--data has {n} images, fewer than the batch {batch}")
    targets = random_targets(n)
    schedule = StepSchedule(np.arange(n), batch, math.ceil(2 * total / (n // batch)), 0, True)
    slices = micro_slices(batch, 1, 0, 1)
    loader = make_loader(ImageRows(samples, ResizeCrop(data_cfg)),
                         loader_batches(schedule, 0, slices)[:2 * total], a.workers,
                         pin_memory=device.type == "cuda")
    it, counter = iter(loader), iter(range(10**9))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    e2e = timed(lambda: step_fn(objs, it, next(counter), schedule, slices, targets),
                a.warmup, a.steps, batch, device)
    first = next(it)                  # the loader's next batch, fed again and again
    rows = first[1].numpy()
    resident = iter(lambda: first, None)
    fixed = StepSchedule(rows, batch, 10**6, 0, True)
    fixed.batch_rows = lambda step: rows
    gpu = timed(lambda: step_fn(objs, resident, next(counter), fixed, slices, targets),
                a.warmup, a.steps, batch, device)
    peak = torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None
    return {"e2e": e2e, "resident": gpu, "peak_gb": peak, "path": record["mode"]}


def peak_only(ms, batch: int, path: str, precision: str, device, steps: int = 3,
              limit: float | None = None) -> float | None:
    """Peak GB of ``steps`` steps on a random resident batch; None if it ran out of memory
    (``limit``: the process may use at most this many bytes of the device)."""
    torch.cuda.empty_cache()
    device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, (limit or total) / total), device)
    torch.cuda.reset_peak_memory_stats(device)
    try:
        objs, data_cfg = fast_objects(ms, device, precision)
        step_fn, _ = choose_step(objs, "off" if path == "eager" else "on", 1)
        feed, sched = random_resident(batch, data_cfg.input_size)
        for s in range(steps):
            step_fn(objs, feed, s, sched, micro_slices(batch, 1, 0, 1), random_targets(batch))
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) / 1e9
    except torch.cuda.OutOfMemoryError:
        return None
    finally:
        objs = step_fn = None
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(1.0, device)


def largest_batch_40gb(ms, points: dict[int, float], path: str, device) -> dict:
    """Fit peak = a + b * batch through two measured points, then verify under a 40 GB cap
    (stepping down 10% per failure); a multiple of 8."""
    (b1, m1), (b2, m2) = sorted(points.items())[:1] + sorted(points.items())[-1:]
    slope = (m2 - m1) / (b2 - b1)
    guess = int(((GB40 / 1e9 - m1) / slope + b1) // 8 * 8)
    for _ in range(4):
        peak = peak_only(ms, guess, path, "bf16", device, limit=GB40)
        if peak is not None:
            return {"batch": guess, "peak_gb": round(peak, 1), "verified": True,
                    "gb_per_image": round(slope, 3)}
        guess = int(guess * 0.9 // 8 * 8)
    return {"batch": guess, "verified": False, "gb_per_image": round(slope, 3)}


def bench_model(name: str, samples, a, device) -> dict:
    ms, cuda = spec(name, a.tiny), device.type == "cuda"
    paths = (("eager", "graph") + (("compiled",) if a.compile else ())) if cuda else ("eager",)
    out = {"steps": {}, "memory": {}}
    fill = a.fill_batch
    while True:    # the largest power-of-two share of --fill-batch that fits
        try:
            out["steps"]["fill"] = {p: bench_step(ms, samples, fill, p, "bf16", a, device)
                                    for p in paths}
            break
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            fill //= 2
            print(f"  {name}: out of memory, fill batch {fill}", flush=True)
    out["fill_batch"] = fill
    out["steps"]["paper"] = {p: bench_step(ms, samples, 40, p, "bf16", a, device) for p in paths}
    for p in paths:
        f, s = out["steps"]["fill"][p], out["steps"]["paper"][p]
        print(f"  {name} {p}: batch {fill} {f['e2e']:,.0f} img/s (resident {f['resident']:,.0f}),"
              f" batch 40 {s['e2e']:,.0f} (resident {s['resident']:,.0f}): ratio "
              f"{s['e2e'] / f['e2e']:.2f}", flush=True)
    out["authors"] = authors_step(ms, samples, 40, a, device)
    out["infer"] = classifier_infer(ms, a.fill_batch, a, device)
    out["train_gflop_per_img"] = 3 * forward_flops(ms) / 1e9      # forward + backward ~ 3x
    if cuda:
        for prec in a.precisions:
            for p in ("eager", "graph"):
                out["memory"][f"{prec}/{p}"] = {
                    b: peak_only(ms, b, p, prec, device) for b in sorted({40, fill})}
        pts = {b: v for b, v in out["memory"]["bf16/graph"].items() if v is not None}
        if len(pts) == 2:
            out["max_batch_40gb"] = largest_batch_40gb(ms, pts, "graph", device)
    return out


def project(res: dict, a) -> dict:
    """Hours of the paper's grid on one device from the preset models' measured img/s."""
    o_models = [m for m in PRESET_MODELS if m in res]
    if len(o_models) < 2:
        return {}

    def grid(key: str, paths) -> float:
        return sum(grid_parts(res, key, paths, o_models).values())

    def authors_pair(o, c):      # swap the classifier's fp32 forward cost into the measured e2e
        r, rc = res[o]["authors"], res[c]["authors"]
        per_img = 1 / r["e2e"] - 1 / r["classifier_fp32"] + 1 / rc["classifier_fp32"]
        return 4 * (N_TRAIN * per_img + N_VAL * (1 / r["classifier_fp32"] + 1 / rc["classifier_fp32"]))

    out = {"runs": 4 * len(o_models) ** 2, "models": o_models,
           "authors_h": sum(authors_pair(o, c) for o in o_models for c in o_models) / 3600}
    for label, paths in (("eager", ("eager",)), ("graph", ("graph",)),
                         ("fastest", ("eager", "graph", "compiled"))):
        if all(set(paths) & set(res[o]["steps"]["paper"]) for o in o_models):
            out[f"{label}_paper_h"] = grid("paper", paths)
            out[f"{label}_fill_h"] = grid("fill", paths)
            if label == "fastest":          # where the hours go
                out["fastest_paper_parts_h"] = grid_parts(res, "paper", paths, o_models)
    out["fastest_paths"] = {o: max(res[o]["steps"]["paper"].items(), key=lambda kv: kv[1]["e2e"])[0]
                            for o in o_models}
    return out


def print_table(res: dict, proj: dict, a, device) -> None:
    name = device_name(device)
    peak = next((v for k, v in BF16_PEAK_TFLOPS.items() if k in name), None)
    print(f"\n## Oracle training ({name}, {time.strftime('%Y-%m-%d')}, torch {torch.__version__},"
          f" {a.workers} workers, bf16)\n")
    print("| model | path | fill batch img/s (resident) | batch 40 img/s (resident) | ratio 40/fill |"
          " batch-40 TFLOP/s (% bf16 peak) | authors' style, batch 40 |")
    print("|---|---|---|---|---|---|---|")
    for m, r in res.items():
        for p, f in r["steps"]["fill"].items():
            s = r["steps"]["paper"][p]
            tf = s["e2e"] * r["train_gflop_per_img"] / 1e3
            mfu = f" ({100 * tf / peak:.0f}%)" if peak else ""
            print(f"| {m} | {p} | {r['fill_batch']}: {f['e2e']:,.0f} ({f['resident']:,.0f}) | "
                  f"{s['e2e']:,.0f} ({s['resident']:,.0f}) | {s['e2e'] / f['e2e']:.2f} | "
                  f"{tf:.0f}{mfu} | {r['authors']['e2e']:,.0f} |")
    print("\nbf16 inference: " + ", ".join(f"{m} {r['infer']:,.0f} img/s" for m, r in res.items()))
    if any(r["memory"] for r in res.values()):
        print("\n| model | precision/path | peak GB by batch | largest batch on a 40 GB card (bf16, graph) |")
        print("|---|---|---|---|")
        for m, r in res.items():
            fit = r.get("max_batch_40gb", {})
            for k, v in r["memory"].items():
                by = ", ".join(f"{b}: {g:.1f}" if g else f"{b}: OOM" for b, g in v.items())
                best = (f"{fit['batch']} ({'verified' if fit['verified'] else 'NOT verified'}, "
                        f"{fit['gb_per_image']} GB/img)") if k == "bf16/graph" and fit else ""
                print(f"| {m} | {k} | {by} | {best} |")
    if proj:
        print(f"\nThe paper's {proj['runs']}-run grid ({' x '.join(proj['models'])}), one device, "
              "extraction included:")
        for path in ("eager", "graph", "fastest"):
            if f"{path}_paper_h" in proj:
                which = (" (" + ", ".join(f"{m}: {p}" for m, p in proj["fastest_paths"].items())
                         + ")") if path == "fastest" else ""
                print(f"  {path}{which}: {proj[f'{path}_paper_h']:.2f} h at batch 40, "
                      f"{proj[f'{path}_fill_h']:.2f} h at the fill batch")
        print(f"  authors' style: {proj['authors_h']:.1f} h at batch 40")


def main() -> None:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=None, help="ImageFolder root (default: generated JPEGs)")
    p.add_argument("--split", default="train")
    p.add_argument("--models", default=None, help="comma-separated timm names")
    p.add_argument("--tiny", action="store_true", help="tiny models and sizes (CPU smoke run)")
    p.add_argument("--fill-batch", type=int, default=None, help="default 256 (CUDA) / 16 (tiny)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 50 / 3 tiny)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps (default 10 / 1 tiny)")
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--images", type=int, default=None, help="generated JPEGs (default 2000 / 64)")
    p.add_argument("--precisions", default="bf16,fp32", help="of the memory table")
    p.add_argument("--compile", action="store_true", help="also time the graphed step with a "
                   "torch.compile'd model (path 'compiled'; a minute or two of compilation)")
    p.add_argument("--json", default=None, help="also write the results here")
    a = p.parse_args()
    a.tiny = a.tiny or not cuda
    a.fill_batch = a.fill_batch or (16 if a.tiny else 256)
    a.steps, a.warmup = a.steps or (3 if a.tiny else 50), a.warmup or (1 if a.tiny else 10)
    a.workers = default_workers() if a.workers is None else a.workers
    a.precisions = a.precisions.split(",")
    models = (a.models.split(",") if a.models else list(TINY) if a.tiny
              else ["vit_base_patch16_224", *PRESET_MODELS])
    device = torch.device("cuda" if cuda else "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(a.data) if a.data else make_jpegs(Path(tmp), a.images or (64 if a.tiny else 2000))
        samples = list_split(str(root), a.split)
        res = {}
        for m in models:        # the JSON after each model: a run cut short keeps what it measured
            res[m] = bench_model(m, samples, a, device)
            write_json(a, device, res, project(res, a))
    proj = project(res, a)
    print_table(res, proj, a, device)
    if not cuda:
        print("\n(CPU smoke run: the loader workers and the step share the same cores, so these "
              "figures only show that the benchmark runs; the targets are for CUDA.)")


def write_json(a, device, res: dict, proj: dict) -> None:
    if a.json:
        Path(a.json).write_text(json.dumps({"device": device_name(device), "date": time.strftime(
            "%Y-%m-%d"), "args": vars(a), "results": res, "projection": proj}, indent=2, default=str))


if __name__ == "__main__":
    main()
