"""Levers on train-oracle's step, each measured alone against the step as it ships, in one process.

    python bench/step_levers.py --json bench/results/step-levers-1xH200.json
    python bench/step_levers.py --models resnet50 --levers base,cudnn-benchmark --batches 40,256
    python bench/step_levers.py --tiny --device cpu --levers base,gelu-tanh     # smoke run

The step is bench/train_parts.py's ``resident_step``: train-oracle's step (normalise, flip,
forward, SS loss, backward, SGD) on one resident uint8 batch, bf16, captured in one CUDA graph,
the ViT compiled (``--compile``, what the runbook runs) and the ResNet not (its compiled step is
slower: bench_train.py).  Every variant of a model is built and captured first; then they are
timed in alternating rounds (``--rounds``), so a drift of the clock or of the GPU's temperature
falls on all of them alike; each variant's figure is its median round.

A lever changes one thing (``LEVERS``): an inductor option during compilation, cuDNN picking
convolution kernels by timing them, an SDPA backend, the patch embedding as a convolution (the
shipped oracle runs it as one GEMM: ``pipeline.oracle.nets.patchgemm``), the SGD update unfused (the shipped graph
runs it fused: ``capture.fused_sgd_step``), the model compiled or not, or the tanh approximation
of GELU.  ``numerics``: the first step's loss and summed gradient norms against
the shipped step's on the same batch and weights (relative differences); the fine-tuned tests
accept 2e-2.  On CUDA each variant's kernel time per step is grouped (attention, GEMM, other:
vit_roofline.py's groups), so a lever's gain shows where it comes from.
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_vit_peak import backend_context  # noqa: E402
from bench.grid_hours import grid_parts  # noqa: E402
from bench.train_parts import (PRESET_MODELS, classifier_infer, resident_step, spec,  # noqa: E402
                               timed)
from bench.vit_roofline import kernel_profile  # noqa: E402
from pipeline.core.timing import device_name  # noqa: E402


@dataclass(frozen=True)
class Lever:
    """One change to the shipped step."""
    what: str
    inductor: dict = field(default_factory=dict)   # torch._inductor.config while compiling
    model_kwargs: dict = field(default_factory=dict)
    sdpa: str = "default"
    cudnn_benchmark: bool = False
    foreach_sgd: bool = False
    conv_patch: bool = False                       # not pipeline.oracle.nets.patchgemm
    flip_compile: bool = False                     # the model compiled where it ships eager


LEVERS = {
    "base": Lever("the step as train-oracle runs it"),
    "flip-compile": Lever("the model compiled where it ships eager, eager where compiled",
                          flip_compile=True),
    "coord-descent": Lever("inductor: coordinate-descent tuning of its kernels' block sizes",
                           inductor={"coordinate_descent_tuning": True}),
    "aggressive-fusion": Lever("inductor: fuse nodes that share no read",
                               inductor={"aggressive_fusion": True}),
    "max-autotune-pointwise": Lever("inductor: autotune element-wise kernels' configs",
                                    inductor={"max_autotune_pointwise": True}),
    "foreach-sgd": Lever("the SGD update unfused: torch's foreach kernels, a pass over the "
                         "weights for each of weight decay, momentum and lr", foreach_sgd=True),
    "conv-patch": Lever("the patch embedding as timm's convolution (the shipped oracle runs it "
                        "as one GEMM over the patches)", conv_patch=True),
    "flash": Lever("SDPA: FlashAttention-2 instead of PyTorch's choice", sdpa="flash"),
    "gelu-tanh": Lever("GELU's tanh approximation (a numeric change)",
                       model_kwargs={"act_layer": "gelu_tanh"}),
    "cudnn-benchmark": Lever("cuDNN picks convolution kernels by timing them",
                             cudnn_benchmark=True),
}
COMPILED = {"vit_base_patch16_384": True, "resnet50": False, "vit_tiny_patch16_224": True,
            "resnet10t": False}


@contextmanager
def applied(lever: Lever):
    """The process-wide settings of ``lever`` while a variant compiles and is captured."""
    import torch._inductor.config as inductor
    from pipeline.oracle.finetune import graph
    from pipeline.oracle.loop.capture import sgd_step
    from pipeline.oracle.nets import model

    saved_bench, saved_sgd = torch.backends.cudnn.benchmark, graph.fused_sgd_step
    saved_patch = model.patch_gemm
    with ExitStack() as stack:
        stack.enter_context(inductor.patch(lever.inductor) if lever.inductor else nullcontext())
        stack.enter_context(backend_context(lever.sdpa))
        torch.backends.cudnn.benchmark = lever.cudnn_benchmark
        if lever.foreach_sgd:
            graph.fused_sgd_step = lambda: (sgd_step, "the foreach-sgd lever")
        if lever.conv_patch:
            model.patch_gemm = lambda backbone: 0
        try:
            yield
        finally:
            torch.backends.cudnn.benchmark, graph.fused_sgd_step = saved_bench, saved_sgd
            model.patch_gemm = saved_patch


def variant(name: str, lever: Lever, batch: int, tiny: bool, device) -> dict:
    """A captured step of ``lever`` (its first call compiles and captures) and that first step's
    loss and gradient sums."""
    ms = spec(name, tiny)
    ms = replace(ms, kwargs={**ms.kwargs, **lever.model_kwargs})
    compiled = COMPILED.get(name, False) != lever.flip_compile
    graph = "on" if device.type == "cuda" else "off"
    with applied(lever):
        t0 = time.perf_counter()
        step, record = resident_step(ms, batch, compiled and device.type == "cuda", graph, device)
        loss, _, grads = step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return {"step": step, "path": record, "first": (loss.item(), grads[0].item()),
            "build_s": round(time.perf_counter() - t0, 1)}


def measure_model(name: str, batch: int, levers: list[str], a, device) -> dict:
    """Every lever's variant of ``name`` at ``batch``, timed in alternating rounds."""
    built, start = {}, time.perf_counter()
    for lv in levers:
        if time.perf_counter() - start > a.build_budget_s:
            built[lv] = {"error": f"not built: --build-budget-s {a.build_budget_s:g} spent"}
            continue
        try:
            built[lv] = variant(name, LEVERS[lv], batch, a.tiny, device)
            print(f"  {name} batch {batch} {lv}: built in {built[lv]['build_s']} s", flush=True)
        except Exception as err:   # noqa: BLE001 - a lever this step cannot take: say so
            built[lv] = {"error": f"{type(err).__name__}: {err}"[:300]}
            print(f"  {name} batch {batch} {lv}: cannot run ({built[lv]['error']})", flush=True)
        torch._dynamo.reset()      # the next variant compiles afresh, under its own settings
    ok = [lv for lv in levers if "step" in built[lv]]
    rounds = {lv: [] for lv in ok}
    for _ in range(a.rounds):
        for lv in ok:
            rounds[lv].append(batch / timed(built[lv]["step"], 2, a.steps, batch, device) * 1e3)
    base = built.get("base", {}).get("first")
    out = {}
    for lv in levers:
        b = built[lv]
        if "step" not in b:
            out[lv] = {"error": b["error"]}
            continue
        ms = statistics.median(rounds[lv])
        out[lv] = {"step_ms": round(ms, 3), "img_per_s": round(batch / ms * 1e3, 1),
                   "rounds_ms": [round(r, 3) for r in rounds[lv]], "path": b["path"],
                   "build_s": b["build_s"], "numerics": _numerics(b["first"], base)}
        if device.type == "cuda" and a.profile_steps:
            out[lv]["kernels"] = kernel_profile(b["step"], device, a.profile_steps, a.top)
    if "base" in ok:
        for lv in ok:
            out[lv]["vs_base"] = round(out["base"]["step_ms"] / out[lv]["step_ms"], 3)
    for b in built.values():
        b.pop("step", None)
    torch.cuda.empty_cache() if device.type == "cuda" else None
    return out


