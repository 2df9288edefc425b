"""Everything a run resolves before any model is built, fine-tuned or head-only.

config -> the presets fill what was not given -> open the training and evaluation caches
(fingerprints checked) -> targets into RAM -> carve the held-out rows -> resolve the loss ->
the run record, its group and its directory.  The classifier never runs here: o and the TCP
target come from ``cli.py extract``'s cache.
"""
from __future__ import annotations

import platform
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import timm
import torch
import torch.distributed as tdist

from cache.integrity import as_no_room
from cache.runs import RunDir, RunError, default_run_dir, run_record
from pipeline.core import dist
from pipeline.core.losses import (PARAMS, LossConfig, check_loss_options, head_of, loss_label,
                                  resolve_loss, variant_tags)
from pipeline.core.models import ModelSpec, file_sha256, resolve_spec
from pipeline.core.precision import default_precision
from pipeline.core.presets import ss_slopes
from pipeline.data.images import default_workers
from pipeline.data.sources import FMNIST_NAME, is_embedded
from pipeline.oracle.settings.config import (LOSS_OPTIONS, NOT_IN_GROUP, TrainConfig, as_record,
                                             group_hash, resolve_protocol)
from pipeline.oracle.settings.defaults import (classifier_weights, heldout_note, say,
                                               small_run_batch, small_run_epochs)
from pipeline.oracle.settings.sampler import StepSchedule, carve_rows
from pipeline.oracle.settings.targets import (CLASSIFIER_KEYS, Split, SplitMemo, check_both_classes,
                                              open_split, training_targets)

# Settings a refusal of "holds another run" names when they differ: the run part of the config.
CLAIM_COMPARED = tuple(sorted(f for f in TrainConfig.__dataclass_fields__ if f not in NOT_IN_GROUP))
CLAIM_HINTS = {"weights_sha256": "the --weights file's contents are not the ones this run was "
               "trained with (the file changed in place, or another file): restore that file to "
               "continue this run; new weights make a new run"}


@dataclass
class Prepared:
    """Everything resolved before any model is built."""
    cfg: TrainConfig              # the resolved config (saved in run.json and checkpoints)
    record: dict                  # the DATA_CONTRACT ``run`` record
    run: RunDir
    state: str                    # unclaimed, then new | resume | complete
    train: Split
    evals: list[Split]
    targets: dict[str, np.ndarray]
    train_rows: np.ndarray
    val_rows: np.ndarray
    loss: LossConfig
    spec: ModelSpec
    schedule: StepSchedule
    counts: tuple[int, int]       # (incorrect, correct) training rows
    protocol: dict = field(default_factory=dict)   # which preset filled which options

    @property
    def config(self) -> dict:
        """The resolved config as run.json and checkpoints record it."""
        return as_record(self.cfg)


def default_eval_splits(data: str | None, train: Split) -> tuple[str, ...]:
    """The dataset's own held-out split: test for the embedded set, else val (or test)."""
    if is_embedded(data) or train.samples.dataset == FMNIST_NAME:
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
        raise RunError(f"--train-limit {cfg.train_limit}: expected a positive number of rows")
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


def prepare(cfg: TrainConfig, device: torch.device, splits: SplitMemo | None = None) -> Prepared:
    """Open and check every cache, carve the rows, resolve the loss, name the run dir.
    ``splits`` (a sweep's) lists the data and checks its images once for all its runs."""
    given = {k: getattr(cfg, k) for k in LOSS_OPTIONS}
    check_loss_options(cfg.loss, given)
    train = open_split(cfg.data, Path(cfg.cache), cfg.classifier, cfg.train_split, cfg.labels_file,
                       memo=splits)
    embedded = is_embedded(cfg.data) or train.samples.dataset == FMNIST_NAME
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
    loss = resolve_loss(cfg.loss, given, alphas, counts)
    notes = {"weights": weights_note, "batch_size": batch_note, "epochs": epochs_note,
             "ss_slopes": _slopes_note(cfg, spec, loss, why)}
    for note in filter(None, notes.values()):
        say(note)
    if any(notes.values()):     # run.json says which default came from the data, and why
        protocol = {**protocol, "notes": {k: v for k, v in notes.items() if v}}
    z_head = head_of(cfg.loss, cfg.z)
    cfg = replace(cfg, oracle=cfg.oracle or cfg.classifier, eval_splits=eval_tags,
                  preprocess=cfg.preprocess or train.cache.identity["preprocess"], z=z_head,
                  weights_sha256=file_sha256(cfg.weights) if cfg.weights else None,
                  **{name: getattr(loss, name) for name, p in PARAMS.items() if p.recorded})
    config = as_record(cfg)
    tags = variant_tags(loss, z_head) + (["head-only"] if cfg.head_only else []) + \
        [t for t, on in (("confidnet", cfg.head_arch == "confidnet"),
                         ("stacked", cfg.head_inputs == "stacked")) if on]
    record = run_record(config, oracle_model=spec.name, variant="+".join(tags),
                        loss_label=loss_label(loss, tags), group=group_hash(config, train.cache.identity),
                        dataset=train.samples.dataset,
                        num_classes=train.cache.identity["num_classes"])
    runs_root = Path(cfg.runs_root) if cfg.runs_root else Path(cfg.artifacts) / "runs"
    run_dir = Path(cfg.out) if cfg.out else default_run_dir(runs_root, record)
    schedule = StepSchedule(train_rows, cfg.batch_size, cfg.epochs, cfg.seed, cfg.flip)
    return Prepared(cfg, record, RunDir(run_dir), "unclaimed", train, evals, targets, train_rows,
                    val_rows, loss, spec, schedule, counts, protocol)


