"""The ``imagecorruptions`` package (ImageNet-C's code by Hendrycks & Dietterich, packaged for
images of any size by Michaelis et al. 2019) on today's numpy / scikit-image, deterministic per
call, with a fast exact ``glass_blur``.

``corrupt_hwc(name, severity, img, seed)``: uint8 (H, W, 3) -> float64 (H, W, 3) in [0, 255],
the package's own function's output, clipped, not yet rounded.

Its last release (1.1.2) predates numpy 2 and today's scikit-image; three things break and are
bridged here, inside the package's module only (nothing global is changed):

* ``from pkg_resources import resource_filename`` (setuptools 81 removed ``pkg_resources``): a
  stand-in module sits in ``sys.modules`` for the duration of the import only.
* ``np.float_`` (removed in numpy 2; ``fog``): the module sees numpy through ``_NumpyView``,
  which adds ``float_ = float64``.
* ``skimage.filters.gaussian(..., multichannel=True)`` (removed; ``gaussian_blur``,
  ``glass_blur``): the module's ``gaussian`` passes ``channel_axis=-1`` instead.

Randomness: the package draws from numpy's *global* RNG (``np.random.normal`` ...).  The module's
``np.random`` is answered with a per-thread ``RandomState`` that ``seeded`` installs for one call,
so a result is a pure function of the seed in any process, worker or thread, and no global RNG
state is read or changed.  Outside ``seeded`` it is numpy's global RNG, as the package expects.

Checked: ``bench/check_imagecorruptions.py`` compares every function, through this module, with
the unpatched package under numpy 1.23.5 / scikit-image 0.19.3 (same seeds): identical for 13 of
18, the rest within float rounding (max |difference| 4.3e-7 of 255; docs/DEMO_DATA.md).
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import types
import warnings

import numpy as np

from pipeline.data.imagenet_c import IMAGECORRUPTIONS_VERSION

_STATE = threading.local()


class _NumpyView(types.ModuleType):
    """numpy as the package sees it: ``float_`` restored, ``random`` seeded per call."""
    float_ = np.float64

    def __getattr__(self, name):
        return getattr(np, name)

    @property
    def random(self):
        return getattr(_STATE, "rng", None) or np.random


def _gaussian(image, *args, multichannel=None, **kwargs):
    """scikit-image's gaussian, accepting the removed ``multichannel`` flag."""
    from skimage.filters import gaussian
    if multichannel is not None and "channel_axis" not in kwargs:
        kwargs["channel_axis"] = -1 if multichannel else None
    return gaussian(image, *args, **kwargs)


def _resource_filename(module_name: str, relative: str) -> str:
    return os.path.join(os.path.dirname(sys.modules[module_name].__file__), relative)


def _import_package():
    try:
        import pkg_resources  # noqa: F401  (setuptools < 81 still has it)
        stub = None
    except ImportError:
        stub = types.ModuleType("pkg_resources")
        stub.resource_filename = _resource_filename
        sys.modules["pkg_resources"] = stub
    try:
        with warnings.catch_warnings():   # its scipy.ndimage.interpolation import is deprecated
            warnings.simplefilter("ignore", DeprecationWarning)
            from imagecorruptions import corruptions as lib
    except ImportError as e:
        raise ImportError("ImageNet-C's corruptions beyond the built-in eight need the "
                          f"`imagecorruptions` package: pip install "
                          f"imagecorruptions=={IMAGECORRUPTIONS_VERSION} ({e})") from e
    finally:
        if stub is not None and sys.modules.get("pkg_resources") is stub:
            del sys.modules["pkg_resources"]
    version = getattr(sys.modules.get("imagecorruptions"), "__version__", None) or installed_version()
    if version != IMAGECORRUPTIONS_VERSION:
        raise ImportError(f"imagecorruptions {version} is installed; the compatibility layer "
                          f"knows {IMAGECORRUPTIONS_VERSION} only: pip install "
                          f"imagecorruptions=={IMAGECORRUPTIONS_VERSION}")
    lib.np = _NumpyView("numpy")
    lib.gaussian = _gaussian
    return lib


_LIB = None


def installed_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("imagecorruptions")
    except PackageNotFoundError:
        return None


def package():
    """The patched ``imagecorruptions.corruptions`` module (imported on first use)."""
    global _LIB
    if _LIB is None:
        _LIB = _import_package()
    return _LIB


@contextlib.contextmanager
def seeded(seed: np.random.SeedSequence | int):
    """Within the block, the package's ``np.random`` is a RandomState seeded from ``seed`` (this
    thread only).  An int seeds it as ``np.random.seed(seed)`` seeds the global one."""
    previous = getattr(_STATE, "rng", None)
    _STATE.rng = np.random.RandomState(
        np.random.MT19937(seed) if isinstance(seed, np.random.SeedSequence) else seed)
    try:
        yield _STATE.rng
    finally:
        _STATE.rng = previous


GLASS = ((0.7, 1, 2), (0.9, 2, 1), (1, 2, 3), (1.1, 3, 2), (1.5, 4, 2))   # sigma, delta, iterations


def glass_blur(x, severity: int):
    """The package's ``glass_blur``, same draws and same result, ~100x faster.

    The package visits pixels bottom-right to top-left and for each does
    ``x[h, w], x[h', w'] = x[h', w'], x[h, w]`` on numpy views, which *copies* x[h', w'] into
    x[h, w] (the second assignment writes back the value just written) — ImageNet-C's own
    behaviour.  Following the copies on an index array gives every output pixel's source; the
    random offsets are drawn in one call, which yields the same stream as one call per pixel."""
    lib = package()
    sigma, delta, iterations = GLASS[severity - 1]
    x = np.uint8(_gaussian(np.array(x) / 255., sigma=sigma, channel_axis=-1) * 255)
    h_, w_ = x.shape[:2]
    hs = range(h_ - delta, delta, -1)
    ws = range(w_ - delta, delta, -1)
    src = list(range(h_ * w_))
    for _ in range(iterations):
        offsets = lib.np.random.randint(-delta, delta, size=(len(hs) * len(ws), 2)).tolist()
        k = 0
        for h in hs:
            for w in ws:
                dx, dy = offsets[k]
                k += 1
                src[h * w_ + w] = src[(h + dy) * w_ + (w + dx)]
    x = x.reshape(h_ * w_, -1)[np.asarray(src)].reshape(h_, w_, -1)
    return np.clip(_gaussian(x / 255., sigma=sigma, channel_axis=-1), 0, 1) * 255


def corrupt_hwc(name: str, severity: int, img: np.ndarray,
                seed: np.random.SeedSequence | int) -> np.ndarray:
    """uint8 (H, W, 3) -> float64 (H, W, 3) in [0, 255]: the package's corruption ``name``."""
    from PIL import Image
    fn = glass_blur if name == "glass_blur" else getattr(package(), name)
    with seeded(seed):
        out = fn(Image.fromarray(img), severity)
    return np.clip(np.asarray(out, dtype=np.float64), 0, 255)