def _numerics(first: tuple, base: tuple | None) -> dict | None:
    """Relative differences of the first step's loss and gradient-norm sum from the base's."""
    if base is None:
        return None
    rel = lambda x, y: abs(x - y) / max(abs(y), 1e-12)  # noqa: E731
    return {"loss_rel": float(f"{rel(first[0], base[0]):.3g}"),
            "grad_norm_rel": float(f"{rel(first[1], base[1]):.3g}")}


def report(name: str, batch: int, res: dict) -> None:
    for lv, r in res.items():
        if "error" in r:
            print(f"| {name} | {batch} | {lv} | cannot run: {r['error'][:80]} |")
            continue
        groups = r.get("kernels", {}).get("groups_ms", {})
        kern = ", ".join(f"{g} {v:.2f}" for g, v in groups.items())
        num = r["numerics"] or {}
        print(f"| {name} | {batch} | {lv} | {r['step_ms']:.2f} ms | {r['img_per_s']:,.0f} | "
              f"{r.get('vs_base', float('nan')):.3f} | {kern} | "
              f"{num.get('loss_rel', '')} / {num.get('grad_norm_rel', '')} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(PRESET_MODELS))
    ap.add_argument("--levers", default=None, help="comma-separated LEVERS (default: each "
                    "model's: the ViT's compiler and GELU levers, the ResNet's cuDNN one)")
    ap.add_argument("--batches", default=None, help="comma-separated batch sizes (default: the "
                    "paper's 40, and 256 beside it for the ResNet, whose ratio is a target)")
    ap.add_argument("--tiny", action="store_true", help="tiny models at 64 px (CPU smoke run)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per round")
    ap.add_argument("--profile-steps", type=int, default=5, help="0: no kernel profile")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--build-budget-s", type=float, default=float("inf"), help="per model and "
                    "batch: build (compile, capture) no further variant after this many seconds")
    ap.add_argument("--grid", action="store_true", help="also the paper's grid in hours "
                    "(bench/grid_hours.py) from each model's batch-40 step of every lever, its "
                    "inference measured here and --extract-json's extraction rates")
    ap.add_argument("--extract-json", type=Path, default=None, help="bench/profile_extract.py's "
                    "JSON of this call: each model's steady extract img/s")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    device = torch.device(a.device)
    torch._dynamo.config.cache_size_limit = 64     # one model class, many compiled variants
    models = [{"vit_base_patch16_384": "vit_tiny_patch16_224", "resnet50": "resnet10t"}.get(m, m)
              if a.tiny else m for m in a.models.split(",")]
    out = {"device": device_name(device), "date": time.strftime("%Y-%m-%d"),
           "torch": torch.__version__,
           "command": shlex.join(["python", "bench/step_levers.py", *sys.argv[1:]]),
           "levers": {k: v.what for k, v in LEVERS.items()}, "results": {}}
    print("| model | batch | lever | step | img/s | base / lever | kernels ms | numerics |")
    for m in models:
        levers = (a.levers or default_levers(m)).split(",")
        batches = a.batches or ("40" if m.startswith("vit") else "40,256")
        for batch in [int(b) for b in batches.split(",")]:
            res = measure_model(m, batch, levers, a, device)
            out["results"].setdefault(m, {})[str(batch)] = res
            report(m, batch, res)
            if a.json:            # after each: a call cut short keeps what it measured
                a.json.write_text(json.dumps(out, indent=1) + "\n")
    for m, by in out["results"].items():       # batch 40 against the largest batch, per lever
        if "40" in by and len(by) > 1:
            fill = max(by, key=int)
            out.setdefault("ratios", {})[m] = {
                lv: round(r["img_per_s"] / by[fill][lv]["img_per_s"], 3)
                for lv, r in by["40"].items() if "img_per_s" in r and "img_per_s" in by[fill][lv]}
            print(f"{m}: batch-40 img/s over batch-{fill} img/s: {out['ratios'][m]}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    if a.grid and not all("40" in by for by in out["results"].values()):
        sys.exit("step_levers: --grid needs every model at the paper's batch of 40 (--batches)")
    if a.grid:
        out["grid"] = grid(out["results"], models, a, device)
        print(json.dumps(out["grid"], indent=1))
        if a.json:
            a.json.write_text(json.dumps(out, indent=1) + "\n")


def grid(results: dict, models: list[str], a, device) -> dict:
    """The grid's hours by lever (each model's batch-40 step under it, where it ran), and with
    each model at its fastest lever; inference measured now, extraction from --extract-json."""
    extract = {}
    if a.extract_json:
        try:
            extract = {m: r["extract"]["steady_img_per_s"]
                       for m, r in json.loads(a.extract_json.read_text())["models"].items()}
        except (OSError, ValueError, KeyError, TypeError) as err:
            sys.exit(f"step_levers: --extract-json {a.extract_json}: not bench/profile_extract.py's "
                     f"JSON ({type(err).__name__}: {err}); pass the file its --json wrote")
    infer = {m: round(classifier_infer(spec(m, a.tiny), 256 if device.type == "cuda" else 8,
                                       argparse.Namespace(warmup=3, steps=a.steps), device), 1)
             for m in models}
    res = {m: {"steps": {"paper": {lv: {"e2e": r["img_per_s"]}
                                   for lv, r in results[m]["40"].items() if "img_per_s" in r}},
               "infer": infer[m], "extract": extract.get(m)} for m in models}
    levers = sorted(set.intersection(*(set(res[m]["steps"]["paper"]) for m in models)))
    out = {"infer_img_per_s": infer, "extract_img_per_s": extract, "target_h": 3.5, "hours": {}}
    for label, paths in [(lv, (lv,)) for lv in levers] + [("fastest", tuple(levers))]:
        parts = grid_parts(res, "paper", paths, models)
        out["hours"][label] = {"parts_h": {k: round(v, 3) for k, v in parts.items()},
                               "total_h": round(sum(parts.values()), 3)}
    return out


def default_levers(model: str) -> str:
    if model.startswith("vit"):
        return "base,foreach-sgd,conv-patch,coord-descent,gelu-tanh,flash,aggressive-fusion"
    return "base,foreach-sgd,cudnn-benchmark,flip-compile"


if __name__ == "__main__":
    main()
