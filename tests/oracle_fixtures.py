"""Helpers for the stage-2 tests: a generated ImageNet-layout tree whose classes have distinct
colours (so a random classifier's correctness is a learnable function of the image), its
stage-1 caches, and an in-process CLI runner."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner

PALETTE = np.array([[200, 40, 40], [40, 200, 40], [40, 40, 200]])
TINY_VIT_KWARGS = {"img_size": 32, "patch_size": 8, "depth": 2, "embed_dim": 48, "num_heads": 2}
CLASSIFIER = "vit_tiny_patch16_224"


def write_colour_tree(root: Path, per_class: dict[str, int], seed: int = 0) -> Path:
    """ROOT/<split>/<wnid>/<wnid>_<i>.JPEG; class k is PALETTE[k] plus noise, sizes vary."""
    from PIL import Image

    from pipeline.data.labels import imagenet_synsets

    rng = np.random.default_rng(seed)
    for split, n in per_class.items():
        for k, wnid in enumerate(imagenet_synsets()[:len(PALETTE)]):
            for i in range(n):
                h, w = (int(v) for v in rng.integers(28, 48, 2))
                img = np.clip(PALETTE[k] + rng.integers(-50, 50, (h, w, 3)), 0, 255)
                path = root / split / wnid / f"{wnid}_{i}.JPEG"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(img.astype(np.uint8)).save(path, quality=90)
    return root


def run_cli(args: list[str], expect: int | None = 0):
    from cli import cli

    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    if expect is not None:
        assert result.exit_code == expect, result.output
    return result


def extract(data: Path, cache: Path, splits=("train", "val"), seed: int = 0,
            kwargs: dict | None = None, flip_view: bool = True, classifier: str = CLASSIFIER,
            extra: tuple = ()):
    kw = {**TINY_VIT_KWARGS, "num_classes": 3, **(kwargs or {})}
    args = ["extract", "--classifier", classifier, "--random-init", "--model-kwargs",
            json.dumps(kw), "--data", data, "--out", cache, "--workers", 0, "--precision", "fp32",
            "--seed", seed, "--no-progress"]
    for split in splits:
        args += ["--split", split]
    return run_cli(args + (["--flip-view"] if flip_view else []) + list(extra))


def train_args(data: Path, cache: Path, out: Path | None, *extra, loss: str = "ce") -> list:
    """A tiny, fast train-oracle command line (fp32, no workers, every step logged; one epoch,
    the paper's, unless ``extra`` gives --epochs: on these few rows the small-run rule would
    otherwise raise it to MIN_TRAIN_STEPS steps)."""
    args = ["train-oracle", "--classifier", CLASSIFIER, "--oracle", CLASSIFIER, "--random-init",
            "--model-kwargs", json.dumps(TINY_VIT_KWARGS), "--data", data, "--cache", cache,
            "--loss", loss, "--batch-size", 8, "--workers", 0, "--precision", "fp32",
            "--log-every", 1, "--no-progress", "--epochs", 1]
    return args + (["--out", out] if out is not None else []) + list(extra)


def trained_colour_run(base: Path) -> tuple[Path, Path, Path]:
    """A colour tree (8 train / 4 val images per class), its cache and one CE run holding out a
    quarter of the training rows: (data, cache, run)."""
    data = write_colour_tree(base / "colours", {"train": 8, "val": 4})
    cache = base / "cache"
    extract(data, cache, flip_view=False)
    run = base / "run"
    run_cli(train_args(data, cache, run, "--lr", 0.05, "--val-fraction", 0.25, "--batch-size", 4))
    return data, cache, run


def step_losses(run_dir: Path) -> dict[int, float]:
    out = {}
    for line in (Path(run_dir) / "log.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if "loss" in entry:
            out[entry["step"]] = entry["loss"]
    return out
