"""identity.json (written first) and manifest.json (written last) of a classifier cache directory.

The identity file makes a half-written cache recognisable, so a re-run either resumes it (same
identity) or refuses it naming the differing attribute.  The manifest's presence means complete.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from cache.atomic import read_json, write_json_atomic
from cache.claim import Claim
from cache.shards import shard_entry, shard_path, shard_problem
from cache.schema import (CLASSIFIER_IDENTITY, SCHEMA_VERSION, SOURCE_STAMP, CacheError,
                          CacheMismatch, check_schema_version)

IDENTITY_FILE = "identity.json"
MANIFEST_FILE = "manifest.json"


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


def _same_schema(folder: Path, found: Mapping[str, Any], identity: Mapping[str, Any]) -> None:
    check_schema_version(found, f"cache directory {folder}",
                         identity.get("schema_version", SCHEMA_VERSION))


# A classifier cache directory's claim (cache.claim): identity.json first, manifest.json last.
CACHE_CLAIM = Claim(
    record=IDENTITY_FILE, marker=MANIFEST_FILE, what="cache identity", check=_same_schema,
    keys=CLASSIFIER_IDENTITY, found_in="cache", expected_in="expected", nested=False, show=None,
    error=CacheError, mismatch=CacheMismatch,
    refused="cache directory {folder} holds a different cache",
    fix="To complete or reuse it, pass the --data, --weights FILE and other options it was "
        "extracted with (a complete cache's manifest.json records them under config); else use "
        "another --out directory, or delete this one to rebuild it.",
    foreign="cache directory {folder} is not empty and holds no cache (no {record}); choose "
            "another --out or empty it",
    unwritable="cannot create the cache directory {folder} ({err}); choose another --out")


def claim_directory(cache_dir: Path, identity: Mapping[str, Any]) -> bool:
    """Create or re-open ``cache_dir`` for ``identity``.  Returns True if the cache is complete.

    Refuses a directory that holds another cache (naming the differing attributes) or unrelated
    files, so nothing already written is ever overwritten or silently mixed.
    """
    return CACHE_CLAIM.take(cache_dir, identity) == "complete"


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


def find_damage(cache_dir: Path, identity: Mapping[str, Any], ranges: list[tuple[int, int]],
                full: bool = False) -> dict[Path, str]:
    """{shard path: what is wrong} for every shard file present in ``cache_dir`` that is not a
    sound part of the cache ``identity`` (foreign, truncated, unreadable, wrong rows; ``full``:
    also changed bytes).  Against the manifest when there is one (sizes, file hashes), else against
    the shards' own attributes and column checksums.  Missing shards of an incomplete cache are
    not damage (they are computed on resume)."""
    cache_dir = Path(cache_dir)
    manifest = load_manifest(cache_dir) if (cache_dir / MANIFEST_FILE).exists() else None
    entries = {e["file"]: e for e in manifest["shards"]} if manifest else {}
    found = {}
    for s, (start, stop) in enumerate(ranges):
        path = shard_path(cache_dir, s)
        if manifest is None and not path.exists():
            continue
        entry = entries.get(path.name, {"file": path.name, "start": start, "stop": stop})
        problem = shard_problem(path, entry, identity, full)
        if problem:
            found[path] = problem
    return found


def discard(cache_dir: Path, damaged: Mapping[Path, str]) -> list[str]:
    """Remove the manifest (the cache is no longer complete), then the damaged shards, so the
    resume recomputes exactly them.  Returns one note per shard."""
    if not damaged:
        return []
    (Path(cache_dir) / MANIFEST_FILE).unlink(missing_ok=True)
    notes = []
    for path, problem in damaged.items():
        Path(path).unlink(missing_ok=True)
        notes.append(f"shard {path} {problem}: recomputing it")
    return notes


def record_checksums(cache_dir: Path) -> None:
    """Add size and XXH3-128 hash of every shard to the manifest of a cache written before checksums
    (the caller has just read every shard in full)."""
    manifest = load_manifest(cache_dir)
    manifest["shards"] = [shard_entry(Path(cache_dir) / e["file"], e["start"], e["stop"])
                          for e in manifest["shards"]]
    write_json_atomic(Path(cache_dir) / MANIFEST_FILE, manifest)


def record_shards(cache_dir: Path, stamps: Mapping[str, str] | None = None,
                  rewritten: list[str] | None = None, columns: list[str] | None = None) -> None:
    """Update a complete cache's manifest: new source stamps of shards whose files kept their
    content (``stamps``: {file: digest}), fresh records of ``rewritten`` shards, and ``columns``
    added to its column list."""
    path = Path(cache_dir) / MANIFEST_FILE
    manifest = load_manifest(cache_dir)
    entries = []
    for e in manifest["shards"]:
        if e["file"] in (rewritten or []):
            e = shard_entry(Path(cache_dir) / e["file"], e["start"], e["stop"])
        entries.append({**e, **({SOURCE_STAMP: stamps[e["file"]]} if e["file"] in (stamps or {})
                                else {})})
    manifest["shards"] = entries
    manifest["columns"] = list(dict.fromkeys([*manifest["columns"], *(columns or [])]))
    write_json_atomic(path, manifest)
