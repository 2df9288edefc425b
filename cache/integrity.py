"""Checksums of cache files and the one wording of "the disk is full".

Every HDF5 file this project writes carries an XXH3-64 hash of each column's bytes in its
``xxh3_64`` attribute (computed from the arrays before writing), so every read verifies what it
returns at the cost of one hash over the bytes read.  A classifier cache's manifest records, per
shard, the file's size and XXH3-128 hash (``xxhsum -H2`` agrees with it): the size is checked
whenever the cache is opened, the hash by ``cli.py extract --verify``.  XXH3 (xxhash) rather
than zlib's CRC-32 or SHA-256 because it runs near memory speed, which keeps checking every read
and hashing every shard within a few per cent of extraction and report times (bench/NOTES.md);
the threat is damage (truncation, copies, flipped bits), not forgery.  See docs/DATA_CONTRACT.md.
"""
from __future__ import annotations

import errno
import hashlib
import re
import socket
from pathlib import Path

import numpy as np
import xxhash

from cache.schema import CacheError

# errno values meaning "no room for this file": the file system is full (ENOSPC), the user's
# quota is spent (EDQUOT) or the file would exceed a size limit (EFBIG: `ulimit -f`, FAT32)
NO_ROOM = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
           errno.EFBIG: "file size limit reached"}
# HDF5 reports failed writes inside RuntimeError/OSError messages: "..., errno = 28, ..."
_HDF5_ERRNO = re.compile(r"errno = (\d+)")
_CHUNK = 1 << 24


def column_hash(array: np.ndarray) -> str:
    """XXH3-64 (hex) of an array's bytes in C order (what HDF5 stores for an unchunked dataset)."""
    return xxhash.xxh3_64_hexdigest(memoryview(np.ascontiguousarray(array)).cast("B"))


def file_sha256(path: Path) -> str:
    """sha256 (hex) of a file's bytes, read in 16 MiB pieces: what names a weights file or an
    exported file by content."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_digest(path: Path) -> dict:
    """``{"bytes": size, "xxh3_128": hex}`` of a file, read in 16 MiB pieces."""
    h, size = xxhash.xxh3_128(), 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return {"bytes": size, "xxh3_128": h.hexdigest()}


def no_room_reason(err: BaseException) -> str | None:
    """Why ``err`` (or an exception it wraps) is a "no room to write" failure, else None.

    torch.save raises RuntimeError with the OSError as its context; h5py raises RuntimeError or
    OSError with HDF5's "errno = 28" in the text; plain writes raise OSError(ENOSPC)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        code = getattr(err, "errno", None)
        if code in NO_ROOM:
            return NO_ROOM[code]
        for match in _HDF5_ERRNO.finditer(str(err)):
            if int(match.group(1)) in NO_ROOM:
                return NO_ROOM[int(match.group(1))]
        err = err.__cause__ or err.__context__
    return None


class NoRoom(CacheError):
    """A write found no room (disk full, quota, file size limit); nothing complete was lost."""


def as_no_room(err: BaseException, where: Path, kept: str) -> NoRoom | None:
    """``err`` itself if it is a NoRoom; a NoRoom naming the file (else ``where``) if ``err`` is
    an unhandled "no room" failure (a log line, a library's own write); None otherwise."""
    if isinstance(err, NoRoom):
        return err
    reason = no_room_reason(err)
    return no_room(getattr(err, "filename", None) or where, reason, kept) if reason else None


def no_room(path: Path, reason: str, kept: str) -> NoRoom:
    """The one message for a write that found no room: what, where, what is kept, what to do."""
    return NoRoom(f"disk full while writing {path}: free space, then re-run the same command; "
                  f"{kept} ({reason})")


# errno values meaning "this process may not write here": a read-only mount, missing permission
NOT_WRITABLE = {errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
                errno.EPERM: "operation not permitted"}


class NotWritable(CacheError):
    """A directory this command must write in is read-only for it."""


def not_writable(err: BaseException, where: Path) -> NotWritable | None:
    """The one message for a write refused by the file system, else None."""
    reason = NOT_WRITABLE.get(getattr(err, "errno", None))
    if reason is None:
        return None
    # the host too: on a cluster, a folder shared by the nodes may be read-only on one of them
    return NotWritable(f"cannot write in {where} ({reason}, on host {socket.gethostname()}): "
                       "choose another --out, or make it writable there")
