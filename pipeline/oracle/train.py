"""Stage 2: train an oracle from cached classifier targets, then score the evaluation splits.

resolve config -> open caches (fingerprints checked) -> targets into RAM -> carve held-out rows ->
claim the run directory (skip / resume / new) -> build oracle, optimizer, OneCycle, scaler ->
loop (pipeline.oracle.step) with validation and checkpoints -> best oracle over each eval split.
The classifier never runs here: o and the TCP target come from ``cli.py extract``'s cache.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from cache.integrity import as_no_room
from cache.manifest import write_json_atomic
from pipeline.core import dist
from pipeline.core.models import ModelError, ModelSpec, resolve_spec
from pipeline.core.presets import EMBEDDED_ORACLE, PAPER_ORACLE, SS_ALPHAS, family
from pipeline.data.sources import FMNIST_NAME, is_embedded
from pipeline.oracle import loop as fit
from pipeline.oracle.graph import choose_step
from pipeline.oracle.losses import (LossConfig, check_loss_options, loss_label, resolve_loss,
                                    variant_tags)
from pipeline.oracle.predict import finish_run
from pipeline.oracle.runs import (VAL_FILE, RunError, RunLock, TrainingDiverged, claim_run,
                                  default_run_dir, group_hash, mark_failed, run_record,
                                  write_run_file)
from pipeline.oracle.sampler import StepSchedule, carve_rows
from pipeline.oracle.targets import (CLASSIFIER_KEYS, Split, check_both_classes, open_split,
                                     training_targets)

LOSS_OPTIONS = ("gamma", "alpha_pos", "alpha_neg", "z", "class_balanced", "cb_beta",
                "pos_weight", "neg_weight", "broadcast")


@dataclass(frozen=True)
class TrainConfig:
    classifier: str = "vit"
    loss: str = "ss"
    oracle: str | None = None              # default: the classifier's name
    data: str | None = None                # None: the embedded Fashion-MNIST
    cache: str = "artifacts/fashion-mnist/cache"
    artifacts: str = "artifacts/fashion-mnist"   # default run dirs: <artifacts>/runs/<name>
    out: str | None = None
    runs_root: str | None = None           # default run dirs: <runs_root>/<name>; None: <artifacts>/runs
    labels_file: str | None = None
    train_split: str = "train"
    eval_splits: tuple[str, ...] = ()      # resolved: the dataset's test/val split + extras
    seed: int = 0
    # oracle backbone
    weights: str | None = None
    random_init: bool = False
    model_kwargs: dict = field(default_factory=dict)
    preprocess: str | None = None          # default: the classifier cache's preprocessing
    # loss (None / False = not given; resolve_loss fills defaults and refuses misfits)
    z: str | None = None
    gamma: float | None = None
    alpha_pos: float | None = None
    alpha_neg: float | None = None
    class_balanced: bool = False
    cb_beta: float | None = None
    pos_weight: float | None = None
    neg_weight: float | None = None
    broadcast: bool = False
    # optimisation.  None = not given: resolve_protocol fills these from presets.PAPER_ORACLE
    # (the paper's protocol) or, on the embedded dataset, presets.EMBEDDED_ORACLE
    lr: float | None = None
    weight_decay: float | None = None
    momentum: float | None = None
    warmup_steps: int | None = None
    cycle_momentum: bool = False
    batch_size: int | None = None
    accum_steps: int = 1
    epochs: int | None = None
    flip: bool = True
    # rows
    train_limit: int | None = None         # resolved; 0 = every row
    val_fraction: float = 0.05
    val_every: int | None = None           # resolved; None: 4 validations per run (+ the end)
    split_seed: int = 0
    # runtime
    precision: str | None = None           # resolved (bf16; fp32 on the embedded dataset)
    channels_last: bool = True
    compile: bool = False
    cuda_graph: str = "auto"               # auto | on | off (pipeline.oracle.graph)
    device: str | None = None
    workers: int = 8
    eval_batch_size: int = 256
    ckpt_every: int = 2000
    log_every: int = 10
    stop_at_step: int | None = None
    resume: bool = False
    progress: bool = True
    # head-only: the frozen oracle backbone's cached features (pipeline.oracle.headonly)
    head_only: bool = False
    features_cache: str | None = None      # cache root of the oracle's features; None: --cache


@dataclass
class Prepared:
    """Everything resolved before any model is built."""
    config: dict                  # the resolved config (saved in run.json and checkpoints)
    record: dict                  # the DATA_CONTRACT ``run`` record
    run_dir: Path
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


def default_eval_splits(data: str | None, train: Split) -> tuple[str, ...]:
    """The dataset's own held-out split: test for the embedded set, else val (or test)."""
    if is_embedded(data) or train.samples.dataset == FMNIST_NAME:
        return ("test",)
    root = Path(data)
    return ("val",) if (root / "val").is_dir() or not (root / "test").is_dir() else ("test",)


