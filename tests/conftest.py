"""Shared fixtures: generated ImageNet-layout JPEG trees and tiny timm model settings (CPU)."""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "2")

FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")

# Tiny random-init timm models: seconds on a CPU, same code paths as the real ones.
TINY_VIT = ("vit_tiny_patch16_224",
            {"img_size": 32, "patch_size": 8, "depth": 2, "embed_dim": 48, "num_heads": 2})
TINY_RESNET = ("resnet10t", {})


def write_jpeg(path: Path, rng: np.random.Generator, size=(40, 56)) -> None:
    from PIL import Image

    h, w = size
    base = rng.integers(0, 256, size=(1, 1, 3))
    noise = rng.integers(-60, 60, size=(h, w, 3))
    img = np.clip(base + noise, 0, 255).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(img).save(path, quality=90)


def make_imagenet_tree(root: Path, wnids: list[str], per_class: int, splits=("train", "val"),
                       seed: int = 0) -> Path:
    """ROOT/<split>/<wnid>/<wnid>_<i>.JPEG with random-content JPEGs of varied sizes."""
    rng = np.random.default_rng(seed)
    for split in splits:
        for wnid in wnids:
            for i in range(per_class):
                size = (int(rng.integers(24, 64)), int(rng.integers(24, 64)))
                write_jpeg(root / split / wnid / f"{wnid}_{i}.JPEG", rng, size)
    return root


@pytest.fixture
def imagenet_tree(tmp_path) -> Path:
    from pipeline.data.labels import imagenet_synsets

    wnids = list(imagenet_synsets()[:3])
    return make_imagenet_tree(tmp_path / "imagenet", wnids, per_class=4)


@pytest.fixture
def fmnist_dir() -> Path:
    if not FMNIST_DIR.exists():
        pytest.skip("dataset-fashion-mnist is not installed (apt-get install dataset-fashion-mnist)")
    return FMNIST_DIR


# ------------------------------------------------------------------ stage 1 (extract) helpers --
@pytest.fixture
def tiny_extract(tmp_path):
    """Factory: ExtractConfig for a tiny random-init timm model on CPU, fp32, several workers."""
    from pipeline.extract.run import ExtractConfig

    def make(data, out=None, split="val", model=TINY_VIT, **overrides):
        kw = dict(classifier=model[0], model_kwargs=dict(model[1]), out=out or tmp_path / "cache",
                  data=str(data), split=split, random_init=True, device="cpu", precision="fp32",
                  workers=2, batch_size=4, shard_size=6, progress=False)
        kw.update(overrides)
        return ExtractConfig(**kw)
    return make


def real_photo(name: str) -> np.ndarray:
    """A real photo: skimage.data's (chelsea, coffee, astronaut, rocket) or sklearn's (china,
    flower) as uint8 HxWx3."""
    if name in ("china", "flower"):
        from sklearn.datasets import load_sample_image
        return load_sample_image(f"{name}.jpg")
    import skimage.data
    return getattr(skimage.data, name)()


def assert_error(result, pattern, code=1):
    """A user's mistake: exit ``code``, the message matching ``pattern``, no traceback."""
    assert result.exit_code == code, result.output
    assert re.search(pattern, result.output, re.S), result.output
    assert "Traceback" not in result.output


@pytest.fixture
def restore_registry():
    """Loss classes a test registers leave with it: the command line's --loss choices are built
    once per process, so a later test would see a registry larger than its options."""
    from pipeline.core.losses import registry
    before = dict(registry._LOSSES)
    yield
    registry._LOSSES.clear()
    registry._LOSSES.update(before)
