"""Everything a run resolves before any model is built, fine-tuned or head-only.

config -> the presets fill what was not given -> open the training and evaluation caches
(fingerprints checked) -> targets into RAM -> carve the held-out rows -> resolve the loss ->
the run record, its group and its directory.  The classifier never runs here: o and the TCP
target come from ``cli.py extract``'s cache.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from cache.reader import slug
from cache.runs import RunDir, RunError, default_run_dir, run_record
from pipeline.core import dist
from pipeline.core.losses import (CUSTOM_PREFIX, HEADS, Context, FunctionLoss, Loss,
                                  LossOptionError, check_options, flag, get, is_custom)
from pipeline.core.models import ModelSpec, file_sha256, resolve_spec
from pipeline.core.precision import default_precision
from pipeline.core.presets import ss_slopes
from pipeline.data.loader import default_workers
from pipeline.data.sources import is_embedded_dataset
from pipeline.oracle.settings.config import LOSS_OPTIONS, TrainConfig, resolve_protocol
from pipeline.oracle.settings.record import as_record, group_hash
from pipeline.oracle.settings.defaults import (classifier_weights, heldout_note, say,
                                               small_run_batch, small_run_epochs)
from pipeline.oracle.settings.sampler import StepSchedule, carve_rows
from pipeline.oracle.settings.targets import (Split, SplitMemo, check_both_classes, open_split,
                                              training_targets)

@dataclass(frozen=True)
class Prepared:
    """Everything resolved before any model is built (the run directory's claim, made after,
    is ``pipeline.oracle.loop.rundir.claimed``'s to return)."""
    cfg: TrainConfig              # the resolved config (saved in run.json and checkpoints)
    record: dict                  # the DATA_CONTRACT ``run`` record
    run: RunDir
    train: Split
    evals: list[Split]
    targets: dict[str, np.ndarray]
    train_rows: np.ndarray
    val_rows: np.ndarray
    loss: Loss                    # the resolved loss (a FunctionLoss for a user's function)
    spec: ModelSpec
    schedule: StepSchedule
    counts: tuple[int, int]       # (incorrect, correct) training rows
    protocol: dict = field(default_factory=dict)   # which preset filled which options
    loss_fn: Callable | None = None   # a user's loss (``loss`` named custom:...), else None

    @property
    def config(self) -> dict:
        """The resolved config as run.json and checkpoints record it."""
        return as_record(self.cfg)


def default_eval_splits(data: str | None, train: Split) -> tuple[str, ...]:
    """The dataset's own held-out split: test for the embedded set, else val (or test)."""
    if is_embedded_dataset(train.samples.dataset):
        return ("test",)
    root = Path(data)
    return ("val",) if (root / "val").is_dir() or not (root / "test").is_dir() else ("test",)


def resolve_oracle(cfg: TrainConfig, embedded: bool) -> tuple[ModelSpec, tuple[float, float],
                                                               str | None]:
    """The oracle's ModelSpec, SS's default slopes for it and why (None: the paper's own)."""
    name = cfg.oracle or cfg.classifier
    spec = resolve_spec(name, embedded, cfg.weights, cfg.random_init, cfg.model_kwargs)
    return (spec, *ss_slopes(name, spec.name))


def _schedule_rows(cfg: TrainConfig, train: Split, targets: dict,
                   protocol: dict) -> tuple[TrainConfig, np.ndarray, np.ndarray, str | None]:
    usable = np.flatnonzero(targets["valid"])
    if cfg.train_limit is not None and not 0 < cfg.train_limit:
        raise RunError(f"--max-samples {cfg.train_limit}: expected a positive number of rows")
    if not 0.0 <= cfg.val_fraction < 1.0:
        raise RunError(f"--val-fraction {cfg.val_fraction}: expected 0 <= fraction < 1")
    train_rows, val_rows = carve_rows(usable, cfg.val_fraction, cfg.train_limit, cfg.split_seed)
    cfg, batch_note = small_run_batch(cfg, protocol, len(train_rows))
    if len(train_rows) < cfg.batch_size:
        raise RunError(f"split {train.tag!r} leaves {len(train_rows)} training rows, fewer than "
                       f"--batch-size {cfg.batch_size}: pass a --batch-size of at most "
                       f"{len(train_rows)} (or leave it out: a batch the rows can fill is chosen), "
                       "or label more images")
    warning = heldout_note(cfg, len(usable), targets["correct"][val_rows])
    if warning:
        say(warning, "warning")
    return cfg, train_rows, val_rows, batch_note


def _runtime(cfg: TrainConfig, device: torch.device) -> TrainConfig:
    """The settings a fine-tuned run resolves on its machine: precision (PRECISION_RULE, unless
    given or preset) and DataLoader workers."""
    if cfg.head_only:
        return cfg
    workers = default_workers(dist.local_world()) if cfg.workers is None else cfg.workers
    return replace(cfg, precision=default_precision(cfg.precision, device), workers=workers)


def prepare(cfg: TrainConfig, device: torch.device, splits: SplitMemo | None = None,
            loss_fn: Callable | None = None) -> Prepared:
    """Open and check every cache, carve the rows, resolve the loss, name the run dir.
    ``splits`` (a sweep's) lists the data and checks its images once for all its runs;
    ``loss_fn``: a user's loss, for a config whose loss is named ``custom:...``."""
    given = check_loss(cfg, loss_fn)
    train = open_split(cfg.data, Path(cfg.cache), cfg.classifier, cfg.train_split, cfg.labels_file,
                       memo=splits)
    embedded = is_embedded_dataset(train.samples.dataset)
    if cfg.head_only:     # the head always trains in float32 (on fp16-stored features)
        cfg = replace(cfg, precision="fp32")
    cfg, protocol = resolve_protocol(cfg, embedded)
    cfg = _runtime(cfg, device)
    cfg, weights_note = classifier_weights(cfg, train.cache, embedded)
    eval_tags = tuple(dict.fromkeys(default_eval_splits(cfg.data, train) + tuple(cfg.eval_splits)))
    evals = [open_split(cfg.data, Path(cfg.cache), cfg.classifier, tag, cfg.labels_file,
                        same_classifier_as=train.cache.identity, memo=splits)
             for tag in eval_tags]
    check_not_trained_on(train, evals, cfg.eval_splits)
    targets = training_targets(train)
    cfg, train_rows, val_rows, batch_note = _schedule_rows(cfg, train, targets, protocol)
    counts = check_both_classes(targets["correct"][train_rows], f"split {train.tag!r}")
    cfg, epochs_note = small_run_epochs(cfg, protocol, len(train_rows))
    spec, alphas, why = resolve_oracle(cfg, embedded)
    loss, z_head = _resolve_loss(cfg, given, alphas, counts)
    notes = {"weights": weights_note, "batch_size": batch_note, "epochs": epochs_note,
             "ss_slopes": _slopes_note(cfg, spec, loss, why)}
    for note in filter(None, notes.values()):
        say(note)
    if any(notes.values()):     # run.json says which default came from the data, and why
        protocol = {**protocol, "notes": {k: v for k, v in notes.items() if v}}
    cfg = replace(cfg, oracle=cfg.oracle or cfg.classifier, eval_splits=eval_tags,
                  preprocess=cfg.preprocess or train.cache.identity["preprocess"], z=z_head,
                  weights_sha256=file_sha256(cfg.weights) if cfg.weights else None,
                  loss_params={p.name: loss.values[p.name] for p in loss.params if p.recorded},
                  cb_beta=loss.cb_beta)
    record = _run_record(cfg, loss, spec, train)
    runs_root = Path(cfg.runs_root) if cfg.runs_root else Path(cfg.artifacts) / "runs"
    # a custom loss's name (custom:module.qualname) as a folder name: slugged
    named = {**record, "loss": slug(record["loss"])} if is_custom(cfg.loss) else record
    run_dir = Path(cfg.out) if cfg.out else default_run_dir(runs_root, named)
    schedule = StepSchedule(train_rows, cfg.batch_size, cfg.epochs, cfg.seed, cfg.flip)
    return Prepared(cfg, record, RunDir(run_dir), train, evals, targets, train_rows,
                    val_rows, loss, spec, schedule, counts, protocol, loss_fn)


def _run_record(cfg: TrainConfig, loss: Loss, spec: ModelSpec, train: Split) -> dict:
    """The DATA_CONTRACT ``run`` record of a resolved config: its variant tags, label and group.
    A custom loss is labelled by its name; the built-in losses' tags (weights, broadcasting,
    linear z) are forms of those losses."""
    config = as_record(cfg)
    custom = is_custom(cfg.loss)
    slopes = ss_slopes(cfg.oracle or cfg.classifier, spec.name)[0]
    tags = ([] if custom else loss.tags(cfg.z, slopes)) + \
        [t for t, on in (("head-only", cfg.head_only), ("confidnet", cfg.head_arch == "confidnet"),
                         ("stacked", cfg.head_inputs == "stacked")) if on]
    if custom:
        label = cfg.loss + (f" ({', '.join(tags)})" if tags else "")
    else:
        label = loss.display(tags)
    return run_record(config, oracle_model=spec.name, variant="+".join(tags), loss_label=label,
                      group=group_hash(config, train.cache.identity),
                      dataset=train.samples.dataset,
                      num_classes=train.cache.identity["num_classes"], tnr=loss.tnr)


def check_loss(cfg: TrainConfig, loss_fn: Callable | None) -> dict:
    """The loss options the config sets (option -> value, None = unset), checked: against its
    built-in loss (``pipeline.core.losses``), or, for a user's loss (``custom:...``, trained only
    with its function), none but the head (--ss-distance): the others are parameters of the built-in
    losses, which a custom loss does not read."""
    given = {**cfg.loss_params, **{k: getattr(cfg, k) for k in LOSS_OPTIONS if k != "loss_params"}}
    if not is_custom(cfg.loss):
        if loss_fn is not None:
            raise RunError(f"a loss function was given for a run of the registered loss "
                           f"{cfg.loss!r}: its config's loss must be named {CUSTOM_PREFIX}...")
        check_options(cfg.loss, given)
        return given
    if loss_fn is None:
        raise RunError(f"the loss {cfg.loss!r} is a user's function, which the command line "
                       "cannot import: train it from Python (trust_oracles.training.train("
                       "settings, loss=fn)); train-oracle trains the built-in losses")
    wrong = [flag(k) for k, v in given.items() if k != "z" and v is not None and v is not False]
    if wrong:
        raise LossOptionError(f"{', '.join(wrong)} {'does' if len(wrong) == 1 else 'do'} not "
                              f"apply to the custom loss {cfg.loss} (it is called with z and the "
                              "trust labels only; --ss-distance chooses its head)")
    if cfg.z is not None and cfg.z not in HEADS:
        raise LossOptionError(f"--ss-distance {cfg.z!r}: expected one of {HEADS}")
    return given


def _resolve_loss(cfg: TrainConfig, given: dict, alphas: tuple[float, float],
                  counts: tuple[int, int]) -> tuple[Loss, str]:
    """The resolved loss and the head it trains.  A loss function has no options; its head is
    --ss-distance's, linear by default (the registered losses' default head but SS's)."""
    if is_custom(cfg.loss):
        return FunctionLoss(function_name=cfg.loss), cfg.z or "linear"
    loss = get(cfg.loss).resolve(given, Context(alphas), counts)
    return loss, loss.head_of(cfg.z)


def _slopes_note(cfg: TrainConfig, spec: ModelSpec, loss: Loss,
                 why: str | None) -> str | None:
    """SS's slopes for a backbone the paper did not train, when not both were given."""
    if (not loss.slopes_by_oracle or why is None or
            all(p.name in cfg.loss_params for p in loss.params)):
        return None
    if cfg.val_fraction == 0:
        raise RunError(f"--loss ss on oracle {spec.name}: the paper gives SS slopes for ViT and "
                       "ResNet backbones only, and --val-fraction 0 leaves no held-out rows to "
                       "choose them on; give --alpha-pos and --alpha-neg, or keep held-out rows "
                       "(--val-fraction > 0) and choose the slopes with `cli.py sweep`")
    return (f"SS slopes alpha+ = {loss.alpha_pos:g}, alpha- = {loss.alpha_neg:g} for oracle "
            f"{spec.name}: {why} (pipeline/core/presets.py ss_slopes); --alpha-pos/--alpha-neg "
            "set others")


def check_not_trained_on(train: Split, evals: list[Split], given: tuple[str, ...]) -> None:
    """Refuse to evaluate on the images the oracle trains on (the same listing, by its dataset
    fingerprint, whatever the tag or corruption): its numbers would be training-set numbers,
    and the report, which fits its baselines on held-out training rows, would fit them on the
    evaluated split.  Refused rather than labelled: every table, figure and export would have
    to carry the label, and one that missed it would print a silently wrong number."""
    fingerprint = train.cache.identity["dataset_fingerprint"]
    for split in evals:
        if split.cache.identity["dataset_fingerprint"] != fingerprint:
            continue
        given_here = split.tag in given
        how = (f"--eval-split {split.tag}" if given_here
               else f"the dataset's evaluation split {split.tag!r} (always scored)")
        fix = (f"drop --eval-split {split.tag}" if given_here
               else "train on another split (--train-split, e.g. the dataset's train split)")
        raise RunError(f"--train-split {train.tag} and {how} list the same images (dataset "
                       f"fingerprint {fingerprint[:12]}): the oracle would be scored on the rows "
                       "it is trained on, and the report's baselines fitted on the evaluated "
                       f"split. {fix[0].upper()}{fix[1:]}.")
