"""Defaults a run takes from its data rather than from a preset alone, each said in a
``note:`` line and recorded in run.json (its config holds the values, ``protocol`` the reasons):

* the oracle's starting weights: an oracle of the classifier's architecture starts from the
  weights file the classifier cache recorded (``extract --weights``), checked against the cache's
  ``weights_sha256`` by content, unless --weights, --random-init or --hub-weights say otherwise;
* SS's slopes for a backbone the paper did not train (``presets.ss_slopes``);
* a training split too small for the paper's protocol gets a batch it can fill
  (``presets.MIN_STEPS_PER_EPOCH``) and the epochs that reach ``presets.MIN_TRAIN_STEPS`` steps;
* a held-out set under ``presets.MIN_HELDOUT_ROWS`` rows warns and says which --val-fraction
  would reach it.
"""
from __future__ import annotations

import json
import math
import sys
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path

import numpy as np

from cache.reader import ClassifierCache
from pipeline.core import dist
from pipeline.core.models import ModelError, resolve_spec, weights_sha256
from pipeline.core.presets import (MAX_AUTO_EPOCHS, MIN_HELDOUT_PER_KIND, MIN_HELDOUT_ROWS,
                                   MIN_STEPS_PER_EPOCH, MIN_TRAIN_STEPS)
from pipeline.oracle.nets.model import cache_classifier, recorded_weights
from pipeline.oracle.settings.config import TrainConfig

# Two memos of this process, each bounded (oldest forgotten first), since a notebook or a sweep
# may prepare thousands of runs in one process.  The notes already said: a sweep prepares every
# point of one setting and would repeat each note per point.  The weights hashes of files already
# checked, by (path, size, mtime, classifier): rebuilding a large classifier per point would cost
# seconds each.
MEMO_SIZE = 256
_SAID: OrderedDict[str, None] = OrderedDict()
_CHECKED: OrderedDict[tuple, str] = OrderedDict()


def _remember(memo: OrderedDict, key, value=None) -> None:
    memo[key] = value
    while len(memo) > MEMO_SIZE:
        memo.popitem(last=False)


