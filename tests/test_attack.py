"""`cli.py attack` on CPU with a tiny fitted classifier: the attack lowers its accuracy, the
stored PNGs reproduce the logged outputs through `extract`, resume re-attacks only what is
missing, foreign folders and bad options are refused, and the split is consumed like any other."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from cli import cli
from conftest import ROOT, TINY_VIT

CPU = ["--device", "cpu", "--no-progress"]
# classes 40 grey levels apart per channel: learnable in a few epochs, and an L-inf budget of
# 32 levels can move an image most of the way to another class
PALETTE = np.array([[148, 108, 108], [108, 148, 108], [108, 108, 148]])
STRONG = ["--eps", "32/255", "--step-size", "8/255", "--steps", "6"]


def invoke(*args):
    return CliRunner().invoke(cli, [*map(str, args)], catch_exceptions=False)


def ok(*args) -> str:
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return result.output


def user_error(result, pattern: str, code: int) -> None:
    import re
    assert result.exit_code == code, result.output
    assert re.search(pattern, result.output, re.S), result.output
    assert "Traceback" not in result.output


def colour_tree(root, per_class: dict, seed=0):
    """ImageFolder whose 3 classes differ by colour; sizes vary (so resize + crop matter).  The
    first training image of each class has the next class's colour: the classifier errs there,
    so an oracle has both classes to learn from."""
    from PIL import Image
    rng = np.random.default_rng(seed)
    for split, n in per_class.items():
        for k in range(len(PALETTE)):
            (root / split / f"class_{k}").mkdir(parents=True, exist_ok=True)
            for i in range(n):
                h, w = rng.integers(30, 48, size=2)
                colour = PALETTE[(k + 1) % len(PALETTE)] if split == "train" and i == 0 \
                    else PALETTE[k]
                img = np.clip(colour + rng.normal(0, 20, (h, w, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(img).save(root / split / f"class_{k}" / f"img{i}.png")
    return root


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """(tree, checkpoint) of TINY_VIT fitted on the colours; its timm eval config resizes to 35
    and centre-crops 32, so reading the stored 32 px images with that crop would change them."""
    base = tmp_path_factory.mktemp("attack")
    tree = colour_tree(base / "colours", {"train": 12, "val": 6})
    ckpt = base / "tiny.pt"
    ok("fit-classifier", "--classifier", TINY_VIT[0], "--model-kwargs", json.dumps(TINY_VIT[1]),
       "--data", tree, "--split", "train", "--epochs", "5", "--batch-size", "8", "--lr", "3e-3",
       "--val-fraction", "0.25", "--out", ckpt, *CPU)
    return tree, ckpt


def attack_args(tree, ckpt, out, *extra):
    return ["attack", "--classifier", TINY_VIT[0], "--weights", ckpt, "--data", tree, "--split",
            "val", "--out", out, "--name", "val-adv", "--precision", "fp32", "--workers", "0",
            "--batch-size", "4", "--shard-size", "6", *STRONG, *CPU, *extra]


def records(split_dir):
    out = {}
    for path in sorted((split_dir / ".attack").glob("shard-*.npz")):
        with np.load(path) as z:
            for k in ("files", "stored_logits", "stored_pred", "label", "source_index"):
                out.setdefault(k, []).append(z[k])
    return {k: np.concatenate(v) for k, v in out.items()}


def manifest(split_dir) -> dict:
    return json.loads((split_dir / ".attack" / "manifest.json").read_text())


def test_attack_lowers_accuracy_and_extract_reproduces_its_outputs(fitted, tmp_path):
    from cache.reader import ClassifierCache
    from pipeline.data.images import decode_file
    from pipeline.data.sources import list_split

    tree, ckpt = fitted
    out = ok(*attack_args(tree, ckpt, tmp_path / "adv"))
    split_dir = tmp_path / "adv" / "val-adv"
    s = manifest(split_dir)["summary"]
    assert "stored uint8 PNGs" in out and f"{s['rows']} rows" in out
    assert s["rows"] == 18 and s["computed_rows"] == 18
    assert s["clean_accuracy"] >= 0.8                              # the classifier works...
    assert s["stored_accuracy"] <= s["clean_accuracy"] - 0.4        # ...until attacked
    assert s["unquantised_success"] > 0.4 and 0 < s["linf_max_levels"] <= 32
    ident = manifest(split_dir)["identity"]
    assert ident["params"] == {"eps": 32 / 255, "alpha": 8 / 255, "steps": 6,
                               "random_start": True}
    assert ident["library"].startswith("torchattacks ") and ident["seed"] == 0
    assert (tmp_path / "adv" / "classes.txt").read_text().split() == [
        "class_0", "class_1", "class_2"]
    # an ordinary ImageFolder split of 32 px PNGs with the original labels
    samples = list_split(str(tmp_path / "adv"), "val-adv")
    src = list_split(str(tree), "val")
    assert samples.dataset == src.dataset and samples.model_resolution == (3, 32, 32)
    assert samples.fingerprint != src.fingerprint
    rec = records(split_dir)
    np.testing.assert_array_equal(rec["label"], src.labels[rec["source_index"]])
    assert decode_file(str(split_dir / rec["files"][0])).shape == (3, 32, 32)
    # extract reads exactly the attacked pixels: the same logits and predictions as logged
    ok("extract", "--classifier", TINY_VIT[0], "--weights", ckpt, "--data", tmp_path / "adv",
       "--split", "val-adv", "--out", tmp_path / "cache", "--precision", "fp32", "--workers",
       "0", *CPU)
    cache = ClassifierCache.open(tmp_path / "cache" / TINY_VIT[0] / "val-adv")
    cols = cache.load(["logits", "pred", "label"])
    row = {n: i for i, n in enumerate(samples.names)}
    order = np.array([row[f] for f in rec["files"]])
    np.testing.assert_array_equal(cols["pred"][order], rec["stored_pred"])
    np.testing.assert_array_equal(cols["label"][order], rec["label"])
    np.testing.assert_allclose(cols["logits"][order].astype(np.float32), rec["stored_logits"],
                               rtol=2e-3, atol=2e-3)                 # fp16 storage in the cache
    assert cache.manifest["summary"]["accuracy"] == pytest.approx(s["stored_accuracy"])


def test_resume_reattacks_only_missing_shards(fitted, tmp_path):
    tree, ckpt = fitted
    args = attack_args(tree, ckpt, tmp_path / "adv", "--max-samples", "12")   # 2 shards
    ok(*args)
    split_dir = tmp_path / "adv" / "val-adv"
    before = {p: p.read_bytes() for p in sorted(split_dir.rglob("*.png"))}
    stamp = {p: p.stat().st_mtime_ns for p in before}
    # an interrupted run: shard 1's record and one of its images missing, a stale temporary
    # file, and no manifest yet
    (split_dir / ".attack" / "manifest.json").unlink()
    (split_dir / ".attack" / "shard-00001.npz").unlink()
    done = set(records(split_dir)["files"].tolist())     # shard 0
    victim = next(p for p in before if str(p.relative_to(split_dir)) not in done)
    victim.unlink()
    (victim.parent / f".{victim.name}.tmp").write_bytes(b"half")
    out = ok(*args)
    s = manifest(split_dir)["summary"]
    assert s["computed_rows"] == 6 and s["rows"] == 12 and "6 rows attacked" in out
    after = sorted(split_dir.rglob("*.png"))
    assert after == sorted(before) and len(after) == 12              # no row lost or doubled
    assert all(p.read_bytes() == before[p] for p in after)            # seeded: same pixels
    unchanged = [p for p in after if p.stat().st_mtime_ns == stamp[p]]
    assert len(unchanged) == 6                                        # only shard 1 rewritten
    assert "already complete" in ok(*args)


def test_foreign_folder_and_options_are_refused(fitted, tmp_path):
    tree, ckpt = fitted
    ok(*attack_args(tree, ckpt, tmp_path / "adv", "--max-samples", "4"))
    other = attack_args(tree, ckpt, tmp_path / "adv", "--max-samples", "4")
    other[other.index("--eps") + 1] = "8/255"
    user_error(invoke(*other), r"another attack run:.*params\.eps: the folder has 0\.125.*"
               r"this command 0\.031", 1)
    user_error(invoke(*attack_args(tree, ckpt, tmp_path / "adv", "--max-samples", "4",
                                   "--attack", "pgd_l2")),
               r"attack: the folder has 'pgd_linf', this command 'pgd_l2'", 1)
    user_error(invoke(*attack_args(tree, ckpt, tmp_path / "adv", "--max-samples", "4",
                                   "--seed", "1")), r"seed: the folder has 0, this command 1", 1)
    (tmp_path / "mine" / "val-adv" / "x").mkdir(parents=True)
    user_error(invoke(*attack_args(tree, ckpt, tmp_path / "mine")), r"not written by", 1)
    for opt, value, pattern in (("--eps", "-0.1", r"--eps -0\.1.*>= 0"),
                                ("--steps", "0", r"'--steps'.*0 is not in the range x>=1"),
                                ("--step-size", "0", r"--step-size 0\.0.*> 0"),
                                ("--step-size", "-1/255", r"--step-size -0\.0039.*> 0"),
                                ("--eps", "lots", r"--eps 'lots'.*8/255")):
        args = attack_args(tree, ckpt, tmp_path / "bad")
        i = args.index(opt) + 1
        user_error(invoke(*args[:i], value, *args[i + 1:]), pattern, 2)
    assert not (tmp_path / "bad").exists()


def test_classifier_without_gradients_is_refused():
    from pipeline.attack.methods import AttackError, PixelClassifier, check_differentiable
    from pipeline.core.models import DataConfig

    cfg = DataConfig((3, 8, 8), "bilinear", 1.0, "squash", (0.5,) * 3, (0.5,) * 3)
    x, y = torch.rand(2, 3, 8, 8), torch.tensor([0, 1])

    class NoGrad(torch.nn.Module):        # e.g. a forward wrapped in torch.no_grad()
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(192, 2)

        @torch.no_grad()
        def forward(self, x):
            return self.fc(x.flatten(1))

    class Rounding(NoGrad):               # differentiable graph, zero gradient everywhere
        def forward(self, x):
            return self.fc(torch.round(x.flatten(1)))

    for model, pattern in ((NoGrad(), "carry no gradient"), (Rounding(), "all-zero gradient")):
        pix = PixelClassifier(model, cfg, "fp32", torch.device("cpu"))
        with pytest.raises(AttackError, match=f"--classifier tiny cannot be differentiated.*{pattern}"):
            check_differentiable(pix, x, y, "tiny")
    good = PixelClassifier(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(192, 2)), cfg,
                           "fp32", torch.device("cpu"))
    check_differentiable(good, x, y, "tiny")


def test_unfinished_split_is_refused_by_readers(fitted, tmp_path):
    from pipeline.data.errors import DataError
    from pipeline.data.sources import list_split

    tree, ckpt = fitted
    ok(*attack_args(tree, ckpt, tmp_path / "adv", "--max-samples", "4"))
    split_dir = tmp_path / "adv" / "val-adv"
    extra = split_dir / "class_0" / "extra.png"
    extra.write_bytes((tree / "val" / "class_0" / "img0.png").read_bytes())
    with pytest.raises(DataError, match="holds 5 images but the attack wrote 4"):
        list_split(str(tmp_path / "adv"), "val-adv")
    extra.unlink()
    (split_dir / ".attack" / "manifest.json").unlink()
    with pytest.raises(DataError, match="has not finished"):
        list_split(str(tmp_path / "adv"), "val-adv")
    user_error(invoke("extract", "--classifier", TINY_VIT[0], "--weights", fitted[1], "--data",
                      tmp_path / "adv", "--split", "val-adv", "--out", tmp_path / "c", *CPU),
               "has not finished", 1)


def test_grey_png_keeps_its_values_for_one_channel_models(tmp_path):
    from PIL import Image

    from pipeline.core.models import DataConfig
    from pipeline.data.images import ResizeCrop, decode_file

    grey = np.arange(256, dtype=np.uint8).reshape(16, 16)
    Image.fromarray(grey).save(tmp_path / "g.png")
    cfg = DataConfig((1, 16, 16), "bilinear", 1.0, "center", (0.5,), (0.5,))
    out = ResizeCrop(cfg)(decode_file(str(tmp_path / "g.png")))
    np.testing.assert_array_equal(out[0].numpy(), grey)


@pytest.mark.slow  # ~40 s: train-oracle and predict on the attacked split
def test_eval_split_and_predict_consume_the_attacked_split(fitted, tmp_path):
    """Written into the data root, the attacked split is an --eval-split like any other; in
    another root, predict scores it."""
    import shutil
    tree = tmp_path / "colours"
    shutil.copytree(fitted[0], tree)
    ckpt = fitted[1]
    ok(*attack_args(tree, ckpt, tree))
    common = ["--classifier", TINY_VIT[0], "--weights", ckpt, "--precision", "fp32",
              "--workers", "0", *CPU]
    ok("extract", "--data", tree, "--split", "train", "--split", "val", "--split", "val-adv",
       "--out", tmp_path / "cache", *common)
    run = tmp_path / "run"
    ok("train-oracle", "--classifier", TINY_VIT[0], "--oracle", TINY_VIT[0], "--random-init",
       "--model-kwargs", json.dumps(TINY_VIT[1]), "--data", tree, "--cache", tmp_path / "cache",
       "--loss", "ss", "--batch-size", "8", "--workers", "0", "--precision", "fp32",
       "--val-fraction", "0", "--eval-split", "val-adv", "--epochs", "1", "--out", run, *CPU)
    assert (run / "outputs" / "val-adv.h5").exists()
    ok(*attack_args(tree, ckpt, tmp_path / "elsewhere"))
    ok("extract", "--data", tmp_path / "elsewhere", "--split", "val-adv", "--out",
       tmp_path / "cache-adv", *common)
    ok("predict", "--run", run, "--data", tmp_path / "elsewhere", "--split", "val-adv",
       "--cache", tmp_path / "cache-adv", "--name", "adv-elsewhere", "--workers", "0",
       "--precision", "fp32", *CPU)
    import h5py
    with h5py.File(run / "outputs" / "val-adv.h5") as a, \
            h5py.File(run / "outputs" / "adv-elsewhere.h5") as b:
        np.testing.assert_allclose(a["z"][:], b["z"][:], rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # ~30 s: three interpreters import torch + timm on 2 cores
def test_torchrun_two_processes_write_the_same_split(fitted, tmp_path):
    tree, ckpt = fitted
    args = attack_args(tree, ckpt, tmp_path / "one")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # as torchrun's OMP_NUM_THREADS=1 per process: the same kernels
    try:
        ok(*args)
    finally:
        torch.set_num_threads(threads)
    args[args.index("--out") + 1] = tmp_path / "two"
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", str(ROOT / "cli.py"), *map(str, args)],
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                         text=True, timeout=300, cwd=tmp_path)
    assert two.returncode == 0, two.stderr
    assert two.stdout.count("18 rows;") == 1                 # one summary, from rank 0
    a, b = tmp_path / "one" / "val-adv", tmp_path / "two" / "val-adv"
    files = sorted(p.relative_to(a) for p in a.rglob("*.png"))
    assert files == sorted(p.relative_to(b) for p in b.rglob("*.png")) and len(files) == 18
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    ma, mb = manifest(a), manifest(b)
    assert ma["identity"] == mb["identity"] and mb["summary"]["computed_rows"] == 18
    assert mb["info"]["world_size"] == 2


def test_grey_fashion_mnist_split_in_its_idx_folder(tmp_path):
    """Attacked into the folder of the idx files: an extra split of that --data (classes.txt
    with folder-safe names, 1-channel PNGs); extract reproduces the logged outputs exactly."""
    from cache.reader import ClassifierCache
    from fmnist_subset import write_fmnist_subset
    from pipeline.data.sources import FMNIST_CLASSES, check_splits, list_split

    data = write_fmnist_subset(tmp_path / "fm", n_train=20, n_test=40)
    model = ["--classifier", "vit_tiny_patch16_224", "--random-init", "--model-kwargs",
             json.dumps({"img_size": 28, "patch_size": 7, "in_chans": 1, "num_classes": 10,
                         "embed_dim": 32, "depth": 1, "num_heads": 2}),
             "--precision", "fp32", "--workers", "0", *CPU]
    ok("attack", *model, "--data", data, "--split", "test", "--max-samples", "10", "--out", data)
    name = "test-pgd_linf-vit_tiny_patch16_224"
    check_splits(str(data), ("test", name))
    samples = list_split(str(data), name)
    assert samples.dataset == "fashion-mnist" and len(samples) == 10
    assert samples.classes[0] == "T-shirt_top" and len(samples.classes) == len(FMNIST_CLASSES)
    assert samples.model_resolution == (1, 28, 28)
    ok("extract", *model, "--data", data, "--split", name, "--out", tmp_path / "cache")
    cache = ClassifierCache.open(tmp_path / "cache" / "vit_tiny_patch16_224" / name)
    rec = records(data / name)
    order = np.array([samples.names.index(f) for f in rec["files"]])
    cols = cache.load(["logits", "pred"])
    np.testing.assert_array_equal(cols["pred"][order], rec["stored_pred"])
    np.testing.assert_allclose(cols["logits"][order].astype(np.float32), rec["stored_logits"],
                               rtol=2e-3, atol=2e-3)


def test_a_batchnorm_classifier_is_attacked_and_scored_frozen(fitted, tmp_path):
    """A classifier with BatchNorm (resnet10t): the accuracies the attack logs are the frozen
    model's, batch after batch, so extract reproduces them.  (torchattacks puts its model back
    into the mode it found it in; a wrapper left in train mode switched BatchNorm to batch
    statistics after the first batch.)"""
    from cache.reader import ClassifierCache
    from pipeline.data.sources import list_split

    tree, _ = fitted
    model = ["--classifier", "resnet10t", "--random-init", "--model-kwargs", '{"num_classes": 3}',
             "--data", tree, "--precision", "fp32", "--workers", "0", *CPU]
    ok("attack", *model, "--split", "val", "--out", tmp_path / "adv", "--name", "val-adv",
       "--batch-size", "4", "--shard-size", "6", *STRONG)
    split_dir = tmp_path / "adv" / "val-adv"
    rec, s = records(split_dir), manifest(split_dir)["summary"]
    ok("extract", *[a for a in model if a != "--data" and a != tree], "--data", tmp_path / "adv",
       "--split", "val-adv", "--out", tmp_path / "cache")
    ok("extract", *model, "--split", "val", "--out", tmp_path / "cache")
    adv = ClassifierCache.open(tmp_path / "cache" / "resnet10t" / "val-adv")
    clean = ClassifierCache.open(tmp_path / "cache" / "resnet10t" / "val")
    row = {n: i for i, n in enumerate(list_split(str(tmp_path / "adv"), "val-adv").names)}
    order = np.array([row[f] for f in rec["files"]])
    np.testing.assert_array_equal(adv.load(["pred"])["pred"][order], rec["stored_pred"])
    assert adv.manifest["summary"]["accuracy"] == pytest.approx(s["stored_accuracy"])
    assert clean.manifest["summary"]["accuracy"] == pytest.approx(s["clean_accuracy"])


# ReColorAdv past its paper budget (grid bound 0.06, Adam lr 0.001, 100-300 iterations): enough
# to recolour the tiny classifier's colour classes in 5 iterations of one batch
RECOLOR = ["--attack", "recoloradv", "--eps", "0.5", "--step-size", "0.1", "--steps", "5",
           "--random-start", "--max-samples", "6", "--batch-size", "6", "--shard-size", "6"]


def have_recoloradv() -> bool:
    try:
        from recoloradv.mister_ed import adversarial_attacks  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not have_recoloradv(), reason="the recoloradv extra is not installed: "
                    "pip install -e '.[recoloradv]' (make install does)")
def test_recoloradv_lowers_accuracy_and_is_reproducible_under_a_seed(fitted, tmp_path):
    """The authors' package through `--attack recoloradv`: accuracy drops, the split is an
    ordinary attacked split, and its random start is drawn under --seed (the same PNG bytes
    again; other bytes without it, so the equality is not that of a deterministic attack)."""
    tree, ckpt = fitted

    def run(name, *extra):
        args = attack_args(tree, ckpt, tmp_path / "adv", *RECOLOR, *extra)
        args[args.index("--name") + 1] = name
        for opt in STRONG[::2]:                       # PGD's budget is not this attack's
            i = args.index(opt)
            del args[i:i + 2]
        ok(*args)
        split_dir = tmp_path / "adv" / name
        return manifest(split_dir), {p.relative_to(split_dir): p.read_bytes()
                                     for p in sorted(split_dir.rglob("*.png"))}

    doc, first = run("a")
    s, ident = doc["summary"], doc["identity"]
    assert s["rows"] == 6 and s["clean_accuracy"] >= 0.8
    assert s["stored_accuracy"] <= s["clean_accuracy"] - 0.5 and s["unquantised_success"] >= 0.5
    assert ident["library"] == "recoloradv 0.0.1" and ident["attack"] == "recoloradv"
    assert ident["params"] == {"eps": 0.5, "alpha": 0.1, "steps": 5, "random_start": True}
    assert doc["defaults"]["values"] == {"eps": 0.06, "alpha": 0.001, "steps": 300,
                                         "random_start": False}
    assert "evaluate_imagenet.py" in doc["defaults"]["source"]
    again, fixed = run("b")[1], run("c", "--no-random-start")[1]
    assert again == first                                  # seeded: the same pixels
    assert fixed.keys() == first.keys() and fixed != first  # the random start is in effect


def test_recoloradv_refuses_grey_input_and_names_its_extra_when_missing(tmp_path, monkeypatch):
    from fmnist_subset import write_fmnist_subset

    data = write_fmnist_subset(tmp_path / "fm", n_train=20, n_test=10)
    grey = ["attack", "--classifier", "vit_tiny_patch16_224", "--random-init", "--model-kwargs",
            json.dumps({"img_size": 28, "patch_size": 7, "in_chans": 1, "num_classes": 10,
                        "embed_dim": 32, "depth": 1, "num_heads": 2}), "--data", data, "--split",
            "test", "--out", tmp_path / "adv", "--attack", "recoloradv", "--workers", "0", *CPU]
    user_error(invoke(*grey), r"--attack recoloradv recolours RGB images, but --classifier "
               r"vit_tiny_patch16_224 reads 1-channel input.*--attack pgd_linf or pgd_l2", 1)
    assert not (tmp_path / "adv").exists()
    monkeypatch.setitem(sys.modules, "recoloradv", None)      # the package not installed
    user_error(invoke(*grey), r"--attack recoloradv needs the authors' package "
               r"recoloradv==0\.0\.1 and six .*pip install '\.\[recoloradv\]'", 1)
    assert not (tmp_path / "adv").exists()


def test_an_attack_that_leaves_no_correct_prediction_says_so(fitted, tmp_path):
    """A split with no correct prediction gives an oracle nothing to rank: the command warns,
    naming --eps and the fix (the split is written: it is still an attacked copy of the data)."""
    tree, ckpt = fitted
    args = attack_args(tree, ckpt, tmp_path / "adv")
    args[args.index("--eps") + 1], args[args.index("--steps") + 1] = "1", "20"
    args[args.index("--step-size") + 1] = "64/255"
    out = ok(*args)
    assert manifest(tmp_path / "adv" / "val-adv")["summary"]["stored_accuracy"] == 0
    assert "no correct prediction" in out and "lower --eps" in out
    assert "no correct prediction" not in ok(*attack_args(tree, ckpt, tmp_path / "weak", "--eps",
                                                          "1/255", "--max-samples", "6"))
