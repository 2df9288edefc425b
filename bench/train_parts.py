"""The pieces bench/bench_train.py times: models, the project's step objects, the authors' step,
inference, FLOPs, generated JPEGs."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.core import dist  # noqa: E402
from pipeline.core.models import ModelSpec  # noqa: E402
from pipeline.core.precision import autocast, grad_scaler  # noqa: E402
from pipeline.core.presets import IMAGENET_PRESETS  # noqa: E402
from pipeline.data.images import GpuNormalize  # noqa: E402
from pipeline.core.losses import get  # noqa: E402
from pipeline.oracle.finetune.step import TargetTable  # noqa: E402
from pipeline.oracle.nets.model import build_oracle  # noqa: E402

# the paper's oracles/classifiers (the presets' architectures without their weight tags)
PRESET_MODELS = tuple(IMAGENET_PRESETS[k].split(".")[0] for k in ("vit", "resnet"))
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


def random_resident(batch: int, input_size, pin: bool = False):
    """(feed, schedule) of one random uint8 batch fed again and again at fixed rows: the step's
    GPU cost alone, no loader (``pin``: the batch in page-locked memory, as a loader's)."""
    import numpy as np

    from pipeline.oracle.settings.sampler import StepSchedule
    x = torch.randint(0, 256, (batch, *input_size), dtype=torch.uint8)
    x = x.pin_memory() if pin else x
    rows = np.arange(batch)
    schedule = StepSchedule(rows, batch, 10**6, 0, True)
    schedule.batch_rows = lambda step: rows
    return iter(lambda: (x, torch.from_numpy(rows), None), None), schedule


def fast_objects(ms: ModelSpec, device, precision: str, compile_: bool = False):
    """The project's TrainObjects for one process (SGD + OneCycleLR, as train-oracle builds);
    ``compile_``: the step calls a torch.compile'd model."""
    from pipeline.oracle.finetune.step import TrainObjects

    model, data_cfg = build_oracle(ms, "hyperplane", "model", 0)
    model = model.to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=1e-5, momentum=0.05)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-5, total_steps=10**6,
                                                pct_start=100 / 10**6, cycle_momentum=False)
    objs = TrainObjects(model, torch.compile(model) if compile_ else model, None, opt, sched, grad_scaler(precision, device),
                        GpuNormalize(data_cfg, device), get("ss")({"alpha_pos": 1.0, "alpha_neg": 3.0}),
                        precision, device, dist.DistInfo(), 0.0)
    return objs, data_cfg


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


def authors_step(ms: ModelSpec, samples, batch, a, device) -> dict:
    """fp32, classifier forward each step, CE on sigmoid (the authors' loop); img/s end to end,
    on a resident batch, and of the fp32 classifier forward alone."""
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

    steps = max(2, a.steps // 2)      # fp32 at 384 px is slow: half the steps
    it = iter(authors_loader(samples, size, batch, a.workers, a.warmup + steps,
                             device.type == "cuda"))
    e2e = timed(lambda: step(*(t.to(device, non_blocking=True) for t in next(it))),
                a.warmup, steps, batch, device)
    x = torch.randn(batch, 3, size, size, device=device)
    y = torch.zeros(batch, dtype=torch.long, device=device)
    gpu = timed(lambda: step(x, y), a.warmup, steps, batch, device)
    with torch.no_grad():
        cls_fwd = timed(lambda: classifier(x), a.warmup, steps, batch, device)
    return {"e2e": e2e, "resident": gpu, "classifier_fp32": cls_fwd}


def classifier_infer(ms: ModelSpec, batch, a, device) -> float:
    """bf16 img/s of the classifier's forward on a resident batch."""
    import timm

    model = timm.create_model(ms.name, **ms.kwargs).to(device).eval()
    model = model.to(memory_format=torch.channels_last)
    size = build_oracle(ms, "linear", "model", 0)[1].input_size
    x = torch.randn(batch, *size, device=device).contiguous(memory_format=torch.channels_last)
    with torch.inference_mode(), autocast("bf16", device):
        return timed(lambda: model(x), a.warmup, a.steps, batch, device)


def forward_flops(ms: ModelSpec) -> float:
    """FLOPs of one image's forward pass through the oracle (torch's FLOP counter: matmuls,
    convolutions and attention; 2 per multiply-add)."""
    from torch.utils.flop_counter import FlopCounterMode

    model, data_cfg = build_oracle(ms, "hyperplane", "model", 0)
    x = torch.zeros(1, *data_cfg.input_size)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.eval()(x)
    return float(counter.get_total_flops())


def random_targets(n: int) -> TargetTable:
    rng = np.random.default_rng(0)
    return TargetTable.from_arrays({k: (rng.random(n) > 0.3).astype(np.float32) if "correct" in k
                                    else rng.random(n).astype(np.float32)
                                    for k in ("correct", "correct_flip", "p_true", "p_true_flip")})


def resident_step(ms: ModelSpec, batch: int, compiled: bool, graph: str, device):
    """train-oracle's step (bf16, ``graph``: choose_step's mode) on one resident random batch, as
    a function of no arguments; and its step_path record."""
    from pipeline.oracle.finetune.graph import choose_step
    from pipeline.oracle.settings.sampler import micro_slices

    objs, data_cfg = fast_objects(ms, device, "bf16", compile_=compiled)
    step_fn, record = choose_step(objs, graph, 1)
    feed, schedule = random_resident(batch, data_cfg.input_size, pin=device.type == "cuda")
    targets, slices = random_targets(batch), micro_slices(batch, 1, 0, 1)
    counter = iter(range(10**9))
    return (lambda: step_fn(objs, feed, next(counter), schedule, slices, targets)), record
