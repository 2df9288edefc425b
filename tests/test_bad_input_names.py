"""Folders and file names as users have them: symbolic links to folders (followed by `extract`
and `predict --images` alike), a link that loops back (not followed, noted), names that are not
UTF-8 (refused before any work), and photos stored rotated with an EXIF Orientation tag (read as
stored unless `extract --exif-transpose`, which `predict --images` then follows)."""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import TINY_VIT, assert_error, make_imagenet_tree
from oracle_fixtures import run_cli, trained_colour_run
from pipeline.data.labels import imagenet_synsets

SYN = imagenet_synsets()
FAST = ("--workers", 0, "--no-progress")
EXTRACT = ["extract", "--classifier", TINY_VIT[0], "--model-kwargs", json.dumps(TINY_VIT[1]),
           "--random-init", "--device", "cpu", "--precision", "fp32", "--batch-size", 4,
           "--shard-size", 6, *FAST]
CONVMV = r"Rename them to UTF-8, e.g. `convmv -f latin1 -t utf8 -r --notest "


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return trained_colour_run(tmp_path_factory.mktemp("names"))


def linked_tree(data: Path, dest: Path) -> Path:
    """A copy of ``data``'s val split whose second class folder lives elsewhere, reached by a
    symbolic link: DEST/val/<wnid> -> DEST/elsewhere/<wnid>."""
    shutil.copytree(data / "val", dest / "val")
    moved = sorted((dest / "val").iterdir())[1]
    shutil.move(moved, dest / "elsewhere" / moved.name)
    moved.symlink_to(Path("..") / "elsewhere" / moved.name, target_is_directory=True)
    return dest


