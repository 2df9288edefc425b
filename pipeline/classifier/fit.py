"""``cli.py fit-classifier``: train a base classifier on a dataset split and save a project
checkpoint that ``pipeline.core.models`` loads (``extract``, ``train-oracle`` use it like hub weights).

resolve config (hyperparameters: ``pipeline.core.presets``) -> carve a seeded held-out part of the
split -> AdamW + warm-up/cosine schedule, random-crop (zero padding) + horizontal-flip
augmentation on uint8 batches -> held-out accuracy (both ``recipe.py``) -> checkpoint (temp file +
rename).
On the embedded Fashion-MNIST, ``vit``/``resnet`` train on ``clf-train`` (disjoint from the
oracles' ``train``) and land where ``extract --classifier vit`` looks for them.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import timm
import torch

from pipeline.classifier.checkpoint import read_checkpoint, save_checkpoint, stale_reasons
from pipeline.classifier.recipe import evaluate, train_epochs
from pipeline.core import dist
from pipeline.core.heldout import HELD_OUT, HELD_OUT_NAMES, mask_held_out
from pipeline.core.models import (ModelError, build_model, file_sha256, is_project_checkpoint,
                                  resolve_data_config, resolve_spec,
                                  state_dict_from_file)
from pipeline.core.precision import default_precision
from pipeline.core.presets import DEFAULT_FIT, EMBEDDED_ARCH, EMBEDDED_FIT, embedded_classifier_path
from pipeline.data.errors import DataError
from pipeline.data.newclass import kept_classes, resolve_holdout, select_classes
from pipeline.data.sources import default_artifacts, embedded_data, is_embedded_dataset, list_split

# FitConfig fields that say where and how, not what is fitted: not in the checkpoint's meta
RUNTIME_ONLY = ("out", "force", "progress")
HPARAMS = tuple(DEFAULT_FIT)   # epochs, batch_size, lr, weight_decay, warmup_epochs, pad, ...


@dataclass(frozen=True)
class FitConfig:
    classifier: str = "vit"
    data: str | None = None
    split: str | None = None            # None: default_split
    out: Path | None = None             # None: the preset's path / <artifacts root>/classifiers
    labels_file: str | None = None
    num_classes: int | None = None      # None: the number of classes of the dataset
    model_kwargs: dict = field(default_factory=dict)
    weights: str | None = None          # initialise from this file (classifier head re-initialised)
    pretrained: bool = False            # initialise from timm's hub weights
    hparams: dict = field(default_factory=dict)   # overrides of DEFAULT_FIT / EMBEDDED_FIT
    max_samples: int | None = None      # seeded subset of the split (tests, quick looks)
    holdout_classes: tuple[str, ...] = ()   # class names/indices left out (data/newclass.py)
    device: str | None = None
    seed: int = 0
    force: bool = False
    progress: bool = True


def resolve_hparams(cfg: FitConfig, embedded_preset: bool) -> dict:
    """DEFAULT_FIT <- EMBEDDED_FIT[name] (embedded presets) <- explicit options."""
    unknown = set(cfg.hparams) - set(HPARAMS)
    if unknown:
        raise ValueError(f"unknown fit hyperparameter(s) {sorted(unknown)}; known: {HPARAMS}")
    base = {**DEFAULT_FIT, **(EMBEDDED_FIT.get(cfg.classifier, {}) if embedded_preset else {})}
    hp = {**base, **{k: v for k, v in cfg.hparams.items() if v is not None}}
    if hp["workers"] is None:
        hp["workers"] = max(0, min(8, (os.cpu_count() or 1) - 1))
    if not 0 < hp["val_fraction"] < 1:
        raise DataError(f"--val-fraction {hp['val_fraction']}: expected a value in (0, 1)")
    return hp


def default_out(cfg: FitConfig, embedded_preset: bool) -> Path:
    if cfg.out is not None:
        return Path(cfg.out)
    if embedded_preset:
        return embedded_classifier_path(cfg.classifier)
    # the data's artifacts root, beside its caches and runs (wnid data: not "imagenet")
    return default_artifacts(cfg.data) / "classifiers" / f"{cfg.classifier.replace('/', '_')}.pt"


def classifier_spec(cfg: FitConfig, num_classes: int, embedded_preset: bool):
    """The ModelSpec to train: architecture, kwargs with ``num_classes``, initialisation."""
    if cfg.weights and cfg.pretrained:
        raise ModelError("--weights and --hub-weights exclude each other")
    kwargs = {**cfg.model_kwargs, "num_classes": num_classes}
    if cfg.weights and is_project_checkpoint(cfg.weights):
        # its architecture and preprocessing (import-weights, a fit); init_from_file loads the
        # tensors, the head aside where the classes differ
        spec = replace(resolve_spec(cfg.classifier, embedded_preset, cfg.weights, False, kwargs),
                       weights=None, random_init=True)
    else:
        spec = resolve_spec(cfg.classifier, embedded_preset, None, True, kwargs)
    if cfg.pretrained:
        spec = type(spec)(spec.name, spec.kwargs, None, False, spec.data_config)
    return spec


def build_classifier(cfg: FitConfig, spec) -> torch.nn.Module:
    """The model in train mode, initialised as ``spec`` / ``cfg.weights`` say."""
    model = build_model(spec, seed=cfg.seed, train=True)
    if cfg.weights:
        init_from_file(model, cfg.weights)
    return model


def init_sha256(cfg: FitConfig) -> str | None:
    """The identity of the weights file the fit starts from (None: random or hub weights)."""
    return file_sha256(cfg.weights) if cfg.weights else None


def init_from_file(model: torch.nn.Module, path: str) -> None:
    """Load every tensor that fits; only the classifier head may be left out (other classes)."""
    state = state_dict_from_file(path)
    own = model.state_dict()
    fits = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    head = _head_prefix(model) + "."
    left_out = [k for k in own if k not in fits and not k.startswith(head)
                and not k.endswith("num_batches_tracked")]
    if left_out:
        raise ModelError(f"--weights {path} does not fit {type(model).__name__}: no matching "
                         f"tensor for {len(left_out)} parameter(s) {left_out[:4]}")
    model.load_state_dict(fits, strict=False)


def _head_prefix(model: torch.nn.Module) -> str:
    head = model.get_classifier()
    return next(name for name, mod in model.named_modules() if mod is head)


def split_rows(n: int, val_fraction: float, seed: int, max_samples: int | None):
    """Seeded (train rows, held-out rows), each sorted; ``max_samples`` subsamples first."""
    rows = np.random.default_rng(seed).permutation(n)
    if max_samples is not None:
        rows = rows[:max_samples]
    n_val = max(1, round(val_fraction * len(rows)))
    if len(rows) - n_val < 1:
        raise DataError(f"only {len(rows)} image(s) in the split: too few to hold out "
                        f"{val_fraction:.0%} and still train")
    return np.sort(rows[n_val:]), np.sort(rows[:n_val])


# train-oracle's default --train-split: a classifier fitted on it is right on nearly every row
# the oracles learn from (its training images), so they see few of the errors they must flag
ORACLE_TRAIN_SPLIT = "train"
ORACLE_SPLIT_WARNING = (
    "fitted on split {split!r}, the split train-oracle trains the oracles on by default: on its "
    "own training images the classifier is right almost everywhere, so the oracles would see few "
    "of the errors they must learn to flag. Keep images the classifier never saw for the oracles: "
    "put the classifier's own in ROOT/clf-train/ (fit-classifier's default where it exists), or "
    "pass --split NAME here, or train the oracles on another split (train-oracle --train-split)")


def default_split(data: str | None, idx_data: bool) -> str:
    """clf-train on the embedded dataset (``idx_data``: its idx files) and wherever
    ROOT/clf-train/ exists (the classifier's images, kept apart from the oracles'), else train
    (with ORACLE_SPLIT_WARNING)."""
    if idx_data or (data is not None and (Path(data) / "clf-train").is_dir()):
        return "clf-train"
    return ORACLE_TRAIN_SPLIT


def _known_rows(cfg: FitConfig, samples):
    """(the rows of the classes not held out, the held-out class indices): the classifier is
    fitted and scored on those rows only; its outputs stay the dataset's classes."""
    held = resolve_holdout(cfg.holdout_classes, samples.classes) if cfg.holdout_classes else ()
    if not held:
        return samples, ()
    return select_classes(samples, kept_classes(held, len(samples.classes), False)), held


