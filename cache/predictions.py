"""Prediction tables of ``predict --images``: one row per image file, the deployment output.

    fmt = table_format(path)               # by extension: .csv, .jsonl, .parquet (refused early)
    write_table(path, columns, meta)       # the table + <stem>.meta.json (how trust was decided)

Columns (in this order): ``path`` (the image file, absolute), ``pred`` (the classifier's class
index), ``class_name``, ``msp`` (the classifier's maximum softmax probability), ``confidence``
(the oracle's, sigmoid(z)), ``trust`` (confidence >= the threshold), ``error`` (empty, or why the
file could not be decoded: such rows, kept with ``--skip-bad``, have no prediction: empty cells in
CSV, null in JSON lines and Parquet).  The threshold, how it was chosen and on which rows go to the
sidecar JSON (and, in Parquet, into the file's schema metadata under ``trust_oracles``).  Files are
written under a temporary name and renamed: a table that exists is complete.  Torch-free.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from cache.atomic import atomic_path
from cache.manifest import write_json_atomic
from cache.schema import CacheError

COLUMNS = ("path", "pred", "class_name", "msp", "confidence", "trust", "error")
FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".parquet": "parquet"}
META_SUFFIX = ".meta.json"


def table_format(path: Path) -> str:
    """The format ``path``'s extension names; refuses others, and Parquet without pyarrow."""
    fmt = FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise CacheError(f"--out-file {path}: unknown table format "
                         f"{Path(path).suffix or '(none)'!r}; name the file .csv, .jsonl (JSON "
                         "lines) or .parquet")
    if fmt == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise CacheError(f"--out-file {path}: writing Parquet needs pyarrow, which is not "
                             "installed (pip install pyarrow); or name the file .csv or .jsonl"
                             ) from None
    return fmt


def meta_path(path: Path) -> Path:
    """``preds.csv`` -> ``preds.meta.json``: the threshold and how it was chosen."""
    return Path(path).with_suffix(META_SUFFIX)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.9g}"       # float32 values round-trip exactly
    return str(value)


def _write_csv(tmp: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    with open(tmp, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        for row in rows:
            writer.writerow([_cell(row[c]) for c in COLUMNS])


def _write_jsonl(tmp: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    with open(tmp, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps({c: row[c] for c in COLUMNS}, ensure_ascii=False) + "\n")


def _write_parquet(tmp: Path, rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = {"path": pa.string(), "pred": pa.int64(), "class_name": pa.string(),
             "msp": pa.float32(), "confidence": pa.float32(), "trust": pa.bool_(),
             "error": pa.string()}
    table = pa.table({c: pa.array([r[c] for r in rows], type=types[c]) for c in COLUMNS})
    table = table.replace_schema_metadata({"trust_oracles": json.dumps(dict(meta))})
    pq.write_table(table, tmp)


def write_table(path: Path, rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> Path:
    """Write ``rows`` (dicts with every column of COLUMNS) to ``path`` in the format of its
    extension, and ``meta`` beside it; returns the sidecar's path.  A full disk is one message;
    a previous table is replaced only by a complete one."""
    path = Path(path)
    fmt = table_format(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, kept="the trained run is kept") as tmp:
        if fmt == "csv":
            _write_csv(tmp, rows)
        elif fmt == "jsonl":
            _write_jsonl(tmp, rows)
        else:
            _write_parquet(tmp, rows, meta)
    sidecar = meta_path(path)
    write_json_atomic(sidecar, {**meta, "table": str(path), "format": fmt})
    return sidecar
