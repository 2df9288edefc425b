"""Where one ``extract --decode cpu`` process spends its time: each stage's ceiling, then the real run.

In one process, on the first ``--rows`` files of the bench's JPEGs (``bench/make_jpegs.py``):
1. ``per_image``: one worker's ms per image (one thread, files in the page cache): read + XXH3,
   ``decode_file``, ``ResizeCrop``, all ``ImageRows.__getitem__``, the shared-memory collate;
   ``ceilings_img_per_s`` = 1000 / ms x ``--workers``;
2. ``loader``: extract's loader alone, steady img/s, ``pin_memory`` as extract sets it and off;
3. ``model_alone``: ``classify`` with extract's ``forward_fn`` on a resident uint8 batch, img/s;
4. ``extract``: the real ``extract()`` (random init, cache in a temp dir), steady img/s and the
   main thread's steady wall time split by wrapping what its loop calls (no synchronisation
   added: on CUDA the GPU's time shows as ``device_wait_in_sink``, the wait for the last batch);
5. ``two_procs`` (``--two-procs``): two spawned ``extract()`` runs, W/2 workers each, on the two
   halves of the rows at once: summed img/s vs one process.
Prints a verdict (the lowest ceiling vs extract's rate) and one ``PROFILE_EXTRACT {json}`` line.

    python bench/make_jpegs.py --out /tmp/jpegs --n-val 12800 --n-train 0
    python bench/profile_extract.py --data /tmp/jpegs --models resnet50 --json profile.json
    python bench/profile_extract.py --data /tmp/jpegs --device cpu --models resnet10t \\
        --rows 256 --batch-size 32 --workers 2                             # CPU smoke run
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_extract import device_name, subset_tree  # noqa: E402
from bench.extract_spans import Spans, instrumented  # noqa: E402
from bench.profile_decode import loader_rate, rate  # noqa: E402
from pipeline.core.models import build_model, resolve_data_config, resolve_spec  # noqa: E402
from pipeline.core.precision import autocast, default_precision  # noqa: E402
from pipeline.data.decode import make_dataset  # noqa: E402
from pipeline.data.images import GpuNormalize, decode_file, transform_for  # noqa: E402
from pipeline.data.loader import default_workers  # noqa: E402
from pipeline.data.sources import list_split  # noqa: E402
from pipeline.data.stamps import SourceRecorder, read_stamped  # noqa: E402
from pipeline.extract import forward as fwd, run  # noqa: E402
from pipeline.extract.run import ExtractConfig, extract  # noqa: E402


def per_image(samples, dataset, n: int, workers: int, batch_size: int) -> dict:
    """Mean ms per image of each worker step, one intra-op thread (as DataLoader's workers)."""
    threads, n = torch.get_num_threads(), min(n, len(samples))
    torch.set_num_threads(1)
    paths = [samples.path(i) for i in range(n)]
    for p in paths:   # into the page cache: a steady extract reads files the OS has cached
        read_stamped(p)
    steps = {"read_stamped": lambda p, _: read_stamped(p)[0],   # bytes + (size, mtime, XXH3)
             "of_which_xxh3": lambda _, data: xxhash.xxh3_128_digest(data) and data,  # again
             "decode": lambda p, data: decode_file(str(p), data, samples.exif_transpose),
             "resize_crop": lambda _, img: dataset.transform(img)}   # ImageRows' exact calls
    ms = dict.fromkeys(steps, 0.0)
    try:
        for p in paths:
            value = None
            for k, step in steps.items():
                t0 = time.perf_counter()
                value = step(p, value)
                ms[k] += 1000 * (time.perf_counter() - t0) / n
        t0 = time.perf_counter()
        items = [dataset[i] for i in range(n)]
        ms["getitem"] = 1000 * (time.perf_counter() - t0) / n
        ms["collate_shared"] = collate_ms(items, batch_size)
    finally:
        torch.set_num_threads(threads)
    ms["worker_total"] = ms["getitem"] + ms["collate_shared"]
    return {**{k: round(v, 6) for k, v in ms.items()}, "images": n, "workers": workers,
            "ceilings_img_per_s": {k: round(1000 / v * workers, 1) for k, v in ms.items()
                                   if k != "of_which_xxh3" and v > 0}}


def collate_ms(items: list, batch_size: int) -> float:
    """ms per image of default_collate into new shared memory, as in a worker (it does that only
    where it sees a worker info, so one is set)."""
    from torch.utils.data import default_collate
    from torch.utils.data._utils import worker

    saved, worker._worker_info = worker._worker_info, object()
    try:
        t0 = time.perf_counter()
        for a in range(0, len(items), batch_size):
            default_collate(items[a:a + batch_size])
        return 1000 * (time.perf_counter() - t0) / len(items)
    finally:
        worker._worker_info = saved


def model_alone(model, data_cfg, args, device) -> dict:
    """``classify`` as extract calls it, on a uint8 batch on the device; also from a pinned
    host batch (the host->device copy included, as the loader delivers it)."""
    fn, normalize = run.forward_fn(model, args.features, False), GpuNormalize(data_cfg, device)
    x = torch.randint(0, 256, (args.batch_size, *data_cfg.input_size), dtype=torch.uint8)
    host = x.pin_memory() if device.type == "cuda" else x
    resident, labels = x.to(device), torch.zeros(len(x), dtype=torch.int64, device=device)

    def step(batch):
        with torch.inference_mode(), autocast(args.precision, device):
            fwd.classify(fn, normalize(batch), labels)
    return {"resident_img_per_s": rate(lambda: step(resident), len(x), device, args.seconds),
            "from_pinned_host_img_per_s": rate(lambda: step(host), len(x), device, args.seconds)}


def config(args, data: Path, out: Path, workers: int, device) -> ExtractConfig:
    """bench_extract's ExtractConfig (run_fast): random init, one shard, no progress bar."""
    return ExtractConfig(classifier=args.model, out=out, data=str(data), split=args.split,
                         batch_size=args.batch_size, workers=workers, precision=args.precision,
                         device=str(device), random_init=True, features=args.features,
                         shard_size=len(list_split(str(data), args.split)), progress=False)


def extract_split(args, device, tmp: Path) -> dict:
    spans = Spans()
    with instrumented(spans):
        summary = extract(config(args, args.data, tmp / "cache", args.workers, device))
    out = {"steady_img_per_s": summary["steady_img_per_s"], "img_per_s": summary["img_per_s"]}
    if spans.start is None or spans.end is None:
        return {**out, "error": "one batch only: no steady part"}
    window = spans.end - spans.start
    parts = {**spans.total, "other_python": window - sum(spans.total.values())}
    return {**out, "window_s": round(window, 4), "seconds": {k: round(v, 6) for k, v in
                                                             parts.items()},
            "fraction": {k: round(v / window, 6) for k, v in parts.items()}}


def _child(cfg: ExtractConfig, queue) -> None:
    queue.put(extract(cfg)["steady_img_per_s"])


def two_procs(args, device, tmp: Path) -> dict:
    """Two spawned extract processes (W/2 workers each) on the two halves of the rows: not a
    Pool, whose daemonic processes could not start loader workers."""
    names = list_split(str(args.data), args.split).names
    ctx, half, procs = mp.get_context("spawn"), len(names) // 2, []
    queue = ctx.Queue()
    for k, part in enumerate((names[:half], names[half:])):
        for name in part:
            (tmp / f"half{k}" / args.split / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / f"half{k}" / args.split / name).symlink_to(
                Path(args.data).resolve() / args.split / name)
        cfg = config(args, tmp / f"half{k}", tmp / f"cache{k}", max(1, args.workers // 2), device)
        procs.append(ctx.Process(target=_child, args=(cfg, queue)))
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    rates = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    return {"steady_img_per_s_each": rates, "summed_img_per_s": round(sum(r or 0 for r in rates), 1),
            "img_per_s_with_startup": round(len(names) / (time.perf_counter() - t0), 1)}


def verdict(res: dict) -> dict:
    """The lowest stage ceiling (the bound) against extract's measured steady rate."""
    ceilings = {k: v for k, v in [
        ("cpu_workers", res["per_image"]["ceilings_img_per_s"].get("worker_total")),
        ("loader_alone", res["loader"]["img_per_s"]),
        ("model_alone", res["model_alone"]["resident_img_per_s"])] if v}
    bound, got = min(ceilings, key=ceilings.get), res["extract"]["steady_img_per_s"] or 0
    top = sorted(res["extract"].get("fraction", {}).items(), key=lambda kv: -kv[1])[:3]
    text = (f"bound: {bound} at {ceilings[bound]:,.0f} img/s = {ceilings[bound] / max(got, 1e-9):.2f}x"
            f" extract's {got:,.0f} img/s steady; extract's main thread: "
            + ", ".join(f"{k} {v:.0%}" for k, v in top))
    # below 1: W workers at once are slower per image than one alone (shared cores, SMT, memory)
    scaling = ceilings.get("loader_alone", 0) / ceilings.get("cpu_workers", float("inf"))
    return {"ceilings_img_per_s": ceilings, "bound": bound, "text": text,
            "bound_over_extract": round(ceilings[bound] / got, 3) if got else None,
            "loader_over_cpu_workers": round(scaling, 3)}


def show(title: str, part: dict) -> dict:
    print(f"  {title}: {json.dumps(part)}", flush=True)
    return part


def profile_model(name: str, samples, args, device, tmp: Path) -> dict:
    args.model, spec = name, resolve_spec(name, False, None, True, {})
    model = build_model(spec, seed=0).to(device).to(memory_format=torch.channels_last)
    data_cfg = resolve_data_config(model, spec, "model")
    # extract's --decode cpu dataset: ImageRows with a SourceRecorder (stamp + hash per file)
    dataset = make_dataset(samples, transform_for(samples, data_cfg), "cpu", None, False)
    dataset.recorder = SourceRecorder(len(samples))
    rows, bs, w, pin = len(samples), args.batch_size, args.workers, device.type == "cuda"
    res = {"model": name, "data_config": data_cfg.to_dict()}
    res["per_image"] = show("1 per image (ms, one thread)", per_image(samples, dataset,
                                                                       args.per_image, w, bs))
    res["loader"] = show("2 loader alone", {   # pinned batches on CUDA only, as extract
        "pin_memory": pin, "img_per_s": loader_rate(dataset, rows, bs, w, pin),
        "no_pin_img_per_s": loader_rate(dataset, rows, bs, w, False)})
    res["model_alone"] = show("3 model alone", model_alone(model, data_cfg, args, device))
    del model
    res["extract"] = show("4 extract", extract_split(args, device, tmp / name))
    if args.two_procs:
        torch.cuda.empty_cache() if device.type == "cuda" else None   # memory for the two
        res["two_procs"] = show("5 two processes", two_procs(args, device, tmp / f"{name}2"))
    res["verdict"] = verdict(res)
    print(f"  verdict {name}: {res['verdict']['text']}", flush=True)
    return res


def parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="root written by make_jpegs.py")
    for flag, kind, default, text in [
            ("--split", str, "val", None), ("--models", str, "resnet50", None),
            ("--batch-size", int, 256, None), ("--workers", int, None, "default: extract's"),
            ("--precision", str, None, "default: extract's"), ("--device", str, None, None),
            ("--rows", int, None, "only the first N rows"),
            ("--per-image", int, 500, "files timed one by one (part 1)"),
            ("--seconds", float, 3.0, "per model-alone figure"),
            ("--json", Path, None, "also write the results here")]:
        ap.add_argument(flag, type=kind, default=default, help=text)
    ap.add_argument("--features", action="store_true", help="extract --features (default off, "
                    "as the published bench_extract figures)")
    ap.add_argument("--two-procs", action="store_true", help="also two extract processes at once")
    return ap.parse_args(argv)


def main(argv=None) -> None:
    args = parse(argv)
    args.workers = default_workers() if args.workers is None else args.workers
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    args.precision = default_precision(args.precision, device)
    import timm
    import torchvision
    out = {"device": device_name(device), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "command": " ".join(["python", *sys.argv]), "torch": torch.__version__,
           "torchvision": torchvision.__version__, "timm": timm.__version__,
           "cpu_count": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)),
           "workers": args.workers, "batch_size": args.batch_size, "precision": args.precision,
           "features": args.features, "models": {}}
    with tempfile.TemporaryDirectory(prefix="profile_extract_") as tmp:
        if args.rows is not None:
            args.data = subset_tree(args.data, args.split, args.rows, Path(tmp) / "subset")
        samples = list_split(str(args.data), args.split)
        out["rows"] = len(samples)
        print(f"profile_extract: {len(samples)} rows of {args.data}/{args.split}, {out['device']}, "
              f"{args.workers} workers, batch {args.batch_size}, {args.precision}, torch "
              f"{torch.__version__}, {out['cpu_count']} CPUs", flush=True)
        for name in [m for m in args.models.split(",") if m]:
            out["models"][name] = profile_model(name, samples, args, device, Path(tmp))
    print("PROFILE_EXTRACT " + json.dumps(out), flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
