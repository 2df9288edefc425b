"""Benchmark of stage 3 (`cli.py report`) against a naive baseline measured in the same run.

    python bench/bench_report.py                 # the issue's sizes (about 2 minutes, ~400 MB disk)
    python bench/bench_report.py --small         # a quick smoke run
    python bench/bench_report.py --only-a --paper-grid   # A as the paper's Table 1 grid

Two workloads (their targets on a 2-core CPU at the right):
  A. 16 runs x 50,000 rows: 2 <O,C> pairs x 4 losses x 2 seeds, two classifier caches of
     50,000 x 1,000 float16 logits (ImageNet-val-sized; the post-hoc baselines read them).  < 10 s
     With --paper-grid: the paper's grid at one split, 4 <O,C> pairs (ViT/ResNet oracle x
     ViT/ResNet classifier) x 4 losses x 1 seed, the same two caches.  With --train-rows
     1281167: the training caches the baselines' fits read their held-out rows from are
     ImageNet-train-sized (1.28M x 1,000, in extract's 3,125-row shards; ~5 GB of disk).
  B. 1 run x 1,281,167 rows (ImageNet-train-sized), a cache with 10 classes.                < 5 s
Target: A, with intervals, fits in 8 GiB of host memory and 60 s; every command run is
printed with the peak resident memory of its whole process tree (the command and its joblib
workers, sampled: bench/proctree.py) and the largest single process's exact peak (ru_maxrss).

Measured, in the same run: the whole command in a fresh interpreter (imports, joblib start-up,
checks, metrics of both definitions, working points, separability, the seven post-hoc baselines
with temperature scaling and MaxLogit-pNorm fitted on held-out training rows, figures, four files)
with ``--no-ci`` (the configuration before bootstrap intervals existed) and with everything on
(1,000-resample intervals for every number, paired comparisons), the latter in-process too, and
the metric computation alone.  Workload A's runs list 5% of a 50,000-row training cache per
classifier as held-out rows (val_split.json), as train-oracle does.  Naive baseline = how the reference code computes the same numbers:
one scikit-learn call per metric (roc_auc_score, average_precision_score x 3, roc_curve), the
authors' FPR-95%-TPR loop over the 10,000-threshold grid, and fd-shifts' per-row Python loops for
AURC and AUGRC.  For B it runs on a 10% subsample and is extrapolated linearly (noted).

The report is numpy-only and CPU-bound by design (no model in memory), so there is no CUDA path.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.proctree import PeakTreeRSS  # noqa: E402
from bench.synthetic_runs import write_cache, write_run, write_study  # noqa: E402
from cache.outputs import read_outputs  # noqa: E402
from pipeline.report.scoring import score_summary  # noqa: E402


def naive_metrics(conf: np.ndarray, correct: np.ndarray) -> dict:
    """The reference implementations' way: sklearn per metric + Python loops over thresholds/rows."""
    from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve
    out = {"auc": roc_auc_score(correct, conf), "ap_succ": average_precision_score(correct, conf),
           "ap_err_paper": average_precision_score(~correct, conf),
           "ap_err_std": average_precision_score(~correct, -conf)}
    fpr, tpr, _ = roc_curve(correct, conf, drop_intermediate=False)
    out["fpr95_std"] = fpr[tpr >= 0.9495].min()
    out["fpr95_paper"] = None
    for delta in np.arange(conf.min(), conf.max(), (conf.max() - conf.min()) / 10000):
        t = len(conf[correct & (conf >= delta)]) / len(conf[correct])
        if 0.95 + 0.0005 >= t >= 0.95 - 0.0005:
            out["fpr95_paper"] = len(conf[~correct & (conf >= delta)]) / len(conf[~correct])
            break
    out["aurc"], out["augrc"] = _fd_loop(conf, correct, False), _fd_loop(conf, correct, True)
    return out


def _fd_loop(conf, correct, generalized):
    res = 1.0 - correct[np.argsort(conf)]
    c = np.sort(conf)
    n, err, cov = len(res), float(res.sum()), len(res)
    covs, risks = [1.0], [err / n]
    for i in range(n - 1):
        cov -= 1
        err -= res[i]
        if c[i] != c[i + 1]:
            covs.append(cov / n)
            risks.append(err / (n if generalized else cov))
    covs.append(0.0)
    risks.append(0.0 if generalized else risks[-1])
    x, y = np.array(covs), np.array(risks)
    return float(-np.sum(np.diff(x) * (y[1:] + y[:-1]) / 2))


