"""End-to-end extraction throughput (file read + decode + resize + model + cache write), img/s.

Compares, in one run on the same JPEGs (``bench/make_jpegs.py``):

* ``naive``: the authors' style -- PIL decode + timm's PIL transform with float32 ToTensor /
  Normalize in the loader workers, fp32 model, ``.cpu()`` of the logits every batch;
* our ``extract()`` (the real stage-1 code path, cache written) in variants
  ``cpu`` | ``gpu`` | ``mixed`` | ``hw`` | ``hw-mixed`` (where JPEGs are decoded, ``--decode``;
  also ``mixed:N/D``, ``hw:N/D``), each optionally ``+compile``; always uint8 until the device,
  normalise on the device, bf16, channels_last.

``--profile`` adds what limits the device decoders (``bench/profile_decode.py``): each decoder
alone (img/s on file bytes already in memory), the model alone, and each decoder while the
model runs on the same GPU.

Throughput is "steady": rows after the first batch / time after the first batch (worker start-up
and compilation excluded; the end-to-end figure is printed beside it).  Random-init weights (no
hub needed).  Prints one ``BENCH_EXTRACT {json}`` line per model and ``BENCH_EXTRACT_SUMMARY``.

    python bench/make_jpegs.py --out /tmp/jpegs --n-val 10240
    python bench/bench_extract.py --data /tmp/jpegs                       # CUDA, defaults
    python bench/bench_extract.py --data /tmp/jpegs --device cpu --models resnet10t \\
        --variants naive,cpu,gpu --batch-size 32 --rows 256                # CPU smoke run
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.data.loader import default_workers  # noqa: E402
from pipeline.data.sources import list_split  # noqa: E402
from pipeline.extract.run import ExtractConfig, extract  # noqa: E402

MODELS = ("resnet50", "vit_base_patch16_224", "vit_base_patch16_384")
VARIANTS = ("naive", "cpu", "cpu+compile", "gpu+compile", "mixed+compile")


class PILRows(torch.utils.data.Dataset):
    """The naive loader: PIL decode, timm's PIL eval transform, float32 CHW out."""

    def __init__(self, paths, labels, transform):
        self.paths, self.labels, self.transform = paths, labels, transform

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        from PIL import Image

        with Image.open(self.paths[i]) as im:
            return self.transform(im.convert("RGB")), int(self.labels[i])


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_naive(name: str, samples, rows: int, args, device: torch.device) -> dict:
    import timm
    import timm.data

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False).eval().to(device)
    transform = timm.data.create_transform(**timm.data.resolve_model_data_config(model))
    paths = [str(samples.path(i)) for i in range(rows)]
    loader = torch.utils.data.DataLoader(PILRows(paths, samples.labels, transform),
                                         batch_size=args.batch_size, num_workers=args.workers)
    outputs, start, t_first, first = [], time.perf_counter(), None, 0
    with torch.no_grad():
        for x, y in loader:
            if first and t_first is None:
                sync(device)
                t_first = time.perf_counter()
            logits = model(x.to(device))
            probs = logits.softmax(-1)
            p_true = probs.gather(1, y.to(device)[:, None])[:, 0]
            outputs.append((logits.cpu().numpy(), p_true.cpu().numpy()))
            first = first or len(x)
    sync(device)
    end = time.perf_counter()
    return {"img_per_s": round((rows - first) / (end - t_first), 1) if t_first else None,
            "end_to_end_img_per_s": round(rows / (end - start), 1), "rows": rows}


def run_fast(name: str, variant: str, rows: int, args, device: torch.device) -> tuple[dict, np.ndarray]:
    decode, _, flag = variant.partition("+")
    out = args.work / name / variant
    shutil.rmtree(out, ignore_errors=True)
    cfg = ExtractConfig(classifier=name, out=out, data=str(args.data), split=args.split,
                        batch_size=args.batch_size, workers=args.workers, precision=args.precision,
                        device=str(device), random_init=True, shard_size=rows,
                        compile=flag == "compile", decode=decode, progress=False)
    summary = extract(cfg)
    from cache.reader import ClassifierCache
    logits = ClassifierCache.open(out).load(["logits"])["logits"]
    shutil.rmtree(out, ignore_errors=True)
    return ({"img_per_s": summary["steady_img_per_s"], "end_to_end_img_per_s": summary["img_per_s"],
             "rows": summary["computed_rows"]}, logits)


