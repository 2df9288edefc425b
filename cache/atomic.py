"""Writing a file so that nobody reads half of it: under a hidden temporary name beside it, then
renamed over it (``os.replace``, atomic on one file system).  Every writer of the project goes
through here, so a file that exists is complete and the previous version survives a failed write.

    with atomic_file(path, "w", kept="the previous file is kept") as fh:   # a file object
        json.dump(doc, fh)
    with atomic_path(path, suffix=".npz") as tmp:                          # a library names it
        np.savez(tmp, **arrays)

The temporary name is ``.<name>.tmp-<pid><suffix>``: hidden (listings skip it), one per process
(two processes never write the same one), ``suffix`` for the libraries that choose the format by
the file's extension (numpy's ``.npz``, matplotlib's ``.png``).  On any failure it is removed;
with ``kept`` (what the failure leaves intact, as the message says it), a failure for lack of
room is re-raised as ``cache.integrity``'s one "disk full" error.  ``write_json_atomic`` writes a
JSON document that way (sorted keys, indented, one trailing newline: the format of every JSON
record of caches and runs); ``read_json`` reads one back, a missing or damaged file refused with
one clear ``CacheError``.
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterator, Mapping

from cache.integrity import no_room, no_room_reason
from cache.schema import CacheError, canonical


def temp_name(path: Path, suffix: str = "") -> Path:
    """The temporary file ``path`` is written under."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}{suffix}")


def temp_files(path: Path) -> list[Path]:
    """The temporary files of ``path`` of every process: what an interrupted write left."""
    return sorted(path.parent.glob(f".{path.name}.tmp-*"))


@contextmanager
def atomic_path(path: Path | str, *, suffix: str = "", durable: bool = True,
                kept: str | None = None) -> Iterator[Path]:
    """Yields the temporary path to write; renamed over ``path`` when the block ends without an
    error.  ``durable``: its bytes are on disk (fsync) before the rename, so a crash leaves the
    old file or the new one, never an empty one under the final name."""
    path = Path(path)
    tmp = temp_name(path, suffix)
    try:
        yield tmp
        if durable:
            _fsync(tmp)
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        reason = no_room_reason(err) if kept is not None else None
        if reason:
            raise no_room(path, reason, kept) from None
        raise


@contextmanager
def atomic_file(path: Path | str, mode: str = "wb", *, kept: str | None = None,
                **open_args) -> Iterator[IO]:
    """``atomic_path`` for a writer that takes a file object: yields the open temporary file,
    flushed and fsynced through its own handle before the rename."""
    with atomic_path(path, durable=False, kept=kept) as tmp:
        with open(tmp, mode, **open_args) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())


def write_json_atomic(path: Path, payload: Mapping[str, Any]) -> None:
    """Write to a temporary name, fsync, then rename: readers never see half a file.  On any
    failure (disk full, interrupt) the temporary file is removed and nothing else changes."""
    path = Path(path)
    with atomic_file(path, "w", kept=f"{path.name} is unchanged and everything complete "
                     "is kept") as fh:
        json.dump(canonical(payload), fh, indent=2, sort_keys=True)
        fh.write("\n")


def read_json(path: Path, what: str) -> dict:
    try:
        with open(path) as fh:
            return json.load(fh)
    except FileNotFoundError:
        raise CacheError(f"{what} not found: {path}") from None
    except (OSError, json.JSONDecodeError) as err:
        raise CacheError(f"{what} {path} is unreadable ({err}); delete it and re-run") from None


def _fsync(path: Path) -> None:
    """fsync a file some library wrote and closed (a read-only descriptor flushes it too)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