def resolve_protocol(cfg: TrainConfig, embedded: bool) -> tuple[TrainConfig, dict]:
    """Fill every protocol option left at None from the preset of the dataset (the one place
    where defaults are chosen).  Returns the resolved config and what was taken from where."""
    name = "EMBEDDED_ORACLE" if embedded else "PAPER_ORACLE"
    preset = EMBEDDED_ORACLE if embedded else PAPER_ORACLE
    given = {k: getattr(cfg, k) for k in preset}
    filled = {k: preset[k] if v is None else v for k, v in given.items()}
    if filled["train_limit"] == 0:        # explicit "every row" (the embedded preset has a limit)
        filled["train_limit"] = None
    origin = {"preset": f"pipeline.presets.{name}",
              "from_preset": sorted(k for k, v in given.items() if v is None)}
    return replace(cfg, **filled), origin


def resolve_oracle(cfg: TrainConfig, embedded: bool) -> tuple[ModelSpec, tuple[float, float] | None]:
    name = cfg.oracle or cfg.classifier
    spec = resolve_spec(name, embedded, cfg.weights, cfg.random_init, cfg.model_kwargs)
    fam = family(name) if family(name) != "other" else family(spec.name)
    return spec, SS_ALPHAS.get(fam)


def _schedule_rows(cfg: TrainConfig, train: Split, targets: dict) -> tuple[np.ndarray, np.ndarray]:
    usable = np.flatnonzero(targets["valid"])
    if cfg.train_limit is not None and not 0 < cfg.train_limit:
        raise RunError(f"--train-limit {cfg.train_limit}: expected a positive number of rows")
    if not 0.0 <= cfg.val_fraction < 1.0:
        raise RunError(f"--val-fraction {cfg.val_fraction}: expected 0 <= fraction < 1")
    train_rows, val_rows = carve_rows(usable, cfg.val_fraction, cfg.train_limit, cfg.split_seed)
    if len(train_rows) < cfg.batch_size:
        raise RunError(f"split {train.tag!r} leaves {len(train_rows)} training rows, fewer than "
                       f"--batch-size {cfg.batch_size}")
    return train_rows, val_rows