def say(text: str, kind: str = "note") -> None:
    """``note: ...`` (or ``warning: ...``) on stderr, once per process (a sweep prepares many
    runs of one setting) and only on the main process of a torchrun."""
    if text not in _SAID and dist.info().is_main:
        _remember(_SAID, text)
        print(f"{kind}: {text}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ the oracle's weights --
def same_architecture(cfg: TrainConfig, cache: ClassifierCache, embedded: bool) -> bool:
    """The oracle is the classifier's model: the same name, or a name that resolves to the
    cache's model, with no --model-kwargs that differ from the classifier's."""
    ident = cache.identity
    name = cfg.oracle or cfg.classifier
    if name != cfg.classifier:
        try:
            spec = resolve_spec(name, embedded, None, True, cfg.model_kwargs)
        except ModelError:
            return False     # an unknown name is refused with suggestions where it is built
        if spec.name != ident["model"]:
            return False
    kwargs = ident.get("model_kwargs") or {}
    return all(kwargs.get(k) == v for k, v in cfg.model_kwargs.items())


def classifier_weights(cfg: TrainConfig, cache: ClassifierCache,
                       embedded: bool) -> tuple[TrainConfig, str | None]:
    """``cfg`` with ``weights`` set to the classifier's weights file where the oracle starts from
    it, and the note that says so (None: nothing changed)."""
    path = recorded_weights(cache)
    if (cfg.weights or cfg.random_init or cfg.hub_weights or not path
            or not same_architecture(cfg, cache, embedded)):
        return cfg, None
    fix = ("restore it, or pass --weights FILE (the oracle's starting weights; the classifier's "
           "own file for the usual oracle of its architecture) or --hub-weights")
    if not Path(path).is_file():
        raise ModelError(f"cache {cache.path} was extracted with --weights {path}, the weights an "
                         f"oracle of the classifier's architecture starts from, but {path} is "
                         f"{'a directory' if Path(path).is_dir() else 'missing'}: {fix}")
    found = _loaded_weights_sha256(cache, path)
    expected = cache.identity["weights_sha256"]
    if found != expected:
        raise ModelError(f"cache {cache.path} was extracted with --weights {path}, the weights an "
                         f"oracle of the classifier's architecture starts from, but {path} now "
                         f"holds other weights (sha256 {found[:12]}..., the cache recorded "
                         f"{expected[:12]}...): {fix}")
    note = (f"the oracle ({cache.identity['model']}, the classifier's architecture) starts from "
            f"the classifier's weights {path}, as cache {cache.path} recorded them (checked by "
            "content); --weights FILE or --hub-weights start it elsewhere")
    return replace(cfg, weights=path), note


def _loaded_weights_sha256(cache: ClassifierCache, path: str) -> str:
    """The hash ``extract`` records (``weights_sha256`` of the model it built) of the classifier
    rebuilt from ``path`` as the cache's extract built it."""
    stat = Path(path).stat()
    key = (str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns, cache.identity["model"],
           json.dumps(cache.manifest.get("config", {}).get("model_kwargs"), sort_keys=True))
    if key not in _CHECKED:
        _remember(_CHECKED, key, weights_sha256(cache_classifier(cache, path)))
    return _CHECKED[key]


# --------------------------------------------------------------------- the step count --
def small_run_batch(cfg: TrainConfig, protocol: dict, train_rows: int) -> tuple[TrainConfig,
                                                                              str | None]:
    """A preset's batch that gives fewer than MIN_STEPS_PER_EPOCH steps an epoch (or none): the
    largest power of two that gives that many.  A batch the user gave is kept (prepare refuses
    one the rows cannot fill)."""
    steps = train_rows // cfg.batch_size
    if steps >= MIN_STEPS_PER_EPOCH or "batch_size" not in protocol.get("from_preset", ()):
        return cfg, None
    batch = 2 ** int(math.log2(max(1, train_rows // MIN_STEPS_PER_EPOCH)))
    if batch >= cfg.batch_size:
        return cfg, None
    note = (f"{train_rows} training rows make {steps} step(s) an epoch of the preset's batch of "
            f"{cfg.batch_size}: using batch {batch} (the rule: the largest power of two that "
            f"gives at least {MIN_STEPS_PER_EPOCH} steps an epoch). --batch-size N sets it")
    return replace(cfg, batch_size=batch), note


def small_run_epochs(cfg: TrainConfig, protocol: dict, train_rows: int) -> tuple[TrainConfig,
                                                                               str | None]:
    """The paper's protocol on a split too small for it: the fewest epochs that give
    MIN_TRAIN_STEPS optimizer steps (at most MAX_AUTO_EPOCHS), when the preset chose --epochs."""
    per_epoch = train_rows // cfg.batch_size
    steps = per_epoch * cfg.epochs
    if (not protocol.get("preset", "").endswith("PAPER_ORACLE") or per_epoch == 0
            or "epochs" not in protocol.get("from_preset", ()) or steps >= MIN_TRAIN_STEPS):
        return cfg, None
    epochs = max(cfg.epochs, min(MAX_AUTO_EPOCHS, math.ceil(MIN_TRAIN_STEPS / per_epoch)))
    if epochs == cfg.epochs:
        return cfg, None
    note = (f"{train_rows} training rows make {steps} optimizer step(s) of batch {cfg.batch_size} "
            f"in the preset's {cfg.epochs} epoch(s), too few to train: running {epochs} epochs "
            f"({epochs * per_epoch} steps; the rule: at least {MIN_TRAIN_STEPS} steps, at most "
            f"{MAX_AUTO_EPOCHS} epochs). --epochs N sets it")
    return replace(cfg, epochs=epochs), note


# ------------------------------------------------------------------- the held-out rows --
def heldout_note(cfg: TrainConfig, usable: int, val_correct: np.ndarray) -> str | None:
    """A warning when the held-out rows are too few to choose the checkpoint (and to fit the
    report's temperature-scaled baselines), with the --val-fraction that would reach enough."""
    n = len(val_correct)
    wrong = int((val_correct == 0).sum())
    if n == 0 or (n >= MIN_HELDOUT_ROWS and min(wrong, n - wrong) >= MIN_HELDOUT_PER_KIND):
        return None
    # rows that would hold MIN_HELDOUT_PER_KIND of the rarer kind at the rate seen here
    rare = min(wrong, n - wrong)
    rows = max(MIN_HELDOUT_ROWS, math.ceil(MIN_HELDOUT_PER_KIND * n / rare) if rare else 0)
    pool = min(usable, cfg.train_limit or usable)
    need = rows / pool if pool else 1.0
    fix = (f"pass --val-fraction {math.ceil(need * 100) / 100:g} (about {rows} rows)"
           if need <= 0.5 else f"the split's {pool} rows cannot spare {rows}: it needs more "
           "labelled images")
    return (f"only {n} held-out row(s) ({n - wrong} correct, {wrong} incorrect) choose "
            f"the checkpoint: its held-out AUPR-Error is noise below {MIN_HELDOUT_ROWS} rows with "
            f"{MIN_HELDOUT_PER_KIND} of each kind, and the report's temperature-scaled baselines "
            f"are not fitted on fewer; {fix}")
