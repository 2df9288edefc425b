"""``SampleList``: which samples a split holds, in which order, with which labels, and the
dataset fingerprint that identifies them (``pipeline.data.sources`` lists them)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np


@dataclass(frozen=True, eq=False)
class SampleList:
    dataset: str                 # "fashion-mnist", "imagenet", or the data root's folder name
    root: str
    split: str
    names: tuple[str, ...]       # relative paths (files) or "<idx file>[row]" (idx)
    labels: np.ndarray           # int64, one per name
    classes: tuple[str, ...]
    idx_images: np.ndarray | None = field(default=None, repr=False)  # (N, 28, 28) uint8 for idx
    # (C, H, W) when the images are stored at a model's input resolution (an attack's output):
    # they must be read without another resize/crop (``images.transform_for``)
    model_resolution: tuple[int, int, int] | None = None
    content_id: str = ""         # what made the pixels (an attack's identity hash), or ""
    base: str | None = None      # the folder ``names`` are relative to; None: ROOT/<split>
    # read with EXIF orientation applied (``extract --exif-transpose``, data/orientation.py):
    # how the pixels are read, not which samples, so outside the fingerprint
    exif_transpose: bool = False

    def __len__(self) -> int:
        return len(self.names)

    @cached_property            # computed once per list (1.28M lines for ImageNet train)
    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for name, label in zip(self.names, self.labels.tolist()):
            h.update(f"{name}\t{label}\n".encode())
        if self.content_id:  # a re-made attack into the same folder is another dataset
            h.update(f"content\t{self.content_id}\n".encode())
        return h.hexdigest()

    @property
    def folder(self) -> Path:
        """The folder ``names`` are relative to."""
        return Path(self.base) if self.base is not None else Path(self.root) / self.split

    def path(self, i: int) -> Path:
        return self.folder / self.names[i]
