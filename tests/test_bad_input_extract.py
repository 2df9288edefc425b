"""Bad input at extraction: non-finite weights and outputs, a
cache copied under another classifier's name, duplicate labels-file entries, animated GIFs, a
read-only --out, empty class folders, a classes.txt with a byte-order mark, an unknown class
folder in a later split, and more loader workers than cores.  Each case is listed in
docs/BAD_INPUT.md with the test that covers it."""
from __future__ import annotations

import json
import os
import re
import socket
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from cli import cli
from conftest import ROOT, TINY_VIT, assert_error, write_jpeg
from oracle_fixtures import CLASSIFIER, extract, run_cli, train_args, write_colour_tree

TINY = ["--classifier", TINY_VIT[0], "--model-kwargs", json.dumps(TINY_VIT[1]), "--device", "cpu",
        "--precision", "fp32", "--workers", "0", "--batch-size", "4", "--shard-size", "4",
        "--no-progress"]


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _folder_tree(root: Path, splits: dict[str, list[str]], per_class: int = 3) -> Path:
    rng = np.random.default_rng(0)
    for split, classes in splits.items():
        for c in classes:
            (root / split / c).mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                write_jpeg(root / split / c / f"{c}_{i}.jpg", rng)
    return root


def _weights(path: Path, num_classes: int, edit=None) -> Path:
    import timm

    torch.manual_seed(0)
    model = timm.create_model(TINY_VIT[0], **TINY_VIT[1], num_classes=num_classes)
    state = model.state_dict()
    if edit is not None:
        edit(state)
    torch.save(state, path)
    return path


# ----------------------------------------------------------------- non-finite weights, outputs --
def test_non_finite_weights_and_outputs_are_refused_before_a_shard_is_written(tmp_path):
    tree = _folder_tree(tmp_path / "pets", {"val": ["cat", "dog", "fox"]})

    def one_nan(state):
        state["patch_embed.proj.weight"][0, 0, 0, 0] = float("nan")
    nan = _weights(tmp_path / "nan.pth", 3, one_nan)
    result = run("extract", *TINY, "--weights", nan, "--data", tree, "--split", "val",
                 "--out", tmp_path / "c")
    assert_error(result, r"error: --classifier vit_tiny_patch16_224 \(weights .*nan.pth\) has "
                         r"non-finite values \(NaN or inf\) in 1 parameter\(s\): "
                         r"patch_embed.proj.weight; its outputs would be NaN")
    assert not (tmp_path / "c").exists()

    def huge(state):                     # finite weights whose logits overflow float32
        state["head.weight"].fill_(3e38)
        state["head.bias"].fill_(3e38)
    inf = _weights(tmp_path / "inf.pth", 3, huge)
    result = run("extract", *TINY, "--weights", inf, "--data", tree, "--split", "val",
                 "--out", tmp_path / "c")
    assert_error(result, r"error: --classifier vit_tiny_patch16_224 \(weights .*inf.pth\) gives "
                         r"non-finite logits \(NaN or inf\) on 4 of 4 images of this batch, e.g. "
                         r".*cat_0.jpg \(row 0\).*Check the weights")
    assert not list((tmp_path / "c").rglob("*.h5"))       # no shard, no claimed folder
    assert not list((tmp_path / "c").rglob("identity.json"))


