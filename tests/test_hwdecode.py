"""``--decode hw|hw-mixed`` on CPU: the refusals (nvImageCodec missing, no CUDA), the decode
modes' row shares, and -- where the optional nvImageCodec package is installed -- its real
decoder (the bundled libjpeg-turbo backend, the code path the GPU's hardware backend runs)
against PIL on real photos, through ``DeviceDecoder`` and a whole ``extract`` whose cache records
the decoder and refuses to be extended by another.  GPU tests: tests/test_decode_cuda.py."""
from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from cli import cli
from conftest import TINY_RESNET, real_photo
from pipeline.core.models import DataConfig
from pipeline.data.decode import DeviceDecoder, RawRows, collate_raw, device_share, uses_hardware
from pipeline.data.images import ResizeCrop, decode_file
from pipeline.data.sources import list_split

ROOT = Path(__file__).resolve().parents[1]
PHOTOS = ("china", "flower")        # scikit-learn's sample photos, always installed


def have_nvimgcodec() -> bool:
    try:
        import nvidia.nvimgcodec  # noqa: F401
    except ImportError:
        return False
    return True


needs_nvimgcodec = pytest.mark.skipif(not have_nvimgcodec(),
                                      reason="the optional nvImageCodec package is not installed")


def photo_jpeg(name: str, size: tuple[int, int], **save) -> bytes:
    img = Image.fromarray(real_photo(name)).resize(size, Image.BICUBIC)
    buf = io.BytesIO()
    img.save(buf, "JPEG", **{"quality": 90, **save})
    return buf.getvalue()


def test_hw_modes_share_rows_like_gpu_and_mixed():
    assert [device_share(m) for m in ("hw", "hw-mixed", "hw:2/3")] == [(1, 1), (1, 2), (2, 3)]
    assert [uses_hardware(m) for m in ("hw", "hw-mixed", "hw:1/4", "gpu", "mixed", "cpu")] == \
        [True, True, True, False, False, False]
    for bad in ("hw:3/2", "hw:0/2", "hw-mixed:1/2", "hw2"):
        with pytest.raises(ValueError, match="hw:N/D"):
            device_share(bad)