def _recorded_config(cfg: FitConfig) -> dict:
    """The checkpoint meta's config: JSON values, the run-time fields left out, and
    holdout_classes only where given (the checkpoints of other fits keep their bytes)."""
    return {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v)
            for k, v in asdict(cfg).items()
            if k not in RUNTIME_ONLY and (k != "holdout_classes" or v)}


def fit(cfg: FitConfig) -> dict:
    """Fit one classifier; returns {"skipped", "out", "meta", "notes"} (meta as saved)."""
    if dist.info().enabled:
        raise ModelError("fit-classifier runs in one process: start it with python, not torchrun")
    idx_data = embedded_data(cfg.data)
    samples = list_split(cfg.data, cfg.split or default_split(cfg.data, idx_data),
                         cfg.labels_file)
    samples, held = _known_rows(cfg, samples)
    embedded_preset = is_embedded_dataset(samples.dataset) and cfg.classifier in EMBEDDED_ARCH
    hp = resolve_hparams(cfg, embedded_preset)
    num_classes = cfg.num_classes or len(samples.classes)
    if int(samples.labels.max()) >= num_classes:
        raise DataError(f"--num-classes {num_classes}: split {samples.split!r} has labels up to "
                        f"{int(samples.labels.max())}; use --num-classes auto")
    spec = classifier_spec(cfg, num_classes, embedded_preset)
    out = default_out(cfg, embedded_preset)
    if out.exists() and not cfg.force:
        ckpt = read_checkpoint(out)
        fitted = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(out.stat().st_mtime))
        return {"skipped": True, "out": str(out), "meta": ckpt.get("meta", {}), "fitted": fitted,
                "notes": stale_reasons(ckpt, spec, hp, samples, init_sha256(cfg), held)}
    notes = []
    if is_embedded_dataset(samples.dataset) and samples.split != "clf-train":
        notes.append(f"fitted on split {samples.split!r}: the embedded dataset keeps 'clf-train' "
                     "for the classifiers so that the oracles' 'train' and 'test' stay unseen")
    warnings = [ORACLE_SPLIT_WARNING.format(split=samples.split)] \
        if samples.split == ORACLE_TRAIN_SPLIT and not idx_data else []
    _, device = dist.init(cfg.device)
    hp["precision"] = default_precision(hp["precision"], device)   # meta records it resolved
    model = build_classifier(cfg, spec)
    data_cfg = resolve_data_config(model, spec, "model")
    train_rows, val_rows = split_rows(len(samples), hp["val_fraction"], cfg.seed, cfg.max_samples)
    model = model.to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    start = time.perf_counter()
    history = train_epochs(model, samples, data_cfg, train_rows, hp, device, cfg.seed, cfg.progress)
    train_s = time.perf_counter() - start
    mask_held_out(model, held)   # as build_model will build it from the checkpoint
    accuracy = evaluate(model, samples, data_cfg, val_rows, hp, device)
    # What determines the weights, and nothing else: no wall time, date or output path, so the same
    # command on the same machine and thread count writes a byte-identical file (docs/RESULTS.md,
    # "Determinism"). The CPU thread count is recorded: it changes the order of float sums.
    meta = {"model": spec.name, "config": _recorded_config(cfg),
            "hparams": hp, "dataset": samples.dataset, "split": samples.split,
            "dataset_fingerprint": samples.fingerprint, "num_classes": num_classes,
            "init_sha256": init_sha256(cfg),
            "classes": list(samples.classes), "train_rows": len(train_rows),
            "held_out_rows": len(val_rows), "held_out_accuracy": accuracy, "history": history,
            "device": str(device), "threads": torch.get_num_threads(),
            "torch": str(torch.__version__), "timm": str(timm.__version__)}
    if held:   # only then: the checkpoints of other fits keep their bytes
        meta.update({HELD_OUT: list(held), HELD_OUT_NAMES: [samples.classes[k] for k in held]})
    save_checkpoint(out, model, spec, data_cfg, meta)
    timing = {"train_s": round(train_s, 2), "img_per_s": round(hp["epochs"] * len(train_rows) / train_s, 1)}
    return {"skipped": False, "out": str(out), "meta": meta, "notes": notes, "warnings": warnings,
            "timing": timing}