def prepare(cfg: TrainConfig, info: dist.DistInfo) -> Prepared:
    """Open and check every cache, carve the rows, resolve the loss, name the run dir."""
    given = {k: getattr(cfg, k) for k in LOSS_OPTIONS}
    check_loss_options(cfg.loss, given)
    train = open_split(cfg.data, Path(cfg.cache), cfg.classifier, cfg.train_split, cfg.labels_file)
    embedded = is_embedded(cfg.data) or train.samples.dataset == FMNIST_NAME
    if cfg.head_only:     # the head always trains in float32 (on fp16-stored features)
        cfg = replace(cfg, precision="fp32")
    cfg, protocol = resolve_protocol(cfg, embedded)
    eval_tags = tuple(dict.fromkeys(default_eval_splits(cfg.data, train) + tuple(cfg.eval_splits)))
    evals = [open_split(cfg.data, Path(cfg.cache), cfg.classifier, tag, cfg.labels_file,
                        same_classifier_as=train.cache.identity) for tag in eval_tags]
    targets = training_targets(train)
    train_rows, val_rows = _schedule_rows(cfg, train, targets)
    counts = check_both_classes(targets["correct"][train_rows], f"split {train.tag!r}")
    spec, alphas = resolve_oracle(cfg, embedded)
    if cfg.loss == "ss" and alphas is None and (cfg.alpha_pos is None or cfg.alpha_neg is None):
        raise ModelError(f"oracle {spec.name!r} is neither a ViT nor a ResNet, so SS has no "
                         "default slopes: give --alpha-pos and --alpha-neg")
    loss = resolve_loss(cfg.loss, given, alphas or (1.0, 1.0), counts)
    z_head = (cfg.z or "hyperplane") if cfg.loss == "ss" else "linear"
    config = asdict(replace(cfg, oracle=cfg.oracle or cfg.classifier, eval_splits=eval_tags,
                            preprocess=cfg.preprocess or train.cache.identity["preprocess"],
                            z=z_head, gamma=loss.gamma, alpha_pos=loss.alpha_pos,
                            alpha_neg=loss.alpha_neg, cb_beta=loss.cb_beta))
    tags = variant_tags(loss, z_head) + (["head-only"] if cfg.head_only else [])
    group = group_hash(config, train.cache.identity)
    record = run_record(config, oracle_model=spec.name, variant="+".join(tags),
                        loss_label=loss_label(loss, tags), group=group,
                        dataset=train.samples.dataset,
                        num_classes=train.cache.identity["num_classes"])
    runs_root = Path(cfg.runs_root) if cfg.runs_root else Path(cfg.artifacts) / "runs"
    run_dir = Path(cfg.out) if cfg.out else default_run_dir(runs_root, record)
    schedule = StepSchedule(train_rows, cfg.batch_size, cfg.epochs, cfg.seed, cfg.flip)
    return Prepared(config, record, run_dir, "unclaimed", train, evals, targets, train_rows,
                    val_rows, loss, spec, schedule, counts, protocol)


def _claim(run_dir: Path, record: dict, must_resume: bool, info: dist.DistInfo) -> str:
    """Rank 0 decides; the others follow (or stop with it)."""
    err, state = None, "new"
    if info.is_main:
        try:
            state = claim_run(run_dir, record, must_resume)
        except RunError as e:
            err = e
    if not dist.all_ok(info, err is None):
        raise err or RunError(f"rank 0 refused run directory {run_dir}")
    if info.enabled:
        import torch.distributed as tdist
        box = [state]
        tdist.broadcast_object_list(box, src=0)
        state = box[0]
    return state


def write_val_split(prep: Prepared, info: dist.DistInfo) -> None:
    """val_split.json: the held-out rows carved from the training split (rank 0)."""
    if not info.is_main:
        return
    prep.run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(prep.run_dir / VAL_FILE, {
        "split": prep.train.tag, "val_fraction": prep.config["val_fraction"],
        "split_seed": prep.config["split_seed"], "train_limit": prep.config["train_limit"],
        "num_train_rows": int(len(prep.train_rows)), "num_val_rows": int(len(prep.val_rows)),
        "val_rows": prep.val_rows.tolist()})


def run_extras(prep: Prepared, schedule_info: dict) -> dict:
    ident = prep.train.cache.identity
    return {"schedule": schedule_info, "loss": prep.loss.to_dict(),
            "train_cache": str(prep.train.cache.path),
            "eval_caches": {s.tag: str(s.cache.path) for s in prep.evals},
            "classifier_identity": {k: ident[k] for k in CLASSIFIER_KEYS},
            "class_counts": {"incorrect": prep.counts[0], "correct": prep.counts[1]},
            "rows": {"train": int(len(prep.train_rows)), "val": int(len(prep.val_rows))},
            "protocol": prep.protocol}