def test_cli_refuses_hw_when_nvimgcodec_is_missing(tmp_path):
    """A real CLI process in which the package cannot be imported (whether or not it is
    installed here): one line naming what to install and the alternative, exit 2, no traceback,
    nothing written -- and no switch to another decoder."""
    code = ("import sys; sys.modules['nvidia.nvimgcodec'] = None; sys.path.insert(0, sys.argv[1]);"
            "from cli import cli; cli(sys.argv[2:])")
    out = subprocess.run([sys.executable, "-c", code, str(ROOT), "extract", "--decode", "hw",
                          "--device", "cpu", "--out", str(tmp_path / "cache"), "--no-progress"],
                         cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    error = [ln for ln in out.stderr.splitlines() if ln.startswith("Error:")]
    assert len(error) == 1, out.stderr
    assert "nvImageCodec" in error[0] and "pip install '.[nvimgcodec]'" in error[0]
    assert "--decode gpu" in error[0]
    assert list(tmp_path.iterdir()) == []


@needs_nvimgcodec
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cli_refuses_hw_without_cuda(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for mode in ("hw", "hw-mixed"):
        result = CliRunner().invoke(cli, ["extract", "--decode", mode, "--device", "cpu"])
        assert result.exit_code == 2, result.output
        assert f"--decode {mode} decodes JPEGs on a CUDA device" in result.output
    assert list(tmp_path.iterdir()) == []


@needs_nvimgcodec
def test_nvimgcodec_decoder_equals_pil_on_real_photos():
    """The decoder class on nvImageCodec's CPU backend: planar uint8 RGB of each file's size,
    the same pixels as PIL's libjpeg-turbo (4:2:0 and 4:4:4), ``None`` for a broken file."""
    from pipeline.data.hwdecode import HardwareJpeg

    files = [photo_jpeg("china", (500, 375)), photo_jpeg("flower", (375, 500), subsampling=0),
             photo_jpeg("china", (333, 500))]
    broken = bytearray(files[0])
    broken[broken.find(b"\xff\xda") + 20:] = b"\x00" * 64       # scan data gone, no EOI
    decoder = HardwareJpeg(torch.device("cpu"))
    tensors = [torch.frombuffer(bytearray(f), dtype=torch.uint8) for f in files + [bytes(broken)]]
    images = decoder(tensors)
    assert images[-1] is None
    for data, img in zip(files, images):
        ref = torch.from_numpy(np.array(Image.open(io.BytesIO(data)).convert("RGB")))
        ref = ref.permute(2, 0, 1)
        assert img.dtype == torch.uint8 and img.shape == ref.shape
        diff = (img.int() - ref.int()).abs()
        assert diff.max() <= 1 and (diff > 0).float().mean() < 0.01, diff.float().mean()


@pytest.fixture
def photo_split(tmp_path):
    """val/<wnid>/: real photos as baseline JPEGs of ImageNet-like sizes, one progressive (CPU
    path), one PNG named .JPEG (CPU path), one with a broken body (bad row)."""
    from pipeline.data.labels import imagenet_synsets

    d = tmp_path / "val" / imagenet_synsets()[0]
    d.mkdir(parents=True)
    sizes = [(500, 375), (375, 500), (500, 333), (240, 240), (500, 375), (320, 480)]
    for i, size in enumerate(sizes):
        (d / f"img_{i}.JPEG").write_bytes(photo_jpeg(PHOTOS[i % 2], size, progressive=i == 3))
    Image.fromarray(real_photo("flower")[:200, :300]).save(d / "img_6.JPEG", "PNG")
    data = bytearray(photo_jpeg("china", (300, 200)))
    data[data.find(b"\xff\xc4") + 5: data.find(b"\xff\xc4") + 20] = b"\xff" * 15
    (d / "img_7.JPEG").write_bytes(bytes(data))
    return list_split(str(tmp_path), "val")


@needs_nvimgcodec
def test_device_decoder_with_nvimgcodec_gives_the_gpu_modes_rows(photo_split):
    """RawRows -> collate_raw -> DeviceDecoder on a shuffled batch, hw / hw-mixed against
    gpu / mixed (torchvision's decoder; on the CPU both are libjpeg-turbo, so the rows must be
    identical): the same rows, shapes and valid flags, CPU-path rows (progressive, PNG, odd rows)
    exactly as --decode cpu makes them, device rows within resize rounding of them, and the
    broken file a zero, invalid row."""
    dcfg = DataConfig((3, 224, 224), "bicubic", 0.95, "center", (0.5,) * 3, (0.5,) * 3)
    transform, order = ResizeCrop(dcfg), [5, 2, 7, 0, 6, 3, 1, 4]
    for hw_mode, mode in (("hw", "gpu"), ("hw-mixed", "mixed")):
        out = {}
        for m in (hw_mode, mode):
            rows = RawRows(photo_split, transform, m, skip_bad=True)
            batch = collate_raw([rows[i] for i in order])
            out[m] = DeviceDecoder(photo_split, transform, torch.device("cpu"), True, m)(batch)
        images, got, valid, _ = out[hw_mode]
        assert got.tolist() == order and images.shape == (8, 3, 224, 224)
        assert torch.equal(images, out[mode][0]) and torch.equal(valid, out[mode][2])
        for pos, i in enumerate(order):
            if i == 7:
                assert valid[pos] == 0 and (images[pos] == 0).all()
                continue
            ref = transform(decode_file(str(photo_split.path(i))))
            diff = (images[pos].int() - ref.int()).abs()
            on_device = i in ({0, 1, 2, 4, 5} if hw_mode == "hw" else {0, 2, 4})
            assert valid[pos] == 1 and (diff.float().mean() < 0.5 if on_device else diff.max() == 0)


@needs_nvimgcodec
def test_extract_records_the_hw_decoder_and_refuses_another(imagenet_tree, tiny_extract, tmp_path):
    """``extract`` with decode="hw" (Python API, CPU backend): the same rows and shapes as
    decode="cpu", the decoder in the identity and nvImageCodec's version in the manifest; the
    cache is not extended by another decoder, nor a cpu cache by hw."""
    from cache.reader import ClassifierCache
    from cache.schema import CacheError
    from pipeline.extract.run import extract

    model = dict(model=TINY_RESNET)
    extract(tiny_extract(imagenet_tree, out=tmp_path / "cpu", **model))
    extract(tiny_extract(imagenet_tree, out=tmp_path / "hw", decode="hw", **model))
    cpu, hw = (ClassifierCache.open(tmp_path / n) for n in ("cpu", "hw"))
    a, b = cpu.load(["index", "logits", "valid"]), hw.load(["index", "logits", "valid"])
    assert np.array_equal(a["index"], b["index"]) and a["logits"].shape == b["logits"].shape
    assert np.array_equal(a["valid"], b["valid"])
    np.testing.assert_allclose(a["logits"], b["logits"], atol=0.05)  # +-1 pixel: resize rounding
    manifest = json.loads((tmp_path / "hw" / "manifest.json").read_text())
    assert manifest["identity"]["decode"] == "hw"
    import nvidia.nvimgcodec
    assert manifest["info"]["nvimgcodec"] == nvidia.nvimgcodec.__version__
    for out, decode in (("hw", "cpu"), ("cpu", "hw"), ("hw", "gpu")):
        with pytest.raises(CacheError, match="decode"):
            extract(tiny_extract(imagenet_tree, out=tmp_path / out, decode=decode, **model))
