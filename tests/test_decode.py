"""The device decode path on CPU: batched resize == ResizeCrop, the decoder's batch assembly
(fallbacks, bad files, CPU-decoded rows) and the decode-ahead thread (order, errors, close)."""
from __future__ import annotations

import io
import threading
import time

import numpy as np
import pytest
import torch

from pipeline.core.models import DataConfig
from pipeline.data.decode import DeviceDecoder, RawRows, collate_raw, device_share, make_dataset
from pipeline.data.images import BadImageError, ResizeCrop, decode_file
from pipeline.data.prefetch import StagedPrefetch
from pipeline.data.resize import BatchResize, axis_weights
from pipeline.data.sources import list_split

MEAN = (0.5, 0.5, 0.5)


def smooth_images(sizes, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for h, w in sizes:
        x = torch.randint(0, 256, (1, 3, h, w), generator=g).float()
        out.append(torch.nn.functional.avg_pool2d(x, 3, 1, 1)[0].round().to(torch.uint8))
    return out


@pytest.mark.parametrize("interp", ["bilinear", "bicubic", "nearest"])
def test_axis_weights_are_interpolates(interp):
    """The weight matrices reproduce F.interpolate (antialias for bilinear/bicubic) on float
    images: downscale, upscale, identity and odd ratios."""
    for h, w, oh, ow in [(375, 500, 235, 313), (24, 30, 35, 43), (50, 50, 50, 50), (97, 61, 32, 32)]:
        x = torch.rand(3, h, w) * 255
        aa = interp != "nearest"
        ref = torch.nn.functional.interpolate(x[None], size=(oh, ow), mode=interp, antialias=aa,
                                              align_corners=False if aa else None)[0]
        wy = axis_weights(torch.tensor([h]), torch.tensor([oh]), torch.tensor([0]), oh, h + 7, interp)
        wx = axis_weights(torch.tensor([w]), torch.tensor([ow]), torch.tensor([0]), ow, w, interp)
        assert (wy[0, :, h:] == 0).all()  # nothing from the padding
        out = wy[0, :, :h] @ x @ wx[0].T
        torch.testing.assert_close(out, ref, atol=1e-3, rtol=0)


CONFIGS = [((3, 224, 224), "bicubic", 0.95, "center"), ((3, 224, 224), "bilinear", 0.875, "center"),
           ((3, 64, 48), "bicubic", 1.0, "squash"), ((3, 32, 32), "nearest", 0.9, "center"),
           ((3, 40, 40), "bicubic", 0.9, "center")]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c[1]}-{c[3]}-{c[0][1]}x{c[0][2]}")
def test_batch_resize_equals_resizecrop(cfg):
    """Mixed sizes and orientations in one call, chunked: each image equals ResizeCrop's float
    path (what it does on CUDA) up to a rare +-1 at .5, and its CPU uint8 path up to +-1."""
    dcfg = DataConfig(cfg[0], cfg[1], cfg[2], cfg[3], MEAN, MEAN)
    single, batch = ResizeCrop(dcfg), BatchResize(dcfg)
    sizes = [(375, 500), (500, 375), (333, 500), (260, 500), (45, 45), (41, 70), (90, 33), (300, 400)]
    images = [im for im in smooth_images(sizes) if batch.supports(*im.shape[-2:])]
    assert len(images) >= 6
    got = {}
    for ks, out in batch(images):
        assert out.dtype == torch.uint8 and out.shape[1:] == dcfg.input_size
        got.update({k: o for k, o in zip(ks, out)})
    assert sorted(got) == list(range(len(images)))
    mismatched = total = 0
    for k, im in enumerate(images):
        on_cpu = single(im)
        as_cuda = single(im.float()).clamp(0, 255).round().to(torch.uint8) \
            if cfg[1] != "nearest" else on_cpu
        assert (got[k].int() - on_cpu.int()).abs().max() <= 1
        diff = (got[k].int() - as_cuda.int()).abs()
        assert diff.max() <= 1
        mismatched, total = mismatched + int((diff > 0).sum()), total + diff.numel()
    assert mismatched / total < 1e-3


def test_batch_resize_chunks_bound_memory(monkeypatch):
    import pipeline.data.resize as rz

    monkeypatch.setattr(rz, "_CHUNK_ELEMS", 3 * 60 * 60 * 2)  # two 60x60 images a chunk
    dcfg = DataConfig((3, 32, 32), "bicubic", 0.9, "center", MEAN, MEAN)
    images = smooth_images([(60, 60), (50, 60), (60, 40), (35, 60), (60, 60)], seed=1)
    chunks = BatchResize(dcfg)(images)
    assert len(chunks) >= 3 and sorted(k for ks, _ in chunks for k in ks) == list(range(5))
    for ks, out in chunks:
        for k, o in zip(ks, out):
            assert (o.int() - ResizeCrop(dcfg)(images[k]).int()).abs().max() <= 1


def jpeg_bytes(img: torch.Tensor, **kw) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img.permute(1, 2, 0).numpy()).save(buf, "JPEG", **kw)
    return buf.getvalue()


@pytest.fixture
def jpeg_split(tmp_path):
    """val/<wnid>/: 8 JPEGs of assorted sizes, one progressive (CPU path), one corrupt body."""
    from pipeline.data.labels import imagenet_synsets

    d = tmp_path / "val" / imagenet_synsets()[0]
    d.mkdir(parents=True)
    sizes = [(60, 80), (80, 60), (60, 80), (33, 47), (70, 70), (60, 80), (90, 40), (64, 64)]
    for i, img in enumerate(smooth_images(sizes, seed=2)):
        (d / f"img_{i}.JPEG").write_bytes(jpeg_bytes(img, quality=95, progressive=i == 4))
    data = bytearray((d / "img_6.JPEG").read_bytes())
    dht = data.find(b"\xff\xc4")
    data[dht + 5: dht + 20] = b"\xff" * 15  # headers and EOI intact, Huffman table broken
    (d / "img_6.JPEG").write_bytes(bytes(data))
    return list_split(str(tmp_path), "val")


