"""ImageNet-C-style corruptions: API contract, determinism across processes, severity ordering,
fidelity to ImageNet-C's formulas, size scaling, and `extract --corruption` end to end."""
from __future__ import annotations

import gzip
import json
import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from cli import cli
from conftest import make_imagenet_tree, real_photo
from pipeline.data.corruptions import (CORRUPTIONS, PARAMS, REFERENCE_SIZE, SEVERITIES, Corruption,
                                       corruption_from_tag, disk_kernel, filter2d, make_corruption,
                                       parse_corruption_tag)
from pipeline.data.errors import DataError
from pipeline.data.imagenet_c import BUILT_IN
from pipeline.data.images import ImageRows
from pipeline.data.loader import make_loader
from pipeline.data.labels import imagenet_synsets
from pipeline.data.sources import SampleList, fashion_mnist


def photo(size: int | None = REFERENCE_SIZE) -> torch.Tensor:
    """skimage's chelsea as uint8 RGB CHW, centre-cropped square and resized to ``size``."""
    arr = real_photo("chelsea")
    s = min(arr.shape[:2])
    t = torch.from_numpy(arr[:s, :s].copy()).permute(2, 0, 1).contiguous()
    return t if size is None else F.interpolate(t[None].float(), size=(size, size), mode="area",
                                                antialias=False)[0].round().to(torch.uint8)


@pytest.fixture(scope="module")
def fmnist_images():
    from conftest import FMNIST_DIR
    if not FMNIST_DIR.exists():
        pytest.skip("dataset-fashion-mnist is not installed")
    return torch.from_numpy(fashion_mnist(FMNIST_DIR, "test").idx_images[:64].copy())[:, None]


