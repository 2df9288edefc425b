"""Attack speed in images/s: ReColorAdv (the authors' package, `attack --attack recoloradv`) and
PGD (torchattacks) on a timm classifier, through the objects `cli.py attack` uses
(pipeline/attack/methods.py: PixelClassifier + build_attack), on one resident batch.

    python bench/bench_attack.py                   # CUDA: ViT-B/16@384 and ResNet-50@224, bf16
    python bench/bench_attack.py --models vit_base_patch16_224 --batch-sizes 32,64
    python bench/bench_attack.py --quick           # CPU smoke run (tiny model, 32 px, seconds)

ReColorAdv's cost is per iteration, and a real run does 100 to 300 of them (it stops after 100
once its loss settles), so each attack runs exactly --steps iterations here (counted as the
classifier's forward passes) and the table gives ms per image-iteration and the images/s of
100- and 300-iteration runs; PGD is timed at its 10 steps.  Models are random-init and images
uniform noise: speed does not depend on either.  One untimed iteration of each attack first.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.attack.methods import PixelClassifier, build_attack, resolve_params  # noqa: E402
from pipeline.core.models import ModelSpec, build_model, resolve_data_config  # noqa: E402
from pipeline.core.precision import PRECISIONS  # noqa: E402
from pipeline.core.timing import device_name  # noqa: E402

TINY = ("vit_tiny_patch16_224", {"img_size": 32, "patch_size": 8, "depth": 2, "embed_dim": 48,
                                 "num_heads": 2})


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_attack(attack: str, pixels, x, labels, steps: int | None, device) -> dict:
    """One attack on the batch: seconds, iterations (forward passes), images/s."""
    params = resolve_params(attack, steps=steps)
    atk = build_attack(attack, pixels, params)
    calls = []
    # on the timm model: mister_ed calls PixelClassifier.forward directly, past its hooks
    hook = pixels.model.register_forward_hook(lambda *_: calls.append(1))
    sync(device)
    start = time.perf_counter()
    adv = atk(x, labels)
    sync(device)
    seconds = time.perf_counter() - start
    hook.remove()
    n = len(x)
    return {"attack": attack, "params": params, "images": n, "iterations": len(calls),
            "seconds": round(seconds, 4), "img_per_s": round(n / seconds, 3),
            "ms_per_img_iteration": round(1e3 * seconds / (n * len(calls)), 4),
            "max_change": round(float((adv - x).abs().max()), 4)}


def bench(name, kwargs, batches, attacks, steps, precision, device) -> list[dict]:
    spec = ModelSpec(name, kwargs, None, True, None)
    model = build_model(spec, seed=0).eval()
    data_cfg = resolve_data_config(model, spec, "model")
    model = model.to(device).to(memory_format=torch.channels_last)
    pixels = PixelClassifier(model, data_cfg, precision, device).to(device)
    gen = torch.Generator().manual_seed(0)
    out = []
    for b in batches:
        x = torch.rand(b, *data_cfg.input_size, generator=gen).to(device)
        labels = torch.randint(0, int(model.num_classes), (b,), generator=gen).to(device)
        # warm-up at this batch size: ReColorAdv builds (and caches) its identity colour grid per
        # batch size in a Python loop over the 16 x 32 x 32 nodes, once, seconds
        for attack in attacks:
            time_attack(attack, pixels, x, labels, 1, device)
        for attack in attacks:
            r = time_attack(attack, pixels, x, labels,
                            steps if attack == "recoloradv" else None, device)
            r.update(model=name, input_size=list(data_cfg.input_size), batch_size=b,
                     precision=precision)
            if attack == "recoloradv":
                per = r["ms_per_img_iteration"]
                r["img_per_s_at"] = {k: round(1e3 / (per * k), 3) for k in (100, 300)}
            out.append(r)
            extra = "".join(f", {v} img/s at {k} it" for k, v in r.get("img_per_s_at", {}).items())
            print(f"{name} {data_cfg.input_size[1]}px batch {b:4d} {attack:10s}: {r['iterations']} "
                  f"it in {r['seconds']:.2f} s = {r['img_per_s']} img/s, "
                  f"{r['ms_per_img_iteration']} ms/img/it{extra}", flush=True)
    return out


def main() -> None:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="vit_base_patch16_384,resnet50",
                   help="comma-separated timm names, each at its own input size")
    p.add_argument("--batch-sizes", default="64", help="comma-separated (64: attack's default)")
    p.add_argument("--attacks", default="recoloradv,pgd_linf")
    p.add_argument("--steps", type=int, default=20, help="ReColorAdv iterations (exactly, up to 100)")
    p.add_argument("--precision", choices=PRECISIONS, default="bf16" if cuda else "fp32")
    p.add_argument("--device", default="cuda" if cuda else "cpu")
    p.add_argument("--quick", action="store_true", help="tiny model, 32 px, batch 8, 3 iterations")
    p.add_argument("--json", default=None, help="also write the results here")
    a = p.parse_args()
    device = torch.device(a.device)
    if device.type == "cuda":
        # mister_ed puts its tensors on the current device ("cuda" alone names none: index 0)
        torch.cuda.set_device(device.index or 0)
    if a.quick:
        models, batches, a.steps = [TINY], [8], 3
    else:
        models = [(m, {}) for m in a.models.split(",")]
        batches = [int(b) for b in a.batch_sizes.split(",")]
    attacks = a.attacks.split(",")
    print(f"device {device_name(device)}, precision {a.precision}, torch {torch.__version__}",
          flush=True)
    results = []
    for name, kwargs in models:
        results += bench(name, kwargs, batches, attacks, a.steps, a.precision, device)
    if a.json:
        Path(a.json).write_text(json.dumps({"device": device_name(device), "torch":
                                            torch.__version__, "python": platform.python_version(),
                                            "results": results}, indent=2))


if __name__ == "__main__":
    main()