def load_runs(runs_root: Path) -> list[tuple[np.ndarray, np.ndarray, str]]:
    out = []
    for h5 in sorted(runs_root.glob("*/outputs/*.h5")):
        o = read_outputs(h5)
        valid = o.columns["valid"] == 1
        out.append((o.columns["confidence"][valid], o.columns["correct"][valid].astype(bool),
                    o.run["loss"]))
    return out


MEMORY_TARGET_GIB, TIME_TARGET_S = 8.0, 60.0     # A with intervals, 2 cores
EXTRACT_SHARD = 3125       # extract's default --shard-size (pipeline/extract/run.py)


def time_cli(runs_root: Path, out: Path, extra: tuple[str, ...] = ()) -> dict:
    """Wall time, CPU time (user + sys of the command and its joblib workers) and peak memory of
    a fresh interpreter running `cli.py report [extra]`: the process tree's summed RSS (sampled)
    and the largest single process's peak (ru_maxrss of the children waited for, exact; it only
    grows, so it is the largest over this bench's commands so far)."""
    import resource
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    cmd = [sys.executable, str(ROOT / "cli.py"), "report", "--runs-root", str(runs_root),
           "--out", str(out), *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL)
    with PeakTreeRSS(proc.pid) as peak:
        code = proc.wait()
    wall = time.perf_counter() - start
    if code:
        raise subprocess.CalledProcessError(code, cmd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"wall_s": wall,
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "tree_peak_gib": peak.bytes / 2**30, "processes": peak.processes,
            "single_peak_gib": after.ru_maxrss * 1024 / 2**30}    # Linux: KiB


def time_in_process(runs_root: Path, out: Path) -> float:
    """The report() call with imports done but a COLD joblib worker pool (started inside)."""
    from joblib.externals.loky import get_reusable_executor
    from pipeline.report.run import ReportConfig, report
    get_reusable_executor().shutdown(wait=True)
    start = time.perf_counter()
    summary = report(ReportConfig(runs_root=str(runs_root), out=str(out)))
    return time.perf_counter() - start, summary["timings"]


def time_metrics(runs) -> float:
    start = time.perf_counter()
    for conf, correct, loss in runs:
        score_summary(conf, correct, {"paper": 0.1 if loss == "tcp" else 0.5, "standard": 0.5})
    return time.perf_counter() - start


def time_naive(runs, fraction: float) -> float:
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for conf, correct, _ in runs:
        keep = rng.random(len(conf)) < fraction if fraction < 1 else slice(None)
        naive_metrics(conf[keep], correct[keep])
    return (time.perf_counter() - start) / fraction


