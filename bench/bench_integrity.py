"""What cache verification costs: per-shard checksum work, and extraction with checksums on/off.

    python bench/bench_integrity.py                  # ImageNet-val-sized shards + a CPU extract
    python bench/bench_integrity.py --quick          # a smoke run (seconds)

1. One shard of ``--rows`` rows x ``--classes`` fp16 logits (default 3,125 x 1,000 = an
   ImageNet-val shard, 6.4 MB), in the page cache:
   * write: the writer before checksums (h5py writing straight to the file, the baseline) vs
     ``write_shard`` (HDF5 built in RAM, an XXH3-64 hash per column, one plain write);
   * manifest: ``shard_entry`` (read back, XXH3-128 hash), once per shard at the end of extraction;
   * load: ``read_columns`` of every column with its XXH3-64 checks vs h5py alone;
   * ``extract --verify``: the XXH3-128 hash of the whole file.
   The added milliseconds are set against the time the accelerator spends on one shard at
   ``--gpu-rate`` img/s (docs/PERFORMANCE.md: ~9,600 img/s for ResNet-50 on an H100).
2. ``extract()`` end to end on CPU (a tiny random-init model over ``--extract-rows`` generated
   JPEGs, decoded in-process), with checksums and with them switched off (column hashes and
   XXH3-128 hash replaced by constants), alternating, best of ``--repeats``: img/s and CPU seconds
   each, and the ratios.
3. The image stamps (pipeline/data/stamps.py) over ``--stamp-rows`` generated JPEGs in the page
   cache, per file: the check every stage runs on a cache used with ``--data`` (one ``stat`` per
   file, then a hash of the (size, mtime_ns) table) against listing the split, which every stage
   already does (the baseline); and the content hash (what ``extract --verify`` or a changed
   stamp costs) against reading the files' bytes alone.

Prints one ``BENCH_INTEGRITY {json}`` line.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import cache.shards as shards  # noqa: E402
from cache.integrity import file_digest  # noqa: E402
from cache.schema import to_attr  # noqa: E402


def shard_columns(rows: int, classes: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"index": np.arange(rows, dtype=np.int64), "label": rng.integers(0, classes, rows),
            "valid": np.ones(rows, np.uint8),
            "logits": rng.normal(size=(rows, classes)).astype(np.float16),
            "pred": rng.integers(0, classes, rows), "correct": rng.integers(0, 2, rows, np.uint8),
            "p_true": rng.random(rows, np.float32), "p_max": rng.random(rows, np.float32)}


def write_before(path: Path, columns: dict, attrs: dict) -> None:
    """The writer before checksums: h5py straight to the file (temp name + rename)."""
    import h5py

    tmp = path.with_name(f".{path.name}.tmp")
    with h5py.File(tmp, "w") as fh:
        for key, value in attrs.items():
            fh.attrs[key] = to_attr(value)
        for name, array in columns.items():
            fh.create_dataset(name, data=np.ascontiguousarray(array))
    tmp.replace(path)


def read_before(path: Path, names: list[str]) -> dict:
    import h5py

    with h5py.File(path, "r") as fh:
        return {n: fh[n][...] for n in names}


def best_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * min(times)


def shard_costs(rows: int, classes: int, repeats: int, gpu_rate: float, work: Path) -> dict:
    cols = shard_columns(rows, classes)
    attrs = {"schema_version": 1, "kind": "classifier", "start": 0, "stop": rows, "bad_rows": []}
    old, new = work / "before.h5", work / "shard-00000.h5"
    names = list(cols)
    ms = {"write_before": best_ms(lambda: write_before(old, cols, attrs), repeats),
          "write_checksummed": best_ms(lambda: shards.write_shard(new, cols, attrs), repeats),
          "manifest_entry": best_ms(lambda: shards.shard_entry(new, 0, rows), repeats),
          "load_before": best_ms(lambda: read_before(old, names), repeats),
          "load_checked": best_ms(lambda: shards.read_columns(new, names), repeats),
          "verify_file_hash": best_ms(lambda: file_digest(new), repeats)}
    shard_ms = 1000 * rows / gpu_rate
    extract_added = ms["write_checksummed"] - ms["write_before"] + ms["manifest_entry"]
    return {"rows": rows, "classes": classes, "shard_bytes": new.stat().st_size,
            "ms": {k: round(v, 2) for k, v in ms.items()},
            "gpu_rate": gpu_rate, "gpu_ms_per_shard": round(shard_ms, 1),
            "extract_added_pct_of_gpu_time": round(100 * extract_added / shard_ms, 2),
            "load_added_ms": round(ms["load_checked"] - ms["load_before"], 2)}


@contextmanager
def checksums_off():
    """Column hashes and XXH3-128 hash replaced by constants (everything else unchanged)."""
    saved = shards.column_hash, shards.file_digest
    shards.column_hash = lambda array: "0"
    shards.file_digest = lambda path: {"bytes": Path(path).stat().st_size, "xxh3_128": "off"}
    try:
        yield
    finally:
        shards.column_hash, shards.file_digest = saved


def extract_rates(n: int, repeats: int, work: Path) -> dict:
    import shutil

    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import TINY_VIT, make_imagenet_tree
    from pipeline.data.labels import imagenet_synsets
    from pipeline.extract.run import ExtractConfig, extract

    data = make_imagenet_tree(work / "jpegs", list(imagenet_synsets()[:10]), per_class=n // 10,
                              splits=("val",))
    rates, cpu = {"on": [], "off": []}, {"on": [], "off": []}
    for i in range(repeats):
        for mode in ("off", "on"):
            out = work / f"cache-{mode}-{i}"
            # workers=0: decoding in this process, so its CPU time is the whole cost (the CPU
            # time is the steadier figure on a machine shared with other work)
            cfg = ExtractConfig(classifier=TINY_VIT[0], model_kwargs=dict(TINY_VIT[1]), out=out,
                                data=str(data), split="val", random_init=True, device="cpu",
                                precision="fp32", workers=0, batch_size=64, shard_size=250,
                                progress=False)
            start = time.process_time()
            with checksums_off() if mode == "off" else _nothing():
                summary = extract(cfg)
            cpu[mode].append(round(time.process_time() - start, 3))
            rates[mode].append(summary["img_per_s"])
            shutil.rmtree(out)
    best = {k: max(v) for k, v in rates.items()}
    least = {k: min(v) for k, v in cpu.items()}
    return {"rows": n, "img_per_s": best, "cpu_s": least, "all_img_per_s": rates,
            "all_cpu_s": cpu, "ratio_img_per_s_on_over_off": round(best["on"] / best["off"], 3),
            "ratio_cpu_on_over_off": round(least["on"] / least["off"], 3)}


@contextmanager
def _nothing():
    yield


def stamp_costs(n: int, repeats: int, work: Path) -> dict:
    """Microseconds per file: listing the split (baseline), the stamp check, reading the files,
    hashing their contents; and the ratios check/listing, hashing/reading."""
    sys.path.insert(0, str(ROOT / "tests"))
    from cache.integrity import column_hash
    from conftest import make_imagenet_tree
    from pipeline.data.labels import imagenet_synsets
    from pipeline.data.sources import list_split
    from pipeline.data.stamps import current_hashes, current_stats

    data = make_imagenet_tree(work / "stamped", list(imagenet_synsets()[:10]), per_class=n // 10,
                              splits=("val",))
    samples = list_split(str(data), "val")
    rows = len(samples)

    def read_all():
        for i in range(rows):
            samples.path(i).read_bytes()

    ms = {"list_split": best_ms(lambda: list_split(str(data), "val"), repeats),
          "stamp_check": best_ms(lambda: column_hash(current_stats(samples, 0, rows)), repeats),
          "read_files": best_ms(read_all, repeats),
          "hash_files": best_ms(lambda: current_hashes(samples, 0, rows), repeats)}
    return {"rows": rows, "us_per_file": {k: round(1e3 * v / rows, 2) for k, v in ms.items()},
            "ratio_check_over_listing": round(ms["stamp_check"] / ms["list_split"], 3),
            "ratio_hash_over_read": round(ms["hash_files"] / ms["read_files"], 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=3125)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--gpu-rate", type=float, default=9600.0)
    ap.add_argument("--extract-rows", type=int, default=2000)
    ap.add_argument("--stamp-rows", type=int, default=20000)
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.repeats, args.extract_rows, args.stamp_rows = 300, 2, 40, 40
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        result = {"shard": shard_costs(args.rows, args.classes, args.repeats, args.gpu_rate, work),
                  "extract_cpu": extract_rates(args.extract_rows, min(args.repeats, 3), work),
                  "stamps": stamp_costs(args.stamp_rows, args.repeats, work),
                  "cpu": platform.processor() or platform.machine(),
                  "date": time.strftime("%Y-%m-%d")}
    print("BENCH_INTEGRITY " + json.dumps(result))


if __name__ == "__main__":
    main()
