"""ImageFolder-style splits: ``ROOT/<split>/<class>/*.<ext>``, or a flat split with a labels file;
the class order from ``ROOT/classes.txt``, ImageNet's synsets, or the sorted folders of train/;
an adversarial split written by ``cli.py attack`` (``pipeline.data.attacked``).  The layout is
``sources.IMAGE_FOLDER`` of ``sources.FORMATS``."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.data import attacked
from pipeline.data import labels as labelfiles
from pipeline.data.errors import DataError
from pipeline.data.listing import IMAGE_EXTENSIONS, images_in as _images_in, refuse_non_utf8
from pipeline.data.listing import subdirs as _subdirs
from pipeline.data.samples import SampleList


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
        raise DataError(no_folder(root, split))
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
    classes, name, lookup = known_classes(root, split_dir, dirs)
    names, labels = [], []
    for d in dirs:
        files = _images_in(split_dir / d)
        names += [f"{d}/{f}" for f in files]
        labels += [lookup[d]] * len(files)
    refuse_non_utf8(names, "image file", split_dir)
    return names, labels, classes, name


def known_classes(root: Path, split_dir: Path, dirs: list[str]):
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


def folder_splits(root: Path) -> tuple[str, ...]:
    found = tuple(s for s in ("train", "val", "test") if (root / s).is_dir())
    if not found:
        raise DataError(f"--data {root} has no train/, val/ or test/ folder; name the split "
                        f"with --split (folders there: {_subdirs(root)[:10]})")
    return found


def no_folder(root: Path, split: str) -> str:
    return f"--split {split!r}: {root / split} not found; folders in {root}: {_subdirs(root)[:20]}"