def bench_model(name: str, samples, args, device: torch.device) -> dict:
    rows = len(samples)
    res, reference, extra = {}, None, {}
    for variant in args.variants:
        torch._dynamo.reset()  # fresh compile per run; no recompile limit across variants
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        try:
            if variant == "naive":
                res[variant] = run_naive(name, samples, min(rows, args.naive_rows or rows), args,
                                         device)
            else:
                res[variant], logits = run_fast(name, variant, rows, args, device)
                if reference is None:
                    reference, extra["reference_variant"] = logits, variant
                else:  # decoders/compile change rounding only: report how much
                    res[variant].update(logit_agreement(reference, logits))
        except Exception as err:  # noqa: BLE001 - report and go on with the other variants
            res[variant] = {"error": f"{type(err).__name__}: {err}"[:500]}
        r = res[variant]
        line = (f"{fmt(r['img_per_s'])} img/s steady, {fmt(r['end_to_end_img_per_s'])} "
                f"end-to-end ({r['rows']} rows)" if "error" not in r else r["error"])
        if "logit_max_abs_diff" in r:
            line += (f"; vs {extra['reference_variant']}: logits max |d| {r['logit_max_abs_diff']}, "
                     f"argmax agree {r['argmax_agree']:.4f}, non-finite rows {r['nonfinite_rows']}")
        print(f"  {name:<24} {variant:<14} {line}", flush=True)
    decoders = [d for d in ("gpu", "hw") if any(decode_of(v).startswith(d) or
                                              (d == "gpu" and decode_of(v).startswith("mixed"))
                                              for v in args.variants)]
    for decode in decoders if args.pixel_check else []:
        key = "pixel_check" if decode == "gpu" else f"pixel_check_{decode}"
        try:
            from bench.check_decode import check_model
            extra[key] = check_model(name, samples, min(rows, args.pixel_check), args, device,
                                     decode)
        except Exception as err:  # noqa: BLE001 - report and go on
            extra[key] = {"error": f"{type(err).__name__}: {err}"[:500]}
        print(f"  {name:<24} pixel check {decode} vs cpu decode: {json.dumps(extra[key])}",
              flush=True)
    if args.profile:
        try:
            from bench.profile_decode import profile_model
            extra["profile"] = profile_model(name, samples, args, device, decoders)
        except Exception as err:  # noqa: BLE001 - report and go on
            extra["profile"] = {"error": f"{type(err).__name__}: {err}"[:500]}
        print(f"  {name:<24} profile: {json.dumps(extra['profile'])}", flush=True)
    return summarise(name, res, device, extra)


def fmt(rate) -> str:
    """img/s for the table; None (a single batch: no steady figure) as n/a."""
    return f"{rate:>9,.0f}" if rate is not None else f"{'n/a':>9}"


def decode_of(variant: str) -> str:
    return variant.partition("+")[0]


def logit_agreement(reference: np.ndarray, logits: np.ndarray) -> dict:
    """How far a variant's fp16 logits are from the reference variant's, row by row.  Rows with
    a non-finite value on either side are counted, not folded into the maximum (one inf - inf
    made the old single maximum NaN).  Random-init weights: +-1 pixel noise moves ResNet-50's
    logits by ~1e-4 and ViT-B/16's by ~1e-2, a different image by ~0.002 / ~3 (check_decode)."""
    ref, got = reference.astype(np.float32), logits.astype(np.float32)
    finite = np.isfinite(ref).all(1) & np.isfinite(got).all(1)
    diff = np.abs(got[finite] - ref[finite])
    return {"logit_max_abs_diff": float(diff.max()) if diff.size else None,
            "logit_p999_abs_diff": float(np.quantile(diff.max(1), 0.999)) if diff.size else None,
            "nonfinite_rows": int((~finite).sum()),
            "argmax_agree": float((got.argmax(1) == ref.argmax(1)).mean())}


