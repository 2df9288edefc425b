"""ImageNet-C's corruptions (Hendrycks & Dietterich, ICLR 2019) as a dataset option: all 19.

``make_corruption(name, severity, seed)`` returns a picklable callable ``corrupt(img, index)`` that
the loader workers apply to each decoded uint8 CHW image (1 or 3 channels) BEFORE resize/crop
(``pipeline.data.images.ImageRows``); it returns uint8 CHW of the same shape.

Eight are built in (``imagenet_c.BUILT_IN``, written in torch below, kept so that caches made
before the other eleven arrived keep their pixels); the other eleven run the ``imagecorruptions``
package's functions (``imagenet_c.PACKAGE``; ``imagecorruptions_compat``).

* Built-in severity parameters are ImageNet-C's published ones (``PARAMS``; hendrycks/robustness,
  ``make_imagenet_c.py``), on the same [0, 1] intensity scale.
* Spatial parameters (blur radius / sigma, in pixels of ImageNet-C's 224-px crop) are multiplied
  by ``min(H, W) / 224``, so a kernel covers the same fraction of the image's shorter side as in
  ImageNet-C, whatever the image size: 1.25 px for defocus severity 5 on 28-px Fashion-MNIST
  (close to CIFAR-10-C's own hand-picked 32-px values), 16.7 px on a 375-px ImageNet photo.
  Per-pixel noise, contrast, brightness and JPEG quality are not size-dependent.
* The package's corruptions have their parameters in pixels of the 224-px crop too (motion
  radius, snow flakes, frost texture, ...), but inside its code: except the per-pixel and
  size-relative ones (``PACKAGE_NATIVE_SCALE``) they run at ImageNet-C's scale instead — the image
  is resampled so its shorter side is 224 px (an integer upscale, e.g. 28 -> 224, by pixel
  repetition), corrupted, and resampled back (an integer upscale is undone exactly by block
  averaging).  Same outcome: the corruption covers the same fraction of the image as in
  ImageNet-C.
* Random draws are a pure function of ``(seed, global index)`` (numpy ``SeedSequence([seed,
  index])``): the classifier's extraction and every later evaluation of the same split see the
  identical corrupted pixels, in any worker, in any order.  All severities of one corruption share
  the draw, so higher severities differ from lower ones only in strength.
* Results are rounded to uint8 (ImageNet-C truncated with ``np.uint8`` and then stored its files
  as JPEG quality 85; neither is reproduced here).
"""
from __future__ import annotations

import functools
import math
import re
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.data.errors import DataError  # noqa: F401
from pipeline.data.imagecorruptions_compat import corrupt_hwc   # imports the package on first use
from pipeline.data.imagenet_c import (CORRUPTIONS, PACKAGE_NATIVE_SCALE, PARAMS, REFERENCE_SIZE,
                                      SEVERITIES, corruption_choices_help)
_SPATIAL = {"defocus_blur", "gaussian_blur"}
_FFT_MIN_KERNEL = 8     # direct conv below this kernel size, FFT above (10x faster at 35 px)
_TAG = re.compile(r"^(?P<name>[a-z_]+):(?P<severity>-?\d+):seed(?P<seed>\d+)$")


# ------------------------------------------------------------------------------------ noise --
def _gaussian_noise(x, c, rng, scale):
    return x + torch.from_numpy(rng.standard_normal(x.shape, dtype=np.float32)) * c


def _shot_noise(x, c, rng, scale):
    return torch.from_numpy(rng.poisson(x.numpy() * c).astype(np.float32)) / c


def _impulse_noise(x, c, rng, scale):
    """Each value independently: pepper (0) with prob c/2, salt (1) with prob c/2 (skimage s&p)."""
    u = torch.from_numpy(rng.random(x.shape, dtype=np.float32))
    return torch.where(u < c / 2, 0.0, torch.where(u < c, 1.0, x))


