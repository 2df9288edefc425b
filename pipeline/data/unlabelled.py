"""New, unlabelled images (``predict --images``): a folder, searched recursively, a glob, or one
file, listed as a ``SampleList`` without labels.

Rows are the image files in sorted order of their paths relative to the folder (a glob: to the
folders' common parent; absolute), so a row is identified by its path, never by the order a loader returns
it.  Image extensions, hidden names, links to folders (followed, loops not) and names that are not
UTF-8 (refused before any work) follow the rest of the project: ``pipeline.data.listing``.
"""
from __future__ import annotations

import glob
import os
from pathlib import Path

import numpy as np

from pipeline.data.errors import DataError
from pipeline.data.listing import IMAGE_EXTENSIONS, refuse_non_utf8, shown, walk
from pipeline.data.sources import SampleList

NO_LABEL = -1


def _is_image(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_EXTENSIONS and path.is_file()


def _candidates(spec: str) -> tuple[list[Path], Path]:
    """(every file the spec names, the folder their names are relative to)."""
    path = Path(spec).expanduser().resolve()     # absolute: the output names files anywhere
    if path.is_dir():
        return walk(path), path
    if path.is_file():
        return [path], path.parent
    if not path.exists() and glob.has_magic(spec):
        files = [Path(p) for p in glob.glob(os.path.expanduser(spec), recursive=True)]
        files = [p.resolve() for p in files if p.is_file() and not p.name.startswith(".")]
        base = Path(os.path.commonpath([str(p.parent) for p in files])) if files else Path(".")
        return files, base
    raise DataError(f"--images {shown(spec)}: no such file or folder (give a folder of images, "
                    "a glob such as 'photos/**/*.jpg' in quotes, or one image file)")


def list_images(spec: str) -> SampleList:
    """The images ``spec`` names, sorted by relative path; refuses a spec that names none."""
    files, base = _candidates(spec)
    images = [p for p in files if _is_image(p)]
    if not images:
        others = sorted({shown(p.suffix.lower() or p.name) for p in files})
        seen = (f"; it holds {len(files)} other file(s) ({', '.join(others[:5])})"
                if files else "")
        raise DataError(f"--images {shown(spec)}: no image files (extensions "
                        f"{', '.join(IMAGE_EXTENSIONS)}){seen}. Point --images at a folder of "
                        "images (subfolders are searched) or a glob that matches them")
    refuse_non_utf8(images, "image file", base)     # the table holds each absolute path
    names = tuple(sorted({str(p.relative_to(base)) for p in images}))   # a file matched twice
    return SampleList(dataset=base.resolve().name or "images", root=str(base), split="",
                      names=names, labels=np.full(len(names), NO_LABEL, np.int64), classes=(),
                      base=str(base))
