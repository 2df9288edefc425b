"""Inference time of the classifier vs the oracle (paper appendix: oracle 1.53 ms/img against
classifier 1.64 ms/img, <ViT, ViT>), measured in the same run on the same device.

    python bench/bench_inference.py                       # CUDA: ViT-B/16@384 (the paper's), bf16
    python bench/bench_inference.py --models vit_base_patch16_384,resnet50 --precision fp32
    python bench/bench_inference.py --quick               # CPU smoke run (tiny model, seconds)

Both are timed exactly as `extract` and `predict` time themselves (pipeline/core/timing.py):
forward passes only — on-device normalisation + the model under the precision — on a resident
uint8 batch (no data loading), after warm-up, CUDA events on a GPU.  The classifier is the timm
model with its 1000-way head; the oracle is the same backbone with the scalar hyperplane head
(what train-oracle builds).  Models are random-init: speed does not depend on the weights.
Prints ms/img for both and the oracle/classifier ratio per model and batch size.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.core.models import ModelSpec, build_model, resolve_data_config  # noqa: E402
from pipeline.core.precision import PRECISIONS, autocast  # noqa: E402
from pipeline.core.timing import ModelTimer, device_name  # noqa: E402
from pipeline.data.images import GpuNormalize  # noqa: E402
from pipeline.oracle.nets.model import build_oracle  # noqa: E402

TINY = ("vit_tiny_patch16_224", {"img_size": 32, "patch_size": 8, "depth": 2, "embed_dim": 48,
                                 "num_heads": 2})


def time_model(model, data_cfg, batch: int, precision: str, device, warmup: int,
               steps: int) -> dict:
    normalize = GpuNormalize(data_cfg, device)
    x = torch.randint(0, 256, (batch, *data_cfg.input_size), dtype=torch.uint8, device=device)
    timer = ModelTimer(device, skip=warmup)
    with torch.inference_mode():
        for _ in range(warmup + steps):
            with timer.time(batch), autocast(precision, device):
                model(normalize(x))
    return timer.result(precision)


def bench(name: str, kwargs: dict, batches: list[int], precision: str, device, warmup: int,
          steps: int, compile_: bool) -> list[dict]:
    spec = ModelSpec(name, kwargs, None, True, None)
    classifier = build_model(spec, seed=0).eval()
    data_cfg = resolve_data_config(classifier, spec, "model")
    oracle, _ = build_oracle(spec, "hyperplane", "model", seed=0)
    models = {}
    for label, model in (("classifier", classifier), ("oracle", oracle.eval())):
        model = model.to(device).to(memory_format=torch.channels_last)
        models[label] = torch.compile(model) if compile_ else model
    out = []
    for b in batches:
        # two alternating rounds, the second kept: both roles see the same machine state
        for keep in (False, True):
            for label, model in models.items():
                r = time_model(model, data_cfg, b, precision, device, warmup, steps)
                if keep:
                    out.append({"model": name, "role": label, **r})
                    print(f"{name:28s} {label:10s} batch {b:4d}: {r['model_ms_per_img']:.4f} "
                          "ms/img", flush=True)
    return out


def main() -> None:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="vit_base_patch16_384", help="comma-separated timm names")
    p.add_argument("--batch-sizes", default="40,256", help="comma-separated (40: the paper's)")
    p.add_argument("--precision", choices=PRECISIONS, default="bf16" if cuda else "fp32")
    p.add_argument("--device", default="cuda" if cuda else "cpu")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--compile", action="store_true", help="torch.compile both models")
    p.add_argument("--quick", action="store_true", help="tiny model, 2+3 batches of 8 (CPU smoke)")
    p.add_argument("--json", default=None, help="also write the results here")
    a = p.parse_args()
    device = torch.device(a.device)
    if a.quick:
        models, batches, a.warmup, a.steps = [TINY], [8], 2, 3
    else:
        models = [(m, {}) for m in a.models.split(",")]
        batches = [int(b) for b in a.batch_sizes.split(",")]
    print(f"device {device_name(device)}, precision {a.precision}, torch {torch.__version__}, "
          f"{a.steps} timed batches after {a.warmup}", flush=True)
    results = []
    for name, kwargs in models:
        results += bench(name, kwargs, batches, a.precision, device, a.warmup, a.steps, a.compile)
    for name, _ in models:
        for b in batches:
            pick = {r["role"]: r["model_ms_per_img"] for r in results
                    if r["model"] == name and r["batch_size"] == b}
            print(f"{name} batch {b}: oracle {pick['oracle']:.4f} vs classifier "
                  f"{pick['classifier']:.4f} ms/img, ratio {pick['oracle'] / pick['classifier']:.3f} "
                  "(paper: 1.53 / 1.64 = 0.933)")
    if a.json:
        Path(a.json).write_text(json.dumps({"device": device_name(device), "python":
                                            platform.python_version(), "results": results}, indent=2))


if __name__ == "__main__":
    main()