def workload(name: str, root: Path, runs_root: Path, target: float, naive_fraction: float) -> dict:
    runs = load_runs(runs_root)
    rows = sum(len(r[0]) for r in runs)
    load = [os.getloadavg()[0]]
    base = time_cli(runs_root, root / "report-no-ci", extra=("--no-ci",))
    full = time_cli(runs_root, root / "report-cli")
    load.append(os.getloadavg()[0])
    (base_s, base_cpu), (cli_s, cli_cpu) = ((r["wall_s"], r["cpu_s"]) for r in (base, full))
    inproc_s, phases = time_in_process(runs_root, root / "report-inproc")
    metrics_s = time_metrics(runs)
    naive_s = time_naive(runs, naive_fraction)
    result = {"workload": name, "runs": len(runs), "rows": rows, "cli_s": round(cli_s, 2),
              "cli_cpu_s": round(cli_cpu, 2), "cli_no_ci_s": round(base_s, 2),
              "cli_no_ci_cpu_s": round(base_cpu, 2), "ci_cost_ratio": round(cli_s / base_s, 2),
              "load_average": [round(x, 2) for x in load],
              "cli_tree_peak_gib": round(full["tree_peak_gib"], 3),
              "cli_single_peak_gib": round(full["single_peak_gib"], 3),
              "cli_processes": full["processes"],
              "cli_no_ci_tree_peak_gib": round(base["tree_peak_gib"], 3),
              "in_process_s": round(inproc_s, 2), "in_process_phases_s": phases,
              "metrics_only_s": round(metrics_s, 2),
              "naive_metrics_s": round(naive_s, 2),
              "naive_extrapolated_from": naive_fraction if naive_fraction < 1 else None,
              "speedup_metrics": round(naive_s / metrics_s, 1), "target_s": target,
              "meets_target": cli_s < target}
    print(f"{name}: {len(runs)} run(s), {rows:,} rows | cli.py report --no-ci {base_s:.2f} s "
          f"(CPU {base_cpu:.1f} s) | cli.py report, everything on {cli_s:.2f} s "
          f"(target < {target:.0f} s: {'PASS' if cli_s < target else 'FAIL'}; CPU {cli_cpu:.1f} s; "
          f"x{cli_s / base_s:.2f} the --no-ci time) | peak memory, everything on: process tree "
          f"{full['tree_peak_gib']:.2f} GiB ({full['processes']} processes; --no-ci "
          f"{base['tree_peak_gib']:.2f} GiB), largest process {full['single_peak_gib']:.2f} GiB "
          f"(target <= {MEMORY_TARGET_GIB:.0f} GiB and <= {TIME_TARGET_S:.0f} s: "
          f"{'PASS' if full['tree_peak_gib'] <= MEMORY_TARGET_GIB and cli_s <= TIME_TARGET_S else 'FAIL'}"
          f") | load average {load} | in-process "
          f"{inproc_s:.2f} s {phases} | metrics only {metrics_s:.2f} s | naive "
          f"{naive_s:.1f} s{' (extrapolated from %d%%)' % (100 * naive_fraction) if naive_fraction < 1 else ''}"
          f" | metrics speed-up x{naive_s / metrics_s:.0f}", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="Quick run: 4 x 5,000 and 1 x 100,000.")
    parser.add_argument("--dir", default=None, help="Work directory (default: a temporary one).")
    parser.add_argument("--keep", action="store_true", help="Keep the generated runs and reports.")
    parser.add_argument("--only-a", action="store_true", help="Workload A only.")
    parser.add_argument("--paper-grid", action="store_true", help="A as the paper's grid at one "
                        "split: 4 <O,C> pairs x 4 losses x 1 seed (default 2 pairs x 2 seeds).")
    parser.add_argument("--train-rows", type=int, default=None, help="Rows of A's training caches "
                        "(default: as the evaluated split; ImageNet: 1281167, written in "
                        f"extract's {EXTRACT_SHARD:,}-row shards).")
    args = parser.parse_args()
    n_a, seeds, n_b, k_a = (5_000, (0,), 100_000, 100) if args.small else (50_000, (0, 1), 1_281_167, 1000)
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench_report_"))
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, "
          f"python {platform.python_version()}, numpy {np.__version__}; work dir {work}; "
          f"load average {os.getloadavg()[0]:.2f} (other processes compete for the cores)", flush=True)
    try:
        t = time.perf_counter()
        pairs = (("vit", "vit"), ("resnet", "resnet"))
        if args.paper_grid:
            pairs, seeds = ((o, c) for o in ("vit", "resnet") for c in ("vit", "resnet")), (0,)
        runs_a, _ = write_study(work / "A", n=n_a, k=k_a, pairs=tuple(pairs), seeds=seeds,
                                tag="val", held_out=0.05, n_train=args.train_rows,
                                train_shard=EXTRACT_SHARD if args.train_rows else None)
        if not args.only_a:
            cache_b = write_cache(work / "B" / "cache" / "vit" / "train", n=n_b, k=10,
                                  model="vit", split="train")
            write_run(work / "B" / "runs" / "ss", cache_b, oracle="vit", classifier="vit",
                      loss="ss", seed=0, group="b", tag="train")
        print(f"generated inputs in {time.perf_counter() - t:.1f} s", flush=True)
        results = [workload("A", work / "A", runs_a, 10.0, 1.0)]
        if not args.only_a:
            results.append(workload("B", work / "B", work / "B" / "runs", 5.0, 0.1))
        print(f"load average after: {os.getloadavg()[0]:.2f}")
        print(json.dumps(results))
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
