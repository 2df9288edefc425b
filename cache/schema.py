"""The one versioned schema of every HDF5 file this project writes.

Two kinds of cache share it:

* ``classifier`` caches (stage 1, ``cli.py extract``): one directory per (classifier, dataset split),
  holding ``identity.json`` (written first), ``shard-NNNNN.h5`` files (rows ``[start, stop)`` of the
  split, in global-index order) and ``manifest.json`` (written last: its presence means complete).
* ``oracle`` outputs (stage 2, ``cli.py train-oracle`` / ``predict``): one HDF5 file per evaluated
  split in a run directory, aligned by global index with the classifier cache of that split.

Bump ``SCHEMA_VERSION`` whenever a column, dtype or identity attribute changes meaning; readers
refuse files of another version instead of guessing.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Iterable, Mapping

from cache.errors import TrustOraclesError

SCHEMA_VERSION = 1

KIND_CLASSIFIER = "classifier"
KIND_ORACLE = "oracle"

# Per-row columns of a classifier cache shard.  ``index`` is the global sample index (position of
# the sample in the split's sorted sample list); every stage joins on it.
# Logits are stored as float16 (2 bytes x K per row: 2.56 GB for ImageNet train); softmax-derived
# columns are computed in float32 from the un-rounded logits before storage.
CLASSIFIER_COLUMNS: dict[str, str] = {
    "index": "int64",
    "label": "int64",
    "valid": "uint8",       # 0 = image could not be decoded (--skip-bad); other columns are 0 there
    "logits": "float16",    # (N, K)
    "pred": "int64",        # argmax of the logits
    "correct": "uint8",     # the trust label o = [pred == label]
    "p_true": "float32",    # softmax probability of the TRUE class: the TCP target
    "p_max": "float32",     # max softmax probability (MCP)
}
# Columns of the horizontally flipped view (--flip-view): same meaning, suffix "_flip".
FLIP_COLUMNS = ("logits", "pred", "correct", "p_true", "p_max")
FEATURE_COLUMN = "features"  # (N, D) pooled pre-logit features (--features), FEATURE_DTYPE
# The features' storage dtype.  A head-only oracle's head is trained and scored on features
# rounded to it, so the deployed oracle rounds its backbone's features to it as well
# (``pipeline.oracle.nets.model.Oracle``): the same images give the run's own scores.
FEATURE_DTYPE = "float16"
# The flipped view's features (--features with --flip-view): what a head-only oracle trained with
# random flips reads for a flipped row.  Caches that have it carry ``features_flip: true`` in
# their identity (absent otherwise, so caches without it keep their identity).
FEATURE_FLIP_COLUMN = "features_flip"

# What each row was computed from (docs/DATA_CONTRACT.md, pipeline/data/stamps.py): the column of
# per-row XXH3-128 hashes of the image files' bytes (uint8 (N, 16); for idx rows, of the row's
# pixels), and the shard attribute / manifest key holding the XXH3-64 digest of the rows'
# (size, mtime_ns) stamps.  Additions that older readers ignore, like the checksums: caches
# without them keep the schema version and are adopted by the next ``extract``.
SOURCE_HASH_COLUMN = "source_xxh3"
SOURCE_STAMP = "source_stamp"

# MC-Dropout (``extract --mc-dropout T``): per-row summaries of T stochastic passes with the
# classifier's dropout active, beside the deterministic columns (which stay bit-identical).  An
# addition like ``features``: caches without it keep their identity and schema version.  Caches
# that have it carry the identity attribute ``mc_dropout`` (absent otherwise):
# {"passes": T, "rates": {dropout site: p}, "rate_option": R | None (--mc-dropout-rate),
#  "test_time_only": bool (the rate was set by the option on a classifier without active
#  dropout), "seed", "batch_size" (masks are drawn per batch), "masks": how they are seeded}.
MC_DROPOUT = "mc_dropout"
MC_COLUMNS: dict[str, str] = {
    "mcd_msp": "float32",      # max of the mean softmax over the T passes
    "mcd_entropy": "float32",  # entropy (nats) of that mean softmax: the predictive entropy
    "mcd_mi": "float32",       # mutual information = predictive entropy - mean per-pass entropy
}



def cache_columns(flip_view: bool, features: bool, mc_dropout: bool) -> list[str]:
    """The columns of a classifier cache extracted with these options (its manifest lists them)."""
    return (list(CLASSIFIER_COLUMNS) + ([f"{c}_flip" for c in FLIP_COLUMNS] if flip_view else [])
            + ([FEATURE_COLUMN] if features else [])
            + ([FEATURE_FLIP_COLUMN] if features and flip_view else [])
            + (list(MC_COLUMNS) if mc_dropout else []) + [SOURCE_HASH_COLUMN])


# Per-row columns of an oracle output file.
ORACLE_COLUMNS: dict[str, str] = {
    "index": "int64",
    "valid": "uint8",
    "z": "float32",           # the oracle head's scalar output
    "confidence": "float32",  # sigmoid(z), for every loss (as the authors' code does)
    "correct": "uint8",       # copied from the classifier cache, for self-contained reports
    "label": "int64",
    "pred": "int64",
}

# Optional column of an oracle output file: each row's image file as bytes (UTF-8), relative to
# the file's ``path_root`` attribute (``cache.outputs.output_paths`` joins them).  An addition:
# files written before it lack it and keep the schema version; readers read it where present.
ORACLE_PATH_COLUMN = "path"
ORACLE_PATH_ROOT = "path_root"

# Attributes that define what a classifier cache IS.  Resuming, reusing or consuming a cache
# requires all of them to match; anything else (versions, timings, host) is informational.
CLASSIFIER_IDENTITY = (
    "schema_version", "kind", "model", "model_kwargs", "weights_sha256", "preprocess",
    "data_config", "dataset", "dataset_fingerprint", "split", "corruption", "num_rows",
    "num_classes", "precision", "flip_view", "features", "features_flip", "shard_size", "decode",
    MC_DROPOUT, "exif_transpose",   # these two only where given (absent = off)
    "classes_kept",   # only where a classifier held classes out (pipeline/data/newclass.py)
)

# What must agree between the caches of one classifier across splits (train vs test vs shifted),
# and between a run's training cache and the classifier a deployed oracle judges.
CLASSIFIER_KEYS = ("model", "model_kwargs", "weights_sha256", "num_classes", "preprocess",
                   "data_config")

ORACLE_IDENTITY = (
    "schema_version", "kind", "split", "corruption", "dataset_fingerprint", "num_rows",
    "classifier_cache",
)


class CacheError(TrustOraclesError, RuntimeError):
    """A cache file or directory is missing, incomplete, foreign or corrupt."""


class CacheMismatch(CacheError):
    """A cache exists but describes something else than what was asked for."""


def canonical(value: Any) -> Any:
    """JSON round-trip so tuples/lists and int/float spellings compare equal."""
    return json.loads(json.dumps(value, sort_keys=True))


def identity_diff(found: Mapping[str, Any], expected: Mapping[str, Any],
                  keys: Iterable[str] | None = None, found_in: str = "cache", *,
                  expected_in: str = "expected", nested: bool = False,
                  show: Callable[[Any], str] | None = None) -> list[str]:
    """One line per attribute whose values differ, naming it and both values, for an error
    message: ``model: cache has "a", expected "b"``.  ``keys``: the attributes compared, in this
    order (default: ``expected``'s); ``found_in`` / ``expected_in``: the words before each value;
    ``nested``: a differing mapping is named by its differing entries, dotted (``params.eps``;
    every entry of either side, sorted); ``show``: how a value is written (default: JSON, cut at
    120 characters).  Values compare as JSON (tuples equal lists)."""
    keys = keys if keys is not None else tuple(expected)
    show = show or _short
    out = []
    for key in keys:
        a, b = canonical(found.get(key)), canonical(expected.get(key))
        if a == b:
            continue
        if nested and isinstance(a, dict) and isinstance(b, dict):
            out += [f"{key}.{line}" for line in identity_diff(
                a, b, sorted(set(a) | set(b)), found_in, expected_in=expected_in, nested=True,
                show=show)]
        else:
            out.append(f"{key}: {found_in} has {show(a)}, {expected_in} {show(b)}")
    return out


def check_schema_version(found: Mapping[str, Any], where: str,
                         version: Any = SCHEMA_VERSION) -> None:
    """Raise CacheMismatch if ``found`` was written with another schema version than
    ``version`` (``where``: what holds it, for the message)."""
    if canonical(found.get("schema_version")) != canonical(version):
        raise CacheMismatch(
            f"{where} was written with cache schema version {found.get('schema_version')!r}; this "
            f"code reads version {SCHEMA_VERSION}. Re-create it (delete the directory and re-run).")


def check_identity(found: Mapping[str, Any], expected: Mapping[str, Any], where: str,
                   keys: tuple[str, ...] | None = None, hint: str = "",
                   check_version: bool = True) -> None:
    """Raise CacheMismatch naming every differing attribute (schema version first)."""
    if check_version:
        check_schema_version(found, where, expected.get("schema_version", SCHEMA_VERSION))
    diffs = identity_diff(found, expected, keys)
    if diffs:
        raise CacheMismatch(f"{where} holds a different cache:\n  " + "\n  ".join(diffs)
                            + (f"\n{hint}" if hint else ""))


def _short(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def to_attr(value: Any) -> str:
    """HDF5 attributes hold JSON strings so nested configs survive exactly."""
    return json.dumps(canonical(value), sort_keys=True)


def from_attr(value: Any) -> Any:
    if isinstance(value, bytes):
        value = value.decode()
    return json.loads(value)
