"""The eleven ImageNet-C corruptions that run the `imagecorruptions` package: the same output as
the package's own functions, deterministic per (seed, row) in any process, more change at higher
severity, and nothing global touched by the compatibility layer."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from conftest import FMNIST_DIR, real_photo
from pipeline.data.corruptions import make_corruption
from pipeline.data.images import ImageRows
from pipeline.data.loader import make_loader
from pipeline.data.imagenet_c import CORRUPTIONS, PACKAGE, PACKAGE_NATIVE_SCALE, SEVERITIES
from pipeline.data.sources import fashion_mnist

compat = pytest.importorskip("pipeline.data.imagecorruptions_compat")

# Corruptions that draw no random numbers: identical for every row and seed.
DETERMINISTIC = {"zoom_blur", "pixelate", "saturate"}
# Steps s -> s+1 where ImageNet-C's own parameter table does not add pixel change (the package's
# values, which test_package_output_is_the_package_function checks we run unchanged).
NOT_MONOTONE = {
    "glass_blur": "severity 2 makes one pass of reach 2 where 1 makes two of reach 1; "
                  "4 makes two passes where 3 makes three",
    "snow": "severities 2 and 3 differ in flake size and threshold, not in amount",
    "frost": "the image's weight falls (1 -> 0.6) while the frost's rises (0.4 -> 0.75): "
             "on bright images the change can shrink",
    "fog": "severities 3-5 trade fog strength against the fractal's roughness",
    "spatter": "severities 1-3 are water, 4-5 mud: 3 and 4 change about as much",
    "saturate": "severities 1-2 desaturate (x0.3, x0.1), 3-5 saturate (x2, x5, x20)",
}


def mad(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().mean().item()


@pytest.fixture(scope="module")
def images():
    """Two 28-px Fashion-MNIST images (integer upscale to 224) and a 40x56 photo (non-integer)."""
    if not FMNIST_DIR.exists():
        pytest.skip("dataset-fashion-mnist is not installed")
    fm = torch.from_numpy(fashion_mnist(FMNIST_DIR, "test").idx_images[:2].copy())[:, None]
    photo = torch.from_numpy(real_photo("chelsea")).permute(2, 0, 1)
    photo = F.interpolate(photo[None].float(), size=(40, 56), mode="area")[0]
    return [fm[0], fm[1], photo.round().to(torch.uint8)]


@pytest.mark.parametrize("name", PACKAGE)
def test_deterministic_per_seed_and_row_and_growing_with_severity(name, images):
    diffs = []
    for s in SEVERITIES:
        corrupt = make_corruption(name, s, seed=4)
        outs = [corrupt(x, row) for row, x in enumerate(images)]
        assert torch.equal(make_corruption(name, s, seed=4)(images[2], 2), outs[2])
        assert all(o.shape == x.shape and o.dtype == torch.uint8 for o, x in zip(outs, images))
        diffs.append(np.mean([mad(o, x) for o, x in zip(outs, images)]))
    other_row = make_corruption(name, 5, seed=4)(images[2], 99)
    other_seed = make_corruption(name, 5, seed=5)(images[2], 2)
    same = make_corruption(name, 5, seed=4)(images[2], 2)
    if name in DETERMINISTIC:
        assert torch.equal(other_row, same) and torch.equal(other_seed, same)
    else:
        assert not torch.equal(other_row, same) and not torch.equal(other_seed, same)
    assert diffs[-1] > diffs[0] + 1.0, diffs
    if name not in NOT_MONOTONE:
        assert all(a < b for a, b in zip(diffs, diffs[1:])), diffs


@pytest.mark.parametrize("name", [n for n in PACKAGE if n != "glass_blur"])
def test_package_output_is_the_package_function(name):
    """At 224 px (no resampling) on RGB, ours == the package's function under the same seed,
    rounded: the wrapper adds nothing but seeding and rounding."""
    from PIL import Image

    arr = np.ascontiguousarray(real_photo("chelsea")[:224, 50:274])
    seed = np.random.SeedSequence([7, 3])
    with compat.seeded(seed):
        ref = np.asarray(getattr(compat.package(), name)(Image.fromarray(arr), 3), dtype=np.float64)
    ref = np.round(np.clip(ref, 0, 255)).astype(np.uint8)
    ours = make_corruption(name, 3, seed=7)(torch.from_numpy(arr).permute(2, 0, 1), 3)
    assert np.array_equal(ours.permute(1, 2, 0).numpy(), ref)


def test_fast_glass_blur_equals_the_package_function():
    rng = np.random.default_rng(0)
    for shape in ((48, 40, 3), (33, 57, 3)):
        img = Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8))
        for s in SEVERITIES:
            with compat.seeded(11):
                ref = np.asarray(compat.package().glass_blur(img, s))
            with compat.seeded(11):
                ours = compat.glass_blur(img, s)
            assert np.array_equal(ref, ours), (shape, s)


def test_the_compatibility_layer_changes_nothing_global():
    had_pkg_resources = "pkg_resources" in sys.modules
    state = np.random.get_state()
    compat.package()
    img = np.zeros((32, 32, 3), dtype=np.uint8)
    compat.corrupt_hwc("snow", 2, img, np.random.SeedSequence([0, 1]))
    assert ("pkg_resources" in sys.modules) == had_pkg_resources
    after = np.random.get_state()
    assert state[0] == after[0] and np.array_equal(state[1], after[1]) and state[2:] == after[2:]
    if np.lib.NumpyVersion(np.__version__) >= "2.0.0":
        assert not hasattr(np, "float_")                     # numpy itself is left alone
    from skimage.filters import gaussian
    with pytest.raises(TypeError):
        gaussian(np.zeros((4, 4, 3)), sigma=1, multichannel=True)   # and so is scikit-image


def test_identical_in_forked_loader_workers(fmnist_dir):
    samples = fashion_mnist(fmnist_dir, "test")
    corrupt = make_corruption("snow", 3, seed=2)
    batches = [[0, 1, 2], [3, 4, 5]]

    def pixels(workers):
        loader = make_loader(ImageRows(samples, lambda x: x, corrupt), batches, workers, False)
        return torch.cat([x for x, _, _ in loader])

    assert torch.equal(pixels(0), pixels(2))


def test_all_nineteen_are_offered_and_grouped():
    assert len(CORRUPTIONS) == 19 and len(set(CORRUPTIONS)) == 19
    assert set(PACKAGE_NATIVE_SCALE) <= set(PACKAGE) and len(PACKAGE) == 11
