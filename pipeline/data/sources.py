"""Which samples a split holds, in which order, with which labels — never the pixels.

Dataset layouts, one result (``SampleList``); each layout is a ``Format`` of ``FORMATS`` (how a
root is recognised, its default splits, how a split is listed), tried in order:
* ImageNet layout: ``ROOT/train/<wnid>/*.JPEG``; ``ROOT/val/`` in wnid folders, or flat with a
  labels file (see ``pipeline.data.labels``).  Class order = timm's ImageNet synsets (sorted wnids).
* ``ROOT/classes.txt``, when present, gives the class order of class-folder data (one name per
  line, in the order of the classifier's outputs), wnid folders included: pipeline/data/classes.py.
* Any ImageFolder-style tree ``ROOT/<split>/<class>/*.<ext>`` (ImageNet-C's
  ``defocus_blur/5/<wnid>/`` too: ``--data .../defocus_blur --split 5``).
* The embedded default, Fashion-MNIST's four idx files (Debian ``dataset-fashion-mnist``); a
  folder holding the idx files may also hold ImageFolder splits (e.g. an adversarial split).
* An adversarial split written by ``cli.py attack`` is an ImageFolder split with a hidden
  ``.attack/`` manifest (``pipeline.data.attacked``): its images are already at a model's input
  resolution (``SampleList.model_resolution``), it keeps the source dataset's name, and the
  attack's identity enters its fingerprint.

The global sample index of a row is its position in the sorted list of relative paths; the
dataset fingerprint hashes those paths with their labels, in that order.  Hidden names, links to
folders and names that are not UTF-8: ``pipeline.data.listing``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from pipeline.core.artifacts import artifacts_root
from pipeline.data.errors import DataError
from pipeline.data.idx import read_idx
from pipeline.data.listing import subdirs as _subdirs
from pipeline.data.folders import folder_splits, image_folder, known_classes, no_folder
from pipeline.data.samples import SampleList

FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FMNIST_NAME = "fashion-mnist"
FMNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                  "Sneaker", "Bag", "Ankle boot")
# The embedded dataset's splits: a disjoint part of the training file fits the base classifiers
# (``fit-classifier``), the rest trains the oracles, t10k is the test set.
FMNIST_CLF_ROWS = 12_000
FMNIST_SPLITS = {"clf-train": ("train", 0, FMNIST_CLF_ROWS), "train": ("train", FMNIST_CLF_ROWS, None),
                 "test": ("t10k", 0, None)}


def is_embedded(data: str | None) -> bool:
    """``--data`` names the embedded dataset: left out, empty or its name."""
    return data is None or data in ("", FMNIST_NAME)


def is_embedded_dataset(dataset: str) -> bool:
    """Samples (``SampleList.dataset``) or a cache (its identity's) of the embedded dataset, which
    its presets (``presets.EMBEDDED_*``) apply to: listed under its ``FORMATS`` entry's name (from
    the default, a folder of its idx files, or an attack's split of it, which keeps the name)."""
    return any(f.embedded == dataset for f in FORMATS if f.embedded)


def list_split(data: str | None, split: str, labels_file: str | None = None) -> SampleList:
    """Resolve ``--data``/``--split`` to a SampleList, or raise DataError saying how to fix it."""
    if labels_file and not Path(labels_file).expanduser().is_file():
        raise DataError(f"--labels {labels_file}: file not found")
    if is_embedded(data):
        return fashion_mnist(FMNIST_DIR, split)
    root = _root(data)
    return layout(root, split).list(root, split, labels_file)


def default_splits(data: str | None) -> tuple[str, ...]:
    if is_embedded(data):
        return ("train", "test")
    root = _root(data)
    return next(f for f in FORMATS if f.detect(root)).default_splits(root)


def check_splits(data: str | None, splits: tuple[str, ...]) -> None:
    """Cheap up-front check that every requested split exists, so a typo in the last ``--split``
    fails before hours of work on the first."""
    if is_embedded(data):
        bad = [s for s in splits if s not in FMNIST_SPLITS]
        if bad:
            raise DataError(_no_idx_split(FMNIST_DIR, bad[0]))
        return
    root = _root(data)
    for split in splits:
        fmt = layout(root, split)
        if not fmt.has_split(root, split):
            raise DataError(fmt.missing(root, split))
        if fmt is IMAGE_FOLDER and _subdirs(root / split):   # class folders: all known?
            known_classes(root, root / split, _subdirs(root / split))


def embedded_data(data: str | None) -> bool:
    """The embedded Fashion-MNIST, or a --data folder holding its four idx files (a root that
    the embedded layout of ``FORMATS`` recognises)."""
    return is_embedded(data) or any(f.detect(Path(data)) for f in FORMATS if f.embedded)


def default_artifacts(data: str | None) -> Path:
    """The artifacts root of ``--data`` (``pipeline.core.artifacts``): artifacts/<its folder's
    name>, artifacts/fashion-mnist for the embedded dataset; every stage's default outputs."""
    return artifacts_root(data_name(data))


def data_name(data: str | None) -> str:
    """What names ``--data`` in default paths: its folder's name, or the embedded dataset's."""
    return FMNIST_NAME if is_embedded(data) else Path(data).resolve().name


def _root(data: str) -> Path:
    root = Path(data).expanduser()
    if not root.is_dir():
        raise DataError(f"--data {root}: directory not found; pass the folder that holds the "
                        "split folders (train/, val/, ...), or leave --data out for the embedded "
                        "Fashion-MNIST")
    return root


# ------------------------------------------------------------------------- dataset layouts --
@dataclass(frozen=True)
class Format:
    """A dataset layout under ``--data``: how its root is recognised, the splits it offers by
    default, whether it holds a split (else the error saying so), and how a split is listed."""
    name: str
    detect: Callable[[Path], bool]
    default_splits: Callable[[Path], tuple[str, ...]]
    has_split: Callable[[Path, str], bool]
    missing: Callable[[Path, str], str]
    list: Callable[[Path, str, str | None], SampleList]
    # the embedded dataset's layout: the name it lists every split under (is_embedded_dataset);
    # None for the layouts whose datasets are named after their data
    embedded: str | None = None


def layout(root: Path, split: str) -> Format:
    """The first layout (``FORMATS`` order) that recognises ``root`` and holds ``split``; else
    the first that recognises it (its ``list`` names what is missing)."""
    found = [f for f in FORMATS if f.detect(root)]
    return next((f for f in found if f.has_split(root, split)), found[0])


# ---------------------------------------------------------------------------- Fashion-MNIST --
def _has_idx_files(root: Path) -> bool:
    return any(root.glob("train-images-idx3-ubyte*")) or any(root.glob("t10k-images-idx3-ubyte*"))


def _no_idx_split(root: Path, split: str) -> str:
    return f"--split {split!r}: the embedded dataset has splits {list(FMNIST_SPLITS)}"


def fashion_mnist(root: Path, split: str) -> SampleList:
    if not root.is_dir():
        raise DataError(
            f"Fashion-MNIST not found at {root}. Install it with "
            "`sudo apt-get install -y dataset-fashion-mnist`, or pass --data DIR holding "
            "train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz "
            "and t10k-labels-idx1-ubyte.gz.")
    if split not in FMNIST_SPLITS:
        raise DataError(_no_idx_split(root, split))
    stem, start, stop = FMNIST_SPLITS[split]
    images = read_idx(root / f"{stem}-images-idx3-ubyte")
    labels = read_idx(root / f"{stem}-labels-idx1-ubyte").astype(np.int64)
    if len(images) != len(labels):
        raise DataError(f"{root}: {stem} has {len(images)} images but {len(labels)} labels")
    stop = len(images) if stop is None else min(stop, len(images))  # shorter files: subsets
    if start >= stop:
        raise DataError(f"--split {split!r}: {root} has {len(images)} {stem} rows, but this split "
                        f"starts at row {start}")
    names = tuple(f"{stem}-images-idx3-ubyte[{r}]" for r in range(start, stop))
    return SampleList(FMNIST_NAME, str(root), split, names, labels[start:stop].copy(),
                      FMNIST_CLASSES, idx_images=images[start:stop])


FASHION_MNIST_IDX = Format("Fashion-MNIST idx files", _has_idx_files, lambda root: ("train", "test"),
                           lambda root, split: split in FMNIST_SPLITS, _no_idx_split,
                           lambda root, split, labels_file: fashion_mnist(root, split),
                           embedded=FMNIST_NAME)
IMAGE_FOLDER = Format("image folders", lambda root: True, folder_splits,
                      lambda root, split: (root / split).is_dir(), no_folder, image_folder)
# Tried in this order (``layout``): a root with idx files may also hold ImageFolder splits (an
# attack's output), which are listed as folders when the idx files have no such split.
FORMATS = (FASHION_MNIST_IDX, IMAGE_FOLDER)