# ---------------------------------------------------------- a cache under another classifier --
def test_a_cache_copied_under_another_classifier_name_is_refused(tmp_path):
    data = write_colour_tree(tmp_path / "data", {"train": 8, "val": 4})
    cache = tmp_path / "cache"
    extract(data, cache)
    shutil.copytree(cache / CLASSIFIER, cache / "resnet10t")
    args = train_args(data, cache, tmp_path / "run", "--epochs", 2, "--batch-size", 4)
    args[args.index("--classifier") + 1] = "resnet10t"
    result = run_cli(args, expect=1)
    assert_error(result, r"error: cache .*resnet10t/train was extracted with --classifier "
                         r"vit_tiny_patch16_224 \(model vit_tiny_patch16_224, model_kwargs "
                         r"\{.*\}\), not --classifier resnet10t: it was copied or moved under "
                         r"this name. Pass --classifier vit_tiny_patch16_224")
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------ labels files --
def test_an_image_listed_twice_with_different_labels_is_refused_naming_both_lines(tmp_path):
    from pipeline.data.errors import DataError
    from pipeline.data.labels import imagenet_synsets
    from pipeline.data.sources import list_split

    rng = np.random.default_rng(0)
    for i in range(3):
        write_jpeg(tmp_path / "d" / "val" / f"img_{i}.JPEG", rng)
    labels = tmp_path / "val.txt"
    labels.write_text("img_0.JPEG 3\nimg_1.JPEG 5\n\nimg_2.JPEG 7\nimg_1.JPEG 9\n")
    with pytest.raises(DataError, match=r"val.txt: img_1.JPEG is listed twice with different "
                                        r"labels \(line 2: class 5, line 5: class 9\); keep the "
                                        r"right line and delete the other"):
        list_split(str(tmp_path / "d"), "val", str(labels))
    # the same label twice changes no number: accepted
    labels.write_text("img_0.JPEG 3\nimg_1.JPEG 5\nimg_2.JPEG 7\nimg_1.JPEG 5\n")
    samples = list_split(str(tmp_path / "d"), "val", str(labels))
    assert samples.labels.tolist() == [3, 5, 7] and samples.classes == imagenet_synsets()


# ------------------------------------------------------------------------------------ images --
def test_an_animated_gif_is_read_as_its_first_frame(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(1)
    frames = [rng.integers(0, 256, (30, 40, 3)).astype(np.uint8) for _ in range(3)]
    for name in ("anim", "first"):
        tree = _folder_tree(tmp_path / name, {"val": ["cat", "dog", "fox"]}, per_class=2)
        gif = [Image.fromarray(f).quantize(64) for f in frames]
        if name == "anim":
            gif[0].save(tree / "val" / "cat" / "cat_9.gif", save_all=True, append_images=gif[1:])
        else:   # the first frame alone, as a one-frame GIF
            gif[0].save(tree / "val" / "cat" / "cat_9.gif")
    weights = _weights(tmp_path / "w.pth", 3)
    logits = {}
    for name in ("anim", "first"):
        result = run("extract", *TINY, "--weights", weights, "--data", tmp_path / name,
                     "--split", "val", "--out", tmp_path / f"c-{name}")
        assert result.exit_code == 0, result.output
        from cache.reader import ClassifierCache
        logits[name] = ClassifierCache.open(tmp_path / f"c-{name}" / TINY_VIT[0] / "val").load(
            ["logits", "valid"])
    assert logits["anim"]["valid"].all()
    assert np.array_equal(logits["anim"]["logits"], logits["first"]["logits"])


# -------------------------------------------------------------------------- a read-only --out --
def _read_only(folder: Path, cmd: list) -> subprocess.CompletedProcess:
    """``cmd`` with ``folder`` mounted read-only (a bind mount in a user namespace)."""
    script = (f"mount --bind {folder} {folder} && mount -o remount,ro,bind {folder} {folder} && "
              f"cd {ROOT} && exec " + " ".join(f"'{c}'" for c in cmd))
    return subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True,
                          timeout=300)


def _can_bind_read_only() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount --bind /tmp /tmp && mount -o "
                            "remount,ro,bind /tmp /tmp"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_bind_read_only(), reason="no user namespace for a read-only mount")
