"""The oracle's training step against its roofline: where the time of one ViT-B/16@384 step at
the paper's batch of 40 goes, and the time the step could reach.

    python bench/vit_roofline.py --json bench/results/vit-roofline-1xH100.json
    python bench/vit_roofline.py --compile off --backend flash
    python bench/vit_roofline.py --tiny --device cpu --batch 4    # smoke run: no kernel profile

The step is bench_vit_peak.py's (train-oracle's graphed step on one resident uint8 batch, no
loader).  Three parts:

1. **The step's ops** (one eager step under a dispatch mode, the same ops the graph replays,
   before the compiler fuses the element-wise ones): GEMMs (mm, addmm, bmm, the patch
   embedding's convolution) and attention (SDPA's forward and backward kernels), each with its
   FLOPs by torch's own formulas (torch.utils.flop_counter),
   and every other op as the bytes it reads and writes (views move none).
2. **The bound**: each distinct GEMM and attention call timed alone, on inputs of its very shapes,
   strides and dtypes (so a GEMM counts at the rate cuBLAS reaches for that shape, not at the
   datasheet's peak), plus the other ops' bytes at the device's copy bandwidth (measured: a
   256 MiB device-to-device copy).  The compiled step fuses element-wise ops, so it can beat the
   third term; the first two are what the same kernels cost without anything around them.
3. **Where the step's time goes** (CUDA only): torch.profiler over graph replays, each kernel
   grouped by its name (attention, GEMM, other), against the step's wall time (the rest is idle
   GPU: launch gaps, syncs).

Printed: the step's time, the bound by part, the ratio (goal: within 1.3x), the measured kernel
time by group and the largest kernels.  ``--json``: all of it, with the device, date and command.
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.flop_counter import flop_registry

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_vit_peak import backend_context  # noqa: E402
from bench.train_parts import resident_step, spec, timed  # noqa: E402
from pipeline.core.presets import IMAGENET_PRESETS  # noqa: E402

GEMM_OPS = {"mm", "addmm", "bmm", "baddbmm", "convolution", "convolution_backward"}
ATTENTION = re.compile(r"scaled_dot_product|flash_attention|efficient_attention|cudnn_attention")
FREE_OPS = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided",
            "_local_scalar_dense", "lift_fresh", "detach"}
# kernel names: attention first (cuDNN's fused attention is a generated cuDNN kernel too)
KERNEL_GROUPS = (("attention", re.compile(r"flash|fmha|attention|sdpa|mha", re.I)),
                 ("gemm", re.compile(r"gemm|xmma|cutlass|nvjet|cublas|wgmma|conv|implicit", re.I)))


def op_group(name: str) -> str:
    """An aten op's part of the bound: gemm, attention or memory (the op's packet name)."""
    if name in GEMM_OPS:
        return "gemm"
    return "attention" if ATTENTION.search(name) else "memory"


def kernel_group(name: str) -> str:
    """A CUDA kernel's group by its name: attention, gemm or other."""
    return next((g for g, pattern in KERNEL_GROUPS if pattern.search(name)), "other")


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _key(func, args, kwargs) -> tuple:
    def desc(x):
        if isinstance(x, torch.Tensor):
            return ("T", tuple(x.shape), tuple(x.stride()), str(x.dtype), x.device.type)
        return repr(x)
    return (str(func),) + tuple(desc(x) for x in tree_flatten((args, kwargs))[0])


def _copy(x):
    """A tensor of the same shape, strides, dtype and device (and values: an op may depend on
    them, e.g. SDPA's random seed)."""
    if not isinstance(x, torch.Tensor):
        return x
    out = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
    return out.copy_(x)


class StepOps(TorchDispatchMode):
    """Every aten op of a step: per group, the calls (GEMM and attention ones kept, one copy of
    the inputs per distinct shape, for timing alone) and the other ops' bytes."""

    def __init__(self):
        super().__init__()
        self.calls: dict[tuple, dict] = {}
        self.bytes = 0
        self.ops = defaultdict(int)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.__name__.split(".")[0]
        group = op_group(name)
        self.ops[group] += 1
        if group == "memory":
            if not (getattr(func, "is_view", False) or name in FREE_OPS):
                self.bytes += sum(_nbytes(t) for t in _tensors((args, kwargs)) + _tensors(out))
            return out
        key = _key(func, args, kwargs)
        if key not in self.calls:
            count_flops = flop_registry.get(func._overloadpacket)    # torch's FLOP formulas
            self.calls[key] = {"func": func, "group": group, "count": 0, "name": name,
                               "flops": count_flops(*args, **kwargs, out_val=out)
                               if count_flops else 0,
                               "args": tree_map(_copy, args), "kwargs": tree_map(_copy, kwargs)}
        self.calls[key]["count"] += 1
        return out


def alone_ms(call: dict, device: torch.device, reps: int) -> float:
    """Milliseconds of one call of ``call``'s op on its recorded inputs, with nothing around it."""
    fn = lambda: call["func"](*call["args"], **call["kwargs"])  # noqa: E731
    for _ in range(3):
        fn()
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) * 1e3 / reps


