"""What limits extraction with a device decoder: each part alone, then decoder and model together.

For one model and the device decoders named (gpu: nvJPEG's CUDA kernels on the SMs; hw: the
NVJPG engines through nvImageCodec), on the first ``--profile-rows`` files of the bench's JPEGs
(file bytes read into memory first, so no disk or loader worker is timed):

* ``model_alone``: forward passes on a fixed uint8 batch (normalise, bf16, channels_last);
* ``cpu_workers``: ``--decode cpu``'s loader alone (libjpeg-turbo + resize in ``--workers``);
* ``<dec>_decode_alone``: the batched decode call only; ``<dec>_decode_resize_alone``: the
  decoder's whole device side (decode, batched resize, CPU fallbacks) as ``extract`` runs it;
* ``<dec>_with_model``: the decode+resize loop in one thread while the model runs in another,
  both for the same wall time: their img/s side by side say whether they contend for the GPU.

Steady extraction cannot beat the smallest of these; the bench's ratio is read against them.

    python bench/profile_decode.py --data /tmp/jpegs --models resnet50 --decoders gpu,hw
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.core.models import build_model, resolve_data_config, resolve_spec  # noqa: E402
from pipeline.core.precision import autocast  # noqa: E402
from pipeline.data.decode import DeviceDecoder, RawRows, collate_raw  # noqa: E402
from pipeline.data.images import GpuNormalize, ImageRows, ResizeCrop  # noqa: E402
from pipeline.data.loader import chunk_batches, default_workers, make_loader  # noqa: E402
from pipeline.data.sources import list_split  # noqa: E402


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rate(step, per_step: int, device: torch.device, seconds: float = 3.0) -> float:
    """img/s of ``step()`` repeated for about ``seconds`` after one warm-up call."""
    step()
    sync(device)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        n += 1
    sync(device)
    return round(n * per_step / (time.perf_counter() - start), 1)


def loader_rate(dataset, rows: int, batch_size: int, workers: int, pin: bool) -> float | None:
    """Steady img/s of extract's loader alone over ``dataset``'s first ``rows`` rows (worker
    start-up and the first batch excluded)."""
    loader = make_loader(dataset, chunk_batches([(0, rows)], batch_size), workers, pin_memory=pin)
    start, n = None, 0
    for images, _, _ in loader:
        if start is None:
            start = time.perf_counter()
        else:
            n += len(images)
    return round(n / (time.perf_counter() - start), 1) if n else None


def cycle(items):
    state = {"k": 0}

    def next_item():
        state["k"] = (state["k"] + 1) % len(items)
        return items[state["k"]]
    return next_item


def decoder_parts(decoder: DeviceDecoder, batches: list, device) -> tuple:
    """(decode-only step, decode+resize step) over the batches in turn; rows per step."""
    raws = []
    for packed, *_ in batches:
        flat, ends, _ = packed
        starts = [0, *ends[:-1].tolist()]
        raws.append([flat[a:b] for a, b in zip(starts, ends.tolist())])
    next_raw, next_batch = cycle(raws), cycle(batches)
    held = []

    def decode_only():
        stream = decoder.alloc_stream
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            held[:] = [decoder._decode_jpeg(next_raw())]   # kept until the next call

    def decode_resize():
        images, _, _, event = decoder(next_batch())
        held[:] = [images, event]
    return decode_only, decode_resize


def profile_model(name: str, samples, args, device: torch.device, decoders: list[str]) -> dict:
    spec = resolve_spec(name, False, None, True, {})
    model = build_model(spec, seed=0).eval().to(device).to(memory_format=torch.channels_last)
    data_cfg = resolve_data_config(model, spec, "model")
    transform, normalize = ResizeCrop(data_cfg), GpuNormalize(data_cfg, device)
    bs, rows = args.batch_size, min(len(samples), args.profile_rows)
    x = torch.randint(0, 256, (bs, *data_cfg.input_size), dtype=torch.uint8, device=device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True

    def model_step():
        with torch.inference_mode(), autocast(args.precision, device):
            model(normalize(x))

    out = {"model": name, "rows": rows, "batch_size": bs,
           "model_alone_img_per_s": rate(model_step, bs, device),
           "cpu_workers_img_per_s": loader_rate(ImageRows(samples, transform), rows, bs,
                                                  args.workers, False)}
    for dec in decoders:
        try:
            decoder = DeviceDecoder(samples, transform, device, False, dec)
        except Exception as err:  # noqa: BLE001 - report, go on with the other decoders
            out[f"{dec}_error"] = f"{type(err).__name__}: {err}"[:400]
            continue
        raw = RawRows(samples, transform, dec)
        batches = [collate_raw([raw[i] for i in range(a, min(a + bs, rows))])
                   for a in range(0, rows - bs + 1, bs)]
        batches = [b for b in batches if b[0] is not None and b[1] is None]  # all-device batches
        if not batches:
            out[f"{dec}_error"] = "no batch of device-decodable files"
            continue
        decode_only, decode_resize = decoder_parts(decoder, batches, device)
        with torch.inference_mode():
            out[f"{dec}_decode_alone_img_per_s"] = rate(decode_only, bs, device)
            out[f"{dec}_decode_resize_alone_img_per_s"] = rate(decode_resize, bs, device)
        out[f"{dec}_with_model"] = together(decode_resize, model_step, bs, device)
    return out


def together(decode_step, model_step, bs: int, device, seconds: float = 4.0) -> dict:
    """Both loops for the same wall time, the decoder in a thread of its own (as in extract)."""
    result = {}

    def run_decoder():
        if device.type == "cuda":
            torch.cuda.set_device(device.index if device.index is not None else 0)
        with torch.inference_mode():
            result["decode_resize_img_per_s"] = rate(decode_step, bs, device, seconds)

    thread = threading.Thread(target=run_decoder)
    thread.start()
    result["model_img_per_s"] = rate(model_step, bs, device, seconds)
    thread.join()
    return result


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--split", default="val")
    ap.add_argument("--models", default="resnet50")
    ap.add_argument("--decoders", default="gpu,hw")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--device", default=None)
    ap.add_argument("--profile-rows", type=int, default=4096)
    args = ap.parse_args(argv)
    args.workers = default_workers() if args.workers is None else args.workers
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    samples = list_split(str(args.data), args.split)
    for name in [m for m in args.models.split(",") if m]:
        res = profile_model(name, samples, args, device, [d for d in args.decoders.split(",") if d])
        print("PROFILE_DECODE " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
