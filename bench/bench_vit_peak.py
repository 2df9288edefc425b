"""How close the oracle's training step comes to the GPU's bf16 peak for ViT-B/16@384 at the
paper's batch of 40, per attention backend, eager-graphed and compiled-graphed.

    python bench/bench_vit_peak.py                       # CUDA: every SDPA backend, +/- compile
    python bench/bench_vit_peak.py --backends cudnn,flash --steps 60

The step is train-oracle's (``pipeline.oracle.finetune.graph``: normalise, flip, forward, SS loss,
backward, SGD, one CUDA graph) on one resident uint8 batch, so the figure is the GPU's alone (no
loader).  FLOPs: 3 x torch's forward FLOP count (matmuls and attention; the backward costs two
forwards) x img/s, against the datasheet's dense bf16 peak (989 TFLOP/s for H100 SXM / H200).
SDPA backends (``torch.nn.attention.sdpa_kernel``): ``default`` (PyTorch's own choice),
``flash`` (FlashAttention-2), ``efficient`` (memory-efficient), ``cudnn`` (cuDNN's fused
attention), ``math`` (unfused, for reference).  A backend that cannot run the step is reported as
such, not hidden.  The grid projection (16 runs of the paper's protocol) is bench_train.py's.
"""
from __future__ import annotations

import argparse
import json
import sys
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_train import BF16_PEAK_TFLOPS  # noqa: E402
from bench.train_parts import forward_flops, resident_step, spec, timed  # noqa: E402
from pipeline.core.presets import IMAGENET_PRESETS  # noqa: E402

BACKENDS = ("default", "flash", "efficient", "cudnn", "math")


def backend_context(name: str):
    if name == "default":
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel({"flash": SDPBackend.FLASH_ATTENTION,
                        "efficient": SDPBackend.EFFICIENT_ATTENTION,
                        "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[name])


def step_img_s(ms, batch: int, compiled: bool, a, device) -> float:
    """img/s of the graphed step on one resident batch."""
    step, _ = resident_step(ms, batch, compiled, "on", device)
    return timed(step, a.warmup, a.steps, batch, device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=IMAGENET_PRESETS["vit"].split(".")[0])
    ap.add_argument("--batch", type=int, default=40)
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--compile", default="off,on", help="off, on or both (off,on)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_vit_peak: needs a CUDA device")
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    peak = next((v for k, v in BF16_PEAK_TFLOPS.items() if k in name), None)
    ms = spec(a.model, tiny=False)
    flops = 3 * forward_flops(ms)
    print(f"bench_vit_peak: {name}, torch {torch.__version__}, {a.model} batch {a.batch}, "
          f"{flops / 1e9:.0f} GFLOP per training image, bf16 peak {peak} TFLOP/s")
    rows = []
    for compiled in [c == "on" for c in a.compile.split(",")]:
        for backend in a.backends.split(","):
            try:
                with backend_context(backend):
                    img_s = step_img_s(ms, a.batch, compiled, a, device)
                share = img_s * flops / (peak * 1e12) if peak else None
                row = {"backend": backend, "compile": compiled, "img_per_s": round(img_s, 1),
                       "peak_share": round(share, 3) if share else None}
            except Exception as err:            # a backend this step cannot use: say so
                row = {"backend": backend, "compile": compiled, "error": str(err)[:200]}
            torch._dynamo.reset()
            torch.cuda.empty_cache()
            rows.append(row)
            print(f"  {'compiled' if compiled else 'eager'} graph, SDPA {backend:9s}: "
                  + (f"{row['img_per_s']:7.1f} img/s, {100 * row['peak_share']:.1f}% of peak"
                     if "error" not in row else f"cannot run ({row['error']})"))
    if a.json:
        a.json.write_text(json.dumps({"device": name, "torch": torch.__version__,
                                      "model": a.model, "batch": a.batch, "peak_tflops": peak,
                                      "train_gflop_per_img": flops / 1e9, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
