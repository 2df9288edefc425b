"""Feature caches for head-only oracles: find, check and load the oracle backbone's features.

A head-only oracle reads the pooled pre-logit features that ``cli.py extract --features`` stored
for the ORACLE's model (``<features root>/<oracle>/<split tag>/``).  For <O, C> with O = C that is
the classifier's own cache; otherwise O's cache is joined with C's targets row by row on the global
index, after checking that both caches list the same samples (dataset, fingerprint, split,
corruption, rows) and that O's cache holds the oracle's backbone (model, weights, preprocessing).

Every refusal names the cache and prints the ``extract`` command that makes the right one.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
import torch

from cache.reader import ClassifierCache, cache_dir_for
from cache.schema import (FEATURE_COLUMN, FEATURE_FLIP_COLUMN, CacheError, CacheMismatch,
                          check_identity)
from cache.shards import read_column_into
from pipeline.oracle.head import FeatureTable
from pipeline.oracle.targets import Split

# What the feature cache must share with the classifier cache it is joined with (same samples).
SAME_SAMPLES = ("dataset", "dataset_fingerprint", "split", "corruption", "num_rows")
# What makes the features the oracle backbone's (checked against the backbone built for the run).
BACKBONE_KEYS = ("model", "model_kwargs", "weights_sha256", "preprocess", "data_config")


@dataclass(frozen=True)
class FeatureSource:
    """Where the oracle's features live and what they must be."""
    root: Path                     # the features' cache root (--features-cache, default --cache)
    oracle: str                    # the oracle's name as given (cache directory name)
    backbone: dict                 # BACKBONE_KEYS of the oracle backbone built for this run
    extract_args: tuple[str, ...]  # how to make a cache (--data, --weights/--random-init, ...)


def extract_command(src: FeatureSource, split: Split, root: Path | None = None) -> str:
    """The ``cli.py extract`` command that writes the features ``split`` needs."""
    ident = split.cache.identity
    args = ["python", "cli.py", "extract", "--classifier", src.oracle, "--split", ident["split"]]
    corruption = ident.get("corruption", "none")
    if corruption and corruption != "none":
        name, severity, seed = corruption.split(":")
        args += ["--corruption", name, "--severity", severity, "--seed", seed.removeprefix("seed")]
    args += [*src.extract_args, "--preprocess", src.backbone["preprocess"], "--features",
             "--flip-view", "--out", str(root or src.root)]
    return shlex.join(args)


def _hint(src: FeatureSource, split: Split, path: Path) -> str:
    cmd = extract_command(src, split)
    if (path / "identity.json").exists():   # a cache of another kind occupies the directory
        other = Path(f"{src.root}-features")
        return (f"Its directory holds another extraction, so write the features to another root "
                f"and point --features-cache at it:\n  {extract_command(src, split, other)}\n"
                f"  (then --features-cache {other}), or delete {path} and run:\n  {cmd}")
    return f"Make it with:\n  {cmd}"


def open_features(src: FeatureSource, split: Split, need_flip: bool) -> ClassifierCache:
    """The complete feature cache of the oracle for ``split`` (C's cache of the same tag),
    checked; refuses (naming it, with the extract command) anything else."""
    path = cache_dir_for(src.root, src.oracle, split.tag)
    where = f"feature cache {path} (oracle {src.oracle}, split {split.tag!r})"
    try:
        cache = ClassifierCache.open(path)
    except CacheMismatch:
        raise
    except CacheError as err:
        raise CacheError(f"{where}: {err}\n{_hint(src, split, path)}") from None
    ident = cache.identity
    if not ident.get("features") or FEATURE_COLUMN not in cache.manifest["columns"]:
        raise CacheError(f"{where} holds no features (extracted without --features).\n"
                         + _hint(src, split, path))
    hint = _hint(src, split, path)
    check_identity(ident, {k: split.cache.identity[k] for k in SAME_SAMPLES}, where,
                   keys=SAME_SAMPLES, hint="It lists other samples than the classifier cache "
                   f"{split.cache.path} it must be joined with. " + hint)
    check_identity(ident, src.backbone, where, keys=BACKBONE_KEYS,
                   hint="It holds another backbone's features than the oracle's. " + hint)
    if need_flip and FEATURE_FLIP_COLUMN not in cache.manifest["columns"]:
        raise CacheError(f"{where} has no flipped view's features, which training with --flip "
                         "needs (never mixing views). Train with --no-flip, or re-extract with "
                         "--features --flip-view:\n" + hint)
    return cache


_MEMO: dict[tuple, FeatureTable] = {}


def load_table(cache: ClassifierCache, split: Split, targets: Mapping[str, np.ndarray],
               with_flip: bool, device: torch.device) -> FeatureTable:
    """Features (both views when ``with_flip``) and the joined targets on ``device``.

    ``targets``: the ``correct``/``p_true`` (and ``*_flip``) arrays of C's cache ``split``, indexed
    by global row like the feature cache.  Loaded once: read straight from the shards into one (pinned, on CUDA)
    buffer, copied to the device; a second call with the same cache (a sweep) reuses it."""
    key = (str(cache.path.resolve()), (cache.path / "manifest.json").stat().st_mtime_ns,
           with_flip, str(device), str(split.cache.path.resolve()))
    if key in _MEMO:
        return _MEMO[key]
    n = cache.num_rows
    dim = _feature_dim(cache)
    views = 2 if with_flip else 1
    host = torch.empty((views * n, dim), dtype=torch.float16,
                       pin_memory=device.type == "cuda" and torch.cuda.is_available())
    buf = host.numpy()
    read_column_into(cache.path, cache.manifest, FEATURE_COLUMN, buf[:n])
    if with_flip:
        read_column_into(cache.path, cache.manifest, FEATURE_FLIP_COLUMN, buf[n:])
    x = host.to(device, non_blocking=True)
    _check_finite(x, n, cache.path)
    keys = (("correct", "correct_flip"), ("p_true", "p_true_flip"))
    cols = [np.concatenate([targets[k] for k in pair[:views]]).astype(np.float32) for pair in keys]
    table = FeatureTable(x, torch.from_numpy(cols[0]).to(device), torch.from_numpy(cols[1]).to(device),
                         n, with_flip)
    if len(_MEMO) >= 4:
        _MEMO.clear()
    _MEMO[key] = table
    return table


def _feature_dim(cache: ClassifierCache) -> int:
    import h5py

    first = cache.path / cache.manifest["shards"][0]["file"]
    with h5py.File(first, "r") as fh:
        return int(fh[FEATURE_COLUMN].shape[1])


def _check_finite(x: torch.Tensor, n: int, path: Path, chunk: int = 1 << 16) -> None:
    """Refuse NaN/inf features, naming the first such row (global index) and view.  Checked in
    chunks of rows: a whole-tensor mask of ImageNet's 2 x 1.28M x 2048 features would be 5 GB."""
    for start in range(0, x.shape[0], chunk):
        bad = torch.nonzero(~torch.isfinite(x[start:start + chunk]).all(dim=1)).flatten()
        if len(bad):
            row = start + int(bad[0])
            view = "flipped view" if row >= n else "plain view"
            raise CacheError(f"feature cache {path}: row {row % n} ({view}) holds a non-finite "
                             "feature; re-extract that cache (a model that overflows in "
                             "--precision fp16 needs bf16 or fp32)")
