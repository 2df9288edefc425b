"""Benchmark of stage-2 oracle training: the fast path vs the authors' style, in the same run.

    python bench/bench_train.py                          # CUDA: ViT-B/16@224 and ResNet-50
    python bench/bench_train.py --data /jpegs            # an ImageNet-shaped JPEG folder
    python bench/bench_train.py --models resnet50 --fill-batch 512 --steps 60
    python bench/bench_train.py --tiny                   # CPU smoke run (tiny models, ~1 min)

--data takes any ImageFolder root (ROOT/train/<class>/*.JPEG, e.g. from bench/make_jpegs.py); without
it, bench/make_jpegs.py generates --images JPEGs into a temporary folder.  Models are random-init (no hub needed):
speed does not depend on the weights.

Measured per model (the oracle and the classifier share the architecture, as <ViT,ViT>/<RSN,RSN>):
  fast        the project's training step (pipeline.oracle.step.train_step): targets from RAM (no
              classifier), uint8 loader + on-device normalise + flip, bf16 autocast, channels_last,
              torch.compile where it helps (both measured, the faster one is used)
  fast/gpu    the same step on one batch already on the device (the accelerator's ceiling)
  authors     the authors' style: PIL decode + Resize((s,s)) + flip + ToTensor + Normalize in the
              workers, fp32, the frozen classifier's forward on every step to get o, then the step
  infer       bf16 inference of the classifier (what stage 1's extraction costs per image)
at a GPU-filling batch and at the paper's batch 40, img/s, with the fast/authors ratio.  The
projection is the paper's grid: 4 <O,C> pairs x 4 losses = 16 runs of one epoch over ImageNet
train (1,281,167 images) plus scoring val (50,000), one GPU; the fast path adds one extraction of
train (+ flipped view) and val per classifier.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.core import dist  # noqa: E402
from pipeline.core.models import ModelSpec  # noqa: E402
from pipeline.core.precision import autocast, grad_scaler  # noqa: E402
from pipeline.data.images import GpuNormalize, ImageRows, ResizeCrop, make_loader  # noqa: E402
from pipeline.data.sources import list_split  # noqa: E402
from pipeline.oracle.losses import LossConfig  # noqa: E402
from pipeline.oracle.model import build_oracle  # noqa: E402
from pipeline.oracle.sampler import StepSchedule, loader_batches, micro_slices  # noqa: E402
from pipeline.oracle.step import TargetTable, TrainObjects, train_step  # noqa: E402

N_TRAIN, N_VAL = 1_281_167, 50_000
TINY = {"vit_tiny_patch16_224": {"img_size": 64, "depth": 2, "embed_dim": 64, "num_heads": 2},
        "resnet10t": {}}
TINY_DATA = {"input_size": (3, 64, 64), "interpolation": "bilinear", "crop_pct": 1.0,
             "crop_mode": "center", "mean": (0.5,) * 3, "std": (0.5,) * 3}


def spec(name: str, tiny: bool) -> ModelSpec:
    """Random-init model; tiny models also get a 64 px input (CPU smoke runs)."""
    return ModelSpec(name, TINY.get(name, {}) if tiny else {}, None, True, TINY_DATA if tiny else None)


def make_jpegs(root: Path, n: int) -> Path:
    """n ImageNet-shaped JPEGs (bench/make_jpegs.py: real photos, ~500x375, ~100 KB) in
    ROOT/train/<wnid>/, when no --data is given."""
    import os

    from bench.make_jpegs import generate

    generate(root, n, 0, classes=10, seed=0, procs=max(1, (os.cpu_count() or 2) - 1))
    return root


def timed(step, warmup: int, steps: int, images_per_step: int, device) -> float:
    """img/s of ``step()`` over ``steps`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        step()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return steps * images_per_step / (time.perf_counter() - t0)


def fast_objects(ms: ModelSpec, device, compile_: bool):
    model, data_cfg = build_oracle(ms, "hyperplane", "model", 0)
    model = model.to(device).to(memory_format=torch.channels_last)
    step_model = torch.compile(model) if compile_ else model
    opt = torch.optim.SGD(model.parameters(), lr=1e-5, momentum=0.05)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-5, total_steps=10**6,
                                                pct_start=100 / 10**6, cycle_momentum=False)
    objs = TrainObjects(model, step_model, None, opt, sched, grad_scaler("bf16", device),
                        GpuNormalize(data_cfg, device), LossConfig("ss", alpha_pos=1, alpha_neg=3),
                        "bf16", device, dist.DistInfo(), 0.0)
    return objs, data_cfg


def bench_fast(ms: ModelSpec, samples, batch, a, device, compile_: bool) -> dict:
    """The project's step with its loader (e2e) and on a resident batch (gpu)."""
    objs, data_cfg = fast_objects(ms, device, compile_)
    n = len(samples)
    rng = np.random.default_rng(0)
    targets = TargetTable.from_arrays({k: rng.random(n).astype(np.float32).round() if "correct" in k
                                       else rng.random(n).astype(np.float32)
                                       for k in ("correct", "correct_flip", "p_true", "p_true_flip")})
    total = a.warmup + a.steps
    if n < batch:
        raise SystemExit(f"--data has {n} images, fewer than the batch {batch}")
    schedule = StepSchedule(np.arange(n), batch, math.ceil(total / (n // batch)), 0, True)
    slices = micro_slices(batch, 1, 0, 1)
    loader = make_loader(ImageRows(samples, ResizeCrop(data_cfg)),
                         loader_batches(schedule, 0, slices)[:total], a.workers,
                         pin_memory=device.type == "cuda")
    it, counter = iter(loader), iter(range(10**9))
    e2e = timed(lambda: train_step(objs, it, next(counter), schedule, slices, targets),
                a.warmup, a.steps, batch, device)
    images, rows, valid = next(iter(make_loader(ImageRows(samples, ResizeCrop(data_cfg)),
                                                [list(range(batch))], 0, False)))
    schedule.batch_rows = lambda step: np.arange(batch)   # the resident batch's rows, every step
    resident = iter(lambda: (images, rows, valid), None)
    gpu = timed(lambda: train_step(objs, resident, 0, schedule, slices, targets),
                a.warmup, a.steps, batch, device)
    return {"e2e": e2e, "gpu": gpu}


def authors_loader(samples, size: int, batch: int, workers: int, steps: int, pin: bool):
    """The authors' data path: PIL decode, square resize, flip, float tensors from the workers."""
    from PIL import Image
    from torchvision import transforms as T

    tf = T.Compose([T.Resize((size, size)), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize([0.5] * 3, [0.5] * 3)])

    class Folder(torch.utils.data.Dataset):
        def __len__(self):
            return len(samples)

        def __getitem__(self, i):
            with Image.open(samples.path(i)) as im:
                return tf(im.convert("RGB")), int(samples.labels[i])

    sampler = torch.utils.data.RandomSampler(Folder(), replacement=True, num_samples=steps * batch)
    return torch.utils.data.DataLoader(Folder(), batch, sampler=sampler, num_workers=workers,
                                       pin_memory=pin, drop_last=True)


def bench_authors(ms: ModelSpec, samples, batch, a, device) -> dict:
    """fp32, classifier forward each step, CE on sigmoid (the authors' loop), + components."""
    import timm

    classifier = timm.create_model(ms.name, **ms.kwargs).to(device).eval()
    oracle, data_cfg = build_oracle(ms, "linear", "paper", 0)
    oracle = oracle.to(device)
    opt = torch.optim.SGD(oracle.parameters(), lr=1e-5, momentum=0.05)
    size = data_cfg.input_size[-1]

    def step(x, y):
        with torch.no_grad():
            o = (classifier(x).argmax(1) == y).float()
        p = torch.sigmoid(oracle(x))
        loss = (-o * torch.log(p + 1e-7) - (1 - o) * torch.log(1 - p + 1e-7)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    it = iter(authors_loader(samples, size, batch, a.workers, a.warmup + a.steps,
                             device.type == "cuda"))
    e2e = timed(lambda: step(*(t.to(device, non_blocking=True) for t in next(it))),
                a.warmup, a.steps, batch, device)
    x = torch.randn(batch, 3, size, size, device=device)
    y = torch.zeros(batch, dtype=torch.long, device=device)
    gpu = timed(lambda: step(x, y), a.warmup, a.steps, batch, device)
    with torch.no_grad():
        cls_fwd = timed(lambda: classifier(x), a.warmup, a.steps, batch, device)
    del classifier, oracle, opt
    return {"e2e": e2e, "gpu": gpu, "classifier_fp32": cls_fwd}


def bench_infer(ms: ModelSpec, batch, a, device) -> float:
    import timm

    model = timm.create_model(ms.name, **ms.kwargs).to(device).eval()
    model = model.to(memory_format=torch.channels_last)
    size = build_oracle(ms, "linear", "model", 0)[1].input_size
    x = torch.randn(batch, *size, device=device).contiguous(memory_format=torch.channels_last)
    with torch.inference_mode(), autocast("bf16", device):
        return timed(lambda: model(x), a.warmup, a.steps, batch, device)


def project(res: dict, models: list[str]) -> dict:
    """Hours for the paper's grid (every measured oracle x classifier pair, 4 losses, 1 epoch)."""
    def fast(batch_key):
        train = sum(4 * (N_TRAIN / res[o]["fast"][batch_key]["e2e"] + N_VAL / res[o]["infer"])
                    for o in models for _ in models)
        extract = sum((2 * N_TRAIN + N_VAL) / res[c]["infer"] for c in models)  # + flipped view
        return (train + extract) / 3600

    def authors_pair(o, c):  # swap the classifier's fp32 forward cost into the measured e2e
        r = res[o]["authors"]["paper"]
        per_img = 1 / r["e2e"] - 1 / r["classifier_fp32"] + 1 / res[c]["authors"]["paper"]["classifier_fp32"]
        val = N_VAL * (1 / r["classifier_fp32"] + 1 / res[c]["authors"]["paper"]["classifier_fp32"])
        return 4 * (N_TRAIN * per_img + val)

    authors = sum(authors_pair(o, c) for o in models for c in models) / 3600
    return {"runs": 4 * len(models) ** 2, "fast_fill_h": fast("fill"), "fast_paper_batch_h": fast("paper"),
            "authors_h": authors}


def bench_model(ms: ModelSpec, samples, a, device) -> dict:
    out, name = {"fast": {}, "authors": {}}, ms.name
    for key, batch in (("fill", a.fill_batch), ("paper", 40)):
        runs = {"eager": bench_fast(ms, samples, batch, a, device, False)}
        if a.compile:
            runs["compiled"] = bench_fast(ms, samples, batch, a, device, True)
        best = max(runs, key=lambda k: runs[k]["e2e"])
        out["fast"][key] = {**runs[best], "mode": best,
                            "all": {k: {m: round(v, 1) for m, v in r.items()} for k, r in runs.items()}}
        out["authors"][key] = bench_authors(ms, samples, batch, a, device)
        print(f"  {name} batch {batch}: fast {out['fast'][key]['e2e']:.0f} img/s ({best}; "
              f"gpu-resident {out['fast'][key]['gpu']:.0f}), authors {out['authors'][key]['e2e']:.0f}",
              flush=True)
    out["infer"] = bench_infer(ms, a.fill_batch, a, device)
    return out


def print_table(res: dict, proj: dict, device_name: str, a) -> None:
    print(f"\n## Oracle training ({device_name}, {time.strftime('%Y-%m-%d')}, torch "
          f"{torch.__version__}, {a.workers} workers)\n")
    print("| model | batch | fast img/s | fast, batch resident on device | authors' style img/s | ratio |")
    print("|---|---|---|---|---|---|")
    for m, r in res.items():
        for key, batch in (("fill", a.fill_batch), ("paper", 40)):
            f, au = r["fast"][key], r["authors"][key]
            print(f"| {m} | {batch} | {f['e2e']:,.0f} ({f['mode']}) | {f['gpu']:,.0f} | "
                  f"{au['e2e']:,.0f} | {f['e2e'] / au['e2e']:.1f}x |")
    print(f"\nbf16 inference (extraction): " + ", ".join(f"{m} {r['infer']:,.0f} img/s"
                                                        for m, r in res.items()))
    print(f"\nProjected wall time of the paper's {proj['runs']}-run ImageNet grid on one device: "
          f"fast path {proj['fast_fill_h']:.1f} h at batch {a.fill_batch} "
          f"({proj['fast_paper_batch_h']:.1f} h at batch 40, extraction included) vs the authors' "
          f"style {proj['authors_h']:.1f} h at batch 40 ({proj['authors_h'] / proj['fast_fill_h']:.1f}x).")


def main() -> None:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=None, help="ImageFolder root (default: generated JPEGs)")
    p.add_argument("--split", default="train")
    p.add_argument("--models", default=None, help="comma-separated timm names")
    p.add_argument("--tiny", action="store_true", help="tiny models and sizes (CPU smoke run)")
    p.add_argument("--fill-batch", type=int, default=None, help="default 256 (CUDA) / 16 (tiny)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 50 / 4 tiny)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps (default 10 / 1 tiny)")
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--images", type=int, default=None, help="generated JPEGs (default 2000 / 200)")
    p.add_argument("--no-compile", dest="compile", action="store_false", default=cuda)
    p.add_argument("--json", default=None, help="also write the results here")
    a = p.parse_args()
    tiny = a.tiny or not cuda
    from pipeline.data.images import default_workers
    a.fill_batch = a.fill_batch or (16 if tiny else 256)
    a.steps, a.warmup = a.steps or (3 if tiny else 50), a.warmup or (1 if tiny else 10)
    a.workers = default_workers() if a.workers is None else a.workers
    models = a.models.split(",") if a.models else (list(TINY) if tiny else ["vit_base_patch16_224", "resnet50"])
    device = torch.device("cuda" if cuda else "cpu")
    torch.backends.cudnn.benchmark = True
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(a.data) if a.data else make_jpegs(Path(tmp), a.images or (64 if tiny else 2000))
        samples = list_split(str(root), a.split)
        res = {m: bench_model(spec(m, tiny), samples, a, device) for m in models}
    proj = project(res, models)
    name = torch.cuda.get_device_name() if cuda else f"CPU ({platform.processor() or 'unknown'})"
    print_table(res, proj, name, a)
    if not cuda:
        print("\n(CPU smoke run: the loader workers and the step share the same cores, so these "
              "figures only show that the benchmark runs; the targets are for CUDA.)")
    if a.json:
        Path(a.json).write_text(json.dumps({"device": name, "date": time.strftime("%Y-%m-%d"),
                                            "args": vars(a), "results": res, "projection": proj},
                                           indent=2, default=str))


if __name__ == "__main__":
    main()
