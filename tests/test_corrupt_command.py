"""`cli.py corrupt`: ImageNet-C-layout folders that extract reads back with the original labels
and, for the native protocol, exactly the pixels extract --corruption computes on the fly."""
from __future__ import annotations

import json

import numpy as np
import torch
from click.testing import CliRunner
from PIL import Image

from cli import cli
from conftest import make_imagenet_tree
from fmnist_subset import write_fmnist_subset
from pipeline.data.corruptions import make_corruption
from pipeline.data.labels import imagenet_synsets
from pipeline.data.sources import fashion_mnist, list_split


def run(*args, ok=True):
    result = CliRunner().invoke(cli, [*map(str, args)])
    assert (result.exit_code == 0) == ok, result.output
    return result.output


def test_native_png_tree_holds_extracts_pixels_and_labels_and_resumes(tmp_path):
    data = write_fmnist_subset(tmp_path / "data", n_train=10, n_test=12)
    out = tmp_path / "fmnist-c"
    common = ["corrupt", "--data", data, "--split", "test", "--out", out, "--corruption",
              "gaussian_noise", "--corruption", "motion_blur", "--severity", "2", "--severity",
              "5", "--seed", "3", "--workers", "2", "--no-progress"]
    assert "48 file(s) written" in run(*common)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["protocol"] == "native" and manifest["format"] == "png"
    assert manifest["seed"] == 3 and manifest["source"]["rows"] == 12

    source = fashion_mnist(data, "test")
    for split in ("gaussian_noise/5", "motion_blur/2"):
        name, severity = split.split("/")
        back = list_split(str(out), split)
        assert back.classes == tuple((out / "classes.txt").read_text().split())
        assert len(back) == 12
        for name_i, label in zip(back.names, back.labels):
            row = int(name_i.rsplit("_", 1)[1].split(".")[0])
            assert label == source.labels[row]                       # labels survive
            png = np.asarray(Image.open(out / split / name_i))
            clean = torch.from_numpy(source.idx_images[row].copy())[None]
            expected = make_corruption(name, int(severity), 3)(clean, row)[0].numpy()
            assert np.array_equal(png, expected)                     # extract's pixels

    # resume: nothing to do; a lost file is written again
    assert "0 file(s) written, 48 already present" in run(*common)
    victim = next((out / "motion_blur" / "5").rglob("*.png"))
    victim.unlink()
    assert "1 file(s) written" in run(*common)
    # another seed into the same folder is refused, naming what differs
    output = run(*common, "--seed", "4", ok=False)          # the last --seed wins
    assert "seed" in output and str(out) in output


def test_imagenet_c_protocol_writes_224px_jpegs_in_wnid_folders(tmp_path):
    wnids = list(imagenet_synsets()[:2])
    make_imagenet_tree(tmp_path / "imagenet", wnids, per_class=2, splits=("val",))
    out = tmp_path / "imagenet-c"
    run("corrupt", "--data", tmp_path / "imagenet", "--split", "val", "--out", out,
        "--corruption", "pixelate", "--severity", "4", "--workers", "0", "--no-progress")
    assert json.loads((out / "manifest.json").read_text())["protocol"] == "imagenet-c"
    files = sorted((out / "pixelate" / "4").rglob("*.JPEG"))
    assert len(files) == 4 and {f.parent.name for f in files} == set(wnids)
    assert all(Image.open(f).size == (224, 224) for f in files)
    assert not (out / "classes.txt").exists()                        # wnids need no class list
    back = list_split(str(out), "pixelate/4")
    assert back.dataset == "imagenet"
    assert sorted(set(back.labels.tolist())) == [imagenet_synsets().index(w) for w in wnids]


def test_unknown_corruption_is_a_clear_error(tmp_path):
    output = run("corrupt", "--split", "test", "--out", tmp_path, "--corruption", "fogg", ok=False)
    assert "--corruption" in output and "fogg" in output and "glass_blur" in output