def bytes_named(folder: Path, name: bytes, data: bytes) -> str:
    """Create FOLDER/<name> from raw bytes (a Latin-1 name is not UTF-8); its str path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = os.fsencode(folder) + b"/" + name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, data)
    os.close(fd)
    return os.fsdecode(path)


def test_a_symlinked_folder_is_read_by_extract_and_predict_alike(trained, tmp_path):
    data, _, run = trained
    tree = linked_tree(data, tmp_path / "linked")
    result = run_cli([*EXTRACT, "--data", tree, "--split", "val", "--out", tmp_path / "cache"])
    assert "[val] 12 rows" in result.output          # 4 of them through the link
    result = run_cli(["predict", "--run", run, "--images", tree / "val", "--out",
                      tmp_path / "p.csv", *FAST])
    assert "12 image(s)" in result.output, result.output
    linked = next(p for p in (tree / "val").iterdir() if p.is_symlink())
    rows = (tmp_path / "p.csv").read_text()
    assert rows.count(f"{linked}/") == 4                # named by the path given, not the target


def test_a_link_looping_back_is_not_followed_and_is_noted(trained, tmp_path):
    data, _, run = trained
    tree = linked_tree(data, tmp_path / "loop")
    first = sorted((tree / "val").iterdir())[0]
    (first / "up").symlink_to("..", target_is_directory=True)        # to its parent
    (tree / "val" / "self").symlink_to(".", target_is_directory=True)   # to itself
    result = run_cli(["predict", "--run", run, "--images", tree / "val", "--out",
                      tmp_path / "p.csv", *FAST])
    assert "12 image(s)" in result.output, result.output   # each image once
    assert f"note: {first / 'up'} links back to {tree / 'val'}, a folder on its own path: not " \
           "followed" in result.output
    assert f"note: {tree / 'val' / 'self'} links back to" in result.output
    # extract reads the images directly in each class folder: a link inside one is not read
    (tree / "val" / "self").unlink()
    result = run_cli([*EXTRACT, "--data", tree, "--split", "val", "--out", tmp_path / "cache"])
    assert "[val] 12 rows" in result.output


def test_a_walk_over_two_links_into_each_other_terminates(tmp_path):
    from pipeline.data.listing import SkippedLinkNote, walk

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "x.jpg").write_bytes(b"x")
    (tmp_path / "a" / "to_b").symlink_to("../b", target_is_directory=True)
    (tmp_path / "b" / "to_a").symlink_to("../a", target_is_directory=True)
    with pytest.warns(SkippedLinkNote) as notes:
        files = walk(tmp_path)
    # a/x.jpg, a/to_b/to_a/ loops back to a; b/to_a/x.jpg, b/to_a/to_b/ loops back to b
    assert sorted(str(p.relative_to(tmp_path)) for p in files) == ["a/x.jpg", "b/to_a/x.jpg"]
    assert len(notes) == 2


@pytest.fixture
def latin1(trained, tmp_path) -> tuple[Path, str]:
    """A folder of images, one named 'café.jpg' in Latin-1 bytes."""
    data, _, _ = trained
    folder = tmp_path / "photos"
    shutil.copytree(data / "val", folder)
    jpeg = next((data / "val").rglob("*.JPEG")).read_bytes()
    return folder, bytes_named(folder / "holiday", b"caf\xe9.jpg", jpeg)


def test_a_name_that_is_not_utf8_is_refused_by_predict_before_any_work(trained, latin1,
                                                                       monkeypatch):
    """It crashed with a UnicodeEncodeError traceback writing the table, after the whole
    forward pass."""
    import pipeline.oracle.deploy.rebuild as rebuild

    _, _, run = trained
    folder, _ = latin1

    def no_model(*_args, **_kw):
        raise AssertionError("the classifier was loaded before the names were checked")
    monkeypatch.setattr(rebuild, "load_classifier", no_model)
    for spec in (folder, f"{folder}/**/*.jpg"):
        result = run_cli(["predict", "--run", run, "--images", spec, *FAST], expect=None)
        assert_error(result, rf"error: 1 image file name\(s\) under .* are not valid UTF-8, e.g. "
                             rf"{folder}/holiday/caf\\xe9\.jpg \(bytes that are not UTF-8 shown as "
                             rf"\\xNN\): .*{CONVMV}")
    assert not (run / "predictions" / "photos.csv").exists()


def test_a_name_that_is_not_utf8_is_refused_by_extract_before_any_work(tmp_path, monkeypatch):
    """It crashed with a UnicodeEncodeError traceback hashing the dataset fingerprint, after the
    classifier was built."""
    import pipeline.extract.run as stage

    tree = make_imagenet_tree(tmp_path / "inet", list(SYN[:2]), per_class=2, splits=("val",))
    jpeg = next(tree.rglob("*.JPEG")).read_bytes()
    bytes_named(tree / "val" / SYN[1], b"caf\xe9.jpg", jpeg)
    bytes_named(tree / "val" / SYN[1], b"na\xefve.jpg", jpeg)

    def no_model(*_args, **_kw):
        raise AssertionError("the classifier was built before the names were checked")
    monkeypatch.setattr(stage, "build_model", no_model)
    out = tmp_path / "cache"
    result = run_cli([*EXTRACT, "--data", tree, "--split", "val", "--out", out], expect=None)
    assert_error(result, rf"error: 2 image file name\(s\) under {tree / 'val'} are not valid "
                         rf"UTF-8, e.g. {tree / 'val' / SYN[1]}/caf\\xe9\.jpg .*{CONVMV}"
                         rf"{tree / 'val'}`")
    assert not out.exists()
    # a class folder's own name: refused by the split check, before the split is listed
    shutil.rmtree(tree / "val" / SYN[1])
    bytes_named(Path(os.fsdecode(os.fsencode(tree / "val") + b"/s\xe9rie")), b"a.jpg", jpeg)
    result = run_cli([*EXTRACT, "--data", tree, "--split", "val", "--out", out], expect=None)
    assert_error(result, r"error: 1 class folder name\(s\) under .* e.g. .*/s\\xe9rie ")


# ------------------------------------------------------------------------------------ EXIF --
def rotated_png(path: Path, orientation: int = 6) -> np.ndarray:
    """A 30 x 40 random image saved with an EXIF Orientation tag; returns it upright (as
    PIL.ImageOps.exif_transpose turns it)."""
    from PIL import Image, ImageOps

    rgb = np.random.default_rng(orientation).integers(0, 256, (30, 40, 3)).astype(np.uint8)
    exif = Image.Exif()
    exif[0x0112] = orientation
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rgb).save(path, exif=exif)
    with Image.open(path) as im:
        return np.asarray(ImageOps.exif_transpose(im).convert("RGB"))


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied_only_when_asked_as_pil_applies_it(tmp_path, orientation):
    from pipeline.data.images import decode_file

    upright = rotated_png(tmp_path / "o.png", orientation)
    stored = decode_file(str(tmp_path / "o.png"))
    assert tuple(stored.shape) == (3, 30, 40)                     # as stored, by default
    for data in (None, bytearray((tmp_path / "o.png").read_bytes())):   # extract passes bytes
        turned = decode_file(str(tmp_path / "o.png"), data, exif_transpose=True)
        np.testing.assert_array_equal(turned.permute(1, 2, 0).numpy(), upright)


def test_a_rotated_jpeg_decodes_as_stored_by_default_and_turned_with_the_flag(tmp_path):
    from PIL import Image

    from pipeline.data.images import decode_file

    rgb = np.random.default_rng(0).integers(0, 256, (24, 40, 3)).astype(np.uint8)
    exif = Image.Exif()
    exif[0x0112] = 6                  # "rotate 90 degrees clockwise to view"
    Image.fromarray(rgb).save(tmp_path / "phone.jpg", exif=exif, quality=95)
    stored = decode_file(str(tmp_path / "phone.jpg"))
    turned = decode_file(str(tmp_path / "phone.jpg"), exif_transpose=True)
    assert tuple(stored.shape) == (3, 24, 40) and tuple(turned.shape) == (3, 40, 24)
    assert torch.equal(turned, torch.rot90(stored, -1, (1, 2)))


def test_extract_records_exif_transpose_only_when_on(tmp_path):
    tree = make_imagenet_tree(tmp_path / "inet", list(SYN[:2]), per_class=2, splits=("val",))
    rotated_png(tree / "val" / SYN[0] / "phone.png")
    plain, turned = tmp_path / "plain", tmp_path / "turned"
    run_cli([*EXTRACT, "--data", tree, "--split", "val", "--out", plain])
    run_cli([*EXTRACT, "--data", tree, "--split", "val", "--out", turned, "--exif-transpose"])
    ident = {name: json.loads((root / TINY_VIT[0] / "val" / "identity.json").read_text())
             for name, root in (("plain", plain), ("turned", turned))}
    assert "exif_transpose" not in ident["plain"] and ident["turned"]["exif_transpose"] is True
    assert {k: v for k, v in ident["turned"].items() if k != "exif_transpose"} == ident["plain"]
    from cache.reader import ClassifierCache
    a, b = (ClassifierCache.open(root / TINY_VIT[0] / "val").load(["logits"])["logits"]
            for root in (plain, turned))
    rows = sorted(p.relative_to(tree / "val").as_posix() for p in (tree / "val").rglob("*.*"))
    differ = [rows[i] for i in np.flatnonzero((a != b).any(axis=1))]
    assert differ == [f"{SYN[0]}/phone.png"]        # only the file with an orientation tag
    # the option is part of what the cache is: another run into it is refused, naming it
    result = run_cli([*EXTRACT, "--data", tree, "--split", "val", "--out", plain,
                      "--exif-transpose"], expect=None)
    assert_error(result, r"exif_transpose: cache has null, expected true")


def test_exif_transpose_is_refused_with_a_device_decoder(tmp_path):
    result = run_cli([*EXTRACT, "--exif-transpose", "--decode", "gpu", "--out", tmp_path / "c"],
                     expect=None)
    assert_error(result, r"--exif-transpose turns images upright on the CPU after decoding; "
                         r"--decode gpu does not: use --decode cpu", code=2)


def test_exif_transpose_is_refused_for_idx_arrays(tmp_path, fmnist_dir):
    result = run_cli([*EXTRACT, "--exif-transpose", "--out", tmp_path / "c"], expect=None)
    assert_error(result, r"error: --exif-transpose: fashion-mnist is stored as idx arrays of "
                         r"pixels, which have no EXIF orientation to apply; leave the option out")
    assert not (tmp_path / "c").exists()


def test_predict_images_reads_as_the_runs_training_cache_recorded(trained, tmp_path,
                                                                  monkeypatch):
    """A photo stored rotated with its Orientation tag and the same photo stored upright: one
    prediction only where the training cache was extracted with --exif-transpose."""
    from PIL import Image

    import pipeline.oracle.deploy.images as deploy

    _, _, run = trained
    upright = rotated_png(tmp_path / "imgs" / "phone.png")
    Image.fromarray(upright).save(tmp_path / "imgs" / "upright.png")

    def scores() -> dict:
        run_cli(["predict", "--run", run, "--images", tmp_path / "imgs", "--out",
                 tmp_path / "p.jsonl", *FAST])
        rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
        return {Path(r["path"]).name: (r["msp"], r["confidence"]) for r in rows}

    as_stored = scores()
    assert as_stored["phone.png"] != as_stored["upright.png"]
    cache_of = deploy.training_cache

    def turned_cache(run_dir, record):
        cache = cache_of(run_dir, record)
        manifest = {**cache.manifest, "identity": {**cache.identity, "exif_transpose": True}}
        return replace(cache, manifest=manifest)
    monkeypatch.setattr(deploy, "training_cache", turned_cache)
    turned = scores()
    assert turned["phone.png"] == pytest.approx(turned["upright.png"], abs=1e-6)
    assert turned["upright.png"] == pytest.approx(as_stored["upright.png"], abs=1e-6)
