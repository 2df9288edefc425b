"""EXIF orientation: not applied by default, applied with ``extract --exif-transpose``.

A camera may store a photo as the sensor read it and record in the EXIF Orientation tag how to
turn it upright.  torchvision's ImageFolder and timm's loaders (PIL ``Image.open(...).convert``),
which trained the classifiers and which the paper's authors' code uses, do not apply it, so by
default neither does any command here: a cache's rows are the pixels those loaders give (a TIFF
is the exception in them too: Pillow's TIFF reader turns it upright as it decodes).  With
``--exif-transpose`` every file is turned as ``PIL.ImageOps.exif_transpose`` would turn it, after
decoding; the cache records ``exif_transpose: true`` in its identity (absent when off, so every
cache extracted without it keeps its identity), and ``predict --images`` reads new images as the
run's training cache recorded.  The turn is done on the decoded tensor, so it is the same whichever
decoder read the file (libjpeg/libpng or PIL); the device decoders (``--decode gpu|mixed|hw``) do
not apply it and refuse the option.
"""
from __future__ import annotations

import io
from dataclasses import replace

import torch

from pipeline.data.errors import DataError
from pipeline.data.sources import SampleList

EXIF_TRANSPOSE = "exif_transpose"      # the cache identity's key (present only when on)
ORIENTATION_TAG = 0x0112


def reading_exif(samples: SampleList, on: bool) -> SampleList:
    """``samples`` to be read with EXIF orientation applied (``on``) or not; refuses it for idx
    arrays (Fashion-MNIST), whose pixels carry no EXIF."""
    on = bool(on)
    if on == samples.exif_transpose:
        return samples
    if on and samples.idx_images is not None:
        raise DataError(f"--exif-transpose: {samples.dataset} is stored as idx arrays of pixels, "
                        "which have no EXIF orientation to apply; leave the option out")
    return replace(samples, exif_transpose=on)


def orientation(source: str | bytes | bytearray) -> int:
    """The file's EXIF orientation (1..8; 1, upright, where there is none).  ``source``: a path
    or the file's bytes."""
    from PIL import Image

    src = io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source
    with Image.open(src) as im:
        if im.format == "TIFF":   # Pillow's TIFF reader turns the image itself (and drops the
            im.load()             # tag) as it decodes: the decoder's pixels may be upright already
        value = im.getexif().get(ORIENTATION_TAG, 1)
    return value if value in range(1, 9) else 1   # an invalid tag: left as stored, as PIL does


def turned(img: torch.Tensor, value: int) -> torch.Tensor:
    """``img`` (..., H, W) turned upright for orientation ``value``: the transposition
    ``PIL.ImageOps.exif_transpose`` applies (2: mirror, 3: 180 degrees, 4: flip, 5: transpose,
    6: 90 degrees clockwise, 7: transverse, 8: 90 degrees anticlockwise)."""
    if value == 1:
        return img
    if value == 2:
        img = img.flip(-1)
    elif value == 3:
        img = img.flip(-2, -1)
    elif value == 4:
        img = img.flip(-2)
    elif value == 5:
        img = img.transpose(-2, -1)
    elif value == 6:
        img = torch.rot90(img, -1, (-2, -1))
    elif value == 7:
        img = img.transpose(-2, -1).flip(-2, -1)
    else:
        img = torch.rot90(img, 1, (-2, -1))
    return img.contiguous()
