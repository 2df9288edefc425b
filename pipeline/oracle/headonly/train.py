"""``train-oracle --head-only``: heads trained on the oracle backbone's cached features, written as
ordinary run directories (run.json, val_split.json, log.jsonl, checkpoints/best.pt, outputs/).

prepared runs (as any run: caches checked, rows carved, loss resolved;
``pipeline.oracle.settings.prepare``) -> claimed -> grouped into banks (runs that differ only in
loss parameters) -> per bank: the oracle backbone built once for the identity of its weights -> its
feature caches (train + every eval split) opened and checked against the classifier caches, before
anything is written -> features and targets loaded once -> the loop (``pipeline.oracle.loop.fit``)
over a ``FeatureSession`` -> per head: best.pt (the head only), then every eval split's outputs and
the run complete, as every run ends (``pipeline.oracle.loop.outputs.finish_run``).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from cache.reader import ClassifierCache
from cache.runs import BEST, RunError
from cache.schema import CacheError
from pipeline.core import dist
from pipeline.core.catalog import BEST_KEY
from pipeline.core.losses import tnr_logit
from pipeline.oracle.headonly.bank import BankOptim, score, train_heads
from pipeline.oracle.headonly.features import (FeatureMemo, check_logits, check_valid,
                                               feature_record, feature_source, features_made_on,
                                               load_table, open_features, oracle_backbone)
from pipeline.oracle.headonly.graph import head_step_path
from pipeline.oracle.loop.capture import current_path
from pipeline.oracle.loop.state import HeadState, TrainingDiverged
from pipeline.oracle.loop.log import StepLog
from pipeline.oracle.loop.outputs import Scorer, finish_run, scored_rows, write_z_outputs
from pipeline.oracle.loop.schedule import loop_settings, schedule_of
from pipeline.oracle.nets.checkpoint import load_checkpoint, save_checkpoint
from pipeline.oracle.nets.heads import head_from_checkpoint
from pipeline.oracle.nets.losses import eager_loss
from pipeline.oracle.settings.config import TrainConfig
from pipeline.oracle.settings.given import head_only_misfits
from pipeline.oracle.settings.record import bank_key
from pipeline.oracle.loop.rundir import claimed, run_extras, versions, write_val_split
from pipeline.oracle.settings.prepare import Prepared, prepare

RETRAINS = "a re-run trains the head again (head-only runs keep no mid-run checkpoint)"


def train_head_only(cfgs: list[TrainConfig], memo: FeatureMemo | None = None, *,
                    loss_fn: Callable | None = None) -> list[dict]:
    """Head-only runs in this process: each run directory claimed like any run (a complete one
    is skipped, an incomplete one trained again: it takes seconds), runs differing only in loss
    parameters trained as one bank.  ``memo`` (a sweep's) keeps the loaded features for the
    next call; without it they are freed at the end.  ``loss_fn``: a user's loss for runs whose
    loss is ``custom:...`` (``pipeline.oracle.nets.losses.CustomLoss``; the public API's
    ``trust_oracles.training.train``).  Returns one summary per config."""
    info, device = dist.init(cfgs[0].device)
    if info.world > 1:
        raise RunError("--head-only trains in one process (an epoch is a few matrix products): "
                       "launch it without torchrun")
    for cfg in cfgs:
        wrong = head_only_misfits(cfg)
        if not cfg.head_only or wrong:
            raise RunError(f"not a head-only config: head_only={cfg.head_only}, "
                           f"{', '.join(wrong)} set (they apply to fine-tuning only)")
        # --cuda-graph on where impossible: refused
        head_step_path(device, cfg.cuda_graph, eager_loss(cfg.loss, loss_fn), cfg.compile)
    mine = memo is None
    memo = FeatureMemo() if mine else memo
    summaries: dict[int, dict] = {}
    try:
        preps = [prepare(cfg, device, memo.splits, loss_fn) for cfg in cfgs]
        banks: dict[str, list[int]] = {}
        for i, prep in enumerate(preps):
            banks.setdefault(bank_key(prep.cfg), []).append(i)
        with claimed(preps, info, False, RETRAINS) as claims:
            for members in banks.values():
                for i, summary in zip(members, run_bank([preps[i] for i in members],
                                                        [claims[i] for i in members], info,
                                                        device, memo)):
                    summaries[i] = summary
    finally:
        if mine:
            memo.clear()      # the features leave the device with the call
    return [summaries[i] for i in range(len(cfgs))]


def run_bank(preps: list[Prepared], claims: list[str], info: dist.DistInfo,
             device: torch.device, memo: FeatureMemo) -> list[dict]:
    """Train (or finish) the head-only runs ``preps`` of one bank (``claims``: each run
    directory's state, new, resume or complete); returns one summary each."""
    first = preps[0]
    sched = schedule_of(first, 1)
    backbone = oracle_backbone(first, memo)
    src = feature_source(first, backbone)
    train_fc = open_features(src, first.train, need_flip=first.cfg.flip, memo=memo)
    eval_fcs = {s.tag: open_features(src, s, need_flip=False, memo=memo) for s in first.evals}
    if first.cfg.head_inputs == "stacked":
        check_logits(first.train, first.cfg.flip)
    build = {"model": first.spec.name, "model_kwargs": first.spec.kwargs,
             "data_config": backbone.identity["data_config"], "head": first.cfg.z,
             "head_only": True, "backbone": backbone.record, **head_kind(first.cfg)}
    caches = {tag: feature_record(fc) for tag, fc in [(first.train.tag, train_fc), *eval_fcs.items()]}
    # run.json says which step ran: as chosen, or eager where a capture under auto fell back
    step_path = head_step_path(device, first.cfg.cuda_graph,
                               eager_loss(first.cfg.loss, first.loss_fn),
                               first.cfg.compile)
    extras = [{**run_extras(p, sched, features_made_on(train_fc)), "head_only": True,
               "feature_caches": caches, "oracle_build": build, "step_path": step_path}
              for p in preps]
    todo = [i for i, claim in enumerate(claims) if claim != "complete"]
    for i in todo:
        write_val_split(preps[i], info)
        preps[i].run.write(preps[i].record, "running", versions(), step=0, **extras[i])
    trained, timing, ran = train_bank([preps[i] for i in todo], train_fc, device, memo, sched,
                                      step_path) if todo else ([], {}, step_path)
    trained = dict(zip(todo, trained))
    out, fcs = [], {first.train.tag: train_fc, **eval_fcs}   # train: its held-out rows
    for i, prep in enumerate(preps):
        scorer = lambda run, p=prep: feature_scorer(p, fcs, device, info, memo)  # noqa: E731
        total = prep.schedule.total_steps
        if i not in trained:
            summary = finish_run(prep, scorer, info, total)
        else:
            extra = {**extras[i], "timing": timing, "step_path": ran}
            best = _write_trained(prep, *trained[i], extra)
            if best is None:
                out.append({"run_dir": str(prep.run.path), "status": "failed",
                            "error": prep.run.record().error, "total_steps": total})
                continue
            summary = finish_run(prep, scorer, info, total, best=best, extras=extra)
        out.append({**summary, "already_complete": i not in trained, "resumed_at": 0,
                    "head_only": True})
    return out


def train_bank(bank: list[Prepared], train_fc: ClassifierCache, device: torch.device,
               memo: FeatureMemo, sched: dict, step_path: dict) -> tuple[list[tuple], dict, dict]:
    """The loop over one bank of heads (eager, or captured in a CUDA graph as ``step_path``
    says): per head (its state, best head, final head), the timing, and the step path that ran
    (eager where a capture under auto fell back)."""
    first = bank[0]
    cfg = first.cfg
    check_valid(train_fc, first.train, np.concatenate([first.train_rows, first.val_rows]))
    table = load_table(train_fc, first.train, first.targets, cfg.flip, device, memo,
                       stacked=cfg.head_inputs == "stacked")
    optim = BankOptim(cfg.seed, cfg.z == "hyperplane", cfg.lr, cfg.momentum, cfg.weight_decay,
                      sched["pct_start"], cfg.cycle_momentum, cfg.head_arch)
    logs = [StepLog(p.run, None, True) for p in bank]
    try:
        state, session = train_heads(
            table, first.schedule, [p.loss for p in bank], optim, first.val_rows,
            tnr_logit(first.record["tnr"], first.record["num_classes"]),
            loop_settings(first, None, f"train {cfg.loss} (head-only)"), logs, step_path,
            first.loss_fn)
    finally:
        for log in logs:
            log.close()
    heads = [(h, session.best[p], session.head.state_of(p)) for p, h in enumerate(state.heads)]
    return heads, session.timing(len(bank)), current_path(session.fast, step_path)


def _write_trained(prep: Prepared, h: HeadState, best_state: dict | None, final_state: dict,
                   extra: dict) -> dict | None:
    """best.pt of a freshly trained head; None (run.json 'failed') if it diverged."""
    total = prep.schedule.total_steps
    if h.diverged_at is not None:
        err = TrainingDiverged(
            f"the loss became {h.diverged_value} at step {h.diverged_at} of {total}; training "
            "stopped and nothing was kept (head-only run). Lower --lr, or check the features.")
        prep.run.write(prep.record, "failed", versions(), step=h.diverged_at, error=str(err),
                       **extra)
        return None
    state, step, score_, metric = best_state, h.best_step, h.best_score, BEST_KEY
    if state is None:      # no held-out rows (or no defined score): the final head
        state, step, score_, metric = final_state, total, None, "final"
    save_checkpoint(prep.run.checkpoint(BEST), {
        "head": state, "head_only": True, "step": step, "score": score_, "metric": metric,
        "group": prep.record["group"], "seed": prep.record["seed"], **head_kind(prep.cfg)})
    best = {"step": step, BEST_KEY: score_}
    prep.run.write(prep.record, "scoring", versions(), step=total, best=best, **extra)
    return best


def head_kind(cfg: TrainConfig) -> dict:
    """best.pt's and oracle_build's record of a head other than today's linear one on features
    (``pipeline.oracle.nets.heads.head_from_checkpoint`` reads it; absent: that one)."""
    kind = {"arch": cfg.head_arch, "inputs": cfg.head_inputs}
    return {} if kind == {"arch": "linear", "inputs": "features"} else kind


def feature_scorer(prep: Prepared, eval_fcs: dict, device: torch.device, info: dist.DistInfo,
                   memo: FeatureMemo) -> Scorer:
    """A head-only run's scorer: its chosen head (best.pt) on each split's cached features."""
    path = prep.run.checkpoint(BEST)
    ckpt = load_checkpoint(path)
    if not ckpt.get("head_only"):
        raise CacheError(f"{path} is not a head-only checkpoint")
    head = head_from_checkpoint(ckpt, prep.cfg.z == "hyperplane", count=1).to(device)

    def score_split(split, out_path, rows=None) -> dict:
        cols = split.cache.load(["valid", "correct", "label", "pred", "p_true"])
        rows = scored_rows(cols["valid"], rows)
        fc = eval_fcs[split.tag]
        check_valid(fc, split, rows)
        table = load_table(fc, split, {"correct": cols["correct"], "p_true": cols["p_true"]},
                           False, device, memo, stacked=head.stacked)
        z = score(table, rows, head)[:, 0]
        return write_z_outputs(prep.run, split, cols, rows, z, out_path, prep.record, info,
                               features_made_on(fc))
    return score_split