def copy_bandwidth(device: torch.device, mib: int = 256, reps: int = 20) -> float:
    """Bytes per second of a device-to-device copy (read + write)."""
    src = torch.empty(mib << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    call = {"func": dst.copy_, "args": (src,), "kwargs": {}}
    return 2 * src.numel() / (alone_ms(call, device, reps) / 1e3)


def bound(ops: StepOps, device: torch.device, reps: int) -> dict:
    """The step's bound by part (ms): GEMMs and attention timed alone, the rest's bytes at the
    copy bandwidth."""
    parts = {"gemm": 0.0, "attention": 0.0}
    calls = []
    for call in ops.calls.values():
        ms = alone_ms(call, device, reps)
        parts[call["group"]] += ms * call["count"]
        calls.append({"op": call["name"], "group": call["group"], "count": call["count"],
                      "alone_ms": round(ms, 4), "gflop": round(call["flops"] / 1e9, 3),
                      "alone_tflop_s": round(call["flops"] / ms / 1e9, 1)})
    bandwidth = copy_bandwidth(device)
    parts["memory"] = ops.bytes / bandwidth * 1e3
    flops = {g: sum(c["flops"] * c["count"] for c in ops.calls.values() if c["group"] == g)
             for g in ("gemm", "attention")}
    return {"parts_ms": {k: round(v, 3) for k, v in parts.items()},
            "gflop": {g: round(f / 1e9, 2) for g, f in flops.items()},
            "total_ms": round(sum(parts.values()), 3), "other_bytes": ops.bytes,
            "copy_bandwidth_gb_s": round(bandwidth / 1e9, 1), "ops": dict(ops.ops),
            "calls": sorted(calls, key=lambda c: -c["alone_ms"] * c["count"])}


def kernel_profile(step, device: torch.device, steps: int, top: int) -> dict:
    """Kernel milliseconds per step by group (attention, gemm, other) and the largest kernels,
    over ``steps`` calls of ``step`` (graph replays: CUPTI records the graph's kernels)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize(device)
    by_name = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by_name[e.name] += e.device_time / 1e3 / steps       # us -> ms per step
    groups = defaultdict(float)
    for name, ms in by_name.items():
        groups[kernel_group(name)] += ms
    largest = sorted(by_name.items(), key=lambda kv: -kv[1])[:top]
    return {"groups_ms": {k: round(v, 3) for k, v in sorted(groups.items())},
            "kernels_ms": round(sum(by_name.values()), 3), "kernels": len(by_name),
            "largest": [{"kernel": n[:160], "group": kernel_group(n), "ms": round(ms, 4)}
                        for n, ms in largest]}


def measure(a, device: torch.device) -> dict:
    ms = spec(a.model, tiny=a.tiny)
    with backend_context(a.backend):
        eager, _ = resident_step(ms, a.batch, False, "off", device)
        eager()                                   # lazy state (optimizer buffers) first
        with StepOps() as ops:
            eager()
        limit = bound(ops, device, a.reps)
        step, record = resident_step(ms, a.batch, a.compile == "on",
                                  "on" if device.type == "cuda" else "off", device)
        img_s = timed(step, a.warmup, a.steps, a.batch, device)
        profile = kernel_profile(step, device, a.profile_steps, a.top) \
            if device.type == "cuda" else None
    step_ms = a.batch / img_s * 1e3
    return {"step_ms": round(step_ms, 3), "img_per_s": round(img_s, 1), "step_path": record,
            "bound": limit, "ratio": round(step_ms / limit["total_ms"], 3), "profile": profile}


def report(r: dict) -> None:
    b, p = r["bound"], r["profile"]
    print(f"  step {r['step_ms']:.2f} ms ({r['img_per_s']:.0f} img/s); bound "
          f"{b['total_ms']:.2f} ms = GEMMs alone {b['parts_ms']['gemm']:.2f} + attention alone "
          f"{b['parts_ms']['attention']:.2f} + {b['other_bytes'] / 1e9:.2f} GB at "
          f"{b['copy_bandwidth_gb_s']:.0f} GB/s {b['parts_ms']['memory']:.2f}; "
          f"step / bound = {r['ratio']:.2f} (goal <= 1.3)")
    print(f"  GEMM {b['gflop']['gemm']:.1f} GFLOP, attention {b['gflop']['attention']:.1f} GFLOP "
          "per step; the largest calls alone (calls x ms, TFLOP/s):")
    for c in b["calls"][:8]:
        print(f"    {c['count']:4d} x {c['alone_ms']:8.4f} ms  {c['alone_tflop_s']:7.1f}  "
              f"{c['group']:9s} {c['op']}")
    if p:
        idle = r["step_ms"] - p["kernels_ms"]
        print("  kernels per step: " + ", ".join(f"{g} {v:.2f} ms" for g, v in
                                                p["groups_ms"].items())
              + f"; idle GPU {idle:.2f} ms")
        for k in p["largest"]:
            print(f"    {k['ms']:8.3f} ms  {k['group']:9s} {k['kernel'][:100]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=IMAGENET_PRESETS["vit"].split(".")[0])
    ap.add_argument("--tiny", action="store_true", help="the tiny model at 64 px (smoke runs)")
    ap.add_argument("--batch", type=int, default=40)
    ap.add_argument("--backend", default="default", help="SDPA backend (bench_vit_peak.py's)")
    ap.add_argument("--compile", choices=("off", "on"), default="on")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--profile-steps", type=int, default=10)
    ap.add_argument("--reps", type=int, default=20, help="timed calls of each op alone")
    ap.add_argument("--top", type=int, default=15, help="largest kernels listed")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    if a.tiny and a.model == ap.get_default("model"):
        a.model = "vit_tiny_patch16_224"         # bench/train_parts.py's tiny ViT
    device = torch.device(a.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"vit_roofline: {name}, torch {torch.__version__}, {a.model}{' (tiny)' * a.tiny} "
          f"batch {a.batch}, SDPA {a.backend}, compile {a.compile}")
    r = measure(a, device)
    report(r)
    if a.json:
        a.json.write_text(json.dumps({
            "device": name, "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
            "command": shlex.join(["python", "bench/vit_roofline.py", *sys.argv[1:]]),
            "model": a.model, "tiny": a.tiny, "batch": a.batch, "backend": a.backend,
            "compile": a.compile, "goal_ratio": 1.3, **r}, indent=2) + "\n")


if __name__ == "__main__":
    main()
