"""Benchmark of TrustScore's exact nearest-neighbour search (pipeline/report/knn.py), the part of
`cli.py report` whose cost grows with the training split: fit (each class's density filter, only
when alpha > 0) and scoring (each query's nearest kept row of every class).

    python bench/bench_trustscore.py                           # CPU, scaled down (< 1 min)
    python bench/bench_trustscore.py --imagenet --device cuda  # 1,281,167 x 2,048, 1,000 classes,
                                                               # 50,000 queries (an H100: ~1 min)

Synthetic float16 features (a centre per class plus unit noise; the search's cost does not
depend on the values), labels spread evenly over the classes, queries predicted at random.
Printed: the sizes, fit and score seconds, the score's rate (queries/s) and its arithmetic rate
(the 2 x queries x rows x D flops of the matrix products over seconds); with a device, the
first ``--check`` queries are scored on the CPU too and compared (the same neighbours give the
same float64 distances; a different one among near-ties differs by rounding only).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.report import knn  # noqa: E402

SMALL = dict(rows=60_000, dim=128, classes=10, queries=10_000)   # the embedded demo's train/test
IMAGENET = dict(rows=1_281_167, dim=2048, classes=1000, queries=50_000)


def features(rows: int, dim: int, classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, dim) float16 around a centre per class, in chunks (ImageNet: 5.2 GB, no float64
    copy), and the labels."""
    rng = np.random.default_rng(seed)
    labels = np.arange(rows) % classes
    centres = (3.0 * rng.standard_normal((classes, dim), dtype=np.float32)).astype(np.float32)
    out = np.empty((rows, dim), np.float16)
    for s in range(0, rows, 65_536):
        part = rng.standard_normal((min(65_536, rows - s), dim), dtype=np.float32)
        out[s:s + len(part)] = part + centres[labels[s:s + len(part)]]
    return out, labels


def bench(rows: int, dim: int, classes: int, queries: int, k: int, alpha: float, device: str,
          check: int, seed: int = 0) -> dict:
    train, labels = features(rows, dim, classes, seed)
    query, _ = features(queries, dim, classes, seed + 1)
    pred = np.random.default_rng(seed + 2).integers(0, classes, queries)
    xp = knn.backend(device)
    start = time.perf_counter()
    kept, offsets = knn.kept_sets(train, labels, classes, k, alpha, xp)
    fit_s = time.perf_counter() - start
    start = time.perf_counter()
    scores = knn.trust_ratio(query, pred, kept, offsets, xp)
    score_s = time.perf_counter() - start
    out = {"rows": rows, "dim": dim, "classes": classes, "queries": queries, "k": k,
           "alpha": alpha, "device": device, "kept_rows": int(len(kept)),
           "fit_s": round(fit_s, 3), "score_s": round(score_s, 3),
           "queries_per_s": round(queries / score_s, 1),
           "score_gflop_s": round(2.0 * queries * len(kept) * dim / score_s / 1e9, 1),
           "machine": platform.processor() or platform.machine()}
    if device != "cpu" and check:
        cpu = knn.trust_ratio(query[:check], pred[:check], kept, offsets)
        rel = np.abs(cpu - scores[:check]) / np.maximum(np.abs(cpu), 1e-300)
        out["check"] = {"queries": check, "identical": int((cpu == scores[:check]).sum()),
                        "max_rel_diff": float(rel.max())}
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--imagenet", action="store_true", help="ImageNet sizes (for a GPU)")
    for name in ("rows", "dim", "classes", "queries"):
        ap.add_argument(f"--{name}", type=int, default=None)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--alpha", type=float, default=0.1, help="> 0 so the filter is timed too")
    ap.add_argument("--device", default="cpu", help="cpu, or a torch device (cuda)")
    ap.add_argument("--check", type=int, default=200, help="queries compared with the CPU")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    sizes = dict(IMAGENET if args.imagenet else SMALL)
    sizes.update({n: getattr(args, n) for n in sizes if getattr(args, n) is not None})
    fig = bench(**sizes, k=args.k, alpha=args.alpha, device=args.device, check=args.check)
    print(f"TrustScore, {fig['rows']:,} training rows x {fig['dim']} features, "
          f"{fig['classes']} classes, {fig['queries']:,} queries, k = {fig['k']}, "
          f"alpha = {fig['alpha']}, on {fig['device']}:")
    print(f"  fit (density filter)  {fig['fit_s']:.2f} s   ({fig['kept_rows']:,} rows kept)")
    print(f"  score                 {fig['score_s']:.2f} s   ({fig['queries_per_s']:,.0f} "
          f"queries/s, {fig['score_gflop_s']:,.1f} GFLOP/s float64)")
    if "check" in fig:
        c = fig["check"]
        print(f"  check vs numpy        {c['identical']}/{c['queries']} identical, max relative "
              f"difference {c['max_rel_diff']:.1e}")
    if args.json:
        Path(args.json).write_text(json.dumps(fig, indent=1))
    return fig


if __name__ == "__main__":
    main()