# ------------------------------------------------------------------------------------- blur --
@functools.lru_cache(maxsize=128)
def disk_kernel(radius: float, alias_sigma: float, supersample: int = 16) -> torch.Tensor:
    """Normalised defocus kernel: a disk of ``radius`` px, anti-aliased by area coverage
    (``supersample``^2 points per pixel, so sub-pixel radii stay meaningful), then smoothed by a
    Gaussian of ``alias_sigma`` px as in ImageNet-C.  Shape (k, k), k odd."""
    half = max(1, math.ceil(radius - 0.5 + 1e-9)) + (max(1, math.ceil(3 * alias_sigma)) if alias_sigma > 0 else 0)
    n = (2 * half + 1) * supersample
    pos = (torch.arange(n, dtype=torch.float64) + 0.5) / supersample - (half + 0.5)
    inside = (pos[:, None] ** 2 + pos[None, :] ** 2 <= radius ** 2).to(torch.float64)
    kernel = inside.view(2 * half + 1, supersample, 2 * half + 1, supersample).mean(dim=(1, 3))
    if alias_sigma > 0:
        g = _gauss1d(alias_sigma, max(1, math.ceil(3 * alias_sigma)))
        kernel = F.conv2d(kernel[None, None], (g[:, None] * g[None, :])[None, None].double(),
                          padding=len(g) // 2)[0, 0]
    return (kernel / kernel.sum()).float()


def _gauss1d(sigma: float, radius: int) -> torch.Tensor:
    """Sampled Gaussian taps (scipy.ndimage's discretisation), normalised."""
    t = torch.arange(-radius, radius + 1, dtype=torch.float64)
    g = torch.exp(-0.5 * (t / sigma) ** 2)
    return (g / g.sum()).float()


def _pad(x: torch.Tensor, pad: tuple[int, int, int, int], mode: str) -> torch.Tensor:
    if mode == "reflect" and max(pad) >= min(x.shape[-2:]):
        mode = "replicate"  # reflection needs pad < size; tiny images fall back to edge values
    return F.pad(x, pad, mode=mode)


def filter2d(x: torch.Tensor, kernel: torch.Tensor, mode: str = "reflect") -> torch.Tensor:
    """Same-size 2-D filtering of (C, H, W) with a symmetric odd (k, k) kernel; FFT for big k."""
    k = kernel.shape[-1]
    h = k // 2
    xp = _pad(x[:, None], (h, h, h, h), mode)                         # (C, 1, H+2h, W+2h)
    if k < _FFT_MIN_KERNEL:
        return F.conv2d(xp, kernel[None, None])[:, 0]
    size = (xp.shape[-2] + k - 1, xp.shape[-1] + k - 1)               # linear, not circular
    full = torch.fft.irfft2(torch.fft.rfft2(xp, s=size) * torch.fft.rfft2(kernel, s=size), s=size)
    return full[:, 0, 2 * h: 2 * h + x.shape[-2], 2 * h: 2 * h + x.shape[-1]]


def _defocus_blur(x, c, rng, scale):
    radius, alias = c
    return filter2d(x, disk_kernel(round(radius * scale, 6), round(alias * scale, 6)), "reflect")


def _gaussian_blur(x, c, rng, scale):
    """skimage.filters.gaussian: sampled kernel truncated at 4 sigma, 'nearest' (edge) borders."""
    sigma = c * scale
    g = _gauss1d(sigma, max(1, int(4 * sigma + 0.5)))
    if len(g) >= 4 * _FFT_MIN_KERNEL:  # large sigma (big photos): one FFT beats two long convs
        return filter2d(x, g[:, None] * g[None, :], "replicate")
    r = len(g) // 2
    x = F.conv2d(_pad(x[:, None], (r, r, 0, 0), "replicate"), g.view(1, 1, 1, -1))
    return F.conv2d(_pad(x, (0, 0, r, r), "replicate"), g.view(1, 1, -1, 1))[:, 0]


# -------------------------------------------------------------------------------- photometric --
def _contrast(x, c, rng, scale):
    mean = x.mean(dim=(1, 2), keepdim=True)   # per channel, as ImageNet-C
    return (x - mean) * c + mean


def _brightness(x, c, rng, scale):
    """HSV value + c, clipped, hue and saturation kept.  Closed form of ImageNet-C's
    rgb2hsv -> V += c -> hsv2rgb: every channel scales by V'/V (black becomes grey V')."""
    if x.shape[0] != 3:
        return x + c
    v = x.max(dim=0, keepdim=True).values
    v_new = (v + c).clamp(max=1.0)
    return torch.where(v > 0, x * (v_new / v.clamp_min(1e-12)), v_new)


def _jpeg_compression(img: torch.Tensor, quality: int) -> torch.Tensor:
    from torchvision.io import ImageReadMode, decode_jpeg, encode_jpeg
    with warnings.catch_warnings():  # torchvision >= 0.29 deprecates its codecs (still libjpeg)
        warnings.simplefilter("ignore", DeprecationWarning)
        data = encode_jpeg(img.contiguous(), quality=quality)
        return decode_jpeg(data, mode=ImageReadMode.UNCHANGED)


_FUNCS = {"gaussian_noise": _gaussian_noise, "shot_noise": _shot_noise,
          "impulse_noise": _impulse_noise, "defocus_blur": _defocus_blur,
          "gaussian_blur": _gaussian_blur, "contrast": _contrast, "brightness": _brightness}


# ------------------------------------------------------------------ the imagecorruptions package --
_LUMA = torch.tensor([0.299, 0.587, 0.114], dtype=torch.float64)   # PIL's RGB -> L weights


def _to_reference_scale(img: torch.Tensor):
    """uint8 (3, H, W) -> (uint8 image with shorter side REFERENCE_SIZE, function mapping a
    float (3, H', W') result back to (3, H, W))."""
    h, w = img.shape[-2:]
    short = min(h, w)
    if short == REFERENCE_SIZE:
        return img, lambda out: out
    if REFERENCE_SIZE % short == 0:          # integer upscale: repeat pixels, average blocks back
        k = REFERENCE_SIZE // short
        up = img.repeat_interleave(k, dim=-2).repeat_interleave(k, dim=-1)
        return up, lambda out: F.avg_pool2d(out[None], k)[0]
    size = (round(h * REFERENCE_SIZE / short), round(w * REFERENCE_SIZE / short))
    resized = F.interpolate(img[None].float(), size=size, mode="bilinear", antialias=True,
                            align_corners=False)[0].clamp(0, 255).round().to(torch.uint8)
    return resized, lambda out: F.interpolate(out[None].float(), size=(h, w), mode="bilinear",
                                              antialias=True, align_corners=False)[0].double()


def _package_corruption(name: str, severity: int, img: torch.Tensor,
                        seed: np.random.SeedSequence) -> torch.Tensor:
    """uint8 (C, H, W) -> float64 (C, H, W) in [0, 1] through the package (3 channels there; a
    1-channel image goes in as grey RGB and comes back as PIL's luma of the result)."""
    x = img.expand(3, -1, -1) if img.shape[0] == 1 else img
    x, back = (x, lambda out: out) if name in PACKAGE_NATIVE_SCALE else _to_reference_scale(x)
    out = corrupt_hwc(name, severity, x.permute(1, 2, 0).contiguous().numpy(), seed)
    out = back(torch.from_numpy(out).permute(2, 0, 1))
    if img.shape[0] == 1:
        out = (out * _LUMA[:, None, None]).sum(dim=0, keepdim=True)
    return out / 255.0


# ------------------------------------------------------------------------------------- API --
@dataclass(frozen=True)
class Corruption:
    """``corrupt(img, index)``: uint8 (C, H, W) -> uint8 (C, H, W), deterministic per index.
    A frozen dataclass of plain values, so DataLoader workers can pickle or fork it."""
    name: str
    severity: int
    seed: int = 0

    @property
    def param(self):
        """The built-in corruption's parameter (None for the package's: they live in its code)."""
        return PARAMS[self.name][self.severity - 1] if self.name in PARAMS else None

    @property
    def tag(self) -> str:
        """The cache identity's ``corruption`` attribute (``parse_corruption_tag`` reads it)."""
        return f"{self.name}:{self.severity}:seed{self.seed}"

    def __call__(self, img: torch.Tensor, index: int) -> torch.Tensor:
        if img.dtype != torch.uint8 or img.ndim != 3:
            raise TypeError(f"corruption {self.name}: expected a uint8 (C, H, W) tensor, got "
                            f"{img.dtype} of shape {tuple(img.shape)}")
        if self.name == "jpeg_compression":
            return _jpeg_compression(img, self.param)
        seed = np.random.SeedSequence([self.seed, int(index)])
        if self.name not in PARAMS:
            out = _package_corruption(self.name, self.severity, img, seed)
        else:
            scale = min(img.shape[-2:]) / REFERENCE_SIZE if self.name in _SPATIAL else 1.0
            out = _FUNCS[self.name](img.float() / 255.0, self.param,
                                    np.random.default_rng(seed), scale)
        return (out.clamp(0.0, 1.0) * 255.0).round_().to(torch.uint8)


def make_corruption(name: str, severity: int, seed: int = 0) -> Corruption:
    """Validated ``Corruption``; an unknown name or a severity outside 1..5 raises DataError
    listing the choices."""
    if name not in CORRUPTIONS:
        raise DataError(f"--corruption {name!r}: unknown corruption; choose one of ImageNet-C's "
                        f"19 ({corruption_choices_help()})")
    if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)) \
            or severity not in SEVERITIES:
        raise DataError(f"--severity {severity!r}: expected an integer from 1 to 5 "
                        f"(ImageNet-C's levels) for corruption {name!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise DataError(f"corruption seed {seed!r}: expected a non-negative integer")
    return Corruption(name, int(severity), int(seed))


def parse_corruption_tag(tag: str | None) -> tuple[str, int, int] | None:
    """``"defocus_blur:5:seed0"`` -> ``("defocus_blur", 5, 0)``; ``"none"``/empty -> None.
    Raises DataError for a malformed tag or unknown corruption."""
    if tag is None or tag in ("", "none"):
        return None
    m = _TAG.match(str(tag))
    if m is None:
        raise DataError(f"corruption tag {tag!r}: expected 'none' or 'NAME:SEVERITY:seedN' "
                        "(e.g. 'defocus_blur:5:seed0', as extract writes into identity.json)")
    corruption = make_corruption(m["name"], int(m["severity"]), int(m["seed"]))
    return corruption.name, corruption.severity, corruption.seed


def corruption_from_tag(tag: str | None) -> Corruption | None:
    """Rebuild the exact callable a cache was extracted with (None for a clean split)."""
    parsed = parse_corruption_tag(tag)
    return None if parsed is None else make_corruption(*parsed)