def _slopes_note(cfg: TrainConfig, spec: ModelSpec, loss: LossConfig,
                 why: str | None) -> str | None:
    """SS's slopes for a backbone the paper did not train, when not both were given."""
    if cfg.loss != "ss" or why is None or (cfg.alpha_pos is not None and cfg.alpha_neg is not None):
        return None
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


def write_val_split(prep: Prepared, info: dist.DistInfo) -> None:
    """val_split.json: the held-out rows carved from the training split (rank 0)."""
    if info.is_main:
        cfg = prep.cfg
        prep.run.write_val_split({
            "split": prep.train.tag, "val_fraction": cfg.val_fraction,
            "split_seed": cfg.split_seed, "train_limit": cfg.train_limit,
            "num_train_rows": int(len(prep.train_rows)), "num_val_rows": int(len(prep.val_rows)),
            "val_rows": prep.val_rows.tolist()})


def run_extras(prep: Prepared, schedule_info: dict) -> dict:
    """What run.json records of a run besides its record and status."""
    ident = prep.train.cache.identity
    return {"schedule": schedule_info, "loss": prep.loss.to_dict(),
            "train_cache": str(prep.train.cache.path),
            "eval_caches": {s.tag: str(s.cache.path) for s in prep.evals},
            "classifier_identity": {k: ident[k] for k in CLASSIFIER_KEYS},
            "train_fingerprint": ident["dataset_fingerprint"],
            "class_counts": {"incorrect": prep.counts[0], "correct": prep.counts[1]},
            "rows": {"train": int(len(prep.train_rows)), "val": int(len(prep.val_rows))},
            "protocol": prep.protocol}


def versions() -> dict:
    """The library versions run.json records, and the CPU thread count: fine-tuned weights on
    the CPU depend on it (kernels split float sums by thread; docs/RESULTS.md "Determinism")."""
    return {"torch": torch.__version__, "timm": timm.__version__,
            "python": platform.python_version(), "threads": torch.get_num_threads()}


@contextmanager
def claimed(preps: list[Prepared], info: dist.DistInfo, must_resume: bool, kept: str):
    """Lock and claim the runs' directories (rank 0 decides, the others follow): each prep's
    ``state`` becomes new, resume or complete.  Any error after the claim marks the claimed runs
    that are not complete ``failed`` with its message (a write that finds no room: the one
    disk-full message, ``kept`` saying what survives and how to go on); a failed start leaves
    no empty run folder behind."""
    existed = [p.run.path.exists() for p in preps]
    with ExitStack() as locks:
        try:
            for prep in preps:
                err = None
                try:
                    locks.enter_context(prep.run.lock(info.is_main))
                except RunError as e:
                    err = e
                if not dist.all_ok(info, err is None):
                    raise err or RunError(f"rank 0 could not lock {prep.run.path}")
                prep.state = _claim(prep, must_resume, info)
            yield preps
        except Exception as err:
            full = as_no_room(err, preps[0].run.path, kept)
            if info.is_main:   # a run that stops is never left `running`; another run's
                for prep in preps:   # run.json (a refused claim) is not this call's to mark
                    if prep.state in ("new", "resume"):
                        prep.run.mark_failed(str(full or err))
            if full is None:
                raise
            raise full from None
        finally:
            locks.close()
            for prep, before in zip(preps, existed):
                if info.is_main and not before:   # a failed start leaves no empty run folder
                    _remove_if_empty(prep.run.path)


def _claim(prep: Prepared, must_resume: bool, info: dist.DistInfo) -> str:
    """Rank 0 decides; the others follow (or stop with it)."""
    err, state = None, "new"
    if info.is_main:
        try:
            state = prep.run.claim(prep.record, must_resume, CLAIM_COMPARED, CLAIM_HINTS)
        except RunError as e:
            err = e
    if not dist.all_ok(info, err is None):
        raise err or RunError(f"rank 0 refused run directory {prep.run.path}")
    if info.enabled:
        box = [state]
        tdist.broadcast_object_list(box, src=0)
        state = box[0]
    return state


def _remove_if_empty(run_dir: Path) -> None:
    try:
        run_dir.rmdir()
    except OSError:   # not empty (the run wrote something) or already gone
        pass
