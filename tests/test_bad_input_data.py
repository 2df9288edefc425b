"""Bad input at the data and model end: high-bit-depth images,
class order and the classifier's number of classes, weights files, labels files and devices.
Each case is listed in docs/BAD_INPUT.md with the test that covers it."""
from __future__ import annotations

import json
import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from cli import cli
from conftest import TINY_VIT, assert_error, make_imagenet_tree, write_jpeg
from pipeline.data.labels import imagenet_synsets

SYN = imagenet_synsets()
TINY = ["--classifier", TINY_VIT[0], "--model-kwargs", json.dumps(TINY_VIT[1]), "--random-init",
        "--device", "cpu", "--precision", "fp32", "--workers", "0", "--batch-size", "4",
        "--shard-size", "6", "--no-progress"]


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def write_png16(path: Path, arr: np.ndarray) -> None:
    """A 16-bit PNG (grey HxW or RGB HxWx3 uint16) written from the PNG spec: signature, IHDR
    (bit depth 16), one zlib-compressed IDAT of filter-0 scanlines (big-endian samples), IEND."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(
            ">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    h, w = arr.shape[:2]
    colour = 2 if arr.ndim == 3 else 0
    rows = arr.astype(">u2").reshape(h, -1).view(np.uint8)
    raw = b"".join(b"\x00" + row.tobytes() for row in rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16,
                     colour, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


# ------------------------------------------------------------------ high-bit-depth images --
def test_16bit_pngs_decode_to_the_same_uint8_as_their_8bit_version(tmp_path):
    from PIL import Image

    from pipeline.data.images import decode_file

    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 65536, (20, 30, 3)).astype(np.uint16)
    grey = rng.integers(0, 65536, (20, 30)).astype(np.uint16)
    write_png16(tmp_path / "rgb16.png", rgb)
    write_png16(tmp_path / "grey16.png", grey)
    Image.fromarray(grey).save(tmp_path / "grey16_pil.png")        # Pillow's I;16 PNG
    Image.fromarray(grey).save(tmp_path / "grey16.tif")            # TIFF: Pillow's decoder
    expect_rgb = torch.from_numpy((rgb >> 8).astype(np.uint8)).permute(2, 0, 1)
    expect_grey = torch.from_numpy((grey >> 8).astype(np.uint8)).expand(3, -1, -1)
    assert torch.equal(decode_file(str(tmp_path / "rgb16.png")), expect_rgb)
    for name in ("grey16.png", "grey16_pil.png", "grey16.tif"):
        img = decode_file(str(tmp_path / name))
        assert img.dtype == torch.uint8 and torch.equal(img, expect_grey), name


def test_float_images_are_refused_by_name_and_recorded_with_skip_bad(tmp_path):
    from PIL import Image

    from pipeline.data.images import BadImageError, ImageRows, ResizeCrop
    from pipeline.data.sources import list_split
    from pipeline.core.models import DataConfig

    root = make_imagenet_tree(tmp_path / "d", list(SYN[:2]), per_class=2, splits=("val",))
    bad = root / "val" / SYN[1] / "float.tif"
    Image.fromarray(np.random.default_rng(0).random((20, 30)).astype(np.float32)).save(bad)
    samples = list_split(str(root), "val")
    row = samples.names.index(f"{SYN[1]}/float.tif")
    cfg = DataConfig((3, 16, 16), "bilinear", 1.0, "center", (0.5,) * 3, (0.5,) * 3)
    with pytest.raises(BadImageError, match=rf"float.tif \(row {row}\).*32-bit float"):
        ImageRows(samples, ResizeCrop(cfg))[row]
    img, i, valid = ImageRows(samples, ResizeCrop(cfg), skip_bad=True)[row]
    assert (i, valid, img.dtype) == (row, 0, torch.uint8)


def test_a_batch_mixing_16bit_and_8bit_images_extracts_as_their_8bit_versions(tmp_path):
    """One batch holds JPEGs and 16-bit PNGs; every row equals the run on the 8-bit copies."""
    from PIL import Image

    from cache.reader import ClassifierCache

    rng = np.random.default_rng(1)
    trees = {name: make_imagenet_tree(tmp_path / name, list(SYN[:2]), per_class=3, splits=("val",))
             for name in ("deep", "flat")}
    for k, wnid in enumerate(SYN[:2]):
        arr = rng.integers(0, 65536, (24 + k, 36, 3)).astype(np.uint16)
        write_png16(trees["deep"] / "val" / wnid / "deep.png", arr)
        Image.fromarray((arr >> 8).astype(np.uint8)).save(trees["flat"] / "val" / wnid / "deep.png")
    logits = {}
    for name, tree in trees.items():
        result = run("extract", *TINY, "--data", tree, "--split", "val",
                     "--out", tmp_path / f"c{name}")
        assert result.exit_code == 0, result.output
        cache = ClassifierCache.open(tmp_path / f"c{name}" / TINY_VIT[0] / "val")
        logits[name] = cache.load(["logits", "valid"])
        assert logits[name]["valid"].all()
    assert np.array_equal(logits["deep"]["logits"], logits["flat"]["logits"])


# ----------------------------------------------------- the classifier's classes vs the data's --
def _tiny_weights(path: Path, num_classes: int, seed: int = 0) -> Path:
    import timm

    torch.manual_seed(seed)
    model = timm.create_model(TINY_VIT[0], **TINY_VIT[1], num_classes=num_classes)
    torch.save(model.state_dict(), path)          # what a fine-tuning script saves
    return path


def _extract_args(tree, out, *extra):
    args = [a for a in TINY if a != "--random-init"]
    return ["extract", *args, "--data", tree, "--split", "val", "--out", out, *extra]


def test_the_number_of_classes_is_read_from_the_weights_file(tmp_path):
    from cache.reader import ClassifierCache
    from pipeline.core.models import build_model, resolve_spec, weights_sha256

    tree = make_imagenet_tree(tmp_path / "pets", ["cat", "dog", "fox"], 2, splits=("val",))
    weights = _tiny_weights(tmp_path / "w.pth", 3)
    result = run(*_extract_args(tree, tmp_path / "c", "--weights", weights))
    assert result.exit_code == 0, result.output
    ident = ClassifierCache.open(tmp_path / "c" / TINY_VIT[0] / "val").identity
    model = build_model(resolve_spec(TINY_VIT[0], False, str(weights), kwargs=TINY_VIT[1]))
    assert ident["num_classes"] == 3 == model.num_classes
    assert ident["weights_sha256"] == weights_sha256(model)


def test_a_classifier_of_another_number_of_classes_is_refused(tmp_path):
    tree = make_imagenet_tree(tmp_path / "pets", ["cat", "dog", "fox"], 2, splits=("val",))
    result = run("extract", *TINY, "--data", tree, "--split", "val", "--out", tmp_path / "c")
    assert_error(result, r"has 1000 outputs but .*pets has 3 classes \(cat, dog, fox")
    weights = _tiny_weights(tmp_path / "w5.pth", 5)
    result = run(*_extract_args(tree, tmp_path / "c", "--weights", weights))
    assert_error(result, r"has 5 outputs but .*3 classes")
    assert not (tmp_path / "c").exists() or not list((tmp_path / "c").rglob("*.json"))


def test_wnid_folders_use_the_class_order_of_classes_txt(tmp_path):
    """Three ImageNet wnids that are not ImageNet's first three: a 3-class classifier is refused
    under ImageNet's indices (naming classes.txt), and classes.txt gives the user's own order."""
    from cache.reader import ClassifierCache
    from pipeline.data.sources import list_split

    own = [SYN[500], SYN[10], SYN[300]]
    tree = make_imagenet_tree(tmp_path / "sub", own, per_class=2, splits=("val",))
    weights = _tiny_weights(tmp_path / "w.pth", 3)
    result = run(*_extract_args(tree, tmp_path / "c", "--weights", weights))
    assert_error(result, r"has 3 outputs but .*labels up to 500.*ImageNet.*classes.txt")
    (tree / "classes.txt").write_text("\n".join(own) + "\n")
    samples = list_split(str(tree), "val")
    assert samples.classes == tuple(own) and samples.dataset == "sub"
    rows = [samples.names.index(f"{w}/{w}_0.JPEG") for w in own]
    assert samples.labels[rows].tolist() == [0, 1, 2]
    result = run(*_extract_args(tree, tmp_path / "c", "--weights", weights))
    assert result.exit_code == 0, result.output
    assert ClassifierCache.open(tmp_path / "c" / TINY_VIT[0] / "val").identity["num_classes"] == 3


def test_imagenet_wnid_folders_with_a_first_k_classes_model_get_a_note(tmp_path):
    tree = make_imagenet_tree(tmp_path / "first", list(SYN[:3]), per_class=2, splits=("val",))
    weights = _tiny_weights(tmp_path / "w", 3)
    result = run(*_extract_args(tree, tmp_path / "c", "--weights", weights))
    assert result.exit_code == 0, result.output
    assert re.search(r"note: .*3 outputs.*ImageNet's first 3 classes.*classes.txt", result.output)


# ------------------------------------------------------------- files given on the command line --
def test_a_text_file_given_as_weights_says_so(tmp_path):
    tree = make_imagenet_tree(tmp_path / "d", list(SYN[:3]), per_class=1, splits=("val",))
    notes = tmp_path / "notes.txt"
    notes.write_text("lr 0.01, 3 epochs\n")
    result = run(*_extract_args(tree, tmp_path / "c", "--weights", notes))
    assert_error(result, r"--weights .*notes.txt is a text file, not a weights file")
    assert "(101)" not in result.output
    junk = tmp_path / "junk.pth"
    junk.write_bytes(bytes(range(256)) * 4)
    result = run(*_extract_args(tree, tmp_path / "c", "--weights", junk))
    assert_error(result, r"--weights .*junk.pth is not a PyTorch .* or safetensors file")
    result = run(*_extract_args(tree, tmp_path / "c", "--weights", tmp_path))
    assert_error(result, r"--weights .* is a directory")


def test_a_labels_file_that_does_not_exist_is_refused(tmp_path):
    tree = make_imagenet_tree(tmp_path / "d", list(SYN[:3]), per_class=1, splits=("val",))
    result = run("extract", *TINY, "--data", tree, "--split", "val", "--out", tmp_path / "c",
                 "--labels", tmp_path / "val_labels.txt")
    assert_error(result, r"--labels .*val_labels.txt: file not found")
    assert not (tmp_path / "c").exists()
