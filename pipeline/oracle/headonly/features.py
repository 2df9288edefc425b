"""Feature caches for head-only oracles: find, check and load the oracle backbone's features.

A head-only oracle reads the pooled pre-logit features that ``cli.py extract --features`` stored
for the ORACLE's model (``<features root>/<oracle>/<split tag>/``).  For <O, C> with O = C that is
the classifier's own cache; otherwise O's cache is joined with C's targets row by row on the global
index, after checking that both caches list the same samples (dataset, fingerprint, split,
corruption, rows) and that O's cache holds the oracle's backbone (model, weights, preprocessing).

Every refusal names the cache and prints the ``extract`` command that makes the right one.
What is loaded (features on the device, the backbone's identity) is kept in a ``FeatureMemo`` the
caller owns: one ``train_head_only`` call, or a whole sweep; it is freed with it.

Shapes: ``FeatureTable.x`` (2N, D) float16/float32 features (rows [0, N) the plain view, [N, 2N)
the flipped one; one copy of the plain rows when there is no flipped view); for a head on stacked
inputs ``FeatureTable.stats`` (2N, 6) float32, the statistics of the classifier's cached logits of
the same rows and views (``pipeline.oracle.nets.heads.logit_stats``), raw: the head standardises
them.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

import numpy as np
import torch

from cache.outputs import MADE_ON, MadeOn
from cache.reader import ClassifierCache, cache_dir_for
from cache.schema import (FEATURE_COLUMN, FEATURE_FLIP_COLUMN, CacheError, CacheMismatch,
                          check_identity)
from pipeline.core.models import build_model, file_sha256, resolve_data_config, weights_sha256
from pipeline.oracle.headonly.staging import read_features
from pipeline.oracle.nets.heads import logit_stats
from pipeline.oracle.settings.prepare import Prepared
from pipeline.oracle.settings.targets import Split, SplitMemo, check_images

# What the feature cache must share with the classifier cache it is joined with (same samples).
SAME_SAMPLES = ("dataset", "dataset_fingerprint", "split", "corruption", "num_rows")
# What makes the features the oracle backbone's (checked against the backbone built for the run).
BACKBONE_KEYS = ("model", "model_kwargs", "weights_sha256", "preprocess", "data_config")


@dataclass(frozen=True)
class FeatureTable:
    """A split's features and targets on the device, both views stacked (module docstring)."""
    x: torch.Tensor              # (2N, D) or (N, D) without a flipped view
    correct: torch.Tensor        # (2N,) or (N,) float32
    p_true: torch.Tensor         # (2N,) or (N,) float32
    num_rows: int                # N
    has_flip: bool
    stats: torch.Tensor | None = None    # (2N, 6) or (N, 6): --head-inputs stacked

    @property
    def in_features(self) -> int:
        return self.x.shape[1] + (0 if self.stats is None else self.stats.shape[1])

    def inputs(self, idx: torch.Tensor) -> torch.Tensor:
        """The head's float32 input of rows ``idx`` (positions of ``index``)."""
        x = self.x[idx].float()
        return x if self.stats is None else torch.cat([x, self.stats[idx]], dim=1)

    def stats_moments(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and std of the statistics over the plain view of ``rows`` (the training rows); a
        constant statistic gets std 1 (it stays 0 once centred) instead of a division by 0."""
        s = self.stats[torch.as_tensor(np.asarray(rows, np.int64), device=self.stats.device)]
        std = s.std(dim=0, unbiased=False)
        return s.mean(dim=0), torch.where(std > 0, std, torch.ones_like(std))

    def index(self, rows: torch.Tensor, flips: torch.Tensor | None) -> torch.Tensor:
        """Row positions of the view shown: the flipped copy (row + N) where flipped."""
        if flips is None:
            return rows
        if not self.has_flip:
            raise ValueError("flipped rows requested from features without a flipped view")
        return rows + flips.to(rows.dtype) * self.num_rows


@dataclass(frozen=True)
class Backbone:
    identity: dict      # BACKBONE_KEYS of the oracle backbone
    record: dict        # how predict rebuilds it: weights, random_init, seed, weights_sha256


@dataclass
class FeatureMemo:
    """What head-only runs load once and share: feature tables (at most ``limit``, the device
    memory they hold is freed with the memo), backbone identities, and the splits listed from
    --data with their images checked."""
    limit: int = 4
    tables: dict = field(default_factory=dict)
    backbones: dict = field(default_factory=dict)
    splits: SplitMemo = field(default_factory=SplitMemo)

    def clear(self) -> None:
        self.tables.clear()
        self.backbones.clear()
        self.splits.clear()


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


def open_features(src: FeatureSource, split: Split, need_flip: bool,
                  memo: FeatureMemo | None = None) -> ClassifierCache:
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
    # its own stamps: a classifier cache re-extracted after images changed must not be joined
    # with features of the old images
    check_images(cache, split.samples, memo.splits if memo else None)
    return cache


def load_table(cache: ClassifierCache, split: Split, targets: Mapping[str, np.ndarray],
               with_flip: bool, device: torch.device, memo: FeatureMemo | None = None,
               stacked: bool = False) -> FeatureTable:
    """Features (both views when ``with_flip``) and the joined targets on ``device``.

    ``targets``: the ``correct``/``p_true`` (and ``*_flip``) arrays of C's cache ``split``, indexed
    by global row like the feature cache.  Loaded once (``staging.read_features``); a second call with
    the same cache and ``memo`` (a sweep's stages) reuses it.  ``stacked``: also the statistics
    of the logits of C's cache ``split`` (the same rows and views; ``check_logits`` says they
    exist)."""
    memo = memo if memo is not None else FeatureMemo()
    key = (str(cache.path.resolve()), json.dumps(cache.manifest["shards"], sort_keys=True),
           with_flip, str(device), str(split.cache.path.resolve()), stacked)
    if key in memo.tables:
        return memo.tables[key]
    n = cache.num_rows
    views = 2 if with_flip else 1
    x = read_features(cache, (FEATURE_COLUMN, FEATURE_FLIP_COLUMN)[:views], device)
    _check_finite(x, n, cache.path)
    keys = (("correct", "correct_flip"), ("p_true", "p_true_flip"))
    cols = [np.concatenate([targets[k] for k in pair[:views]]).astype(np.float32) for pair in keys]
    stats = None
    if stacked:
        logits = split.cache.load(["logits", "logits_flip"][:views])
        stats = torch.cat([logit_stats(torch.from_numpy(logits[k])) for k in
                           ("logits", "logits_flip")[:views]]).to(device)
    table = FeatureTable(x, torch.from_numpy(cols[0]).to(device), torch.from_numpy(cols[1]).to(device),
                         n, with_flip, stats)
    if len(memo.tables) >= memo.limit:
        memo.tables.clear()
    memo.tables[key] = table
    return table


def check_logits(split: Split, need_flip: bool) -> None:
    """--head-inputs stacked reads the classifier's logits of every view it trains on: refuse a
    classifier cache without the flipped view's logits when training flips (its statistics
    would be those of the other view), naming the cache and the fix.  (O = C: a cache with
    flipped features has them; this is C's cache beside O's features.)"""
    if not need_flip or "logits_flip" in split.cache.manifest["columns"]:
        return
    name = split.cache.manifest.get("config", {}).get("classifier") or split.cache.identity["model"]
    raise CacheError(f"classifier cache {split.cache.path} (split {split.tag!r}) has no flipped "
                     "view's logits, which --head-inputs stacked needs for the flipped rows "
                     "--flip trains on (never mixing views). Train with --no-flip, or re-extract "
                     f"it with --flip-view added to its `cli.py extract --classifier {name}` "
                     "command (the options its manifest.json records under config)")


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


def oracle_backbone(prep: Prepared, memo: FeatureMemo) -> Backbone:
    """Build the oracle backbone once (CPU) for the identity of its weights.  A random-init
    backbone is built with the seed its feature cache was extracted with."""
    spec, preprocess, cfg = prep.spec, prep.cfg.preprocess, prep.cfg
    seed = 0
    if spec.random_init:
        path = cache_dir_for(Path(cfg.features_cache or cfg.cache), cfg.oracle, prep.train.tag)
        try:
            seed = int(ClassifierCache.open(path).manifest.get("config", {}).get("seed", 0))
        except CacheError:
            seed = 0      # open_features names the missing cache below
    key = json.dumps([spec.name, spec.kwargs, spec.weights, spec.random_init, seed, preprocess],
                     sort_keys=True, default=str)
    if key not in memo.backbones:
        model = build_model(spec, seed=seed)
        identity = {"model": spec.name, "model_kwargs": spec.kwargs,
                    "weights_sha256": weights_sha256(model), "preprocess": preprocess,
                    "data_config": resolve_data_config(model, spec, preprocess).to_dict()}
        weights = str(Path(spec.weights).resolve()) if spec.weights else None
        memo.backbones[key] = Backbone(identity, {
            "weights": weights, "random_init": spec.random_init, "seed": seed,
            "weights_sha256": identity["weights_sha256"],
            "weights_file_sha256": file_sha256(spec.weights) if spec.weights else None})
    return memo.backbones[key]


def feature_source(prep: Prepared, backbone: Backbone) -> FeatureSource:
    cfg = prep.cfg
    args = ["--data", cfg.data] if cfg.data else []
    if cfg.weights:
        args += ["--weights", cfg.weights]
    if cfg.random_init:
        args += ["--random-init", "--seed", str(backbone.record["seed"])]
    if cfg.model_kwargs:
        args += ["--model-kwargs", json.dumps(cfg.model_kwargs)]
    return FeatureSource(Path(cfg.features_cache or cfg.cache), cfg.oracle, backbone.identity,
                         tuple(args))


def check_valid(fcache: ClassifierCache, split: Split, rows: np.ndarray) -> None:
    """Rows the classifier cache scores must have features (decodable in both extractions)."""
    valid = fcache.load(["valid"])["valid"].astype(bool)
    bad = rows[~valid[rows]]
    if len(bad):
        raise CacheError(f"feature cache {fcache.path}: row {int(bad[0])} ({len(bad)} in all) is "
                         f"invalid (undecodable there) but valid in the classifier cache "
                         f"{split.cache.path}; extract both with the same data and --skip-bad")


def features_made_on(fc: ClassifierCache) -> MadeOn:
    """What made a head-only run's scores of ``fc``'s rows: the device and precision of the
    features' extraction (a cache written before it recorded its device: the precision only)."""
    made = MadeOn.from_dict(fc.manifest.get("info", {}).get(MADE_ON))
    made = made or MadeOn("", "", "", fc.identity.get("precision") or "")
    return replace(made, inputs="cached features")


def feature_record(fc: ClassifierCache) -> dict:
    """The feature cache's identity as run.json records it (what the head was trained on)."""
    keys = ("model", "model_kwargs", "weights_sha256", "preprocess", "data_config", "precision",
            "dataset_fingerprint", "split", "corruption", "num_rows", "features_flip")
    return {"path": str(fc.path.resolve()), **{k: fc.identity.get(k) for k in keys}}
