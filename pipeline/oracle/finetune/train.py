"""Stage 2: train a fine-tuned oracle from cached classifier targets, then score the evaluation
splits.  (Head-only runs: ``pipeline.oracle.headonly.train``; both share everything below the
config.)

prepare (``pipeline.oracle.settings.prepare``: caches checked, rows carved, loss resolved, run
named) -> claim the run directory (skip / resume / new) -> build oracle, optimizer, OneCycle, scaler
(``pipeline.oracle.finetune.objects``) -> the loop (``pipeline.oracle.loop.fit``) with validation
and checkpoints -> best oracle over each eval split (``pipeline.oracle.loop.outputs.finish_run``).
"""
from __future__ import annotations

from typing import Callable

import torch

from cache.runs import RUN_IDENTITY, RunError
from pipeline.core import dist
from pipeline.core.catalog import BEST_KEY
from pipeline.core.models import DataConfig
from pipeline.core.precision import made_on
from pipeline.oracle.finetune.graph import choose_step
from pipeline.oracle.finetune.objects import (ImageSession, build_objects, distribute, resume_state,
                                              save_best)
from pipeline.oracle.loop.capture import current_path
from pipeline.oracle.loop.fit import fit
from pipeline.oracle.loop.state import LoopState, TrainingDiverged
from pipeline.oracle.loop.log import StepLog
from pipeline.oracle.loop.outputs import finish_run, image_scorer
from pipeline.oracle.loop.schedule import loop_settings, schedule_of
from pipeline.oracle.settings.config import TrainConfig
from pipeline.oracle.settings.given import head_only_settings
from pipeline.oracle.loop.rundir import claimed, run_extras, versions, write_val_split
from pipeline.oracle.settings.prepare import Prepared, prepare
from pipeline.oracle.settings.targets import SplitMemo

RESUMES = "the run resumes from its last complete checkpoint"


def train(cfg: TrainConfig, splits: SplitMemo | None = None, *,
          loss_fn: Callable | None = None) -> dict:
    """Run stage 2 for one (oracle, classifier, loss, seed); returns a summary dict.
    (Head-only runs: ``pipeline.oracle.headonly.train.train_head_only``.)  ``splits``: a sweep's
    listings and image checks, shared by its runs.  ``loss_fn``: a user's loss for a run whose
    loss is ``custom:...`` (``pipeline.oracle.nets.losses.CustomLoss``; the public API's
    ``trust_oracles.training.train``)."""
    if cfg.head_only or cfg.features_cache or head_only_settings(cfg):
        raise RunError("head-only runs are trained by "
                       "pipeline.oracle.headonly.train.train_head_only "
                       f"({', '.join(['--features-cache'] + head_only_settings(cfg))} "
                       "applies to --head-only runs only)")
    info, device = dist.init(cfg.device)
    prep = prepare(cfg, device, splits, loss_fn)
    dist.agree(info, "train-oracle settings", agreed(prep))
    with claimed([prep], info, cfg.resume, RESUMES) as (claim,):
        return _train_claimed(prep, claim, info, device)


def agreed(prep: Prepared) -> dict:
    """What every process of one run must share: the run (its labels and group: the settings and
    the training cache's identity) and the runtime settings that change its steps; not where
    each node finds the files, its loader workers or its progress bar.  --cuda-graph has its own
    check (``finetune.graph.choose_step``)."""
    local = ("data", "cache", "out", "runs_root", "labels_file", "features_cache", "weights",
             "device", "workers", "progress", "artifacts", "cuda_graph")
    config = {k: v for k, v in prep.record["config"].items() if k not in local}
    return {**config, **{k: prep.record[k] for k in RUN_IDENTITY},
            "eval_caches": [s.cache.identity["dataset_fingerprint"] for s in prep.evals]}


def _train_claimed(prep: Prepared, claim: str, info: dist.DistInfo,
                   device: torch.device) -> dict:
    """``claim``: the run directory's state, new, resume or complete."""
    sched = schedule_of(prep, info.world)
    total = sched["total_steps"]
    if claim == "complete":
        scorer = lambda run: image_scorer(prep, info, device, run)  # noqa: E731
        return {**finish_run(prep, scorer, info, total), "already_complete": True}
    objs, data_cfg = build_objects(prep, info, device, sched)
    state = LoopState()
    if claim == "resume":
        state = resume_state(prep.run, objs, prep.record["group"])
    step_fn, step_path = choose_step(objs, prep.cfg.cuda_graph, prep.cfg.accum_steps)
    objs = distribute(objs, step_path["mode"] == "cuda_graph")
    extras = {**run_extras(prep, sched, made_on(device, prep.cfg.precision)),
              "oracle_build": oracle_build(prep, data_cfg),
              "step_path": step_path}
    write_val_split(prep, info)
    if info.is_main:
        prep.run.write(prep.record, "running", versions(), step=state.step, **extras)
    settings = loop_settings(prep, max(1, prep.cfg.ckpt_every), f"train {prep.record['loss']}")
    resumed_at = state.step
    log = StepLog(prep.run, state.step, info.is_main)
    try:
        outcome = fit(ImageSession(prep, objs, data_cfg, step_fn), state, settings, [log])
    except TrainingDiverged as err:
        extras["step_path"] = current_path(step_fn, step_path)   # a failed capture: eager
        if info.is_main:
            prep.run.write(prep.record, "failed", versions(), step=state.step, error=str(err),
                           **extras)
        raise
    finally:
        log.close()          # flushes the TensorBoard event file
    head = state.heads[0]
    best = {"step": head.best_step, BEST_KEY: head.best_score}
    extras["step_path"] = current_path(step_fn, step_path)       # a failed capture: eager
    extras["grad_norm"] = {**state.grad_norm(), "global_batch": prep.schedule.batch_size}
    if outcome in ("stopped", "interrupted"):
        if info.is_main:
            prep.run.write(prep.record, outcome, versions(), step=state.step, best=best, **extras)
        return {"run_dir": str(prep.run.path), "status": outcome, "step": state.step,
                "total_steps": total, "resumed_at": resumed_at}
    if head.best_step is None:   # no held-out rows (or no defined score): the final model
        save_best(prep.run, objs, prep.record, state.step, None, "final")
        best = {"step": state.step, BEST_KEY: None}
    scorer = lambda run: image_scorer(prep, info, device, run, objs)  # noqa: E731
    summary = finish_run(prep, scorer, info, total, best=best, extras=extras)
    return {**summary, "resumed_at": resumed_at, "already_complete": False}


def oracle_build(prep: Prepared, data_cfg: DataConfig) -> dict:
    """What ``predict`` needs to rebuild the oracle without fetching weights."""
    return {"model": prep.spec.name, "model_kwargs": prep.spec.kwargs,
            "data_config": data_cfg.to_dict(), "head": prep.cfg.z}
