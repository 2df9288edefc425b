"""The reader API later stages use: a complete classifier cache, checked, loaded into RAM.

    cache = ClassifierCache.open(cache_dir, expect={"dataset_fingerprint": fp})
    targets = cache.load(["correct", "p_true", "label"])    # numpy arrays ordered by index

Everything is read in the calling (main) process and every HDF5 file is closed again before
returning, so DataLoader workers forked afterwards inherit no HDF5 state.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from cache.manifest import load_manifest
from cache.schema import KIND_CLASSIFIER, SCHEMA_VERSION, CacheError, check_identity
from cache.shards import load_split


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
        return cls(path, manifest)

    def load(self, columns: list[str] | tuple[str, ...]) -> dict[str, np.ndarray]:
        missing = [c for c in columns if c not in self.manifest["columns"]]
        if missing:
            raise CacheError(f"cache {self.path} has no column(s) {missing} (it was extracted "
                             f"without them; it has {self.manifest['columns']}). Re-extract with "
                             "--flip-view / --features as needed.")
        return load_split(self.path, self.manifest, columns)

    def bad_rows(self) -> list[dict]:
        return list(self.manifest.get("bad_rows", []))
