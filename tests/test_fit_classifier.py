"""`cli.py fit-classifier`: checkpoints that extract loads, on the embedded presets and on any
ImageFolder + timm name; no silent overwrite; clear errors; the augmentation and schedule."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from cli import cli
from conftest import TINY_VIT
from fmnist_subset import write_fmnist_subset
from pipeline.classifier.fit import split_rows
from pipeline.classifier.recipe import augment, lr_at
from pipeline.core.models import CHECKPOINT_FORMAT
from pipeline.data.sources import fashion_mnist

CPU = ["--device", "cpu", "--no-progress"]


def invoke(*args, env=None):
    return CliRunner(env=env).invoke(cli, [*map(str, args)], catch_exceptions=False)


def ok(*args):
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return result.output


def user_error(result, pattern, code=1):
    import re
    assert result.exit_code == code, result.output
    assert re.search(pattern, result.output, re.S), result.output
    assert "Traceback" not in result.output


@pytest.fixture(scope="module")
def subset(tmp_path_factory):
    return write_fmnist_subset(tmp_path_factory.mktemp("fm") / "data", n_train=2400, n_test=400)


def colour_tree(root, classes=3, per_class=16, seed=0):
    """ImageFolder whose classes differ by colour (learnable in a few steps), varied sizes."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    palette = np.array([[220, 40, 40], [40, 200, 60], [50, 60, 230], [230, 220, 40]])
    for split, n in (("train", per_class), ("val", per_class // 2)):
        for k in range(classes):
            (root / split / f"class_{k}").mkdir(parents=True, exist_ok=True)
            for i in range(n):
                h, w = rng.integers(24, 48, size=2)
                img = np.clip(palette[k] + rng.normal(0, 25, (h, w, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(img).save(root / split / f"class_{k}" / f"{i}.png")
    return root


# ------------------------------------------------------------------------- embedded presets --
def test_embedded_vit_fits_saves_and_bare_extract_finds_it(subset, tmp_path, monkeypatch):
    from cache.reader import ClassifierCache

    monkeypatch.chdir(tmp_path)                         # default paths are relative: artifacts/
    out = ok("fit-classifier", "--classifier", "vit", "--data", subset, "--epochs", "3", *CPU)
    path = tmp_path / "artifacts" / "fashion-mnist" / "classifiers" / "vit.pt"
    assert f"saved {path.relative_to(tmp_path)}" in out and "held-out accuracy" in out
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    assert ckpt["format"] == CHECKPOINT_FORMAT and ckpt["version"] == 1
    assert ckpt["model"] == "vit_tiny_patch16_224" and ckpt["model_kwargs"]["num_classes"] == 10
    assert ckpt["data_config"]["input_size"] == (1, 28, 28)
    meta = ckpt["meta"]
    fit_split = fashion_mnist(subset, "clf-train")
    assert meta["split"] == "clf-train" and meta["dataset_fingerprint"] == fit_split.fingerprint
    assert meta["train_rows"] + meta["held_out_rows"] == len(fit_split) == 2400
    assert meta["held_out_accuracy"] > 0.45                          # chance: 0.10
    assert meta["history"][-1]["loss"] < meta["history"][0]["loss"]
    ok("extract", "--classifier", "vit", "--data", subset, "--split", "test", "--workers", "0",
       *CPU)                                                          # no --weights: preset path
    cache = ClassifierCache.open(tmp_path / "artifacts" / "data" / "cache" / "vit" / "test")
    assert cache.manifest["summary"]["accuracy"] > 0.45
    assert cache.identity["model"] == "vit_tiny_patch16_224"


def test_existing_checkpoint_is_kept_unless_force(subset, tmp_path):
    path = tmp_path / "r.pt"
    args = ["fit-classifier", "--classifier", "resnet", "--data", subset, "--out", path,
            "--epochs", "1", "--max-samples", "300", *CPU]
    ok(*args)
    before = path.read_bytes()
    out = ok(*args, "--seed", "1")
    assert "exists" in out and "--force" in out and path.read_bytes() == before
    assert "differs" not in out
    stale = ok(*args, "--seed", "1", "--epochs", "2", "--model-kwargs", '{"stem_width": 8}')
    assert "exists" in stale and path.read_bytes() == before           # kept, but flagged:
    assert "differs" in stale and '"epochs": 1' in stale and '"stem_width": 8' in stale
    ok(*args, "--seed", "1", "--force")
    after = torch.load(path, weights_only=True)
    assert path.read_bytes() != before and after["meta"]["config"]["seed"] == 1
    assert not list(tmp_path.glob(".r.pt.tmp-*"))                     # no temp file left


def test_fitting_on_the_oracles_split_is_flagged(tmp_path):
    result = invoke("fit-classifier", "--classifier", "resnet", "--data", write_fmnist_subset(
        tmp_path / "big", n_train=12_300, n_test=10), "--split", "train", "--out",
        tmp_path / "r.pt", "--epochs", "1", *CPU)
    assert result.exit_code == 0 and "note: fitted on split 'train'" in result.output


def test_fitting_a_folder_on_the_oracles_default_split_warns_and_clf_train_is_preferred(tmp_path):
    """It fitted on train, the split train-oracle trains on by default, without a word."""
    import shutil

    tree = colour_tree(tmp_path / "colours", per_class=4)
    args = ["fit-classifier", "--classifier", TINY_VIT[0], "--model-kwargs",
            json.dumps(TINY_VIT[1]), "--data", tree, "--epochs", "1", "--batch-size", "4", *CPU]
    result = invoke(*args, "--out", tmp_path / "a.pt")
    assert result.exit_code == 0, result.output
    assert ("warning: fitted on split 'train', the split train-oracle trains the oracles on by "
            "default") in result.output and "--train-split" in result.output
    shutil.copytree(tree / "train", tree / "clf-train")       # the classifier's own images
    result = invoke(*args, "--out", tmp_path / "b.pt")
    assert result.exit_code == 0 and "warning" not in result.output, result.output
    assert torch.load(tmp_path / "b.pt", weights_only=True)["meta"]["split"] == "clf-train"


# ------------------------------------------------------------------ any ImageFolder / timm name --
def test_image_folder_with_any_timm_name_and_auto_classes(tmp_path):
    from cache.reader import ClassifierCache

    tree = colour_tree(tmp_path / "colours")
    ckpt = tmp_path / "tiny.pt"
    ok("fit-classifier", "--classifier", TINY_VIT[0], "--model-kwargs", json.dumps(TINY_VIT[1]),
       "--data", tree, "--split", "train", "--num-classes", "auto", "--epochs", "8",
       "--batch-size", "8", "--lr", "3e-3", "--val-fraction", "0.25", "--out", ckpt, *CPU)
    meta = torch.load(ckpt, weights_only=True)["meta"]
    assert meta["num_classes"] == 3 and meta["classes"] == ["class_0", "class_1", "class_2"]
    ok("extract", "--classifier", TINY_VIT[0], "--weights", ckpt, "--data", tree, "--split", "val",
       "--out", tmp_path / "cache", "--workers", "0", *CPU)
    cache = ClassifierCache.open(tmp_path / "cache" / TINY_VIT[0] / "val")
    assert cache.identity["num_classes"] == 3
    assert cache.manifest["summary"]["accuracy"] > 0.6                 # chance: 1/3
    # resnet10t with timm's own eval config (176 px), started from a file with another head:
    # every tensor but the classifier head is loaded, the head is re-initialised
    other = tmp_path / "r1000.pt"
    import timm
    torch.save(timm.create_model("resnet10t", num_classes=1000).state_dict(), other)
    ok("fit-classifier", "--classifier", "resnet10t", "--data", tree, "--split", "train",
       "--weights", other, "--epochs", "1", "--batch-size", "16", "--out", tmp_path / "r.pt", *CPU)
    ckpt = torch.load(tmp_path / "r.pt", weights_only=True)
    assert ckpt["state_dict"]["fc.weight"].shape == (3, 512)
    timm_cfg = timm.data.resolve_model_data_config(timm.create_model("resnet10t"))
    assert ckpt["data_config"]["input_size"] == tuple(timm_cfg["input_size"])


# ------------------------------------------------------------------------------ bad options --
def test_bad_options_are_clear_errors(subset, tmp_path):
    tree = colour_tree(tmp_path / "colours", per_class=4)
    base = ["fit-classifier", "--out", tmp_path / "x.pt", *CPU]
    user_error(invoke(*base, "--num-classes", "1"), r"--num-classes.*'auto' or an integer", 2)
    user_error(invoke(*base, "--data", tree, "--classifier", TINY_VIT[0], "--num-classes", "2"),
               r"--num-classes 2.*labels up to 2")
    user_error(invoke(*base, "--data", tree, "--classifier", "resnet10x"),
               r"unknown model 'resnet10x'.*resnet10t")
    user_error(invoke(*base, "--data", subset, "--split", "nope"), r"--split 'nope'.*clf-train")
    user_error(invoke(*base, "--weights", tmp_path / "w.pt", "--hub-weights"),
               r"--weights and --hub-weights", 2)
    user_error(invoke(*base, "--model-kwargs", "{depth: 2}"), r"--model-kwargs.*JSON", 2)
    user_error(invoke(*base, "--val-fraction", "1.5"), r"--val-fraction", 2)
    user_error(invoke(*base, "--data", subset, env={"WORLD_SIZE": "2"}), r"torchrun")
    wrong = tmp_path / "wrong.pt"
    torch.save({"conv.weight": torch.zeros(3)}, wrong)
    user_error(invoke(*base, "--data", subset, "--classifier", "resnet", "--weights", wrong),
               r"--weights .*wrong.pt does not fit")
    assert not (tmp_path / "x.pt").exists()


# ------------------------------------------------------------------------------- the pieces --
def test_augment_is_a_shifted_window_or_its_mirror():
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (64, 3, 12, 10), dtype=torch.uint8)
    assert torch.equal(augment(x, 0, False, gen), x)
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    y = augment(x, 2, True, gen)
    flips = 0
    for i in range(len(x)):
        windows = [padded[i, :, a:a + 12, b:b + 10] for a in range(5) for b in range(5)]
        plain = any(torch.equal(y[i], w) for w in windows)
        mirrored = any(torch.equal(y[i], w.flip(-1)) for w in windows)
        assert plain or mirrored
        flips += mirrored and not plain
    assert 15 < flips < 49                                           # about half are flipped


def test_schedule_and_held_out_rows():
    lrs = [lr_at(s, 100, 10, 1.0) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:])) and lrs[-1] < 0.01
    train, val = split_rows(1000, 0.1, seed=3, max_samples=None)
    assert len(val) == 100 and len(train) == 900 and not set(train) & set(val)
    again, _ = split_rows(1000, 0.1, seed=3, max_samples=None)
    assert np.array_equal(train, again)
    small, held = split_rows(1000, 0.1, seed=3, max_samples=200)
    assert len(small) + len(held) == 200