def mad(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().mean().item()


# ----------------------------------------------------------------------------- API contract --
@pytest.mark.parametrize("name", CORRUPTIONS)
def test_shape_dtype_and_range_on_grey_and_rgb(name):
    grey = torch.randint(0, 256, (1, 28, 28), dtype=torch.uint8)
    rgb = torch.randint(0, 256, (3, 37, 53), dtype=torch.uint8)   # odd, non-square
    for img in (grey, rgb):
        for severity in SEVERITIES:
            out = make_corruption(name, severity, seed=1)(img, 7)
            assert out.dtype == torch.uint8 and out.shape == img.shape
    with pytest.raises(TypeError, match="uint8"):
        make_corruption(name, 1)(grey.float(), 0)


def test_deterministic_per_seed_and_index_and_shared_across_severities():
    img = photo(64)
    c = make_corruption("gaussian_noise", 3, seed=5)
    assert torch.equal(c(img, 11), c(img, 11))
    assert torch.equal(c(img, 11), make_corruption("gaussian_noise", 3, seed=5)(img, 11))
    assert not torch.equal(c(img, 11), c(img, 12))                      # per image
    assert not torch.equal(c(img, 11), make_corruption("gaussian_noise", 3, 6)(img, 11))
    # one draw per (seed, index): a higher severity scales the same noise, pixel by pixel
    lo = make_corruption("gaussian_noise", 1, 5)(img, 11).float() - img.float()
    hi = make_corruption("gaussian_noise", 5, 5)(img, 11).float() - img.float()
    inside = (img > 60) & (img < 195)                                   # not clipped at sev 1
    assert torch.corrcoef(torch.stack([lo[inside], hi[inside]]))[0, 1] > 0.9


def test_picklable_and_identical_in_forked_loader_workers(fmnist_dir):
    samples = fashion_mnist(fmnist_dir, "test")
    corrupt = make_corruption("shot_noise", 4, seed=3)
    assert pickle.loads(pickle.dumps(corrupt)) == corrupt
    batches = [list(range(i, i + 8)) for i in range(0, 48, 8)]

    def pixels(workers):
        loader = make_loader(ImageRows(samples, lambda x: x, corrupt), batches, workers, False)
        return torch.cat([x for x, _, _ in loader])

    main, forked = pixels(0), pixels(2)
    assert torch.equal(main, forked)
    clean = torch.from_numpy(samples.idx_images[:48].copy())[:, None]
    assert not torch.equal(main, clean)


def test_tag_round_trip_rebuilds_the_same_callable():
    c = make_corruption("defocus_blur", 5, seed=0)
    assert c.tag == "defocus_blur:5:seed0"
    assert parse_corruption_tag(c.tag) == ("defocus_blur", 5, 0)
    assert corruption_from_tag(c.tag) == c
    for clean in ("none", "", None):
        assert parse_corruption_tag(clean) is None and corruption_from_tag(clean) is None
    img = photo(64)
    assert torch.equal(corruption_from_tag("impulse_noise:2:seed9")(img, 4),
                       make_corruption("impulse_noise", 2, 9)(img, 4))


def test_bad_names_severities_and_tags_are_clear_errors():
    with pytest.raises(DataError, match=r"--corruption 'fogg'.*19.*gaussian_noise.*fog.*saturate"):
        make_corruption("fogg", 3)
    for bad in (0, 6, "3", True, 2.0):
        with pytest.raises(DataError, match=r"--severity .*1 to 5"):
            make_corruption("contrast", bad)
    with pytest.raises(DataError, match="seed"):
        make_corruption("contrast", 1, seed=-1)
    for bad in ("defocus_blur-5", "defocus_blur:5", "defocus_blur:5:0", "Blur:1:seed0"):
        with pytest.raises(DataError, match="NAME:SEVERITY:seedN"):
            parse_corruption_tag(bad)
    with pytest.raises(DataError, match="--severity"):
        parse_corruption_tag("contrast:9:seed0")


# ---------------------------------------------------------------------- severity and fidelity --
@pytest.mark.parametrize("name", BUILT_IN)    # the package's 11: test_imagecorruptions.py
def test_severity_increases_the_change_on_a_photo(name):
    img = photo()
    diffs = [mad(make_corruption(name, s, 0)(img, 0), img) for s in SEVERITIES]
    assert all(a < b for a, b in zip(diffs, diffs[1:])), diffs
    assert diffs[0] > 0.5, diffs


@pytest.mark.parametrize("name", BUILT_IN)
def test_severity_never_decreases_on_fashion_mnist(name, fmnist_images):
    """28-px images: the blurs' severities 1-2 are sub-pixel (3 / 224 * 28 = 0.375 px) and leave
    the image unchanged; every other step must add change."""
    diffs = []
    for s in SEVERITIES:
        c = make_corruption(name, s, 0)
        diffs.append(np.mean([mad(c(x, i), x) for i, x in enumerate(fmnist_images)]))
    assert all(a <= b for a, b in zip(diffs, diffs[1:])), diffs
    assert all(a < b for a, b in zip(diffs[2:], diffs[3:])), diffs
    assert diffs[-1] > 5, diffs


def test_gaussian_blur_and_brightness_match_the_reference_formulas():
    from skimage.color import hsv2rgb, rgb2hsv
    from skimage.filters import gaussian

    img = photo()
    x = img.permute(1, 2, 0).numpy() / 255.0
    for s in SEVERITIES:
        ref = np.clip(gaussian(x, sigma=PARAMS["gaussian_blur"][s - 1], channel_axis=-1), 0, 1)
        ours = make_corruption("gaussian_blur", s)(img, 0).permute(1, 2, 0).numpy()
        assert np.abs(ours - np.round(ref * 255)).max() <= 1
        hsv = rgb2hsv(x)
        hsv[..., 2] = np.clip(hsv[..., 2] + PARAMS["brightness"][s - 1], 0, 1)
        ref = np.clip(hsv2rgb(hsv), 0, 1)
        ours = make_corruption("brightness", s)(img, 0).permute(1, 2, 0).numpy()
        assert np.abs(ours - np.round(ref * 255)).max() <= 1
        c = PARAMS["contrast"][s - 1]
        mean = x.mean(axis=(0, 1), keepdims=True)
        ref = np.clip((x - mean) * c + mean, 0, 1)
        ours = make_corruption("contrast", s)(img, 0).permute(1, 2, 0).numpy()
        assert np.abs(ours - np.round(ref * 255)).max() <= 1


def test_defocus_is_close_to_imagenet_c_lattice_disk_at_224():
    """ImageNet-C: binary disk on the integer lattice, blurred by a Gaussian of alias_sigma.
    Ours: area-coverage disk (continuous in the radius), same Gaussian."""
    from scipy import ndimage

    img = photo()
    x = img.float().numpy() / 255.0
    for s, (radius, alias) in enumerate(PARAMS["defocus_blur"], start=1):
        lat = np.arange(-radius, radius + 1)
        disk = (lat[:, None] ** 2 + lat[None, :] ** 2 <= radius ** 2).astype(np.float64)
        disk = ndimage.gaussian_filter(disk / disk.sum(), alias, mode="constant")
        ref = np.stack([ndimage.correlate(ch, disk, mode="mirror") for ch in x])
        ours = make_corruption("defocus_blur", s)(img, 0).float().numpy()
        assert np.abs(ours - np.round(np.clip(ref, 0, 1) * 255)).mean() < 2.0, s
        ours_k = disk_kernel(float(radius), alias).double().numpy()
        r = np.arange(ours_k.shape[0]) - ours_k.shape[0] // 2
        moment = (r[:, None] ** 2 * ours_k).sum()
        # disk E[x^2] = r^2 / 4, plus the alias Gaussian's and the pixel box's (1/12) variances
        assert moment == pytest.approx(radius ** 2 / 4 + alias ** 2 + 1 / 12, rel=0.03)


@pytest.mark.parametrize("name", ["defocus_blur", "gaussian_blur"])
def test_blur_width_scales_with_image_size(name):
    """The same severity on an image twice as large blurs twice as many pixels (a centred
    square, scaled with the image, is blurred into a blob whose width doubles too)."""
    widths = []
    for size in (112, 224, 448):
        img = torch.zeros((1, size, size), dtype=torch.uint8)
        a, b = size // 2 - size // 32, size // 2 + size // 32
        img[0, a:b, a:b] = 255
        out = make_corruption(name, 5)(img, 0).float()[0]
        pos = torch.arange(size, dtype=torch.float32) - size // 2
        widths.append(float(((out.sum(0) / out.sum()) * pos ** 2).sum().sqrt()))
    assert widths[1] / widths[0] == pytest.approx(2.0, rel=0.08)
    assert widths[2] / widths[1] == pytest.approx(2.0, rel=0.08)


def test_fft_path_equals_direct_convolution():
    x = torch.rand(3, 41, 57)
    for k in (5, 9, 31):   # direct below 8, FFT above
        kernel = torch.rand(k, k)
        kernel = (kernel + kernel.flip(0, 1)) / 2           # point-symmetric: conv == correlation
        h = k // 2
        ref = F.conv2d(F.pad(x[:, None], (h,) * 4, mode="reflect"), kernel[None, None])[:, 0]
        assert torch.allclose(filter2d(x, kernel, "reflect"), ref, atol=1e-4)


# ------------------------------------------------------------------------------ end to end --
def cli_ok(*args):
    result = CliRunner().invoke(cli, [*map(str, args)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A real (quickly) trained embedded 'resnet' on a Fashion-MNIST subset, and that subset."""
    from fmnist_subset import write_fmnist_subset

    root = tmp_path_factory.mktemp("fmnist")
    data = write_fmnist_subset(root / "data", n_train=3000, n_test=600)
    ckpt = root / "resnet.pt"
    cli_ok("fit-classifier", "--classifier", "resnet", "--data", data, "--out", ckpt,
           "--epochs", "3", "--device", "cpu", "--no-progress")
    return data, ckpt


def test_extract_defocus_blur_5_lands_beside_the_clean_cache_and_hurts(fitted, tmp_path):
    from cache.reader import ClassifierCache

    data, ckpt = fitted
    common = ["extract", "--classifier", "resnet", "--weights", ckpt, "--data", data,
              "--split", "test", "--out", tmp_path, "--device", "cpu", "--workers", "2",
              "--no-progress"]
    cli_ok(*common)
    cli_ok(*common, "--corruption", "defocus_blur", "--severity", "5")
    clean = ClassifierCache.open(tmp_path / "resnet" / "test")
    blurred = ClassifierCache.open(tmp_path / "resnet" / "test-defocus_blur-5")
    assert blurred.identity["corruption"] == "defocus_blur:5:seed0"
    assert clean.identity["corruption"] == "none"
    assert blurred.identity["dataset_fingerprint"] == clean.identity["dataset_fingerprint"]
    a, b = clean.load(["correct", "logits"]), blurred.load(["correct", "logits"])
    assert a["correct"].mean() > 0.6                                   # a reasonable model ...
    assert b["correct"].mean() < a["correct"].mean() - 0.03            # ... hurt by the blur
    assert not np.array_equal(a["logits"], b["logits"])


def test_stage2_rebuilds_identical_corrupted_pixels_from_the_cache_identity(fitted, tmp_path):
    """What extract saw == what a later stage rebuilds from identity['corruption']: the
    classifier's predictions on the rebuilt pixels equal the cached ones."""
    from cache.reader import ClassifierCache
    from pipeline.core.models import DataConfig
    from pipeline.data.images import GpuNormalize, ResizeCrop
    from pipeline.core.models import build_model, resolve_spec

    data, ckpt = fitted
    cli_ok("extract", "--classifier", "resnet", "--weights", ckpt, "--data", data, "--split",
           "test", "--out", tmp_path, "--device", "cpu", "--precision", "fp32", "--workers", "2",
           "--no-progress", "--corruption", "gaussian_noise", "--severity", "4", "--seed", "3")
    cache = ClassifierCache.open(tmp_path / "resnet" / "test-gaussian_noise-4")
    corrupt = corruption_from_tag(cache.identity["corruption"])
    assert corrupt == Corruption("gaussian_noise", 4, 3)
    samples = fashion_mnist(data, "test")
    rows = ImageRows(samples, ResizeCrop(DataConfig.from_dict(cache.identity["data_config"])), corrupt)
    x = torch.stack([rows[i][0] for i in range(len(samples))])
    model = build_model(resolve_spec("resnet", True, str(ckpt)))
    norm = GpuNormalize(DataConfig.from_dict(cache.identity["data_config"]), torch.device("cpu"))
    with torch.inference_mode():
        pred = model(norm(x)).argmax(1).numpy()
    assert (pred == cache.load(["pred"])["pred"]).mean() > 0.995


def test_imagenet_c_folders_work_through_the_plain_image_folder_path(tmp_path):
    """imagenet-c/<corruption>/<severity>/<wnid>/*.JPEG: --data .../defocus_blur --split 5."""
    from cache.reader import ClassifierCache

    wnids = list(imagenet_synsets()[:3])
    make_imagenet_tree(tmp_path / "imagenet-c" / "defocus_blur", wnids, per_class=3,
                       splits=("3", "5"))
    cli_ok("extract", "--classifier", "resnet10t", "--random-init", "--model-kwargs",
           json.dumps({"num_classes": 1000}), "--data", tmp_path / "imagenet-c" / "defocus_blur",
           "--split", "5", "--out", tmp_path / "cache", "--device", "cpu", "--workers", "0",
           "--batch-size", "4", "--no-progress")
    cache = ClassifierCache.open(tmp_path / "cache" / "resnet10t" / "5")
    assert cache.identity["dataset"] == "imagenet" and cache.identity["split"] == "5"
    assert cache.identity["corruption"] == "none"          # the files are already corrupted
    labels = cache.load(["label"])["label"]
    assert sorted(set(labels.tolist())) == [imagenet_synsets().index(w) for w in wnids]
    assert len(labels) == 9
