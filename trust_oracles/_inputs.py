"""What ``trust_oracles.oracles`` takes from its callers, checked and converted: thresholds,
tensors, PIL images and file paths.  Each refusal is an ``InputError`` saying what was received
and what is expected (``errors.received``)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence, Union

import numpy as np
import torch
from PIL import Image, ImageOps

# the pixel formats the file decoder narrows or refuses: PIL images are read by the same rules
from pipeline.data.images import UnusableImage, Views
from pipeline.data.images import pil_pixels as decoded
from pipeline.data.sources import SampleList
from pipeline.data.unlabelled import NO_LABEL
from pipeline.oracle.deploy.images import DEFAULT_TARGET
from pipeline.oracle.deploy.threshold import parse_target
from trust_oracles.errors import DataError, InputError, received

# A threshold as callers give it: a number in [0, 1], a target ("tpr", 0.95) / "risk=0.05", or
# None for predict --images' default target.
ThresholdSpec = Union[float, str, tuple[str, float], None]


def threshold_key(threshold: ThresholdSpec) -> float | tuple[str, float]:
    """A given number (checked to lie in [0, 1]) or a parsed target ``(kind, value)``."""
    if threshold is None:
        return DEFAULT_TARGET
    if isinstance(threshold, (int, float)) and not isinstance(threshold, bool):
        if not math.isfinite(threshold) or not 0 <= threshold <= 1:
            raise received("threshold", repr(threshold), "a confidence in [0, 1]")
        return float(threshold)
    if isinstance(threshold, tuple) and len(threshold) == 2:
        threshold = f"{threshold[0]}={threshold[1]}"
    if not isinstance(threshold, str):
        raise received("threshold", repr(threshold), "a number in [0, 1], a target such as "
                       "('tpr', 0.95) or 'risk=0.05', or None")
    try:
        return parse_target(threshold)
    except ValueError as err:       # parse_target's words name the value and what is expected
        raise InputError(f"threshold: {err}") from None


def refuse_single(items, kind, what: str, expected: str) -> None:
    """One item where a sequence is expected (a str would be read as its characters)."""
    if isinstance(items, kind) or not isinstance(items, (Sequence, np.ndarray)):
        raise received(what, type(items).__name__, f"a sequence (list, tuple) of {expected}",
                       "wrap a single one in a list")


def checked_batch(x, input_size: tuple[int, int, int], device: torch.device) -> torch.Tensor:
    """``score(x)``'s batch: a (B, C, H, W) uint8 or float32 tensor at the oracle's size."""
    c, h, w = input_size
    what = "score(x)"
    if not isinstance(x, torch.Tensor):
        raise received(what, type(x).__name__, "a torch.Tensor")
    if x.ndim != 4 or tuple(x.shape[1:]) != (c, h, w):
        raise received(what, f"a tensor of shape {tuple(x.shape)}",
                       f"(B, {c}, {h}, {w}), the oracle's input size (data_config)",
                       "score_images and score_files resize images themselves")
    if x.dtype not in (torch.uint8, torch.float32):
        raise received(what, f"dtype {x.dtype}", "torch.uint8 pixels (0..255) or "
                       "torch.float32 normalised with data_config's mean and std")
    check_device(what, x, device)
    return x


def checked_logits(logits, rows: int, classes: int, stacked: bool,
                   device: torch.device) -> torch.Tensor | None:
    """``score(x, logits)``'s logits: (B, K) floats; required by a stacked oracle."""
    what = "score(x, logits)"
    if logits is None:
        if stacked:
            raise received(what, "no logits", f"the classifier's logits ({rows}, {classes}): "
                           "this oracle's head reads them too (stacked inputs)",
                           "score_images and score_files run the classifier")
        return None
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point() or \
            tuple(logits.shape) != (rows, classes):
        got = (f"a {logits.dtype} tensor of shape {tuple(logits.shape)}"
               if isinstance(logits, torch.Tensor) else type(logits).__name__)
        raise received(what, got, f"a float tensor of shape ({rows}, {classes}): the "
                       "classifier's logits of the same images")
    check_device(what, logits, device)
    return logits


def check_device(what: str, t: torch.Tensor, device: torch.device) -> None:
    """Host tensors are copied to the device, as ``predict`` copies its batches; a tensor on
    another accelerator is a mistake the caller should see, not a silent copy."""
    if t.device.type != "cpu" and t.device != device:
        raise received(what, f"a tensor on {t.device}",
                       f"a tensor on the CPU or on the oracle's device {device}")


def image_views(views: Views, image, i: int, upright: bool) -> tuple[torch.Tensor, ...]:
    """Image ``i`` of ``score_images`` resized and cropped for each model, uint8 (C, H, W)."""
    try:
        return views(pil_pixels(image, i, upright))
    except UnusableImage as err:
        raise received(f"score_images: image {i}", f"{image.width}x{image.height} pixels",
                       "an image the classifier's resize/crop can take", str(err)) from None


def pil_pixels(image, i: int, upright: bool) -> torch.Tensor:
    """A PIL image -> uint8 RGB (3, H, W), as ``pipeline.data.images`` decodes a file."""
    if not isinstance(image, Image.Image):
        raise received(f"score_images: item {i}", type(image).__name__, "a PIL.Image.Image")
    if upright:     # the training cache read its files turned upright (extract --exif-transpose)
        image = ImageOps.exif_transpose(image)
    try:
        return decoded(image)          # the file decoder's own rules
    except ValueError as err:
        raise received(f"score_images: image {i}", f"PIL mode {image.mode!r}",
                       "8 or 16 bits per channel", str(err)) from None


def file_list(paths: Sequence[str | Path], upright: bool, skip_bad: bool) -> SampleList:
    """The files as a ``SampleList`` in the given order, named absolutely as the table names
    them; a path that is no file is refused unless ``skip_bad`` (then it is an invalid row)."""
    names = tuple(str(Path(p).expanduser().absolute()) for p in paths)
    missing = [n for n in names if not Path(n).is_file()]
    if missing and not skip_bad:
        raise DataError(f"score_files: {len(missing)} of {len(names)} path(s) are not files, "
                        f"e.g. {missing[0]} (moved or deleted?); pass existing image files, or "
                        "skip_bad=True to score the others")
    return SampleList(dataset="images", root="/", split="", names=names,
                      labels=np.full(len(names), NO_LABEL, np.int64), classes=(), base="/",
                      exif_transpose=bool(upright))


def concat(parts: list, dtype=np.float32) -> np.ndarray:
    """Per-batch CPU tensors or arrays -> one array (empty for no batches)."""
    return np.concatenate([np.asarray(p) for p in parts]).astype(dtype) if parts else \
        np.zeros(0, dtype)