def test_a_read_only_out_gets_one_message_and_a_complete_read_only_cache_is_read(tmp_path):
    tree = _folder_tree(tmp_path / "pets", {"val": ["cat", "dog", "fox"]}, per_class=2)
    weights = _weights(tmp_path / "w.pth", 3)
    cmd = [sys.executable, "cli.py", "extract", *TINY, "--weights", str(weights), "--data",
           str(tree), "--split", "val"]
    (tmp_path / "ro").mkdir()
    proc = _read_only(tmp_path / "ro", cmd + ["--out", str(tmp_path / "ro" / "cache")])
    assert proc.returncode == 1, proc.stderr
    assert re.search(r"error: cannot write in .*ro/cache/vit_tiny_patch16_224/val \(read-only "
                     rf"file system, on host {re.escape(socket.gethostname())}\): choose another "
                     r"--out, or make it writable there", proc.stderr)
    assert "Traceback" not in proc.stderr
    result = run(*cmd[2:], "--out", tmp_path / "done")
    assert result.exit_code == 0, result.output
    # a lock left by a killed extract, which cannot be removed here
    (tmp_path / "done" / TINY_VIT[0] / "val" / ".lock").write_text(
        json.dumps({"pid": 999_999_999, "host": socket.gethostname()}))
    proc = _read_only(tmp_path / "done", cmd + ["--out", str(tmp_path / "done")])
    assert proc.returncode == 0, proc.stderr
    assert "already complete" in proc.stdout and "Traceback" not in proc.stderr
    proc = _read_only(tmp_path / "done", cmd + ["--out", str(tmp_path / "done"), "--verify"])
    assert proc.returncode == 0 and "already complete" in proc.stdout, proc.stderr
    (sorted((tmp_path / "pets" / "val" / "cat").iterdir())[0]).write_bytes(
        (sorted((tmp_path / "pets" / "val" / "dog").iterdir())[0]).read_bytes())
    proc = _read_only(tmp_path / "done", cmd + ["--out", str(tmp_path / "done")])
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert re.search(r"error: cache .*done/vit_tiny_patch16_224/val holds shards of images that "
                     r"changed but is read-only here: make it writable and re-run", proc.stderr)


# ------------------------------------------------------------------------- classes and folders --
def test_an_empty_class_folder_is_named_in_the_class_count_message(tmp_path):
    tree = _folder_tree(tmp_path / "pets", {"train": ["cat", "dog"], "val": ["cat", "dog"]})
    (tree / "train" / "fox").mkdir()
    weights = _weights(tmp_path / "w.pth", 2)
    result = run("extract", *TINY, "--weights", weights, "--data", tree, "--split", "val",
                 "--out", tmp_path / "c")
    assert_error(result, r"has 2 outputs but split 'val' of .*pets has 3 classes \(cat, dog, "
                         r"fox\): its output k must mean class k. Class folder\(s\) "
                         r".*pets/train/fox hold no images: remove it if it is not a class of "
                         r"the classifier.")


def test_a_classes_txt_with_a_byte_order_mark_is_read(tmp_path):
    from pipeline.data.sources import list_split

    tree = _folder_tree(tmp_path / "pets", {"val": ["dog", "cat"]}, per_class=1)
    (tree / "classes.txt").write_text("\ufeffdog\ncat\n", encoding="utf-8")   # Notepad's UTF-8
    samples = list_split(str(tree), "val")
    assert samples.classes == ("dog", "cat")
    assert samples.labels.tolist() == [1, 0]         # cat/ sorts first, and is class 1


def test_an_unknown_class_folder_in_a_later_split_stops_extract_before_any_work(tmp_path):
    tree = _folder_tree(tmp_path / "pets", {"train": ["cat", "dog"], "val": ["cat", "cow", "dog"]},
                        per_class=1)
    weights = _weights(tmp_path / "w.pth", 2)
    result = run("extract", *TINY, "--weights", weights, "--data", tree, "--split", "train",
                 "--split", "val", "--out", tmp_path / "c")
    assert_error(result, r"pets/val: class folder\(s\) \['cow'\] are not among the 2 classes of "
                         r"train/")
    assert not (tmp_path / "c").exists()              # train/ was not extracted first


def test_more_workers_than_usable_cores_is_a_usage_error(tmp_path):
    cores = len(os.sched_getaffinity(0))
    result = run("extract", "--workers", cores + 1, "--out", tmp_path / "c")
    assert_error(result, rf"Invalid value for '--workers': {cores + 1} workers, but this process "
                         rf"may use {cores} core\(s\): give at most --workers {cores}", code=2)
    assert not (tmp_path / "c").exists()
