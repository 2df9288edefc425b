"""Pixel-level fidelity of ``--decode gpu`` (or ``hw``) against ``--decode cpu``, row by row.

The CPU path (``ImageRows``: libjpeg-turbo + ResizeCrop in loader workers) gives the reference
uint8 model input of each row.  The device path runs as ``extract`` runs it -- ``RawRows`` workers,
``StagedPrefetch`` threads, ``DeviceDecoder`` -- with the model running on every batch and outputs
copied to the host one batch late, so any stream/memory race of the decoder would show up as
corrupt or misplaced rows.  Reports per-row pixel differences (a misplaced or corrupt row has a
mean |diff| of tens of levels; IDCT/upsampling/resize rounding gives well under 1) and the
model's logits on both inputs (non-finite rows, largest difference, argmax agreement), beside the
same model's logit change under +-1 pixel noise, which says what rounding alone moves.

    python bench/check_decode.py --data /tmp/jpegs --models resnet50,vit_base_patch16_224
    python bench/check_decode.py --data /tmp/jpegs --models resnet50 --decode hw   # NVJPG engines
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.core.models import build_model, resolve_data_config, resolve_spec  # noqa: E402
from pipeline.core.precision import autocast  # noqa: E402
from pipeline.data.decode import DeviceDecoder, RawRows, collate_raw  # noqa: E402
from pipeline.data.images import GpuNormalize, ImageRows, ResizeCrop  # noqa: E402
from pipeline.data.loader import chunk_batches, default_workers, make_loader  # noqa: E402
from pipeline.data.prefetch import StagedPrefetch  # noqa: E402
from pipeline.data.sources import list_split  # noqa: E402


def reference_pixels(samples, transform, rows: int, batch_size: int, workers: int) -> torch.Tensor:
    out = torch.zeros((rows, *transform.cfg.input_size), dtype=torch.uint8)
    loader = make_loader(ImageRows(samples, transform), chunk_batches([(0, rows)], batch_size),
                         workers, pin_memory=False)
    for images, idx, _ in loader:
        out[idx] = images
    return out


def device_pixels(samples, transform, rows, batch_size, workers, device, model, normalize,
                  precision, decode: str = "gpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(pixels, logits) of the device path, with the model queued on every batch and the host
    copies consumed one batch late (as ``ShardSink``), so the decoder overlaps queued work."""
    pixels = torch.zeros((rows, *transform.cfg.input_size), dtype=torch.uint8)
    logits = torch.zeros((rows, model.num_classes), dtype=torch.float32)
    loader = make_loader(RawRows(samples, transform, decode), chunk_batches([(0, rows)], batch_size),
                         workers, pin_memory=False, collate_fn=collate_raw)
    decoder = DeviceDecoder(samples, transform, device, False, decode)
    batches = StagedPrefetch(iter(loader), decoder.stages, device)
    pending = None
    try:
        for images, idx, _ in batches:
            with autocast(precision, device):
                out = model(normalize(images)).float()
            staged = (idx, images.to("cpu", non_blocking=True), out.to("cpu", non_blocking=True))
            event = torch.cuda.Event() if device.type == "cuda" else None
            if event is not None:
                event.record()
            if pending is not None:
                _file(pending, pixels, logits)
            pending = (*staged, event)
        if pending is not None:
            _file(pending, pixels, logits)
    finally:
        batches.close()
    return pixels, logits


def _file(pending, pixels, logits) -> None:
    idx, images, out, event = pending
    if event is not None:
        event.synchronize()
    pixels[idx], logits[idx] = images, out


@torch.inference_mode()
def model_logits(model, normalize, pixels, device, precision, batch_size) -> torch.Tensor:
    out = []
    for start in range(0, len(pixels), batch_size):
        with autocast(precision, device):
            out.append(model(normalize(pixels[start:start + batch_size].to(device))).float().cpu())
    return torch.cat(out)


def compare(ref_px, px, ref_logits, logits, noise_logits) -> dict:
    d = (px.int() - ref_px.int()).abs()
    row_mean = d.flatten(1).float().mean(1)
    finite = torch.isfinite(logits).all(1) & torch.isfinite(ref_logits).all(1)
    ld = (logits - ref_logits).abs()[finite]
    return {"rows": len(px), "pixel_max_abs_diff": int(d.max()),
            "pixel_mean_abs_diff": round(float(d.float().mean()), 4),
            "pixel_frac_diff_gt1": round(float((d > 1).float().mean()), 5),
            "pixel_frac_diff_gt8": round(float((d > 8).float().mean()), 6),
            "worst_row": int(row_mean.argmax()), "worst_row_mean_abs_diff": round(float(row_mean.max()), 3),
            "rows_mean_abs_diff_gt2": int((row_mean > 2).sum()),  # misplaced/corrupt rows
            "zero_rows": int((px.flatten(1).amax(1) == 0).sum()),
            "nonfinite_logit_rows": int((~finite).sum()),
            "logit_max_abs_diff": round(float(ld.max()), 5) if len(ld) else None,
            "argmax_agree": round(float((logits.argmax(1) == ref_logits.argmax(1)).float().mean()), 5),
            "logit_max_abs_diff_pm1_noise": round(float((noise_logits - ref_logits).abs().max()), 5),
            "logit_max_abs_diff_next_row": round(float((ref_logits.roll(1, 0) - ref_logits).abs().max()), 5)}


def check_model(name: str, samples, rows: int, args, device: torch.device,
                decode: str = "gpu") -> dict:
    """``decode`` (gpu: nvJPEG on the SMs, hw: the NVJPG engines) against the CPU path."""
    spec = resolve_spec(name, False, None, True, {})
    model = build_model(spec, seed=0).eval().to(device).to(memory_format=torch.channels_last)
    data_cfg = resolve_data_config(model, spec, "model")
    transform, normalize = ResizeCrop(data_cfg), GpuNormalize(data_cfg, device)
    ref = reference_pixels(samples, transform, rows, args.batch_size, args.workers)
    with torch.inference_mode():
        px, logits = device_pixels(samples, transform, rows, args.batch_size, args.workers, device,
                                   model, normalize, args.precision, decode)
    ref_logits = model_logits(model, normalize, ref, device, args.precision, args.batch_size)
    noise = torch.randint(-1, 2, ref.shape, generator=torch.Generator().manual_seed(0))
    noisy = (ref.int() + noise).clamp(0, 255).to(torch.uint8)
    noise_logits = model_logits(model, normalize, noisy, device, args.precision, args.batch_size)
    return {"model": name, "decode": decode, **compare(ref, px, ref_logits, logits, noise_logits)}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--split", default="val")
    ap.add_argument("--models", default="resnet50,vit_base_patch16_224")
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--device", default=None)
    ap.add_argument("--decode", default="gpu", choices=("gpu", "hw"),
                    help="the device decoder compared with the CPU path")
    args = ap.parse_args(argv)
    args.workers = default_workers() if args.workers is None else args.workers
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    samples = list_split(str(args.data), args.split)
    rows = min(args.rows, len(samples))
    results = []
    for name in [m for m in args.models.split(",") if m]:
        results.append(check_model(name, samples, rows, args, device, args.decode))
        print("CHECK_DECODE " + json.dumps(results[-1]), flush=True)
    return results


if __name__ == "__main__":
    main()
