"""CUDA only (skipped without a GPU; CI has none -- run on a GPU box): the device decoder never
writes memory that work queued on the consumer's stream still uses, and its pixels match the
CPU path.  torchvision's ``decode_jpeg(device="cuda")`` allocates its outputs on the caller's
current stream and writes them from a private stream (the hardware decoder even ignores stream
order) without waiting for the caller's queued work (pytorch/vision#9606); called on the model's
stream that corrupted the previous batch (NaN logits in the extraction benchmark)."""
from __future__ import annotations

import io

import pytest
import torch

from pipeline.core.models import DataConfig
from pipeline.data.decode import DeviceDecoder, RawRows, collate_raw
from pipeline.data.images import ResizeCrop, decode_file
from pipeline.data.sources import list_split

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CFG = DataConfig((3, 224, 224), "bicubic", 0.95, "center", (0.5,) * 3, (0.5,) * 3)


def write_split(root, n=16):
    import numpy as np
    from PIL import Image

    from pipeline.data.labels import imagenet_synsets

    d = root / "val" / imagenet_synsets()[0]
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        h, w = (375, 500) if i % 3 else (500, 375)
        base = rng.integers(0, 256, (1, 1, 3))
        ramp = np.linspace(-60, 60, w)[None, :, None] * rng.uniform(-1, 1, (1, 1, 3))
        img = np.clip(base + ramp + rng.normal(0, 8, (h, w, 3)), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, "JPEG", quality=92)
        (d / f"img_{i:02d}.JPEG").write_bytes(buf.getvalue())
    return list_split(str(root), "val")


def race(decode, iterations=20, n=16, nbytes=3 * 375 * 500) -> int:
    """Reads of just-freed tensors queued behind a stall on the current stream, then ``decode``:
    the number of reads that saw anything but the tensors' own values."""
    wrong = 0
    for _ in range(iterations):
        xs = [torch.full((nbytes // 4,), float(k + 1), device="cuda") for k in range(n)]
        torch.cuda.synchronize()
        torch.cuda._sleep(20_000_000)  # ~10 ms of queued work before the reads
        sums = [x.sum() for x in xs]
        del xs  # their blocks go back to the current stream's pool, reads still queued
        decode()
        torch.cuda.synchronize()
        wrong += sum(float(s) != (k + 1) * (nbytes // 4) for k, s in enumerate(sums))
    return wrong


def decoded_batch(samples):
    decoder = DeviceDecoder(samples, ResizeCrop(CFG), torch.device("cuda"), skip_bad=False)
    batch = collate_raw([RawRows(samples, ResizeCrop(CFG), "gpu")[i] for i in range(len(samples))])
    return decoder, batch


def test_decoder_leaves_queued_work_alone(tmp_path):
    decoder, batch = decoded_batch(write_split(tmp_path))
    assert race(lambda: decoder(batch)) == 0


def test_decoder_pixels_match_cpu_path(tmp_path):
    samples = write_split(tmp_path)
    decoder, batch = decoded_batch(samples)
    images, rows, valid, event = decoder(batch)
    torch.cuda.current_stream().wait_event(event)
    images = images.cpu()
    assert valid.tolist() == [1] * len(samples)
    refs = torch.stack([ResizeCrop(CFG)(decode_file(str(samples.path(i)))) for i in range(len(samples))])
    for pos, i in enumerate(rows.tolist()):
        # nvJPEG's IDCT / chroma upsampling differ from libjpeg-turbo's by a level or two here
        # and there; any other image is tens of levels away
        dist = (images[pos].int() - refs.int()).abs().flatten(1).float().mean(1)
        assert dist[i] < 2.0 and dist[i] < 0.2 * dist[torch.arange(len(dist)) != i].min(), (i, dist)


if __name__ == "__main__":  # on a GPU box without pytest
    import pathlib
    import tempfile

    for test in (test_decoder_leaves_queued_work_alone, test_decoder_pixels_match_cpu_path):
        with tempfile.TemporaryDirectory() as tmp:
            test(pathlib.Path(tmp))
            print("passed", test.__name__)
