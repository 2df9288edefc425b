"""The cache directory before any work: locked, claimed, and its shards checked.

A second ``extract`` into a cache in use stops at once (``locked``).  ``claim`` creates or
re-opens the directory for this identity and checks every shard already there against the
manifest (sizes, identity, row ranges; with ``--verify`` the XXH3-128 hash of every byte):
damaged or foreign shards are removed with a note, so the run that follows recomputes exactly them.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from cache import manifest as mf
from cache.lock import DirLock
from cache.reader import ClassifierCache
from cache.schema import CacheError
from pipeline.core import dist


@contextmanager
def locked(out: Path, info: dist.DistInfo):
    """Rank 0 holds ``<cache dir>/.lock`` while the cache is checked and written: a second
    extract into the same cache stops at once instead of redoing the work beside the first
    (and deleting its temporary files)."""
    lock, err = DirLock(out, enabled=info.is_main), None
    try:
        lock.__enter__()
    except CacheError as e:
        err = e
    if not dist.all_ok(info, err is None):
        raise err or CacheError(f"rank 0 could not lock {out}")
    try:
        yield
    finally:
        lock.__exit__()


def claim(out: Path, identity: dict, ranges: list, verify: bool,
          info: dist.DistInfo) -> tuple[bool, list[str]]:
    """Rank 0 creates/validates the directory and checks the shards already there: damaged or
    foreign ones (and then the manifest) are removed so they are recomputed; the other ranks
    learn the outcome.  Returns (complete, notes)."""
    err, notes = None, []
    if info.is_main:
        try:
            complete = mf.claim_directory(out, identity)
            damaged = mf.find_damage(out, identity, ranges, full=verify)
            notes = mf.discard(out, damaged)
            complete = complete and not damaged
            if complete and not ClassifierCache(Path(out), mf.load_manifest(out)).has_checksums:
                complete, adopted = _adopt(out, identity, ranges, verify)
                notes += adopted
        except CacheError as e:
            err, complete = e, False
    if not dist.all_ok(info, err is None):
        raise err or CacheError(f"rank 0 refused cache directory {out}")
    if not info.is_main:
        complete = (Path(out) / mf.MANIFEST_FILE).exists()
    return complete, notes


def _adopt(out: Path, identity: dict, ranges: list, verified: bool) -> tuple[bool, list[str]]:
    """A cache written before checksums: read every shard once (HDF5 readable, identity, rows),
    then record sizes and XXH3-128 hashes so later damage is caught.  Returns (complete, notes)."""
    if not verified:  # (with --verify, claim has just read every shard in full)
        damaged = mf.find_damage(out, identity, ranges, full=True)
        if damaged:
            return False, mf.discard(out, damaged)
    mf.record_checksums(out)
    return True, [f"cache {out} predates per-shard checksums: every shard was read and found "
                  "sound; their sizes and XXH3-128 hashes are now recorded in its manifest"]
