"""HDF5 shard writer and reader for classifier caches.

A shard holds rows ``[start, stop)`` of a split, in global-index order, as contiguous (unchunked)
datasets: reads of a whole shard are sequential, and nothing is compressed (fp16 logits do not
compress: random-looking mantissas; bench/bench_integrity.py measures the writes).  Shards are written under a temporary name and renamed, so a shard
file that exists is complete.

h5py is imported lazily and every file is closed before returning: stages load what they need
into RAM in the main process and never hold an HDF5 handle across a DataLoader fork.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from cache.atomic import atomic_path
from cache.integrity import column_hash, file_digest
from cache.schema import (CLASSIFIER_COLUMNS, CLASSIFIER_IDENTITY, SOURCE_STAMP, CacheError,
                          CacheMismatch, check_identity, from_attr, identity_diff, to_attr)

SHARD_PATTERN = "shard-{:05d}.h5"
HASHES = "xxh3_64"   # attribute (and manifest key): {column: XXH3-64 hex of its bytes}


def shard_path(cache_dir: Path, shard_id: int) -> Path:
    return Path(cache_dir) / SHARD_PATTERN.format(shard_id)


def shard_ranges(num_rows: int, shard_size: int) -> list[tuple[int, int]]:
    """Row ranges of every shard: fixed boundaries, independent of GPU count or batch size."""
    return [(s, min(s + shard_size, num_rows)) for s in range(0, num_rows, shard_size)]


def write_shard(path: Path, columns: Mapping[str, np.ndarray], attrs: Mapping[str, Any],
                kept: str = "completed shards are kept and only missing ones are computed") -> None:
    """Write all ``columns`` to ``path`` atomically (temp file + rename), with the XXH3-64 hash
    of each column in the ``xxh3_64`` attribute.

    The HDF5 file is built in memory and written with plain file I/O: a full disk then fails as
    one ``OSError`` (HDF5 writing to a full disk raises from its destructors and can leave the
    library in a state that crashes the process).  On any failure the temporary file is removed
    and a previously complete file is never touched; no room to write -> CacheError saying what
    is ``kept``.
    """
    import h5py

    path = Path(path)
    arrays = {name: np.ascontiguousarray(a) for name, a in columns.items()}
    attrs = {**attrs, HASHES: {name: column_hash(a) for name, a in arrays.items()}}
    # one allocation for the whole image (the core driver grows in 64 KiB steps otherwise)
    block = sum(a.nbytes for a in arrays.values()) + (1 << 16)
    # not fsynced: the manifest's size and hash of every shard (checked on open, --verify) find
    # one a crash lost, and waiting for each shard to reach the disk would stall extraction
    with atomic_path(path, durable=False, kept=kept) as tmp:
        with h5py.File(tmp.name, "w", driver="core", backing_store=False,  # RAM only
                       block_size=block) as fh:
            for key, value in attrs.items():
                fh.attrs[key] = to_attr(value)
            for name, array in arrays.items():
                fh.create_dataset(name, data=array)
            fh.flush()
            image = fh.id.get_file_image()
        with open(tmp, "wb") as out:
            out.write(image)


def add_to_shard(path: Path, columns: Mapping[str, np.ndarray], attrs: Mapping[str, Any]) -> None:
    """Rewrite a sound shard with ``columns`` and ``attrs`` added (a cache adopted by a newer
    version): every column is read (and checked) first, the new file replaces it atomically."""
    old = read_columns(path, None)
    write_shard(path, {**old, **columns}, {**{k: v for k, v in read_attrs(path).items()
                                              if k != HASHES}, **attrs},
                kept="the shard is unchanged; re-run the same command")


def read_attrs(path: Path) -> dict:
    import h5py

    try:
        with h5py.File(path, "r") as fh:
            return {k: from_attr(v) for k, v in fh.attrs.items()}
    except (OSError, RuntimeError, ValueError) as err:
        raise CacheError(f"{path} is not a readable HDF5 file ({_first_line(err)}); re-run "
                         "the command that wrote it (`cli.py extract`, `train-oracle` or "
                         "`predict`)") from None


def shard_is_complete(path: Path, identity: Mapping[str, Any], start: int, stop: int) -> bool:
    """True if ``path`` exists, belongs to ``identity`` and covers exactly ``[start, stop)``.

    A shard of a different identity raises (never silently recomputed over); a shard of the
    right identity but wrong range or unreadable content is reported as incomplete.
    """
    if not Path(path).exists():
        return False
    attrs = read_attrs(path)
    check_identity(attrs, identity, f"shard {path}", keys=CLASSIFIER_IDENTITY)
    return attrs.get("start") == start and attrs.get("stop") == stop


def read_columns(path: Path, names: tuple[str, ...] | list[str] | None,
                 expect: Mapping[str, Any] | None = None,
                 fix: str = "delete it and re-run the command that wrote it",
                 ) -> dict[str, np.ndarray]:
    """Read ``names`` (None: every column) from one file; every column read is checked against
    its recorded hash.

    ``expect``: attributes the file must have (a shard: its cache's identity and row range), so
    a file copied in from another cache is refused naming what differs.  ``fix`` ends every
    error message (what the user does about a damaged file)."""
    import h5py

    path = Path(path)
    try:
        with h5py.File(path, "r") as fh:
            attrs = {k: from_attr(v) for k, v in fh.attrs.items()}
            if expect is not None:
                diffs = identity_diff(attrs, expect, tuple(expect), found_in="the file")
                if diffs:
                    raise CacheMismatch(f"{path} does not belong here (copied from another "
                                        "cache?):\n  " + "\n  ".join(diffs) + f"\n{fix}")
            names = list(fh.keys()) if names is None else names
            missing = [n for n in names if n not in fh]
            if missing:
                raise CacheError(f"{path} has no column(s) {missing}; it holds {sorted(fh.keys())}")
            out = {n: fh[n][...] for n in names}
    except CacheError:
        raise
    except (OSError, RuntimeError, ValueError, KeyError) as err:
        raise CacheError(f"{path} is damaged: HDF5 cannot read it ({_first_line(err)}); "
                         f"{fix}") from None
    hashes = attrs.get(HASHES) or {}
    for n in names:
        if hashes.get(n) is not None:
            check_column(path, n, column_hash(out[n]), hashes[n], fix)
    return out


def check_column(path: Path, name: str, digest: str | None, expected: str | None,
                 fix: str) -> None:
    """Refuse column ``name`` read from ``path`` if its bytes' XXH3-64 ``digest``
    (``column_hash``) is not what its checksum ``expected`` (None: a file written without one)
    says was written."""
    if expected is not None and digest != expected:
        raise CacheError(f"{path} is damaged: column {name!r} does not match its checksum "
                         f"(the file changed after it was written); {fix}")


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


REPAIR = "re-run the same `cli.py extract` command: it recomputes exactly the damaged shards"
CORRUPT = "the cache is corrupt — delete it and re-run `cli.py extract`"


def shard_expect(identity: Mapping[str, Any], start: int, stop: int) -> dict:
    """The attributes a shard of this cache covering ``[start, stop)`` must carry."""
    return {**{k: identity.get(k) for k in CLASSIFIER_IDENTITY}, "start": start, "stop": stop}


def shard_entry(path: Path, start: int, stop: int) -> dict:
    """A manifest's record of one shard: rows, size, XXH3-128 hash, the columns' hashes and (when
    the shard has it) the digest of its source files' stamps."""
    attrs = read_attrs(path)
    stamp = {SOURCE_STAMP: attrs[SOURCE_STAMP]} if SOURCE_STAMP in attrs else {}
    return {"file": Path(path).name, "start": start, "stop": stop, **file_digest(path),
            HASHES: attrs.get(HASHES), **stamp}


def size_problem(path: Path, entry: Mapping[str, Any]) -> str | None:
    """The cheap check (one stat): the shard exists and has the size the manifest records."""
    try:
        size = Path(path).stat().st_size
    except FileNotFoundError:
        return "is missing"
    if "bytes" in entry and size != entry["bytes"]:
        return f"has {size} bytes, the manifest records {entry['bytes']} (truncated or replaced)"
    return None


def shard_problem(path: Path, entry: Mapping[str, Any], identity: Mapping[str, Any],
                  full: bool = False) -> str | None:
    """What is wrong with one shard of a complete cache, or None.  Cheap: size, identity and row
    range (attributes only).  ``full``: also the XXH3-128 hash of the whole file; a shard of a
    cache written before checksums (none recorded) is read entirely instead (readable, hashes)."""
    problem = size_problem(path, entry)
    if problem:
        return problem
    try:
        attrs = read_attrs(path)
    except CacheError:
        return "is not a readable HDF5 file"
    diffs = identity_diff(attrs, shard_expect(identity, entry["start"], entry["stop"]),
                          found_in="the shard")
    if diffs:
        return "belongs to another cache (" + "; ".join(diffs) + ")"
    if not full:
        return None
    if "xxh3_128" in entry:
        if file_digest(path)["xxh3_128"] != entry["xxh3_128"]:
            return ("does not match its recorded XXH3-128 hash (its bytes changed after it was "
                    "written)")
        return None
    try:
        read_columns(path, None)
    except CacheError as err:
        return f"is damaged ({err})"
    return None


def load_split(cache_dir: Path, manifest: Mapping[str, Any],
               columns: tuple[str, ...] | list[str]) -> dict[str, np.ndarray]:
    """Concatenate ``columns`` over all shards of a complete cache, ordered by global index.

    Before reading, every shard's size is compared with the manifest (one stat each); each shard
    read must carry the cache's identity and its row range, and every column read must match its
    hash.  Verifies that the indices are exactly 0..N-1 so rows can never be silently misaligned.
    """
    cache_dir = Path(cache_dir)
    identity = manifest["identity"]
    for shard in manifest["shards"]:
        problem = size_problem(cache_dir / shard["file"], shard)
        if problem:
            raise CacheError(f"cache {cache_dir}: shard {cache_dir / shard['file']} {problem}; "
                             f"{REPAIR}")
    names = list(dict.fromkeys(["index", *columns]))
    parts: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for shard in manifest["shards"]:
        data = read_columns(cache_dir / shard["file"], names,
                            shard_expect(identity, shard["start"], shard["stop"]), REPAIR)
        for n in names:
            parts[n].append(data[n])
    out = {n: np.concatenate(v) if v else np.zeros(0, CLASSIFIER_COLUMNS.get(n, "float32"))
           for n, v in parts.items()}
    n_rows = identity["num_rows"]
    if out["index"].shape[0] != n_rows or not np.array_equal(out["index"], np.arange(n_rows)):
        raise CacheError(f"cache {cache_dir}: shard rows are not the indices 0..{n_rows - 1}; "
                         f"{CORRUPT}")
    return out
