"""The cache directory before any work: locked, claimed, and its shards checked.

A second ``extract`` into a cache in use stops at once (``locked``).  ``claim`` creates or
re-opens the directory for this identity and checks every shard already there against the
manifest (sizes, identity, row ranges; with ``--verify`` the XXH3-128 hash of every byte) and
against the image files of ``--data`` (pipeline/data/stamps.py: stamps, then content hashes):
damaged or foreign shards, and shards holding images that changed, are removed with a note, so
the run that follows recomputes exactly them.  A complete cache on a read-only file system is
checked without writing anything; only a repair it needs is refused.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from cache import manifest as mf
from cache.integrity import NotWritable, column_hash
from cache.lock import DirLock
from cache.reader import ClassifierCache
from cache.schema import MC_DROPOUT, SOURCE_HASH_COLUMN, SOURCE_STAMP, CacheError
from cache.shards import add_to_shard, shard_path
from pipeline.core import dist
from pipeline.data.sources import SampleList
from pipeline.data.stamps import check_sources, current_hashes, current_stats, present_shards


@contextmanager
def locked(out: Path, info: dist.DistInfo):
    """Rank 0 holds ``<cache dir>/.lock`` while the cache is checked and written: a second
    extract into the same cache stops at once instead of redoing the work beside the first
    (and deleting its temporary files).  Yields whether the directory is writable: a complete
    cache on a read-only file system is read without a lock (reading needs no writing)."""
    lock, err, writable = DirLock(out, enabled=info.is_main), None, True
    try:
        lock.__enter__()
    except NotWritable as e:
        err, writable = (None, False) if (Path(out) / mf.MANIFEST_FILE).exists() else (e, True)
    except CacheError as e:
        err = e
    if not dist.all_ok(info, err is None):
        raise err or CacheError(f"rank 0 could not lock {out}")
    try:
        yield writable
    finally:
        if writable:
            lock.__exit__()


def claim(out: Path, identity: dict, ranges: list, verify: bool, info: dist.DistInfo,
          samples: SampleList, writable: bool = True) -> tuple[bool, list[str]]:
    """Rank 0 creates/validates the directory and checks the shards already there: damaged or
    foreign ones, and those holding changed images (then the manifest) are removed so they are
    recomputed; the other ranks learn the outcome.  Returns (complete, notes)."""
    err, notes = None, []
    if info.is_main:
        try:
            identity, kept = kept_mc_dropout(out, identity)
            complete = mf.claim_directory(out, identity)
            damaged = mf.find_damage(out, identity, ranges, full=verify)
            _writing(writable, out, "has damaged shards", damaged)
            notes = kept + mf.discard(out, damaged)
            complete = complete and not damaged
            if complete and not ClassifierCache(Path(out), mf.load_manifest(out)).has_checksums:
                _writing(writable, out, "predates per-shard checksums", True)
                complete, adopted = _adopt(out, identity, ranges, verify)
                notes += adopted
            complete, checked = _check_sources(out, ranges, samples, verify, complete, writable)
            notes += checked
        except CacheError as e:
            err, complete = e, False
    if not dist.all_ok(info, err is None):
        raise err or CacheError(f"rank 0 refused cache directory {out}")
    if not info.is_main:
        complete = (Path(out) / mf.MANIFEST_FILE).exists()
    return complete, notes


def kept_mc_dropout(out: Path, identity: dict) -> tuple[dict, list[str]]:
    """An extract without --mc-dropout that finds a COMPLETE cache extracted with it, identical
    in every other attribute, takes it as complete: its deterministic outputs are exactly those
    this extract would write (the MC passes run after them and leave them unchanged), the MC
    columns are extra.  Returns the identity to claim with (the cache's) and a note.  An
    incomplete one is still refused by the claim (its missing shards would lack the columns)."""
    if MC_DROPOUT in identity or not (Path(out) / mf.MANIFEST_FILE).exists():
        return identity, []
    found = mf.CACHE_CLAIM.found(out) or {}
    if MC_DROPOUT not in found or mf.CACHE_CLAIM.differences(
            {k: v for k, v in found.items() if k != MC_DROPOUT}, identity):
        return identity, []
    return {**identity, MC_DROPOUT: found[MC_DROPOUT]}, [
        f"{out} was extracted with --mc-dropout {found[MC_DROPOUT]['passes']} too: its "
        "deterministic outputs are this extract's, the MC-Dropout columns are kept"]


def _writing(writable: bool, out: Path, why: str, needed) -> None:
    if needed and not writable:
        raise NotWritable(f"cache {out} {why} but is read-only here: make it writable and re-run "
                          "the same `cli.py extract` command (it repairs exactly what is needed)")


def _check_sources(out: Path, ranges: list, samples: SampleList, verify: bool, complete: bool,
                   writable: bool) -> tuple[bool, list[str]]:
    """The shards' recorded image stamps / hashes against the files of ``--data`` now."""
    entries = mf.load_manifest(out)["shards"] if complete else present_shards(out, ranges)
    found = check_sources(out, entries, samples, full=verify)
    notes = []
    if found.changed:
        _writing(writable, out, "holds shards of images that changed", True)
        notes.append(f"{found.changed_text(samples)} changed since cache {out} was extracted "
                     "(their content differs from the hashes it records): recomputing the "
                     f"{len(found.changed)} shard(s) holding them")
        notes += mf.discard(out, {shard_path(out, s): f"holds {len(rows)} changed image(s)"
                                  for s, rows in found.changed.items()})
        complete = False
    if found.restamp and complete:
        _writing(writable, out, "records old file stamps", True)
        mf.record_shards(out, stamps={shard_path(out, s).name: v for s, v in found.restamp.items()})
        notes.append(f"the image files of {len(found.restamp)} shard(s) of cache {out} have new "
                     "sizes or modification times but the content it was computed from (same "
                     "XXH3-128 hashes): their stamps are now recorded")
    unstamped = [s for s in found.unstamped if s not in found.changed]
    if unstamped:
        _writing(writable, out, "predates image stamps", True)
        notes.append(_adopt_sources(out, ranges, samples, unstamped, complete))
    return complete, notes


def _adopt_sources(out: Path, ranges: list, samples: SampleList, shards: list[int],
                   complete: bool) -> str:
    """A cache written before image stamps: record the current files' hashes and stamps."""
    for s in shards:
        a, b = ranges[s]
        add_to_shard(shard_path(out, s), {SOURCE_HASH_COLUMN: current_hashes(samples, a, b)},
                     {SOURCE_STAMP: column_hash(current_stats(samples, a, b))})
    if complete:
        mf.record_shards(out, rewritten=[shard_path(out, s).name for s in shards],
                         columns=[SOURCE_HASH_COLUMN])
    return (f"cache {out} predates image stamps: the content hashes and stamps of the "
            f"{sum(ranges[s][1] - ranges[s][0] for s in shards)} image(s) of --data are now "
            "recorded, so later changes to them are found (if they changed before this run, "
            "delete the cache and extract again)")


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
