"""Whole columns of a complete classifier cache, read shard by shard by threads and verified.

``read_columns_into`` fills whole columns (ImageNet's 1.28M x 768 fp16 features: 2 GB a view)
without a concatenated copy and without h5py's one lock: each shard's dataset is read as the bytes
at its offset in the file (the contiguous, unfiltered datasets ``shards.write_shard`` writes), by
``READ_THREADS`` threads at once, which copy from the page cache several times faster than h5py
(bench/NOTES.md, "Head-only runs and sweeps").  Every shard is checked first (the column's
shape and dtype) and what is read is checked against the XXH3-64 checksum the manifest records
for that shard's column (``_locate``).  A chunked or filtered dataset (another writer's layout)
is read through h5py.

Where the bytes go is the ``ColumnSink``'s: ``ArraySink`` is a C-contiguous numpy array, read into
in place; a sink may instead hand out staging buffers and move each piece on (the head-only
features go to the GPU through pinned buffers this way: ``pipeline.oracle.headonly.staging``),
so the column never needs a host copy of its own.  A shard is read in pieces of at most
``PIECE_BYTES`` and hashed as it streams; a damaged shard raises ``CacheError`` once all of it
was read, so a sink's contents are only valid once ``read_columns_into`` returns.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping, Protocol

import numpy as np
import xxhash

from cache.schema import CacheError, from_attr
from cache.shards import CORRUPT, HASHES, check_column

READ_THREADS = 16           # shards read at once (page-cache copies run in parallel)
BYTES_A_THREAD = 64 << 20   # fewer threads for less: h5py's calls hold one lock, and small
                            # columns cost those calls more than their copies (410 shards of
                            # ImageNet's targets read faster by one thread than by sixteen)
PIECE_BYTES = 8 << 20       # the most a sink's buffer holds at once


class ColumnSink(Protocol):
    """Where a column's bytes go.  ``rows``, ``row_shape``, ``dtype``: the whole column's.
    ``buffer(at, size)``: a writable buffer of ``size`` bytes for the column's bytes
    ``[at, at + size)``; ``put(at, buf)``: it is filled.  Called from the reading threads, one
    piece at a time per thread (a thread asks for its next buffer after its last ``put``)."""
    rows: int
    row_shape: tuple[int, ...]
    dtype: np.dtype

    def buffer(self, at: int, size: int) -> memoryview: ...
    def put(self, at: int, buf: memoryview) -> None: ...


class ArraySink:
    """A C-contiguous numpy array (N, ...), read into in place."""

    def __init__(self, out: np.ndarray):
        if not out.flags.c_contiguous:
            raise ValueError(f"read_column_into: out {out.shape} is not C-contiguous")
        self.rows, self.row_shape, self.dtype = out.shape[0], out.shape[1:], out.dtype
        self.flat = memoryview(out).cast("B")

    def buffer(self, at: int, size: int) -> memoryview:
        return self.flat[at:at + size]

    def put(self, at: int, buf: memoryview) -> None:
        """The bytes are in place already."""


def read_column_into(cache_dir: Path, manifest: Mapping[str, Any], name: str,
                     out: np.ndarray | ColumnSink, threads: int = READ_THREADS) -> None:
    """Column ``name`` of a complete cache into ``out`` (``read_columns_into`` of one column)."""
    read_columns_into(cache_dir, manifest, {name: out}, threads)


def read_columns_into(cache_dir: Path, manifest: Mapping[str, Any],
                      outs: Mapping[str, np.ndarray | ColumnSink],
                      threads: int = READ_THREADS) -> None:
    """Columns of a complete cache (every row, in order), each into its ``outs`` entry: an
    (N, ...) C-contiguous array or a ``ColumnSink`` (module docstring); each shard is opened
    once for all of them.  Raises ``CacheError`` naming the shard if a column is missing, of
    another shape or dtype, or not what its checksum says."""
    sinks = {name: ArraySink(o) if isinstance(o, np.ndarray) else o for name, o in outs.items()}
    n = manifest["identity"]["num_rows"]
    for name, sink in sinks.items():
        if sink.rows != n:
            raise ValueError(f"read_column_into: {name}: out has {sink.rows} rows, expected {n}")
    ends = [0] + [x for s in manifest["shards"] for x in (int(s["start"]), int(s["stop"]))] + [n]
    if ends[::2] != ends[1::2]:         # every row in exactly one shard, in order
        raise CacheError(f"cache {cache_dir}: its manifest's shards do not cover the rows "
                         f"0..{n - 1} in order; {CORRUPT}")
    jobs = [s for s in manifest["shards"] if int(s["stop"]) > int(s["start"])]
    if not jobs or not sinks:
        return
    size = sum(n * _row_bytes(sink) for sink in sinks.values())
    with ThreadPoolExecutor(max(1, min(threads, len(jobs), size // BYTES_A_THREAD))) as pool:
        list(pool.map(lambda entry: _read_shard(Path(cache_dir), entry, sinks), jobs))


def load_columns(cache_dir: Path, manifest: Mapping[str, Any],
                 names: list[str] | tuple[str, ...]) -> dict[str, np.ndarray]:
    """``names`` and ``index`` over every row of a complete cache, each one array, read by
    ``read_columns_into`` (shapes and dtypes from the first shard); ``index`` must be 0..N-1."""
    import h5py

    names = list(dict.fromkeys(["index", *names]))
    n, shards = manifest["identity"]["num_rows"], manifest["shards"]
    if not shards:
        raise CacheError(f"cache {cache_dir}: its manifest lists no shards; {CORRUPT}")
    path = Path(cache_dir) / shards[0]["file"]
    try:
        fid = h5py.h5f.open(str(path).encode(), h5py.h5f.ACC_RDONLY)
    except OSError as err:
        raise CacheError(f"{path} is damaged: HDF5 cannot open it ({err}); {CORRUPT}") from None
    try:
        out = {}
        for name in names:
            try:
                ds = h5py.h5d.open(fid, name.encode())
            except KeyError:
                raise CacheError(f"{path} has no column {name!r}; {CORRUPT}") from None
            out[name] = np.empty((n, *ds.shape[1:]), ds.dtype)
    finally:
        fid.close()
    read_columns_into(cache_dir, manifest, out)
    if not np.array_equal(out["index"], np.arange(n)):
        raise CacheError(f"cache {cache_dir}: shard rows are not the indices 0..{n - 1}; {CORRUPT}")
    return out


def _read_shard(cache_dir: Path, entry: Mapping[str, Any],
                sinks: Mapping[str, ColumnSink]) -> None:
    """One shard's rows of every column in ``sinks``, checked (``_locate``)."""
    path, a, b = cache_dir / entry["file"], int(entry["start"]), int(entry["stop"])
    for name, (offset, expected, data) in _locate(path, a, b, entry, sinks).items():
        row_bytes = _row_bytes(sinks[name])
        start, total = a * row_bytes, (b - a) * row_bytes
        digest = xxhash.xxh3_64() if expected is not None else None
        with open(path, "rb", buffering=0) as fh:
            for at in range(0, total, PIECE_BYTES):
                size = min(PIECE_BYTES, total - at)
                buf = sinks[name].buffer(start + at, size)
                if data is not None:                # read through h5py
                    buf[:] = data[at:at + size]
                else:
                    fh.seek(offset + at)
                    _read_fully(fh, buf, path, name)
                if digest is not None:
                    digest.update(buf)
                sinks[name].put(start + at, buf)
        if digest is not None:
            check_column(path, name, digest.hexdigest(), expected, CORRUPT)


