"""CUDA only (skipped without a GPU; CI has none -- run on a GPU box): the device decoder never
writes memory that work queued on the consumer's stream still uses, and its pixels match the
CPU path.  torchvision's ``decode_jpeg(device="cuda")`` allocates its outputs on the caller's
current stream and writes them from a private stream (the hardware decoder even ignores stream
order) without waiting for the caller's queued work (pytorch/vision#9606); called on the model's
stream that corrupted the previous batch (NaN logits in the extraction benchmark).

``--decode hw`` (the NVJPG engines through nvImageCodec; also skipped where that optional package
is missing or the GPU has no such engines): the same queued-work check, pixels within the bound
of the CPU path, its buffers alive as long as queued work reads them, and a whole ``extract``
giving the rows and shapes of ``--decode cpu``."""
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


def decoded_batch(samples, mode="gpu"):
    decoder = DeviceDecoder(samples, ResizeCrop(CFG), torch.device("cuda"), False, mode)
    batch = collate_raw([RawRows(samples, ResizeCrop(CFG), mode)[i] for i in range(len(samples))])
    return decoder, batch


def hardware_decoder_or_skip():
    """--decode hw's decoder on this GPU, or a skip saying why it cannot be built here."""
    from pipeline.data.errors import DataError
    from pipeline.data.hwdecode import HardwareJpeg

    try:
        return HardwareJpeg(torch.device("cuda"))
    except DataError as err:
        pytest.skip(f"no hardware JPEG decoder here: {err}")


def test_decoder_leaves_queued_work_alone(tmp_path):
    decoder, batch = decoded_batch(write_split(tmp_path))
    assert race(lambda: decoder(batch)) == 0


@pytest.mark.parametrize("mode", ["gpu", "hw"])
def test_decoder_pixels_match_cpu_path(tmp_path, mode):
    if mode == "hw":
        hardware_decoder_or_skip()
    samples = write_split(tmp_path)
    decoder, batch = decoded_batch(samples, mode)
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


def test_hw_decoder_leaves_queued_work_alone(tmp_path):
    hardware_decoder_or_skip()
    decoder, batch = decoded_batch(write_split(tmp_path), "hw")
    assert race(lambda: decoder(batch)) == 0


def test_hw_decoder_buffers_live_while_queued_work_reads_them(tmp_path):
    """The same batch 12 times through the staged threads, each resize queued behind a ~10 ms
    stall on the decoder's stream while the decode thread goes on decoding the next batches:
    every result equals the first (the engines are deterministic), so no decoded buffer was
    freed and reused by nvImageCodec before the resize that reads it had run."""
    from pipeline.data.prefetch import StagedPrefetch

    hardware_decoder_or_skip()
    decoder, batch = decoded_batch(write_split(tmp_path), "hw")

    def stalled_finish(state):
        with torch.cuda.stream(decoder.stream):
            torch.cuda._sleep(20_000_000)
        return decoder.finish(state)

    batches = StagedPrefetch(iter([batch] * 12), [decoder.decode, stalled_finish],
                             torch.device("cuda"))
    first, seen = None, 0
    try:
        for images, rows, valid in batches:
            got = images.cpu()
            first = got if first is None else first
            assert torch.equal(got, first) and valid.tolist() == [1] * len(rows)
            seen += 1
    finally:
        batches.close()
    assert seen == 12


def test_hw_extract_gives_the_rows_and_shapes_of_cpu_decode(tmp_path):
    """A whole ``extract`` (resnet10t, random init, bf16) with --decode hw and hw-mixed against
    --decode cpu: the same indices, shapes and valid flags; logits within decoder rounding."""
    from cache.reader import ClassifierCache
    from pipeline.extract.run import ExtractConfig, extract

    hardware_decoder_or_skip()
    samples = write_split(tmp_path / "data", n=40)
    got = {}
    for mode in ("cpu", "hw", "hw-mixed"):
        cfg = ExtractConfig(classifier="resnet10t", out=tmp_path / mode, data=samples.root,
                            split="val", random_init=True, device="cuda", workers=2,
                            batch_size=16, shard_size=25, decode=mode, progress=False)
        extract(cfg)
        got[mode] = ClassifierCache.open(tmp_path / mode).load(["index", "valid", "logits"])
    for mode in ("hw", "hw-mixed"):
        assert (got[mode]["index"] == got["cpu"]["index"]).all()
        assert (got[mode]["valid"] == got["cpu"]["valid"]).all()
        assert got[mode]["logits"].shape == got["cpu"]["logits"].shape
        diff = abs(got[mode]["logits"].astype("float32") - got["cpu"]["logits"].astype("float32"))
        assert diff.max() < 0.1, diff.max()   # bf16 / decoder rounding, not another row


if __name__ == "__main__":  # on a GPU box without pytest
    import pathlib
    import tempfile

    for test, args in ((test_decoder_leaves_queued_work_alone, ()),
                       (test_decoder_pixels_match_cpu_path, ("gpu",)),
                       (test_decoder_pixels_match_cpu_path, ("hw",)),
                       (test_hw_decoder_leaves_queued_work_alone, ()),
                       (test_hw_decoder_buffers_live_while_queued_work_reads_them, ()),
                       (test_hw_extract_gives_the_rows_and_shapes_of_cpu_decode, ())):
        with tempfile.TemporaryDirectory() as tmp:
            test(pathlib.Path(tmp), *args)
            print("passed", test.__name__, *args)
