"""Which files a folder holds, as every command lists them (torch-free).

* Names starting with '.' are skipped (macOS's ``._x.jpg`` resource forks, ``.attack/``).
* A symbolic link to a folder is a folder and a link to a file is a file: ``extract``'s class
  folders (``sources``) and ``predict --images``'s folder walk (``walk``) follow them alike, as
  torchvision's ImageFolder does (a dataset assembled from links to other disks is common).
* ``walk`` recurses; a link that leads back to a folder on its own path (an ancestor, or itself)
  would recurse forever, so it is not followed: its files are listed under the ancestor's names
  already, and a ``note:`` names the link.  ``extract`` reads the images directly inside each
  class folder (one level), where no link can loop.
* A name that is not valid UTF-8 (on Linux a name is bytes; Python carries undecodable bytes as
  lone surrogates) is refused before any work, naming the file and the fix: the cache's
  fingerprint and manifest, the oracle outputs and the prediction tables store names as UTF-8.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Iterable

from cache.reader import UnverifiedCacheWarning
from pipeline.data.errors import DataError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif")


class SkippedLinkNote(UnverifiedCacheWarning):
    """A link not followed (a loop): a subclass of the warning cli.py prints as ``note: ...``."""


def is_image_name(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def subdirs(path: Path) -> list[str]:
    """Sorted names of the folders in ``path`` (links to folders included), hidden ones not."""
    return sorted(p.name for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))


def images_in(path: Path) -> list[str]:
    """Sorted image file names; scandir's d_type avoids one stat per file (1.28M in train/)."""
    with os.scandir(path) as entries:
        return sorted(e.name for e in entries if not e.name.startswith(".")
                      and is_image_name(e.name) and e.is_file())


def walk(top: Path) -> list[Path]:
    """Every non-hidden file under ``top`` at any depth, links followed, named by the path they
    were reached by (a file under a linked folder keeps the link's name); loops are not
    followed (noted).  Each folder's chain of (device, inode) pairs from ``top`` identifies a
    loop whatever the links are called; a folder reached by two links that do not loop is
    listed under both names, as a file linked twice is."""
    files, loops = [], []
    stack = [(Path(top), frozenset({_key(top)}))]
    while stack:
        folder, chain = stack.pop()
        deeper = []
        for entry in _entries(folder):
            if entry.is_dir():
                key = _key(entry.path)
                if key in chain:
                    loops.append(Path(entry.path))
                else:
                    deeper.append((Path(entry.path), chain | {key}))
            elif entry.is_file():
                files.append(Path(entry.path))
        stack.extend(reversed(deeper))      # depth first, in name order
    for link in loops:
        warnings.warn(f"{shown(link)} links back to {shown(os.path.realpath(link))}, a folder "
                      "on its own path: not followed (its images are listed once, under that "
                      "folder's name)", SkippedLinkNote, stacklevel=2)
    return files


def _key(path) -> tuple[int, int]:
    st = os.stat(path)                      # follows links: the folder a link points to
    return st.st_dev, st.st_ino


def _entries(folder: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as it:
            return sorted((e for e in it if not e.name.startswith(".")), key=lambda e: e.name)
    except OSError as err:   # a folder silently left out would be images silently left out
        raise DataError(f"cannot list folder {shown(folder)} ({err.strerror}): make it readable, "
                        "or move it out of the folder given") from None


def shown(name) -> str:
    """``name`` printable: bytes that are not UTF-8 as ``\\xNN`` (as ``ls -b`` shows them)."""
    return os.fsencode(str(name)).decode("utf-8", "backslashreplace")


def refuse_non_utf8(names: Iterable, what: str, folder) -> None:
    """Raise DataError naming the first of ``names`` (relative to ``folder``, or absolute) that
    is not valid UTF-8, how many are not, and how to rename them."""
    names = [str(n) for n in names]
    if _utf8("\n".join(names)):            # one pass over all names (1.28M in ImageNet train)
        return
    bad = [n for n in names if not _utf8(n)]
    raise DataError(
        f"{len(bad)} {what} name(s) under {shown(folder)} are not valid UTF-8, e.g. "
        f"{shown(os.path.join(folder, bad[0]))} (bytes that are not UTF-8 shown as \\xNN): "
        "caches and prediction tables store names as UTF-8. Rename them to UTF-8, e.g. `convmv "
        f"-f latin1 -t utf8 -r --notest {shown(folder)}` (-f: the encoding they were written in)")


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")                # undecodable bytes are lone surrogates: refused
    except UnicodeEncodeError:
        return False
    return True