def _locate(path: Path, a: int, b: int, entry: Mapping[str, Any],
            sinks: Mapping[str, ColumnSink]) -> dict[str, tuple]:
    """Per column: its byte offset in shard ``path``, its checksum, and, for a layout that cannot
    be read at an offset, its bytes read through h5py (else None).  The file is the one the
    manifest recorded at this place: its own checksums of EVERY column (one attribute) must be
    the manifest's for this shard, so a shard file swapped for another, or copied in from
    another cache, is refused even where the columns read coincide (a model's `valid` column);
    the bytes read are then checked against that checksum.  A manifest without them (a cache
    written before it recorded them) falls back to the file's own checksums and its ``index``
    checked against the rows ``[a, b)``.  Through h5py's low-level API where it can: its File
    objects cost ~1 ms a shard, ImageNet has 410."""
    import h5py

    recorded = entry.get(HASHES) or {}
    out = {}
    try:
        fid = h5py.h5f.open(str(path).encode(), h5py.h5f.ACC_RDONLY)
    except OSError as err:
        raise CacheError(f"{path} is damaged: HDF5 cannot open it ({err}); {CORRUPT}") from None
    try:
        if recorded and _own_hashes(fid) != recorded:
            raise CacheError(f"{path} is not the shard the manifest records here (its columns' "
                             f"checksums differ); {CORRUPT}")
        for name, sink in sinks.items():
            try:
                ds = h5py.h5d.open(fid, name.encode())
            except KeyError:
                raise CacheError(f"{path} has no column {name!r}; {CORRUPT}") from None
            if ds.shape != (b - a, *sink.row_shape) or ds.dtype != sink.dtype:
                raise CacheError(f"{path}: column {name!r} is {ds.dtype} {ds.shape}, expected "
                                 f"{sink.dtype} {(b - a, *sink.row_shape)}")
            plist = ds.get_create_plist()
            offset = (ds.get_offset() if plist.get_layout() == h5py.h5d.CONTIGUOUS
                      and plist.get_nfilters() == 0 else None)
            data = None
            if offset is None:                      # another writer's layout: h5py reads it
                data = np.empty(ds.shape, ds.dtype)
                ds.read(h5py.h5s.ALL, h5py.h5s.ALL, data)
                data = memoryview(data).cast("B")
            out[name] = [offset, recorded.get(name), data]
    finally:
        fid.close()
    if any(name not in recorded for name in sinks):
        _check_rows_and_hashes(path, a, b, out)
    return {name: tuple(v) for name, v in out.items()}