@pytest.mark.parametrize("model_cfg", [((3, 32, 32), "center"), ((1, 32, 32), "center"),
                                       ((3, 48, 48), "border")], ids=["rgb", "grey", "border"])
def test_device_decoder_batch_equals_cpu_rows(jpeg_split, model_cfg):
    """A shuffled mixed batch through RawRows -> collate_raw -> DeviceDecoder (CPU device) gives
    each row its own image as the CPU path makes it (+-1): device-decoded rows, CPU-decoded rows
    (progressive, odd rows in mixed mode), the per-image fallback (grey model, border padding),
    and the bad file as a zero, invalid row with --skip-bad or an error naming it without."""
    dcfg = DataConfig(model_cfg[0], "bicubic", 0.9, model_cfg[1], MEAN, MEAN)
    transform = ResizeCrop(dcfg)
    order = [5, 2, 7, 0, 6, 3, 1, 4]
    for mode in ("gpu", "mixed"):
        rows = RawRows(jpeg_split, transform, mode, skip_bad=True)
        batch = collate_raw([rows[i] for i in order])
        assert batch[0] is not None and (mode == "gpu") == (batch[1].shape[0] == 1)  # progressive
        images, got_rows, valid, event = DeviceDecoder(jpeg_split, transform, torch.device("cpu"),
                                                       skip_bad=True)(batch)
        assert event is None and got_rows.tolist() == order
        assert images.shape == (8, *dcfg.input_size) and images.dtype == torch.uint8
        for pos, i in enumerate(order):
            if i == 6:
                assert valid[pos] == 0 and (images[pos] == 0).all()
                continue
            assert valid[pos] == 1
            ref = transform(decode_file(str(jpeg_split.path(i))))
            assert (images[pos].int() - ref.int()).abs().max() <= 1, (mode, i)
    strict = DeviceDecoder(jpeg_split, transform, torch.device("cpu"), skip_bad=False)
    batch = collate_raw([RawRows(jpeg_split, transform, "gpu")[i] for i in order])
    with pytest.raises(BadImageError, match=r"img_6\.JPEG \(row 6\)"):
        strict(batch)


def test_staged_prefetch_keeps_order_and_raises_in_place():
    """Two stages in their own threads: results in loader order; a failure in either stage is
    raised at its batch's place, after every earlier batch reached the consumer."""
    def first(batch):
        if batch == 5:
            raise BadImageError("cannot decode y.JPEG (row 5)")
        time.sleep(0.002 * (batch % 3))  # uneven stage times
        return batch

    def second(batch):
        if batch == 3:
            raise BadImageError("cannot decode x.JPEG (row 3)")
        return torch.full((1,), batch), torch.tensor([batch]), torch.ones(1), None

    for fail_at, stages in ((3, [first, second]), (5, [first, lambda b: second(b + 10)])):
        seen = []
        ahead = StagedPrefetch(iter(range(8)), stages, torch.device("cpu"), depth=2)
        with pytest.raises(BadImageError, match=rf"row {fail_at}"):
            for images, rows, _ in ahead:
                seen.append(int(images[0]))
        assert seen == [b if fail_at == 3 else b + 10 for b in range(fail_at)]
        ahead.close()
        assert not any(t.is_alive() for t in ahead.threads)


def test_staged_prefetch_close_stops_the_threads_and_the_workers():
    produced, shut = [], threading.Event()

    class Batches:
        def __init__(self):
            self.i = 0

        def __iter__(self):
            return self

        def __next__(self):
            self.i += 1
            produced.append(self.i)
            return self.i

        def _shutdown_workers(self):
            shut.set()

    ahead = StagedPrefetch(Batches(), [lambda b: (torch.zeros(1), torch.tensor([b]), torch.ones(1),
                                                  None)], torch.device("cpu"), depth=2)
    assert int(next(ahead)[1][0]) == 1
    ahead.close(timeout=5)
    assert not any(t.is_alive() for t in ahead.threads) and shut.is_set()
    assert len(produced) <= 8  # bounded read-ahead: two queues of 2, one item in each thread


def test_device_share_picks_rows_by_index(jpeg_split):
    assert device_share("gpu") == (1, 1) and device_share("mixed") == (1, 2)
    assert device_share("mixed:3/4") == (3, 4)
    for bad in ("mixed:4/4", "mixed:0/2", "mixed:3", "nvdec", "mixed:a/b", "mixed:1/65"):
        with pytest.raises(ValueError, match="mixed:N/D"):
            make_dataset(jpeg_split, ResizeCrop(DataConfig((3, 32, 32), "bicubic", 0.9, "center",
                                                           MEAN, MEAN)), bad, None, False)
    rows = RawRows(jpeg_split, ResizeCrop(DataConfig((3, 32, 32), "bicubic", 0.9, "center", MEAN,
                                                     MEAN)), "mixed:3/4", skip_bad=True)
    on_device = [i for i in range(8) if isinstance(rows[i][0], np.ndarray)]
    assert on_device == [0, 1, 2, 5, 6]  # i % 4 < 3, minus row 4 (progressive: CPU path)
