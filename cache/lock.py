"""``DIR/.lock``: one writing process per cache or run directory.

Taken by the process (rank 0) that writes a classifier cache (``cli.py extract``) or trains or
scores a run, so two launches of the same settings never write into one directory at once (the
second would redo all the work and delete the first one's temporary files).  A lock left by a
process that no longer runs on this host is taken over; one of another host (a folder shared by
the nodes of a cluster) never is: this host cannot see that process, and the message names it.
The lock is a hard link to a file that already names its owner (``os.link`` fails if the lock
exists: atomic on local, NFS and cluster file systems), else a file created with O_EXCL; no
``flock``, which network file systems may ignore.
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from cache.integrity import not_writable
from cache.schema import CacheError

LOCK_FILE = ".lock"


class DirLock:
    """Context manager holding ``directory/.lock``; ``error`` is the exception class raised when
    another live process holds it (its message names the owner and how to clear a stale lock)."""

    error: type[Exception] = CacheError

    def __init__(self, directory: Path, enabled: bool = True):
        self.path, self.enabled = Path(directory) / LOCK_FILE, enabled

    def __enter__(self):
        if not self.enabled:
            return self
        try:
            return self._take()
        except OSError as err:      # a read-only mount or folder: one message, no traceback
            refused = not_writable(err, self.path.parent)
            if refused is None:
                raise
            # a run's lock raises its own error class (handled like a busy lock)
            raise (refused if self.error is CacheError else self.error(str(refused))) from None

    def _take(self):
        me = {"pid": os.getpid(), "host": socket.gethostname()}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # The lock appears with its owner already written: a hard link of a file holding it
        # (atomic, and NFS-safe), so a process refused at that instant can name the owner.
        # Where the file system has no hard links, the file is created with O_EXCL, then written.
        mine = self.path.with_name(f"{LOCK_FILE}.{me['host']}.{me['pid']}")
        mine.write_text(json.dumps(me))
        try:
            for _ in range(2):
                try:
                    self._create(mine, me)
                    return self
                except FileExistsError:
                    if not self._stale():
                        raise self.error(f"{self.path.parent} is in use by another process "
                                         f"({self._owner_text()}); wait for it, or delete "
                                         f"{self.path} if that process is gone") from None
                    self.path.unlink(missing_ok=True)   # a stale lock (its unlink may be refused)
        finally:
            mine.unlink(missing_ok=True)
        raise self.error(f"could not take {self.path}")

    def _create(self, written: Path, me: dict) -> None:
        """``.lock`` created holding ``me`` (FileExistsError when another process holds it)."""
        try:
            os.link(written, self.path)
        except FileExistsError:
            raise
        except OSError:       # no hard links here (FAT, some SMB shares)
            with open(self.path, "x") as fh:
                json.dump(me, fh)

    def _owner_text(self) -> str:
        """Who holds the lock: its pid and host, and, for another host, why it is not taken
        over (a shared folder: whether that process still runs cannot be seen from here)."""
        try:
            owner = json.loads(self.path.read_text())
            text = f"pid {owner['pid']} on host {owner['host']}"
        except (OSError, ValueError, KeyError, TypeError):
            return "unknown owner"
        if owner["host"] != socket.gethostname():
            text += (f"; another host than this one ({socket.gethostname()}), which cannot "
                     "tell whether it still runs, so the lock is never taken over from here")
        return text

    def _stale(self) -> bool:
        try:
            owner = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return False          # being written right now
        if owner.get("host") != socket.gethostname():
            return False          # cannot tell from here
        try:
            os.kill(int(owner["pid"]), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def __exit__(self, *exc):
        if self.enabled:
            self.path.unlink(missing_ok=True)
        return False
