"""Claiming an output folder: the one way every stage takes the folder it writes.

    CLAIM = Claim(record="identity.json", marker="manifest.json", error=CacheError,
                  refused="cache directory {folder} holds a different cache", fix="...")
    state = CLAIM.take(folder, identity)     # "new", "resume" or "complete"

A folder whose record (written first) holds this identity is the stage's own: ``complete`` when
its ``marker`` file exists (or ``finished`` says so from the record), else ``resume``.  A record
of another identity is refused naming the folder, each differing attribute with both values
(``cache.schema.identity_diff``) and ``fix``.  A folder that is not empty but holds no record is
refused (``foreign``) or, where a stage allows it, taken.  A new folder gets the record at once
(``write``; None where the stage writes it later, as train-oracle's run.json).  Hidden names
(``.lock``, temporary files) do not count.  Locking is the caller's (``cache.lock.DirLock``,
taken before the claim and held through the work).  Each stage's rule is one ``Claim``:
``cache.manifest`` (extract), ``cache.runs`` (train-oracle), the attack and corrupt stages.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Mapping

from cache.atomic import read_json, write_json_atomic
from cache.schema import CacheError, identity_diff

State = Literal["new", "resume", "complete"]
Identity = Mapping[str, Any]


@dataclass(frozen=True)
class Claim:
    """How one stage claims its folder.  Messages are templates: ``{folder}``, ``{record}``
    (the record's path inside the folder) and, in ``unwritable``, ``{err}``."""
    record: str                       # the identity record's path inside the folder
    refused: str                      # first line of the refusal of another identity
    fix: str                          # its last line: what to do
    error: type[Exception] = CacheError
    mismatch: type[Exception] | None = None   # the refusal's class (default: ``error``)
    foreign: str | None = None        # refusal of a non-empty folder without a record; None: taken
    unwritable: str | None = None     # a folder that cannot be created; None: the OSError stands
    marker: str | None = None         # the file (inside the folder) whose presence means complete
    finished: Callable[[Mapping[str, Any]], bool] | None = None   # complete, as the record says
    section: str | None = None        # the record's key holding the identity (None: all of it)
    what: str = "identity record"     # the record, in the message when it cannot be read
    write: Callable[[Path, Identity], None] | None = write_json_atomic
    # the comparison (cache.schema.identity_diff); keys None: every attribute of either side
    keys: tuple[str, ...] | None = None
    found_in: str = "the folder"
    expected_in: str = "this command"
    nested: bool = True
    show: Callable[[Any], str] | None = repr
    # a found identity this code cannot read at all (another schema version): raise
    check: Callable[[Path, Identity, Identity], None] | None = None
    # more lines for a refusal, after the differing attributes: (found, expected) -> lines
    explain: Callable[[Identity, Identity], list[str]] | None = None

    def take(self, folder: Path, identity: Identity) -> State:
        """Claim ``folder`` for ``identity``: new (its record now written), resume (this
        identity's, incomplete) or complete; any other folder is refused."""
        folder = Path(folder)
        payload = self._read(folder)
        if payload is not None:
            self.refuse_other(folder, self._identity(payload), identity)
            done = ((self.marker is not None and (folder / self.marker).exists())
                    or (self.finished is not None and self.finished(payload)))
            return "complete" if done else "resume"
        if self.foreign is not None and _visible(folder):
            raise self.error(self.foreign.format(folder=folder, record=self.record))
        if self.write is not None:
            self._create(folder, identity)
        return "new"

    def found(self, folder: Path) -> dict | None:
        """The identity recorded in ``folder`` (None: no record)."""
        payload = self._read(Path(folder))
        return None if payload is None else self._identity(payload)

    def differences(self, found: Identity, identity: Identity) -> list[str]:
        """One line per differing attribute, with both values."""
        keys = self.keys if self.keys is not None else sorted(set(found) | set(identity))
        return identity_diff(found, identity, keys, self.found_in, expected_in=self.expected_in,
                             nested=self.nested, show=self.show)

    def refuse_other(self, folder: Path, found: Identity, identity: Identity) -> None:
        """Raise the refusal if ``found`` (the identity in ``folder``) is not ``identity``."""
        if self.check is not None:
            self.check(folder, found, identity)
        diffs = self.differences(found, identity)
        if diffs:
            lines = diffs + (self.explain(found, identity) if self.explain else [])
            raise (self.mismatch or self.error)(
                self.refused.format(folder=folder, record=self.record) + ":\n  "
                + "\n  ".join(lines) + (f"\n{self.fix}" if self.fix else ""))

    def _read(self, folder: Path) -> dict | None:
        path = folder / self.record
        return read_json(path, self.what) if path.exists() else None

    def _identity(self, payload: Mapping[str, Any]) -> dict:
        return dict(payload.get(self.section) or {}) if self.section else dict(payload)

    def _create(self, folder: Path, identity: Identity) -> None:
        path = folder / self.record
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.write(path, identity)
        except (PermissionError, FileExistsError, NotADirectoryError) as err:
            if self.unwritable is None:
                raise
            raise self.error(self.unwritable.format(folder=folder, record=self.record,
                                                    err=err)) from None


def _visible(folder: Path) -> bool:
    """Whether ``folder`` holds anything but hidden names (a file there: NotADirectoryError)."""
    return folder.exists() and any(not p.name.startswith(".") for p in folder.iterdir())
