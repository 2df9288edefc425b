"""Benchmark of head-only oracles (``train-oracle --head-only``, ``cli.py sweep``) on feature caches.

    python bench/bench_head.py                      # CUDA: ImageNet-sized caches, D = 768 and 2048
    python bench/bench_head.py --quick              # CPU smoke run (small caches, seconds)
    python bench/bench_head.py --quick --embedded artifacts/fashion-mnist   # + the demo's figures

Per feature width D (ViT-B 768, ResNet-50 2048), on a synthetic feature cache written in the
project's format (``cache/``: 1,281,167 training rows with both views' fp16 features and targets,
50,000 val rows; the correctness is a noisy linear function of the features, so the head learns):

  one run    end to end, loading included: open the caches, targets and both views' features
             onto the device (``--shard-rows`` rows a shard, as extract writes them), one epoch
             of head-only SS at the paper's protocol (batch 40, SGD + OneCycle, held-out
             validation 4x), then scoring the 50,000 val rows.  Printed beside it: a full fine-tune of the same point, one epoch at
             bench_train's img/s at batch 40 (``--finetune-img-s``, docs/PERFORMANCE.md), and the
             ratio.  The step runs as ``--cuda-graph`` says (default auto: one CUDA graph per
             step on a GPU, ``pipeline/oracle/headonly/graph.py``); where that is the graph, the
             same run with ``--cuda-graph off`` (the eager step) is measured too, with the ratio and
             a check that both chose the same best heads (``--no-eager``: skip it).  With
             ``--compile`` (train-oracle --head-only --compile) the twin is the same step
             uncompiled, the baseline that flag is measured against; with ``--per-replay N
             --baseline step-a-replay``, graphs of up to N steps against one step a replay.
  grid       a 10 x 10 alpha+ / alpha- grid = 100 heads trained as one bank (features loaded once)
             plus scoring every head on the val rows.

Loading reads files that were just written (warm page cache); a cold read adds the disk's time
for 5.1 GB (D = 768) / 13.1 GB (D = 2048).

``--embedded ART`` (CPU figures): one head-only run on the demo's caches (20,000
rows, <vit, vit> SS) and the whole head-only demo grid (4 <O,C> x 6 losses), in this process,
through the same function ``train-oracle --head-only`` calls; the caches must hold features
(``make demo``).  ``--extraction``: extract's img/s with and without ``--features`` on the
embedded train split, and the feature columns' size.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cache.manifest import MANIFEST_FILE, write_json_atomic  # noqa: E402
from cache.reader import ClassifierCache  # noqa: E402
from cache.schema import KIND_CLASSIFIER, SCHEMA_VERSION  # noqa: E402
from cache.shards import shard_entry, shard_path, shard_ranges, write_shard  # noqa: E402
from cache.runs import RunDir  # noqa: E402
from pipeline.core.losses import Context, get  # noqa: E402
from pipeline.extract.run import ExtractConfig  # noqa: E402
from pipeline.oracle.headonly.bank import BankOptim, score, train_heads  # noqa: E402
from pipeline.oracle.headonly.features import load_table  # noqa: E402
from pipeline.oracle.headonly.graph import STEPS_PER_REPLAY, head_step_path  # noqa: E402
from pipeline.oracle.loop.log import StepLog  # noqa: E402
import pipeline.oracle.loop.fit as fit_module  # noqa: E402
from pipeline.oracle.loop.state import LoopSettings  # noqa: E402
from pipeline.oracle.nets.model import Head  # noqa: E402
from pipeline.oracle.settings.sampler import StepSchedule, carve_rows  # noqa: E402

N_TRAIN, N_VAL = 1_281_167, 50_000
LOG_EVERY = 10                  # train-oracle's --log-every
# bench_train's fast path at the paper's batch 40, one H200 (docs/PERFORMANCE.md, 2026-11-26):
# ViT-B/16@224 1,679 img/s, ResNet-50 1,524 img/s.
FINETUNE_IMG_S = {768: 1679.0, 2048: 1524.0}


def write_feature_cache(path: Path, n: int, dim: int, seed: int,
                        shard: int = ExtractConfig.shard_size) -> None:
    """A complete classifier cache with features (both views) and targets, shard by shard.
    o = [x . u + noise > 0]: a head can learn it, so validation and SS's slopes mean something.
    Each shard recorded in the manifest as extract records it (``shard_entry``: size, hash, column
    hashes), so it is read as a verified cache.  A reused --workdir is overwritten."""
    rng = np.random.default_rng(seed)
    u = np.random.default_rng(123).standard_normal(dim).astype(np.float32) / np.sqrt(dim)
    identity = {"schema_version": SCHEMA_VERSION, "kind": KIND_CLASSIFIER, "model": "synthetic",
                "model_kwargs": {}, "weights_sha256": "0" * 64, "preprocess": "model",
                "data_config": {}, "dataset": "synthetic", "dataset_fingerprint": "synthetic",
                "split": path.name, "corruption": "none", "num_rows": n, "num_classes": 1000,
                "precision": "bf16", "flip_view": True, "features": True, "features_flip": True,
                "shard_size": shard, "decode": "cpu"}
    path.mkdir(parents=True, exist_ok=True)
    shards = []
    for s, (a, b) in enumerate(shard_ranges(n, shard)):
        m = b - a
        cols = {"index": np.arange(a, b, dtype=np.int64), "valid": np.ones(m, np.uint8)}
        for suffix in ("", "_flip"):
            x = rng.standard_normal((m, dim), dtype=np.float32)
            o = (x @ u + 0.7 * rng.standard_normal(m, dtype=np.float32) > -1.0)
            cols["features" + suffix] = x.astype(np.float16)
            cols["correct" + suffix] = o.astype(np.uint8)
            cols["p_true" + suffix] = np.where(o, 0.9, 0.1).astype(np.float32)
        write_shard(shard_path(path, s), cols, {**identity, "start": a, "stop": b, "bad_rows": []})
        shards.append(shard_entry(shard_path(path, s), a, b))
    columns = ["index", "valid", "correct", "p_true", "correct_flip", "p_true_flip", "features",
               "features_flip"]
    write_json_atomic(path / MANIFEST_FILE, {"identity": identity, "columns": columns,
                                               "shards": shards, "summary": {}})


def written(path: Path, n: int, shard: int) -> bool:
    """Whether ``path`` holds a cache ``write_feature_cache`` wrote with ``n`` rows and ``shard``
    rows a shard (its features follow from the directory's D and the fixed seeds)."""
    try:
        identity = json.loads((path / MANIFEST_FILE).read_text())["identity"]
    except (OSError, ValueError, KeyError):
        return False
    return identity.get("num_rows") == n and identity.get("shard_size") == shard


def optim(total: int) -> BankOptim:
    """The paper's protocol (presets.PAPER_ORACLE): lr 1e-5, momentum 0.05, 100 warm-up steps."""
    return BankOptim(seed=0, hyperplane=True, lr=1e-5, momentum=0.05, weight_decay=0.0,
                     pct_start=min(max(100, 2), max(2, int(0.3 * total)), total - 1) / total,
                     cycle_momentum=False)


def one_pass(train_dir: Path, val_dir: Path, device, batch: int, epochs: int,
             alphas: list[tuple[float, float]], cuda_graph: str = "auto",
             compiled: bool = False, per_replay: int = STEPS_PER_REPLAY,
             log_every: int = LOG_EVERY, sessions: list | None = None) -> dict:
    """Open + load + train a bank of len(alphas) SS heads + score val; seconds per phase, the
    step path that ran (``--cuda-graph``, up to ``per_replay`` steps a graph replay, the loop
    syncing every ``log_every`` steps) and the best heads' scores.  ``sessions``: the trained
    session is appended to it (bench/head_profile.py replays its graphs)."""
    step_path = head_step_path(device, cuda_graph, compiled=compiled)
    t0 = time.perf_counter()
    train = ClassifierCache.open(train_dir)
    targets = train.load(["valid", "correct", "p_true", "correct_flip", "p_true_flip"])
    table = load_table(train, SimpleNamespace(cache=train), targets, True, device)
    _sync(device)
    t_load = time.perf_counter()
    rows, val_rows = carve_rows(np.flatnonzero(targets["valid"]), 0.05, None, 0)
    schedule = StepSchedule(rows, batch, epochs, 0, True)
    losses = [get("ss").resolve({"alpha_pos": a, "alpha_neg": b}, Context((1.0, 3.0)), None)
              for a, b in alphas]
    total = schedule.total_steps
    settings = LoopSettings(total, batch, log_every, max(1, total // 4), None, None, False,
                            "bench")
    no_log = StepLog(RunDir(train_dir), None, enabled=False)
    with metrics_timer() as metrics_s:
        state, session = train_heads(table, schedule, losses, optim(total), val_rows, 0.0,
                                     settings, [no_log] * len(losses), step_path,
                                     per_replay=per_replay)
    _sync(device)
    t_train = time.perf_counter()
    if sessions is not None:
        sessions.append(session)
    val = ClassifierCache.open(val_dir)
    vt = val.load(["correct", "p_true"])
    vtable = load_table(val, SimpleNamespace(cache=val), vt, False, device)
    head = Head(table.x.shape[1], normalised=True, count=len(alphas)).to(device)
    with torch.no_grad():
        for name in ("weight", "bias"):
            getattr(head.linear, name).copy_(torch.cat(
                [b[f"linear.{name}"] for b in session.best]).to(device))
    z = score(vtable, np.arange(val.num_rows), head)
    t_end = time.perf_counter()
    assert z.shape == (val.num_rows, len(alphas)) and np.isfinite(z).all()
    return {"load_s": t_load - t0, "train_s": t_train - t_load, "score_val_s": t_end - t_train,
            "total_s": t_end - t0, "steps": total, "heads": len(alphas),
            "validation_s": round(session.timing(len(alphas))["val_s"], 3),
            "metrics_s": round(metrics_s[0], 3),
            "best_val_aupr_error": max(h.best_score or 0 for h in state.heads),
            "best": [(h.best_step, h.best_score) for h in state.heads],
            "step_path": step_path, "per_replay": per_replay, "log_every": log_every}


@contextmanager
def metrics_timer():
    """Seconds the loop spends on its validations' metrics (``fit.metrics_of_heads``, on the
    host), accumulated into the yielded list's one item: part of train_s, beside the session's
    own validation_s (scoring the held-out rows)."""
    spent, inner = [0.0], fit_module.metrics_of_heads

    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t

    fit_module.metrics_of_heads = timed
    try:
        yield spent
    finally:
        fit_module.metrics_of_heads = inner


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
    return value


def step_options(ap: argparse.ArgumentParser) -> None:
    """The step measured, as ``one_pass`` takes it (this bench's and head_profile.py's)."""
    ap.add_argument("--cuda-graph", default="auto", choices=("auto", "on", "off"),
                    help="the step path measured (as train-oracle's option)")
    ap.add_argument("--compile", action="store_true", help="train-oracle --head-only --compile: "
                    "the head's forward and the loss compiled")
    ap.add_argument("--per-replay", type=positive, default=STEPS_PER_REPLAY,
                    help="steps a graph replay runs at most (1: a replay a step)")
    ap.add_argument("--log-every", type=positive, default=LOG_EVERY,
                    help="train-oracle's --log-every: the loop syncs every N steps")


def step_of(args: argparse.Namespace) -> dict:
    """``one_pass``'s keyword arguments for the step ``step_options`` declared."""
    return {"cuda_graph": args.cuda_graph, "compiled": args.compile,
            "per_replay": args.per_replay, "log_every": args.log_every}


def path_text(run: dict) -> str:
    path = run["step_path"]
    return path["mode"] + (f" ({path['reason']})" if "reason" in path else "")


def with_baseline(run: dict, base: dict | None, what: str, label: str) -> str:
    """The line's tail comparing ``run`` with its twin (same inputs, the baseline step)."""
    if base is None:
        return ""
    return (f"\n    {label}: {what} {base[what]:.1f}s; "
            f"{base[what] / run[what]:.2f}x ({best_heads_compared(run, base)})")


def best_heads_compared(run: dict, twin: dict) -> str:
    """Whether two passes kept the same best heads: each head's (step, validation error)."""
    if run["best"] == twin["best"]:
        return "same best heads, bit for bit"
    pairs = list(zip(run["best"], twin["best"]))
    steps = sum(a[0] != b[0] for a, b in pairs)
    err = max(abs(a[1] - b[1]) for a, b in pairs)
    return (f"best heads differ: {steps} of {len(pairs)} at another validation step, "
            f"validation errors within {err:.1e}")


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def embedded(art: Path, quiet: bool) -> dict:
    """One head-only run and the whole head-only demo grid on the demo's caches (CPU, in-process,
    each run into a fresh runs root): seconds, imports excluded."""
    from pipeline.core.presets import DEMO
    from pipeline.oracle.settings.config import TrainConfig
    from pipeline.oracle.headonly.train import train_head_only

    runs = Path(tempfile.mkdtemp(prefix="bench_head_runs_"))
    base = TrainConfig(cache=str(art / "cache"), artifacts=str(art), runs_root=str(runs),
                       eval_splits=(f"test-{DEMO['corruption']}-{DEMO['severity']}",),
                       head_only=True, device="cpu", progress=not quiet)
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        train_head_only([replace(base, classifier="vit", oracle="vit", loss="ss")])
        one, one_cpu = time.perf_counter() - t0, time.process_time() - c0
        have = [m for m in DEMO["classifiers"] if (art / "cache" / m / "train").exists()]
        grid = [replace(base, classifier=c, oracle=o, loss=loss, broadcast=bc)
                for c in have for o in have
                for loss, bc in [(l, False) for l in DEMO["losses"]]
                + [(l, True) for l in DEMO["broadcast_losses"]]]
        shutil.rmtree(runs)
        t0, c0 = time.perf_counter(), time.process_time()
        for cfg in grid:                      # one command each, as the demo runs them
            train_head_only([cfg])
        whole, whole_cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    return {"one_run_s": round(one, 2), "one_run_cpu_s": round(one_cpu, 2),
            "grid_runs": len(grid), "grid_s": round(whole, 2), "grid_cpu_s": round(whole_cpu, 2),
            "load_average": os.getloadavg()[0]}


def extraction(art: Path) -> dict:
    """extract's img/s on the embedded test split (10,000 rows; vit, both views, CPU fp32) with
    and without --features, and the cache's size."""
    from pipeline.extract.run import ExtractConfig, extract

    out = {}
    for features in (False, True):
        tmp = Path(tempfile.mkdtemp(prefix="bench_head_extract_"))
        try:
            cfg = ExtractConfig(classifier="vit", out=tmp / "vit" / "test", split="test",
                                precision="fp32", device="cpu", flip_view=True,
                                features=features, progress=False,
                                weights=str(art / "classifiers" / "vit.pt"))
            s = extract(cfg)
            size = sum(p.stat().st_size for p in (tmp / "vit" / "test").glob("shard-*.h5"))
            out["with_features" if features else "without"] = {
                "img_per_s": s["img_per_s"], "rows": s["rows"], "cache_mb": round(size / 2**20, 1)}
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="CPU smoke run: 20,000 rows, D 64/128")
    ap.add_argument("--dims", default=None, help="feature widths (default 768,2048; quick 64,128)")
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--val-rows", type=int, default=None)
    ap.add_argument("--batch", type=int, default=40, help="the paper's batch")
    ap.add_argument("--grid", type=int, default=10, help="alpha values per axis (grid = N x N)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--shard-rows", type=positive, default=ExtractConfig.shard_size,
                    help="rows a shard of the synthetic caches (default: extract's --shard-size)")
    step_options(ap)
    ap.add_argument("--baseline", default=None, choices=("eager", "uncompiled", "step-a-replay"),
                    help="the twin each run is measured against: the eager step (default), the "
                    "same step uncompiled (default with --compile), or one step a graph replay")
    ap.add_argument("--no-eager", action="store_true", help="skip the baseline twin")
    ap.add_argument("--workdir", default=None, help="where the synthetic caches go (default tmp)")
    ap.add_argument("--reuse-caches", action="store_true", help="with --workdir: keep caches an "
                    "earlier run wrote there with the same rows and shard size (else rewritten)")
    ap.add_argument("--finetune-img-s", default=None, help="D:img/s,... of a full fine-tune at "
                    "the same batch (default: bench_train's H200 figures)")
    ap.add_argument("--embedded", type=Path, default=None, help="demo artifacts (with features)")
    ap.add_argument("--extraction", action="store_true", help="with --embedded: extract's cost")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and not args.quick
                                          else "cpu"))
    dims = [int(d) for d in (args.dims or ("64,128" if args.quick else "768,2048")).split(",")]
    n = args.rows or (20_000 if args.quick else N_TRAIN)
    n_val = args.val_rows or (5_000 if args.quick else N_VAL)
    grid = 3 if args.quick and args.grid == 10 else args.grid
    ft = dict(FINETUNE_IMG_S)
    if args.finetune_img_s:
        pairs = (x.split(":") for x in args.finetune_img_s.split(","))
        ft.update({int(k): float(v) for k, v in pairs})
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    print(f"bench_head: device {device} ({name or 'cpu'}), "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads; {n:,} train rows, "
          f"{n_val:,} val rows, batch {args.batch}")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_head_"))
    report = {"device": str(device), "device_name": name or "cpu", "cpus": os.cpu_count(),
              "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
              "command": shlex.join(["python", "bench/bench_head.py", *sys.argv[1:]]),
              "rows": n, "val_rows": n_val, "shard_rows": args.shard_rows, "batch": args.batch,
              "dims": {}}
    try:
        for dim in dims:
            t0 = time.perf_counter()
            for split, rows, seed in (("train", n, 1), ("val", n_val, 2)):
                if not (args.reuse_caches and written(work / f"d{dim}" / split, rows,
                                                      args.shard_rows)):
                    write_feature_cache(work / f"d{dim}" / split, rows, dim, seed=seed,
                                        shard=args.shard_rows)
            print(f"\nD = {dim}: caches written in {time.perf_counter() - t0:.1f}s "
                  f"({sum(p.stat().st_size for p in (work / f'd{dim}').rglob('*.h5')) / 2**30:.2f} GiB)")
            paths = (work / f"d{dim}" / "train", work / f"d{dim}" / "val", device, args.batch, 1)
            alphas = [(float(a), float(b)) for a in np.linspace(0.5, 5, grid)
                      for b in np.linspace(1, 10, grid)]
            step = step_of(args)
            one = one_pass(*paths, [(1.0, 3.0)], **step)
            baseline = args.baseline or ("uncompiled" if args.compile else "eager")
            twin = not args.no_eager and (baseline != "eager"
                                          or one["step_path"]["mode"] == "cuda_graph")
            base_step, label = {
                "eager": ({**step, "cuda_graph": "off"}, "eager step (--cuda-graph off)"),
                "uncompiled": ({**step, "compiled": False}, "uncompiled step"),
                "step-a-replay": ({**step, "per_replay": 1}, "one step a graph replay")}[baseline]
            one_base = one_pass(*paths, [(1.0, 3.0)], **base_step) if twin else None
            ref = n / ft[dim] if dim in ft else None
            print(f"  one run (load {one['load_s']:.1f}s + {one['steps']:,} steps "
                  f"{one['train_s']:.1f}s + score val {one['score_val_s']:.2f}s): "
                  f"{one['total_s']:.1f}s end to end; step: {path_text(one)}"
                  + (f"; full fine-tune of the point ~{ref:,.0f}s at {ft[dim]:,.0f} img/s "
                     f"(bench_train): {ref / one['total_s']:,.0f}x" if ref else "")
                  + with_baseline(one, one_base, "train_s", label))
            many = one_pass(*paths, alphas, **step)
            many_base = one_pass(*paths, alphas, **base_step) if twin else None
            print(f"  {grid}x{grid} alpha grid ({len(alphas)} heads, one bank): "
                  f"{many['total_s']:.1f}s end to end (train {many['train_s']:.1f}s incl. "
                  f"validation {many['validation_s']:.1f}s + metrics {many['metrics_s']:.1f}s); "
                  f"step: {path_text(many)}"
                  + with_baseline(many, many_base, "train_s", label))
            # "eager": the baseline twin's runs, whichever "baseline" names
            report["dims"][dim] = {"one_run": one, "grid": many, "finetune_s": ref,
                                   "eager": {"one_run": one_base, "grid": many_base},
                                   "baseline_kind": baseline if twin else None,
                                   "baseline": label if twin else None}
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    if args.embedded:
        emb = embedded(args.embedded, quiet=True)
        print(f"\nembedded ({args.embedded}): one head-only run (<vit, vit> SS, 20,000 rows) "
              f"{emb['one_run_s']:.2f}s (CPU time {emb['one_run_cpu_s']:.2f}s); the head-only "
              f"demo grid ({emb['grid_runs']} runs) {emb['grid_s']:.1f}s (CPU time "
              f"{emb['grid_cpu_s']:.1f}s); in-process, imports excluded; load average "
              f"{emb['load_average']:.1f}")
        report["embedded"] = emb
        if args.extraction:
            ext = extraction(args.embedded)
            print("extract vit test (10,000 rows, both views, CPU fp32): "
                  + "; ".join(f"{k}: {v['img_per_s']} img/s, {v['cache_mb']} MB"
                              for k, v in ext.items()))
            report["extraction"] = ext
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