def _own_hashes(fid) -> dict | None:
    """The shard's own ``xxh3_64`` attribute (its columns' checksums), or None."""
    import h5py

    if not h5py.h5a.exists(fid, HASHES.encode()):
        return None
    attr = h5py.h5a.open(fid, HASHES.encode())
    value = np.empty(attr.shape, attr.dtype)
    attr.read(value)
    return from_attr(value.item())


def _check_rows_and_hashes(path: Path, a: int, b: int, found: dict[str, list]) -> None:
    """The fallback of ``_locate``: the file's ``index`` is its rows, its own checksums used."""
    import h5py

    with h5py.File(path, "r") as fh:
        if not np.array_equal(fh["index"][...], np.arange(a, b)):
            raise CacheError(f"{path}: rows are not the indices {a}..{b - 1}; {CORRUPT}")
        own = from_attr(fh.attrs[HASHES]) if HASHES in fh.attrs else {}
    for name, item in found.items():
        if item[1] is None:
            item[1] = own.get(name)


def _row_bytes(sink: ColumnSink) -> int:
    return int(np.prod(sink.row_shape, dtype=np.int64)) * np.dtype(sink.dtype).itemsize


def _read_fully(fh, buf: memoryview, path: Path, name: str) -> None:
    done = 0
    while done < len(buf):
        got = fh.readinto(buf[done:])
        if not got:
            raise CacheError(f"{path} is damaged: column {name!r} ends early; {CORRUPT}")
        done += got
