"""What a cache's rows were computed from: each image file's stamp and content hash.

The dataset fingerprint hashes paths and labels only, so an image replaced under the same name
would leave a cache's logits and trust labels describing pixels that are gone.  Each shard
therefore records, per row, the XXH3-128 hash of the image file's bytes (column
``source_xxh3``), computed in the loader worker from the bytes it decodes (no extra read), and
one digest of the rows' stamps, (size, mtime_ns) of each file (attribute and manifest key
``source_stamp``).  Every stage that uses a cache with ``--data`` compares the stamps (one
``stat`` per file); only the files of a shard whose stamps differ are hashed again (no decode),
and ``extract --verify`` hashes them all.  Idx rows (Fashion-MNIST) are in memory: their stamp
is their content hash, so the cheap check is the exact one.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import xxhash

from cache.integrity import column_hash
from cache.schema import SOURCE_HASH_COLUMN, SOURCE_STAMP
from cache.shards import read_columns, read_attrs, shard_path
from pipeline.data.sources import SampleList

UNREADABLE = bytes(16)   # the hash recorded for a file that cannot be read (a --skip-bad row)


def read_stamped(path: Path) -> tuple[bytearray, tuple[int, int, bytes]]:
    """A file's bytes and its (size, mtime_ns, XXH3-128 digest), both from one open."""
    with open(path, "rb") as fh:
        st = os.fstat(fh.fileno())
        data = bytearray(st.st_size)
        n = fh.readinto(data)
        del data[n:]
    return data, (st.st_size, st.st_mtime_ns, xxhash.xxh3_128_digest(data))


class SourceRecorder:
    """(size, mtime_ns, hash) of every row a loader worker reads, in memory shared with the main
    process: created before the workers fork, read by the sink when a shard is full."""

    def __init__(self, num_rows: int):
        self.table = torch.zeros((num_rows, 4), dtype=torch.int64).share_memory_()
        self.rows_ = self.table.numpy()     # the same shared memory, cheaper to write per row

    def record(self, row: int, stamp: tuple[int, int, bytes]) -> None:
        size, mtime, digest = stamp
        self.rows_[row, :2] = size, mtime
        self.rows_[row, 2:] = np.frombuffer(digest, "<i8")

    def record_unreadable(self, row: int, path: Path) -> None:
        try:
            st = os.stat(path)
            self.record(row, (st.st_size, st.st_mtime_ns, UNREADABLE))
        except OSError:
            self.record(row, (-1, -1, UNREADABLE))

    def rows(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        part = self.rows_[start:stop]
        return part[:, :2].copy(), np.ascontiguousarray(part[:, 2:]).view(np.uint8)


def idx_hashes(samples: SampleList, start: int, stop: int) -> np.ndarray:
    """(n, 16) uint8: XXH3-128 of each idx row's pixels."""
    return np.frombuffer(b"".join(xxhash.xxh3_128_digest(np.ascontiguousarray(r))
                                  for r in samples.idx_images[start:stop]),
                         np.uint8).reshape(-1, 16).copy()


def shard_sources(samples: SampleList, recorder: SourceRecorder | None, start: int,
                  stop: int) -> tuple[dict, dict]:
    """The column and attribute a shard of rows [start, stop) records about its sources."""
    if samples.idx_images is not None:
        hashes = idx_hashes(samples, start, stop)
        stats = hashes.view("<i8")
    else:
        stats, hashes = recorder.rows(start, stop)
    return {SOURCE_HASH_COLUMN: hashes}, {SOURCE_STAMP: column_hash(stats)}


def current_stats(samples: SampleList, start: int, stop: int) -> np.ndarray:
    """(n, 2) int64 (size, mtime_ns) of the files now (idx: the rows' hashes)."""
    if samples.idx_images is not None:
        return idx_hashes(samples, start, stop).view("<i8")
    base, out = str(samples.folder), np.empty((stop - start, 2), np.int64)
    for k, name in enumerate(samples.names[start:stop]):   # plain strings: ~8 us a file
        try:
            st = os.stat(os.path.join(base, name))
            out[k] = st.st_size, st.st_mtime_ns
        except OSError:
            out[k] = -1, -1
    return out


def current_hashes(samples: SampleList, start: int, stop: int) -> np.ndarray:
    """(n, 16) uint8 XXH3-128 of the files' bytes now (read, not decoded)."""
    if samples.idx_images is not None:
        return idx_hashes(samples, start, stop)
    out = np.empty((stop - start, 16), np.uint8)
    for k, i in enumerate(range(start, stop)):
        try:
            out[k] = np.frombuffer(read_stamped(samples.path(i))[1][2], np.uint8)
        except OSError:
            out[k] = np.frombuffer(UNREADABLE, np.uint8)
    return out


@dataclass
class SourceCheck:
    """What the files of ``--data`` say about a cache's shards (by shard number)."""
    changed: dict[int, np.ndarray] = field(default_factory=dict)  # rows whose content changed
    restamp: dict[int, str] = field(default_factory=dict)   # new stamps, content unchanged
    unstamped: list[int] = field(default_factory=list)      # shards written before stamps

    @property
    def changed_rows(self) -> np.ndarray:
        return np.concatenate(list(self.changed.values())) if self.changed else np.zeros(0, int)

    def changed_text(self, samples: SampleList, limit: int = 3) -> str:
        rows = self.changed_rows
        shown = ", ".join(str(samples.path(int(i))) for i in rows[:limit])
        return f"{len(rows)} image(s) ({shown}{', ...' if len(rows) > limit else ''})"


def check_sources(cache_dir: Path, shards: list[dict], samples: SampleList,
                  full: bool = False) -> SourceCheck:
    """Compare each shard's recorded sources with the files now.  ``shards``: manifest entries
    (or, for an unfinished cache, the same keys read from the shards present).  Cheap: one stat
    per file; a shard whose stamps differ has its files hashed (no decode) and compared with
    the hashes it records.  ``full`` (``extract --verify``): every file is hashed."""
    found = SourceCheck()
    for entry in shards:
        s, a, b = int(Path(entry["file"]).stem.split("-")[1]), entry["start"], entry["stop"]
        recorded = entry.get(SOURCE_STAMP)
        if recorded is None:
            found.unstamped.append(s)
            continue
        stamp = column_hash(current_stats(samples, a, b))
        if stamp == recorded and not full:
            continue
        hashes = read_columns(Path(cache_dir) / entry["file"], [SOURCE_HASH_COLUMN])
        differs = (hashes[SOURCE_HASH_COLUMN] != current_hashes(samples, a, b)).any(axis=1)
        if differs.any():
            found.changed[s] = np.flatnonzero(differs) + a
        elif stamp != recorded:
            found.restamp[s] = stamp
    return found


def present_shards(cache_dir: Path, ranges: list[tuple[int, int]]) -> list[dict]:
    """Entries like a manifest's for the shards of an unfinished cache that exist."""
    out = []
    for s, (a, b) in enumerate(ranges):
        path = shard_path(cache_dir, s)
        if path.exists():
            attrs = read_attrs(path)
            out.append({"file": path.name, "start": a, "stop": b,
                        **({SOURCE_STAMP: attrs[SOURCE_STAMP]} if SOURCE_STAMP in attrs else {})})
    return out
