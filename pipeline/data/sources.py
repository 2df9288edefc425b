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

import hashlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable

import numpy as np

from pipeline.core.artifacts import artifacts_root
from pipeline.data import attacked
from pipeline.data import labels as labelfiles
from pipeline.data.errors import DataError
from pipeline.data.idx import read_idx
from pipeline.data.listing import IMAGE_EXTENSIONS, images_in as _images_in, refuse_non_utf8
from pipeline.data.listing import subdirs as _subdirs

FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FMNIST_NAME = "fashion-mnist"
FMNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                  "Sneaker", "Bag", "Ankle boot")
# The embedded dataset's splits: a disjoint part of the training file fits the base classifiers
# (``fit-classifier``), the rest trains the oracles, t10k is the test set.
FMNIST_CLF_ROWS = 12_000
FMNIST_SPLITS = {"clf-train": ("train", 0, FMNIST_CLF_ROWS), "train": ("train", FMNIST_CLF_ROWS, None),
                 "test": ("t10k", 0, None)}


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
            _known_classes(root, root / split, _subdirs(root / split))


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


# ------------------------------------------------------------------------------ image folders --
def empty_class_folders(samples: SampleList) -> list[Path]:
    """Folders of the split's classes (in ROOT/train/ and the split) that hold no images: the
    likely cause of a class count that does not match the classifier's."""
    if samples.idx_images is not None:
        return []
    root = Path(samples.root)
    folders = [root / split / c for split in dict.fromkeys(("train", samples.split))
               for c in samples.classes]
    return [f for f in folders if f.is_dir() and not _images_in(f)]


def folder_classes(root: Path, split_dirs: list[str],
                   where: Path | None = None) -> tuple[tuple[str, ...], str]:
    """Class list and dataset name: ``ROOT/classes.txt`` (the user's order) when present, else
    ImageNet's synsets when every folder is a known wnid, else the sorted folders of train/."""
    classes_file = root / "classes.txt"
    if classes_file.exists():
        return _read_classes(classes_file), root.name
    synsets = labelfiles.imagenet_synsets()
    known = [d for d in split_dirs if d in synsets]
    if split_dirs and len(known) == len(split_dirs):
        return tuple(synsets), "imagenet"
    if len(known) * 2 >= len(split_dirs):  # an ImageNet tree with stray folders
        unknown = [d for d in split_dirs if d not in synsets]
        raise DataError(f"{where or root}: class folder(s) {unknown[:5]} are not ImageNet "
                        f"synsets (wnids like {synsets[0]}) while {len(known)} others are; remove "
                        "or rename them")
    source = root / "train" if (root / "train").is_dir() else None
    return tuple(_subdirs(source) if source else split_dirs), root.name


def _read_classes(path: Path) -> tuple[str, ...]:
    # utf-8-sig: Windows editors start a UTF-8 file with a byte-order mark, not part of a name
    classes = tuple(l.strip() for l in path.read_text(encoding="utf-8-sig").splitlines()
                    if l.strip())
    repeated = sorted({c for c in classes if classes.count(c) > 1})
    if not classes or repeated:
        raise DataError(f"{path}: " + (f"class(es) {repeated[:5]} listed more than once" if repeated
                                       else "empty") + "; list every class once, one per line, "
                        "in the order of the classifier's outputs")
    return classes


def image_folder(root: Path, split: str, labels_file: str | None) -> SampleList:
    split_dir = root / split
    if not split_dir.is_dir():
        raise DataError(_no_folder(root, split))
    doc = attacked.read_manifest(split_dir)   # None unless `cli.py attack` wrote the split
    dirs = _subdirs(split_dir)
    if dirs:
        names, labels, classes, name = _class_folders(root, split_dir, dirs)
    else:
        names = _images_in(split_dir)
        if not names:
            raise DataError(f"split {split_dir} is empty: no class folders and no images with "
                            f"extensions {IMAGE_EXTENSIONS}")
        refuse_non_utf8(names, "image file", split_dir)
        mapping, classes, name = labelfiles.flat_labels(root, split, labels_file)
        missing = [n for n in names if n not in mapping]
        if missing:
            raise DataError(f"labels file does not match the images in {split_dir}: "
                            f"{len(missing)} of {len(names)} image(s) have no label, e.g. "
                            f"{missing[:3]}; pass the labels file of this split with --labels")
        labels = [mapping[n] for n in names]
    if not names:
        raise DataError(f"split {split_dir} is empty: its class folders hold no images with "
                        f"extensions {IMAGE_EXTENSIONS}")
    if doc is None:
        return SampleList(name, str(root), split, tuple(names), np.asarray(labels, np.int64),
                          classes)
    attacked.check_listing(split_dir, doc, tuple(names))
    ident = doc["identity"]
    return SampleList(ident["source"]["dataset"], str(root), split, tuple(names),
                      np.asarray(labels, np.int64), classes,
                      model_resolution=tuple(ident["input_size"]),
                      content_id=doc["identity_sha256"])


def _class_folders(root: Path, split_dir: Path, dirs: list[str]):
    classes, name, lookup = _known_classes(root, split_dir, dirs)
    names, labels = [], []
    for d in dirs:
        files = _images_in(split_dir / d)
        names += [f"{d}/{f}" for f in files]
        labels += [lookup[d]] * len(files)
    refuse_non_utf8(names, "image file", split_dir)
    return names, labels, classes, name


def _known_classes(root: Path, split_dir: Path, dirs: list[str]):
    """(classes, dataset name, class -> label); refuses a class folder that is not a class."""
    refuse_non_utf8(dirs, "class folder", split_dir)
    classes, name = folder_classes(root, dirs, split_dir)
    lookup = {c: i for i, c in enumerate(classes)}
    unknown = [d for d in dirs if d not in lookup]
    if unknown:
        where = "train/" if (root / "train").is_dir() and not (root / "classes.txt").exists() \
            else "classes.txt" if (root / "classes.txt").exists() else "the split's folders"
        raise DataError(f"{split_dir}: class folder(s) {unknown[:5]} are not among the "
                        f"{len(classes)} classes of {where}; rename them, or list every class "
                        f"(one per line, in label order) in {root / 'classes.txt'}")
    return classes, name, lookup


def _folder_splits(root: Path) -> tuple[str, ...]:
    found = tuple(s for s in ("train", "val", "test") if (root / s).is_dir())
    if not found:
        raise DataError(f"--data {root} has no train/, val/ or test/ folder; name the split "
                        f"with --split (folders there: {_subdirs(root)[:10]})")
    return found


def _no_folder(root: Path, split: str) -> str:
    return f"--split {split!r}: {root / split} not found; folders in {root}: {_subdirs(root)[:20]}"


FASHION_MNIST_IDX = Format("Fashion-MNIST idx files", _has_idx_files, lambda root: ("train", "test"),
                           lambda root, split: split in FMNIST_SPLITS, _no_idx_split,
                           lambda root, split, labels_file: fashion_mnist(root, split),
                           embedded=FMNIST_NAME)
IMAGE_FOLDER = Format("image folders", lambda root: True, _folder_splits,
                      lambda root, split: (root / split).is_dir(), _no_folder, image_folder)
# Tried in this order (``layout``): a root with idx files may also hold ImageFolder splits (an
# attack's output), which are listed as folders when the idx files have no such split.
FORMATS = (FASHION_MNIST_IDX, IMAGE_FOLDER)
