"""The reader API later stages use: a complete classifier cache, checked, loaded into RAM.

    cache = ClassifierCache.open(cache_dir, expect={"dataset_fingerprint": fp})
    targets = cache.load(["correct", "p_true", "label"])    # numpy arrays ordered by index

Everything is read in the calling (main) process and every HDF5 file is closed again before
returning, so DataLoader workers forked afterwards inherit no HDF5 state.
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from cache.manifest import load_manifest
from cache.schema import KIND_CLASSIFIER, SCHEMA_VERSION, CacheError, check_identity
from cache.columns import load_columns
from cache.shards import REPAIR, load_split, shard_problem, size_problem


class UnverifiedCacheWarning(UserWarning):
    """A cache written before per-shard checksums: readable, but its files cannot be verified."""


class UnstampedCacheWarning(UnverifiedCacheWarning):
    """A cache written before image stamps: readable, but changed images cannot be found."""


_NOTED: set[str] = set()


def note_once(key: str, message: str, category: type[UserWarning] = UnverifiedCacheWarning) -> None:
    """``message`` as a note (cli.py prints these as ``note: ...``), once per process and key."""
    if key not in _NOTED:
        _NOTED.add(key)
        warnings.warn(message, category, stacklevel=3)


def slug(text: str) -> str:
    """File-system-safe name for a model or dataset ("vit_base_patch16_384.orig_in21k" -> same)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "x"


def split_tag(split: str, corruption: str | None = None, severity: int | None = None) -> str:
    """Directory/file name of a (split, corruption) pair: ``val`` or ``val-defocus_blur-5``."""
    return split if not corruption or corruption == "none" else f"{split}-{corruption}-{severity}"


def cache_dir_for(cache_root: Path, classifier: str, tag: str) -> Path:
    """Where ``extract`` writes, and later stages look for, one classifier's cache of a split."""
    return Path(cache_root) / slug(classifier) / tag


@dataclass(frozen=True)
class ClassifierCache:
    path: Path
    manifest: dict

    @property
    def identity(self) -> dict:
        return self.manifest["identity"]

    @property
    def num_rows(self) -> int:
        return int(self.identity["num_rows"])

    @classmethod
    def open(cls, path: Path, expect: Mapping[str, Any] | None = None,
             hint: str = "") -> "ClassifierCache":
        """Open a complete cache; refuse another schema version or any ``expect`` mismatch."""
        path = Path(path)
        manifest = load_manifest(path)
        ident = manifest.get("identity", {})
        check_identity(ident, {"schema_version": SCHEMA_VERSION, "kind": KIND_CLASSIFIER,
                               **(expect or {})}, f"cache {path}", hint=hint)
        cache = cls(path, manifest)
        for shard in manifest["shards"]:  # the cheap check: one stat per shard
            problem = size_problem(path / shard["file"], shard)
            if problem:
                raise CacheError(f"cache {path}: shard {path / shard['file']} {problem}; {REPAIR}")
        if not cache.has_checksums:
            note_once(str(path.resolve()), f"cache {path} was written before per-shard checksums: "
                      "its shards are checked for identity and row order but not for damage; "
                      "re-run the same `cli.py extract` command once to check them and record "
                      "checksums")
        return cache

    @property
    def has_checksums(self) -> bool:
        """True if the manifest records every shard's size and file hash (caches written since)."""
        return all("xxh3_128" in s for s in self.manifest["shards"])

    def problems(self, full: bool = False) -> dict[str, str]:
        """{shard file: what is wrong} (cache.shards.shard_problem); empty when sound."""
        out = {}
        for shard in self.manifest["shards"]:
            problem = shard_problem(self.path / shard["file"], shard, self.identity, full)
            if problem:
                out[shard["file"]] = problem
        return out

    def load(self, columns: list[str] | tuple[str, ...]) -> dict[str, np.ndarray]:
        missing = [c for c in columns if c not in self.manifest["columns"]]
        if missing:
            raise CacheError(f"cache {self.path} has no column(s) {missing} (it was extracted "
                             f"without them; it has {self.manifest['columns']}). Re-extract with "
                             "--flip-view / --features as needed.")
        try:
            return load_columns(self.path, self.manifest, columns)
        except CacheError:      # load_split's checks name what is wrong (or raise the same)
            return load_split(self.path, self.manifest, columns)

    def bad_rows(self) -> list[dict]:
        return list(self.manifest.get("bad_rows", []))
