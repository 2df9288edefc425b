"""HDF5 shard writer and reader for classifier caches.

A shard holds rows ``[start, stop)`` of a split, in global-index order, as contiguous (unchunked)
datasets: reads of a whole shard are sequential, and nothing is compressed (fp16 logits do not
compress; REFERENCE.md §5).  Shards are written under a temporary name and renamed, so a shard
file that exists is complete.

h5py is imported lazily and every file is closed before returning: stages load what they need
into RAM in the main process and never hold an HDF5 handle across a DataLoader fork.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from cache.schema import (CLASSIFIER_COLUMNS, CLASSIFIER_IDENTITY, CacheError, check_identity,
                          from_attr, to_attr)

SHARD_PATTERN = "shard-{:05d}.h5"


def shard_path(cache_dir: Path, shard_id: int) -> Path:
    return Path(cache_dir) / SHARD_PATTERN.format(shard_id)


def shard_ranges(num_rows: int, shard_size: int) -> list[tuple[int, int]]:
    """Row ranges of every shard: fixed boundaries, independent of GPU count or batch size."""
    return [(s, min(s + shard_size, num_rows)) for s in range(0, num_rows, shard_size)]


def write_shard(path: Path, columns: Mapping[str, np.ndarray], attrs: Mapping[str, Any]) -> None:
    """Write all ``columns`` to ``path`` atomically (temp file + rename).

    On failure (disk full, interrupt) the temporary file is removed and the error re-raised with
    the path in its message; a previously complete shard is never touched.
    """
    import h5py

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with h5py.File(tmp, "w") as fh:
            for key, value in attrs.items():
                fh.attrs[key] = to_attr(value)
            for name, array in columns.items():
                fh.create_dataset(name, data=np.ascontiguousarray(array))
            fh.flush()
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and (err.errno == errno.ENOSPC or "No space" in str(err)):
            raise CacheError(f"disk full while writing {path}: free space, then re-run the same "
                             "command; completed shards are kept and only missing ones are "
                             "computed") from err
        raise


def read_attrs(path: Path) -> dict:
    import h5py

    try:
        with h5py.File(path, "r") as fh:
            return {k: from_attr(v) for k, v in fh.attrs.items()}
    except OSError as err:
        raise CacheError(f"{path} is not a readable HDF5 file ({err}); delete it and re-run") from None


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


def read_columns(path: Path, names: tuple[str, ...] | list[str]) -> dict[str, np.ndarray]:
    import h5py

    with h5py.File(path, "r") as fh:
        missing = [n for n in names if n not in fh]
        if missing:
            raise CacheError(f"{path} has no column(s) {missing}; it holds {sorted(fh.keys())}")
        return {n: fh[n][...] for n in names}


def load_split(cache_dir: Path, manifest: Mapping[str, Any],
               columns: tuple[str, ...] | list[str]) -> dict[str, np.ndarray]:
    """Concatenate ``columns`` over all shards of a complete cache, ordered by global index.

    Verifies that the indices are exactly 0..N-1 so rows can never be silently misaligned.
    """
    names = list(dict.fromkeys(["index", *columns]))
    parts: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for shard in manifest["shards"]:
        data = read_columns(Path(cache_dir) / shard["file"], names)
        for n in names:
            parts[n].append(data[n])
    out = {n: np.concatenate(v) if v else np.zeros(0, CLASSIFIER_COLUMNS.get(n, "float32"))
           for n, v in parts.items()}
    n_rows = manifest["identity"]["num_rows"]
    if out["index"].shape[0] != n_rows or not np.array_equal(out["index"], np.arange(n_rows)):
        raise CacheError(f"cache {cache_dir}: shard rows are not the indices 0..{n_rows - 1}; "
                         "the cache is corrupt — delete it and re-run `cli.py extract`")
    return out


def read_column_into(cache_dir: Path, manifest: Mapping[str, Any], name: str,
                     out: np.ndarray) -> None:
    """Fill ``out`` (N, ...) with column ``name`` of a complete cache, shard by shard, straight
    into the rows ``[start, stop)`` of each shard (no concatenated copy: a 1.28M x 2048 feature
    column is 5 GB).  Each shard's ``index`` must be exactly its row range."""
    import h5py

    n = manifest["identity"]["num_rows"]
    if out.shape[0] != n:
        raise ValueError(f"read_column_into: out has {out.shape[0]} rows, the cache {n}")
    for shard in manifest["shards"]:
        a, b = int(shard["start"]), int(shard["stop"])
        path = Path(cache_dir) / shard["file"]
        with h5py.File(path, "r") as fh:
            if name not in fh:
                raise CacheError(f"{path} has no column {name!r}; it holds {sorted(fh.keys())}")
            if not np.array_equal(fh["index"][...], np.arange(a, b)):
                raise CacheError(f"{path}: rows are not the indices {a}..{b - 1}; the cache is "
                                 "corrupt — delete it and re-run `cli.py extract`")
            ds = fh[name]
            if ds.shape != (b - a, *out.shape[1:]) or ds.dtype != out.dtype:
                raise CacheError(f"{path}: column {name!r} is {ds.dtype} {ds.shape}, expected "
                                 f"{out.dtype} {(b - a, *out.shape[1:])}")
            if b > a:
                ds.read_direct(out, dest_sel=np.s_[a:b])
