"""Where a head-only step's time goes: the kernels one graphed (or eager) SS head step launches,
their GPU time, against the step's wall time.

    python bench/head_profile.py --json bench/results/head-profile-1xH100.json
    python bench/head_profile.py --cuda-graph off
    python bench/head_profile.py --compile      # the head's forward and loss compiled

bench_head.py's run (a synthetic ImageNet-width feature cache, a bank of SS heads) on fewer
rows, under torch.profiler: the kernels of the training loop, counted and timed per optimizer
step.  What it tells: if the GPU is busy for most of a step, only fewer or cheaper kernels help
(a fused update); if it idles, the launches and the host between them cost the time (several
steps per graph replay, the epoch's indices resident on the GPU).

``--compile``: train-oracle's ``--head-only --compile``, the head's forward and the loss
torch.compile'd inside the graph (inductor fuses their element-wise ops, forward and backward;
SGD's update and the window's bookkeeping stay as they are; not bit for bit the eager step).
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_head import one_pass, step_of, step_options, write_feature_cache  # noqa: E402


def profile_pass(train: Path, val: Path, device, batch: int, heads: int, step: dict,
                 top: int) -> dict:
    """One head-only pass under the profiler; kernel counts and times per training step.
    ``step``: ``bench_head.one_pass``'s cuda_graph, compiled, per_replay and log_every."""
    from torch.profiler import ProfilerActivity, profile

    alphas = [(1.0 + i, 3.0) for i in range(heads)]
    args = (train, val, device, batch, 1, alphas)
    one_pass(*args, **step)             # warm: allocator, graph, compiled kernels
    kept: list = []
    plain = one_pass(*args, **step, sessions=kept)      # timed, unprofiled
    bare = bare_replays(kept.pop())
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run = one_pass(*args, **step)
    steps = run["steps"]
    by_name, calls = defaultdict(float), defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by_name[e.name] += e.device_time / 1e3                      # us -> ms
            calls[e.name] += 1
    busy = sum(by_name.values())
    largest = sorted(by_name.items(), key=lambda kv: -kv[1])[:top]
    return {"steps": steps, "heads": heads, "step_path": run["step_path"],
            "train_s": round(run["train_s"], 3),
            "wall_us_per_step": round(run["train_s"] / steps * 1e6, 2),
            "unprofiled_us_per_step": round(plain["train_s"] / steps * 1e6, 2),
            "bare_replay_us_per_step": bare,
            "best_val_aupr_error": plain["best_val_aupr_error"],
            "kernels_per_step": round(sum(calls.values()) / steps, 2),
            "gpu_busy_us_per_step": round(busy / steps * 1e3, 2),
            "largest": [{"kernel": n[:160], "calls_per_step": round(calls[n] / steps, 2),
                         "us_per_call": round(ms / calls[n] * 1e3, 2)} for n, ms in largest]}


def bare_replays(session, steps: int = 3000) -> dict[str, float] | None:
    """µs per step of each of a trained session's graphs (by steps a replay) replayed back to
    back for ``steps`` steps: no loop, no sync, no Python between replays -- the graph's own
    pace, against which the loop's wall time per step is read.  The device counters go back to
    0 before the window would overflow (one kernel, stream-ordered); the heads it moves are
    not used any more.  None: no graph ran."""
    fast = session.fast
    if fast is None or not getattr(fast, "graphs", None):
        return None
    out = {}
    for k, graph in sorted(fast.graphs.items()):
        reps, used = max(1, steps // k), fast.window
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(reps):
            if used + k > fast.window:
                fast.counters.zero_()
                used = 0
            graph.replay()
            used += k
        torch.cuda.synchronize()
        out[str(k)] = round((time.perf_counter() - t) / (reps * k) * 1e6, 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=80_000, help="training rows (steps = rows/batch)")
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--batch", type=int, default=40)
    ap.add_argument("--heads", type=int, default=1, help="SS heads in the bank (a grid: 100)")
    step_options(ap)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("head_profile.py profiles CUDA kernels: run it on a GPU")
    device = torch.device("cuda")
    with tempfile.TemporaryDirectory() as tmp:
        train, val = Path(tmp) / "train", Path(tmp) / "val"
        write_feature_cache(train, a.rows, a.dim, seed=0)
        write_feature_cache(val, 5_000, a.dim, seed=1)
        out = profile_pass(train, val, device, a.batch, a.heads, step_of(a), a.top)
    print(f"head_profile: {torch.cuda.get_device_name(0)}, D {a.dim}, batch {a.batch}, "
          f"{a.heads} head(s), {out['step_path']}{', compiled' * a.compile}, up to "
          f"{a.per_replay} step(s) a replay, a sync every {a.log_every}: "
          f"{out['unprofiled_us_per_step']} us a step ({out['wall_us_per_step']} profiled), "
          f"{out['kernels_per_step']} kernels a step, GPU busy {out['gpu_busy_us_per_step']} us; "
          f"graphs replayed back to back (steps a replay: us a step): "
          f"{out['bare_replay_us_per_step']}")
    for k in out["largest"]:
        print(f"  {k['calls_per_step']:6.2f} x {k['us_per_call']:8.2f} us  {k['kernel']}")
    if a.json:
        doc = {"device": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d"),
               "torch": torch.__version__, "command": shlex.join(["python", *sys.argv]),
               "rows": a.rows, "dim": a.dim, "batch": a.batch, "compiled": a.compile,
               "per_replay": a.per_replay, "log_every": a.log_every, **out}
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
