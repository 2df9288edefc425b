"""Pixels: decode -> (optional corruption) -> resize/crop, all uint8 in the loader workers;
float conversion and normalisation happen on the accelerator (``GpuNormalize``).

Keeping images uint8 until the device quarters host->device traffic and the workers' memory
bandwidth; the same code serves extraction, oracle training and prediction.
"""
from __future__ import annotations

import io
import math
import warnings
from dataclasses import replace
from typing import Callable

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision.io import ImageReadMode, decode_image, read_file
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from cache.errors import TrustOraclesError
from pipeline.core.models import DataConfig
from pipeline.data.errors import BadImageError
from pipeline.data.orientation import orientation, turned
from pipeline.data.sources import SampleList
from pipeline.data.stamps import read_stamped

_INTERP = {"bilinear": InterpolationMode.BILINEAR, "bicubic": InterpolationMode.BICUBIC,
           "nearest": InterpolationMode.NEAREST}


class UnusableImage(TrustOraclesError, ValueError):
    """A decoded image the model's resize/crop cannot take (``ResizeCrop.too_long``)."""


# A centre crop resizes the SHORTER side to the crop size first: a strip of 1 x 60000 pixels
# would become 256 x 15,360,000 (11 GiB, half a minute) to keep its middle 224 x 224.  Images whose
# resized size exceeds this many crops are refused by name instead (aspect ratio > ~50:1).
MAX_RESIZED = 64


class ResizeCrop:
    """uint8 (..., C, H, W) -> uint8 (..., C_model, H, W) following timm's eval transform
    (``transforms_imagenet_eval``: center / squash / border crop modes) or the paper's squash.

    Works on one image or a batch of same-sized images, on the CPU or the accelerator.
    """

    def __init__(self, cfg: DataConfig):
        if cfg.crop_mode not in ("center", "squash", "border"):
            raise ValueError(f"crop_mode {cfg.crop_mode!r}: expected center, squash or border")
        self.cfg = cfg
        self.interp = _INTERP[cfg.interpolation]

    def resize_size(self, h: int, w: int) -> tuple[int, int]:
        """Size before the centre crop, for an input of ``h`` x ``w`` (timm's rules)."""
        _, th, tw = self.cfg.input_size
        sh, sw = math.floor(th / self.cfg.crop_pct), math.floor(tw / self.cfg.crop_pct)
        if self.cfg.crop_mode == "squash":
            return sh, sw
        if self.cfg.crop_mode == "center" and sh == sw:  # torchvision Resize(int): shorter side
            short, long = (h, w) if h <= w else (w, h)
            new_long = int(sh * long / short)
            return (sh, new_long) if h <= w else (new_long, sh)
        rh, rw = h / sh, w / sw  # timm ResizeKeepRatio: shorter (center) or longer (border) edge
        ratio = max(rh, rw) if self.cfg.crop_mode == "border" else min(rh, rw)
        return round(h / ratio), round(w / ratio)

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        c, th, tw = self.cfg.input_size
        if img.shape[-3] != c:  # grey <-> RGB, so one dataset serves 1- and 3-channel models
            img = img.expand(*img.shape[:-3], 3, *img.shape[-2:]) if c == 3 else _to_grey(img)
        size = self.resize_size(*img.shape[-2:])
        if size[0] * size[1] > MAX_RESIZED * th * tw:
            raise UnusableImage(self.too_long(img.shape[-2:], size))
        if tuple(img.shape[-2:]) != size:
            img = TF.resize(img, list(size), self.interp, antialias=True)
        if self.cfg.crop_mode == "border" and (size[0] < th or size[1] < tw):
            img = _pad_to(img, th, tw, [round(255 * m) for m in self.cfg.mean[:c]])
        return TF.center_crop(img, [th, tw]).contiguous()

    def too_long(self, shape: tuple[int, int], size: tuple[int, int]) -> str:
        (h, w), (_, th, tw) = shape, self.cfg.input_size
        return (f"its {w}x{h} pixels (aspect ratio {max(h, w) / min(h, w):.0f}:1) would be "
                f"resized to {size[1]}x{size[0]} before the model's {tw}x{th} centre crop "
                f"({3 * size[0] * size[1] / 2**20:,.0f} MiB, more than {MAX_RESIZED} times the "
                "crop); crop the image to a less elongated shape")

    def blank(self) -> torch.Tensor:
        """The stand-in of an undecodable row (``--skip-bad``)."""
        return torch.zeros(self.cfg.input_size, dtype=torch.uint8)


