"""identity.json (written first) and manifest.json (written last) of a classifier cache directory.

The identity file makes a half-written cache recognisable, so a re-run either resumes it (same
identity) or refuses it naming the differing attribute.  The manifest's presence means complete.
"""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any, Mapping

from cache.schema import CLASSIFIER_IDENTITY, CacheError, canonical, check_identity

IDENTITY_FILE = "identity.json"
MANIFEST_FILE = "manifest.json"


def write_json_atomic(path: Path, payload: Mapping[str, Any]) -> None:
    """Write to a temporary name, fsync, then rename: readers never see half a file.  On any
    failure (disk full, interrupt) the temporary file is removed and nothing else changes."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as fh:
            json.dump(canonical(payload), fh, indent=2, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and err.errno == errno.ENOSPC:
            raise CacheError(f"disk full while writing {path}: free space, then re-run the same "
                             "command; completed shards are kept") from err
        raise


def check_cache_root(root: Path) -> None:
    """``--out`` names a cache ROOT holding ``<classifier>/<split tag>/`` cache directories.

    A non-empty folder with anything else in it is refused, so a mistyped ``--out`` never
    scatters caches into an unrelated directory.
    """
    root = Path(root)
    if not root.exists():
        return
    if not root.is_dir():
        raise CacheError(f"--out {root} is a file; pass a directory (the cache root)")
    if (root / IDENTITY_FILE).exists():
        raise CacheError(f"--out {root} is itself a cache directory; --out takes the cache root, "
                         f"under which caches live as <classifier>/<split>/ (here: "
                         f"--out {root.parent.parent})")
    foreign = []
    for entry in _visible(root):
        leaves = _visible(entry) if entry.is_dir() else [entry]
        for leaf in leaves:
            if not leaf.is_dir() or (_visible(leaf) and not (leaf / IDENTITY_FILE).exists()):
                foreign.append(str(leaf.relative_to(root)))
    if foreign:
        raise CacheError(f"--out {root} is not empty and is not a cache root: {foreign[:3]} "
                         f"{'are' if len(foreign) > 1 else 'is'} not <classifier>/<split>/ cache "
                         "directories; choose an empty or new directory")


def _visible(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if not p.name.startswith("."))


def read_json(path: Path, what: str) -> dict:
    try:
        with open(path) as fh:
            return json.load(fh)
    except FileNotFoundError:
        raise CacheError(f"{what} not found: {path}") from None
    except (OSError, json.JSONDecodeError) as err:
        raise CacheError(f"{what} {path} is unreadable ({err}); delete it and re-run") from None


def claim_directory(cache_dir: Path, identity: Mapping[str, Any]) -> bool:
    """Create or re-open ``cache_dir`` for ``identity``.  Returns True if the cache is complete.

    Refuses a directory that holds another cache (naming the differing attributes) or unrelated
    files, so nothing already written is ever overwritten or silently mixed.
    """
    cache_dir = Path(cache_dir)
    id_path = cache_dir / IDENTITY_FILE
    if id_path.exists():
        check_identity(read_json(id_path, "cache identity"), identity, f"cache directory {cache_dir}",
                       keys=CLASSIFIER_IDENTITY,
                       hint="Use another --out directory, or delete this one to rebuild it.")
        return (cache_dir / MANIFEST_FILE).exists()
    if cache_dir.exists() and any(p for p in cache_dir.iterdir() if not p.name.startswith(".")):
        raise CacheError(f"cache directory {cache_dir} is not empty and holds no cache (no "
                         f"{IDENTITY_FILE}); choose another --out or empty it")
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(id_path, identity)
    except (PermissionError, FileExistsError, NotADirectoryError) as err:
        raise CacheError(f"cannot create the cache directory {cache_dir} ({err}); choose "
                         "another --out") from None
    return False


def load_manifest(cache_dir: Path) -> dict:
    cache_dir = Path(cache_dir)
    path = cache_dir / MANIFEST_FILE
    if not path.exists():
        if (cache_dir / IDENTITY_FILE).exists():
            raise CacheError(f"cache {cache_dir} is incomplete (no {MANIFEST_FILE}): re-run the "
                             "same `cli.py extract` command to finish it")
        raise CacheError(f"no classifier cache at {cache_dir} (no {MANIFEST_FILE}); run "
                         "`cli.py extract` first or pass the right --cache")
    return read_json(path, "cache manifest")
