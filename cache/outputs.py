"""Oracle output files: one HDF5 file per evaluated split in a run directory.

Rows are aligned by global index with the classifier cache of the same split; the file's
attributes carry that cache's identity (fingerprint, model, weights hash) so a report can refuse
outputs that belong to another cache, and what made the scores (``MadeOn``: device and precision).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from cache.schema import (KIND_ORACLE, ORACLE_COLUMNS, ORACLE_PATH_COLUMN, ORACLE_PATH_ROOT,
                          SCHEMA_VERSION, CacheError, CacheMismatch, check_identity)
from cache.integrity import file_digest
from cache.reader import UnverifiedCacheWarning
from cache.shards import HASHES, read_attrs, read_columns, write_shard

MADE_ON = "made_on"     # the attribute (and run.json key) holding a MadeOn record


class OtherDeviceNote(UnverifiedCacheWarning):
    """Scores made on another device or in another precision than a run's stored ones: they
    differ from them (cli.py prints it as a note)."""


@dataclass(frozen=True)
class MadeOn:
    """What computed stored scores: the device and the precision of the forward passes that made
    them.  Scores made on another device or in another precision differ in their last bits or
    more (docs/METRICS.md, "Scores on another device"); made on the same, they are the same.

    Attributes
    ----------
    device : str
        cpu or cuda ("" where not recorded).
    name : str
        The GPU's name or the CPU's model.
    isa : str
        The vector instructions torch's CPU kernels use (AVX512, AVX2, ...; "" on a GPU).
    precision : str
        bf16, fp16 or fp32.
    inputs : str
        "images", or "cached features" for a head-only run's own scores, whose features were
        made on the device and in the precision named here (the feature cache's; the head then
        runs in float32).
    """
    device: str
    name: str
    isa: str
    precision: str
    inputs: str = "images"

    def to_dict(self) -> dict[str, str]:
        """The record an output file stores.

        Returns
        -------
        dict of str to str
            {"device", "name", "isa", "precision", "inputs"}.
        """
        return {"device": self.device, "name": self.name, "isa": self.isa,
                "precision": self.precision, "inputs": self.inputs}

    @classmethod
    def from_dict(cls, record: Mapping[str, Any] | None) -> "MadeOn | None":
        """The inverse of ``to_dict``.

        Parameters
        ----------
        record : mapping, optional
            A stored record; missing keys read as "" ("images" for ``inputs``).

        Returns
        -------
        MadeOn or None
            None for no record (files written without one).
        """
        if not record:
            return None
        return cls(str(record.get("device") or ""), str(record.get("name") or ""),
                   str(record.get("isa") or ""), str(record.get("precision") or ""),
                   str(record.get("inputs") or "images"))

    @property
    def known(self) -> bool:
        """Whether the device and the precision are recorded."""
        return bool(self.device and self.precision)

    def describe(self) -> str:
        """A line for a message.

        Returns
        -------
        str
            e.g. ``cuda (NVIDIA H200) at bf16`` or ``cpu (AMD EPYC 9654, AVX512) at fp32``.
        """
        what = ", ".join(x for x in (self.name, self.isa) if x)
        return f"{self.device or 'an unrecorded device'}" + (f" ({what})" if what else "") + \
            f" at {self.precision or 'an unrecorded precision'}"

    def same_numerics(self, other: "MadeOn") -> bool:
        """Whether both ran the same kernels on the same numbers: the same kind of device (the
        same GPU model; CPUs with the same vector instructions) and the same precision.

        Parameters
        ----------
        other : MadeOn

        Returns
        -------
        bool
        """
        if self.device != other.device or self.precision != other.precision:
            return False
        return self.name == other.name if self.device == "cuda" else self.isa == other.isa


# How a row of an idx array is named (pipeline/data/sources.py: "<idx file>[row]"): no file.
IDX_ROW = re.compile(r"-idx\d-ubyte(\.gz)?\[\d+\]$")

REWRITE = ("re-run the command that wrote it (the same `cli.py train-oracle` or `cli.py "
           "predict`): it recomputes the outputs with the kept oracle")


def classifier_ref(cache_path: Path, identity: Mapping[str, Any]) -> dict:
    """The part of a classifier cache's identity an oracle output file records and is checked on."""
    keys = ("model", "weights_sha256", "dataset_fingerprint", "split", "corruption", "num_rows",
            "num_classes", "preprocess")
    return {"path": str(Path(cache_path).resolve()), **{k: identity[k] for k in keys}}