def train(cfg: TrainConfig) -> dict:
    """Run stage 2 for one (oracle, classifier, loss, seed); returns a summary dict.
    (Head-only runs: ``pipeline.oracle.headonly.train_head_only``.)"""
    if cfg.head_only or cfg.features_cache:
        raise RunError("head-only runs are trained by pipeline.oracle.headonly.train_head_only "
                       "(--features-cache applies to --head-only only)")
    info, device = dist.init(cfg.device)
    prep = prepare(cfg, info)
    existed = prep.run_dir.exists()
    lock, err = RunLock(prep.run_dir, info.is_main), None
    try:
        lock.__enter__()
    except RunError as e:
        err = e
    if not dist.all_ok(info, err is None):
        raise err or RunError(f"rank 0 could not lock {prep.run_dir}")
    try:
        prep.state = _claim(prep.run_dir, prep.record, cfg.resume, info)
        return _train_claimed(cfg, prep, info, device)
    except Exception as err:
        full = as_no_room(err, prep.run_dir, "the run resumes from its last complete checkpoint")
        if full is None:
            raise
        if info.is_main:
            mark_failed(prep.run_dir, str(full))
        raise full from None
    finally:
        lock.__exit__()
        if info.is_main and not existed:   # a failed start leaves no empty run folder
            _remove_if_empty(prep.run_dir)


def _remove_if_empty(run_dir: Path) -> None:
    try:
        run_dir.rmdir()
    except OSError:   # not empty (the run wrote something) or already gone
        pass


def _train_claimed(cfg: TrainConfig, prep: Prepared, info: dist.DistInfo, device) -> dict:
    sched = fit.schedule_info(prep.config, prep.schedule.total_steps,
                              prep.schedule.steps_per_epoch, info.world)
    if prep.state == "complete":
        return {**finish_run(prep, None, info, device, sched), "already_complete": True}
    objs, data_cfg = fit.build_objects(prep, info, device, sched)
    state = fit.LoopState()
    if prep.state == "resume":
        state = fit.resume_state(prep.run_dir, objs, prep)
    step_fn, step_path = choose_step(objs, cfg.cuda_graph, cfg.accum_steps)
    extras = {**run_extras(prep, sched), "oracle_build": oracle_build(prep, data_cfg),
              "step_path": step_path}   # the dict a failed capture updates (auto: eager)
    write_val_split(prep, info)
    if info.is_main:
        write_run_file(prep.run_dir, prep.record, "running", step=state.step, **extras)
    settings = fit.LoopSettings(
        prep.run_dir, max(1, cfg.log_every),
        (prep.config["val_every"] or max(1, sched["total_steps"] // 4)) if len(prep.val_rows)
        else None,
        max(1, cfg.ckpt_every), cfg.stop_at_step, cfg.workers, cfg.eval_batch_size, cfg.progress)
    resumed_at = state.step
    try:
        outcome = fit.fit(prep, objs, data_cfg, state, settings, step_fn)
    except TrainingDiverged as err:
        if info.is_main:
            write_run_file(prep.run_dir, prep.record, "failed", step=state.step, error=str(err),
                           **extras)
        raise
    best = {"step": state.best_step, "val_aupr_error": state.best_score}
    extras["grad_norm"] = {**state.grad_norm(), "global_batch": prep.schedule.batch_size}
    if outcome in ("stopped", "interrupted"):
        if info.is_main:
            write_run_file(prep.run_dir, prep.record, outcome, step=state.step, best=best,
                           **extras)
        return {"run_dir": str(prep.run_dir), "status": outcome, "step": state.step,
                "total_steps": sched["total_steps"], "resumed_at": resumed_at}
    if state.best_step is None:   # no held-out rows (or no defined score): the final model
        fit.save_best(prep.run_dir, objs, prep, state.step, None, "final")
        best = {"step": state.step, "val_aupr_error": None}
    summary = finish_run(prep, objs, info, device, sched, best=best, extras=extras)
    return {**summary, "resumed_at": resumed_at, "already_complete": False}


def oracle_build(prep: Prepared, data_cfg) -> dict:
    """What ``predict`` needs to rebuild the oracle without fetching weights."""
    return {"model": prep.spec.name, "model_kwargs": prep.spec.kwargs,
            "data_config": data_cfg.to_dict(), "head": prep.config["z"]}