def summarise(name: str, res: dict, device: torch.device, extra: dict) -> dict:
    ok = {v: r["img_per_s"] for v, r in res.items() if r.get("img_per_s")}
    fast = {v: s for v, s in ok.items() if v != "naive"}
    best = max(fast, key=fast.get) if fast else None
    naive = ok.get("naive")
    out = {"model": name, "device": device_name(device), "variants": res, "best": best,
           "best_img_per_s": fast.get(best), "naive_img_per_s": naive,
           "ratio_best_vs_naive": round(fast[best] / naive, 2) if best and naive else None,
           "ratios_vs_naive": {v: round(r / naive, 2) for v, r in fast.items()} if naive else {},
           **extra}
    print("BENCH_EXTRACT " + json.dumps(out), flush=True)
    return out


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="root written by make_jpegs.py")
    ap.add_argument("--split", default="val")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=None, help="default: cores - 1")
    ap.add_argument("--precision", default="bf16", choices=("bf16", "fp16", "fp32"))
    ap.add_argument("--device", default=None, help="default: cuda if available")
    ap.add_argument("--rows", type=int, default=None, help="use only the first N rows (a "
                    "multiple of --batch-size avoids a recompile for a short last batch)")
    ap.add_argument("--naive-rows", type=int, default=None, help="rows for the naive baseline")
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_extract"))
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--pixel-check", type=int, default=None, help="rows for the per-row pixel "
                    "comparison of each device decoder among the variants (gpu/mixed: nvJPEG, "
                    "hw/hw-mixed: NVJPG engines) vs cpu (bench/check_decode.py); default 1024 "
                    "on CUDA, 0 (off) elsewhere")
    ap.add_argument("--profile", action="store_true", help="also time each device decoder "
                    "alone, the model alone and both together (bench/profile_decode.py)")
    ap.add_argument("--profile-rows", type=int, default=4096)
    args = ap.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    args.workers = default_workers() if args.workers is None else args.workers
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.pixel_check is None:
        args.pixel_check = 1024 if device.type == "cuda" else 0
    data = args.data
    if args.rows is not None:
        data = subset_tree(args.data, args.split, args.rows, args.work / "subset")
    args.data = data
    samples = list_split(str(data), args.split)
    import timm
    import torchvision
    print(f"bench_extract: {len(samples)} rows of {args.data}/{args.split}, {device_name(device)}, "
          f"{args.workers} workers, batch {args.batch_size}, {args.precision}; torch "
          f"{torch.__version__}, torchvision {torchvision.__version__}, timm {timm.__version__}",
          flush=True)
    results = [bench_model(m, samples, args, device) for m in args.models.split(",") if m]
    summary = {"date": time.strftime("%Y-%m-%d"), "device": device_name(device),
               "workers": args.workers, "batch_size": args.batch_size, "rows": len(samples),
               "results": {r["model"]: {k: r[k] for k in ("best", "best_img_per_s",
                                                            "naive_img_per_s",
                                                            "ratio_best_vs_naive",
                                                            "ratios_vs_naive")}
                           for r in results}}
    print("BENCH_EXTRACT_SUMMARY " + json.dumps(summary), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "models": results}, indent=2))


def subset_tree(root: Path, split: str, rows: int, dest: Path) -> Path:
    """The first ``rows`` images of a split as a symlinked tree (same relative paths)."""
    samples = list_split(str(root), split)
    shutil.rmtree(dest, ignore_errors=True)
    for name in samples.names[:rows]:
        (dest / split / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / split / name).symlink_to(Path(root).resolve() / split / name)
    return dest


if __name__ == "__main__":
    main()
