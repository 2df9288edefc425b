"""identity.json (written first) and manifest.json (written last) of a classifier cache directory.

The identity file makes a half-written cache recognisable, so a re-run either resumes it (same
identity) or refuses it naming the differing attribute.  The manifest's presence means complete.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from cache.schema import CLASSIFIER_IDENTITY, CacheError, canonical, check_identity

IDENTITY_FILE = "identity.json"
MANIFEST_FILE = "manifest.json"


def write_json_atomic(path: Path, payload: Mapping[str, Any]) -> None:
    """Write to a temporary name, fsync, then rename: readers never see half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as fh:
        json.dump(canonical(payload), fh, indent=2, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


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
        raise CacheError(f"--out {cache_dir} is not empty and is not a cache directory (no "
                         f"{IDENTITY_FILE}); choose an empty or new directory")
    cache_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(id_path, identity)
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