def write_outputs(path: Path, columns: Mapping[str, np.ndarray], classifier: Mapping[str, Any],
                  run: Mapping[str, Any], made_on: MadeOn,
                  sources: tuple[str, Sequence[str]] | None = None) -> None:
    """Write one split's oracle outputs.  ``classifier`` = classifier_ref(...); ``run`` = the
    run's labels/config (oracle, classifier, loss, seed, ...), stored for self-contained reports;
    ``made_on``: the device and precision that made the scores; ``sources`` = (folder, each row's
    file relative to it): the ``path`` column, so scores map back to image files without the
    dataset listing (None for rows that are no files: idx arrays)."""
    missing = [c for c in ORACLE_COLUMNS if c not in columns]
    if missing:
        raise ValueError(f"oracle outputs for {path} lack column(s) {missing}")
    n = len(columns["index"])
    if n != classifier["num_rows"] or not np.array_equal(columns["index"], np.arange(n)):
        raise CacheError(f"{path}: oracle rows must be the classifier cache's indices "
                         f"0..{classifier['num_rows'] - 1}, in order")
    attrs = {"schema_version": SCHEMA_VERSION, "kind": KIND_ORACLE, "split": classifier["split"],
             "corruption": classifier["corruption"],
             "dataset_fingerprint": classifier["dataset_fingerprint"], "num_rows": n,
             "classifier_cache": dict(classifier), "run": dict(run), MADE_ON: made_on.to_dict()}
    arrays = {c: np.asarray(columns[c], ORACLE_COLUMNS[c]) for c in ORACLE_COLUMNS}
    if sources is not None:
        root, names = sources
        if len(names) != n:
            raise CacheError(f"{path}: {len(names)} file names for {n} rows")
        attrs[ORACLE_PATH_ROOT] = str(root)
        arrays[ORACLE_PATH_COLUMN] = np.array([s.encode("utf-8", "surrogateescape")
                                               for s in names], dtype=bytes)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_shard(path, arrays, attrs, kept="the trained oracle and its checkpoints are kept")


@dataclass(frozen=True)
class OracleOutputs:
    path: Path
    attrs: dict
    columns: dict[str, np.ndarray]

    @property
    def run(self) -> dict:
        return self.attrs["run"]

    @property
    def classifier(self) -> dict:
        return self.attrs["classifier_cache"]

    @property
    def made_on(self) -> MadeOn | None:
        """What made the scores (None: a file written before it was recorded)."""
        return MadeOn.from_dict(self.attrs.get(MADE_ON))


def read_outputs(path: Path, expect_classifier: Mapping[str, Any] | None = None,
                 digest: Mapping[str, Any] | None = None) -> OracleOutputs:
    """Read a whole output file into RAM, every column checked against its hash; with
    ``expect_classifier`` (a classifier_ref of the cache it should belong to), refuse outputs
    computed against another cache; with ``digest`` (``{"bytes", "xxh3_128"}`` as run.json
    records it), refuse a file whose bytes changed since it was written."""
    path = Path(path)
    if not path.exists():
        raise CacheError(f"oracle outputs not found: {path}")
    if digest is not None:
        found = file_digest(path)
        if found != {k: digest.get(k) for k in found}:
            raise CacheError(f"{path} is damaged: {found['bytes']} bytes with another XXH3-128 "
                             f"hash than the {digest.get('bytes')} bytes its run.json records; "
                             f"{REWRITE}")
    attrs = read_attrs(path)
    if attrs.get("kind") != KIND_ORACLE:
        raise CacheError(f"{path} is not an oracle output file (kind={attrs.get('kind')!r})")
    check_identity(attrs, {"schema_version": SCHEMA_VERSION}, f"oracle outputs {path}", keys=())
    if expect_classifier is not None:
        keys = tuple(k for k in expect_classifier if k != "path")
        try:
            check_identity(attrs["classifier_cache"], expect_classifier, f"oracle outputs {path}",
                           keys=keys, check_version=False)
        except CacheMismatch as err:
            raise CacheMismatch(f"{err}\n(the outputs were computed against the classifier cache "
                                f"{attrs['classifier_cache'].get('path')})") from None
    names = list(ORACLE_COLUMNS)
    if ORACLE_PATH_COLUMN in (attrs.get(HASHES) or {}):    # files written before it lack it
        names.append(ORACLE_PATH_COLUMN)
    return OracleOutputs(path, attrs, read_columns(path, names, fix=REWRITE))


def output_paths(outputs: OracleOutputs) -> list[str] | None:
    """Each row's image file (its folder joined with the ``path`` column), or None where the rows
    are no files (idx arrays) or the file was written before that column existed."""
    if ORACLE_PATH_COLUMN not in outputs.columns:
        return None
    names = [b.decode("utf-8", "surrogateescape")
             for b in outputs.columns[ORACLE_PATH_COLUMN].tolist()]
    if names and IDX_ROW.search(names[0]):    # written before idx rows were left without one
        return None
    root = Path(outputs.attrs[ORACLE_PATH_ROOT])
    return [str(root / name) for name in names]