class Views:
    """Several resize/crops of one decoded image, e.g. the classifier's and the oracle's when
    their input sizes differ (``predict --images``): each file is read and decoded once."""

    def __init__(self, *transforms: ResizeCrop):
        self.transforms = transforms

    def __call__(self, img: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(t(img) for t in self.transforms)

    def blank(self) -> tuple[torch.Tensor, ...]:
        return tuple(t.blank() for t in self.transforms)


def _to_grey(img: torch.Tensor) -> torch.Tensor:
    """RGB -> one channel.  A grey image decoded as RGB (R = G = B, e.g. a greyscale PNG) keeps
    its exact values: torchvision's weights sum to 0.9999, which truncates most levels by one."""
    if torch.equal(img[..., 0:1, :, :], img[..., 1:2, :, :]) and \
            torch.equal(img[..., 0:1, :, :], img[..., 2:3, :, :]):
        return img[..., 0:1, :, :]
    return TF.rgb_to_grayscale(img, 1)


def transform_for(samples: SampleList, cfg: DataConfig) -> ResizeCrop:
    """The resize/crop of ``cfg`` for this split's images.  A split stored at a model's input
    resolution (an attack's output) is not resized and cropped a second time: a whole-image
    resize to the input size (the identity at the same size, so the classifier sees exactly the
    attacked pixels; a plain rescale of the same field of view for a model of another size)."""
    if samples.model_resolution is None:
        return ResizeCrop(cfg)
    return ResizeCrop(replace(cfg, crop_pct=1.0, crop_mode="squash"))


def _pad_to(img: torch.Tensor, th: int, tw: int, fill: list[int]) -> torch.Tensor:
    """Centre-pad to at least th x tw with the per-channel ``fill`` (timm CenterCropOrPad)."""
    h, w = img.shape[-2:]
    ph, pw = max(th - h, 0), max(tw - w, 0)
    out = torch.empty((*img.shape[:-2], h + ph, w + pw), dtype=img.dtype, device=img.device)
    out[...] = torch.tensor(fill, dtype=img.dtype, device=img.device).view(-1, 1, 1)
    out[..., ph // 2: ph // 2 + h, pw // 2: pw // 2 + w] = img
    return out


def decode_file(path: str, data: bytearray | None = None,
                exif_transpose: bool = False) -> torch.Tensor:
    """Decode to uint8 RGB CHW (``_decode``); ``exif_transpose``: then turn it upright as its
    EXIF orientation says (off by default, as torchvision's and timm's loaders: orientation.py)."""
    img = _decode(path, data)
    return turned(img, orientation(path if data is None else data)) if exif_transpose else img


def _decode(path: str, data: bytearray | None = None) -> torch.Tensor:
    """Decode to uint8 RGB CHW with libjpeg/libpng; fall back to PIL for other formats.

    A truncated or corrupt file raises (torchvision, then PIL both refuse it).  libjpeg's
    recoverable warnings (e.g. "extraneous bytes before marker", seen in ImageNet train) are not
    errors: PIL and timm's loader decode those files too.  16-bit images (PNG, TIFF) keep their
    8 most significant bits, as an 8-bit export of them would; pixel formats whose range cannot be
    known (32-bit integer or float samples) raise naming the format.  ``data``: the file's bytes
    when the caller has read them already (``extract`` hashes what it decodes).
    """
    try:
        with warnings.catch_warnings():  # torchvision >= 0.29 deprecates its decoders (still fine)
            warnings.simplefilter("ignore", DeprecationWarning)
            raw = read_file(path) if data is None else torch.frombuffer(data, dtype=torch.uint8)
            img = decode_image(raw, mode=ImageReadMode.RGB)
    except Exception:  # noqa: BLE001 - retry with PIL, which reads BMP/TIFF and reports truncation
        return _decode_pil(path if data is None else io.BytesIO(data))
    if img.ndim == 4:  # an animated GIF: its first frame, as PIL and torchvision's ImageFolder
        img = img[0]
    if img.dtype == torch.uint16:  # libpng's 16-bit output: the model expects 0..255
        img = TF.to_dtype(img, torch.uint8, scale=True)
    return img


# PIL modes whose samples are wider than 8 bits: 16-bit greys keep their high byte; the range of
# 32-bit integer ("I") and float ("F") samples is not known, so they are refused.
_PIL_16BIT = ("I;16", "I;16L", "I;16B", "I;16N")
_PIL_UNKNOWN_RANGE = {"I": "32-bit integer", "F": "32-bit float"}


def _decode_pil(path) -> torch.Tensor:
    from PIL import Image

    with Image.open(path) as im:
        return pil_pixels(im)


def pil_pixels(im) -> torch.Tensor:
    """A PIL image -> uint8 RGB (3, H, W) by the decoder's rules (16-bit greys: their high byte);
    ValueError for samples whose value range is unknown."""
    if im.mode in _PIL_UNKNOWN_RANGE:
        raise ValueError(f"unsupported pixel format ({_PIL_UNKNOWN_RANGE[im.mode]} samples, "
                         f"PIL mode {im.mode!r}) whose value range is unknown; convert the "
                         "image to 8 or 16 bits per channel")
    if im.mode in _PIL_16BIT:
        grey = (np.asarray(im).astype(np.uint16) >> 8).astype(np.uint8)
        return torch.from_numpy(grey).expand(3, -1, -1).contiguous()
    return torch.from_numpy(np.asarray(im.convert("RGB")).copy()).permute(2, 0, 1).contiguous()


class ImageRows(Dataset):
    """Row ``i`` of a split -> (uint8 image, i, valid).  Labels stay in the main process."""

    # extract sets a SourceRecorder (pipeline.data.stamps): each file's stamp and content hash,
    # taken from the bytes decoded, so the cache records what its rows were computed from
    recorder = None

    def __init__(self, samples: SampleList, transform: Callable[[torch.Tensor], torch.Tensor],
                 corrupt: Callable[[torch.Tensor, int], torch.Tensor] | None = None,
                 skip_bad: bool = False):
        self.samples, self.transform, self.corrupt, self.skip_bad = samples, transform, corrupt, skip_bad

    def __len__(self) -> int:
        return len(self.samples)

    def _load(self, i: int) -> torch.Tensor:
        if self.samples.idx_images is not None:
            return torch.from_numpy(np.array(self.samples.idx_images[i])).unsqueeze(0)
        path, upright = self.samples.path(i), self.samples.exif_transpose
        if self.recorder is None:
            return decode_file(str(path), exif_transpose=upright)
        try:
            data, stamp = read_stamped(path)
        except OSError:
            self.recorder.record_unreadable(i, path)
            raise
        self.recorder.record(i, stamp)
        return decode_file(str(path), data, upright)

    def __getitem__(self, i: int):
        try:
            img = self._load(i)
            if img.dtype != torch.uint8:  # a batch must never mix dtypes (or scales)
                raise ValueError(f"decoded to {img.dtype}, expected uint8")
        except Exception as err:  # noqa: BLE001 - any decoder failure is a bad row
            if not self.skip_bad:
                raise BadImageError(f"cannot decode {self.samples.path(i)} (row {i}): {err}. "
                                    "Replace the file, or re-run with --skip-bad to record it "
                                    "as invalid") from None
            return self.transform.blank(), i, 0
        if self.corrupt is not None:
            img = self.corrupt(img, i)
        try:
            return self.transform(img), i, 1
        except UnusableImage as err:
            if not self.skip_bad:
                raise BadImageError(f"cannot use {self.samples.path(i)} (row {i}): {err}. "
                                    "Replace the file, or re-run with --skip-bad to record it "
                                    "as invalid") from None
            return self.transform.blank(), i, 0


def bad_row_error(samples: SampleList, i: int) -> str:
    return f"{samples.path(i)}: undecodable image (recorded with --skip-bad)"


class GpuNormalize:
    """uint8 NCHW on the host -> normalised float on ``device`` (channels_last when asked)."""

    def __init__(self, cfg: DataConfig, device: torch.device, channels_last: bool = True):
        c = cfg.input_size[0]
        mean = torch.tensor(cfg.mean[:c], dtype=torch.float32) * 255.0
        std = torch.tensor(cfg.std[:c], dtype=torch.float32) * 255.0
        self.mean = mean.view(1, c, 1, 1).to(device)
        self.inv_std = (1.0 / std).view(1, c, 1, 1).to(device)
        self.device = device
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        """``batch``: uint8 (N, C, H, W) on the host (ideally pinned) or already on ``device``."""
        x = batch.to(self.device, non_blocking=True).float()
        x = (x - self.mean) * self.inv_std
        return x.contiguous(memory_format=self.memory_format)
