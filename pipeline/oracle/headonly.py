"""``train-oracle --head-only``: heads trained on the oracle backbone's cached features, written as
ordinary run directories (run.json, val_split.json, log.jsonl, checkpoints/best.pt, outputs/).

prepared runs (as any run: caches checked, rows carved, loss resolved) -> the oracle backbone built
once, for the identity of its weights -> its feature caches (train + every eval split) opened and
checked against the classifier caches -> features + targets loaded once -> one bank of heads
(``pipeline.oracle.head``) -> per head: log, best.pt (the head only), outputs of every eval split.
Runs that differ only in loss parameters (a sweep's points) share one bank.
"""
from __future__ import annotations

import json
import math
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from cache.outputs import classifier_ref
from cache.reader import ClassifierCache, cache_dir_for
from cache.schema import CacheError
from pipeline.core import dist
from pipeline.core.models import build_model, resolve_data_config, weights_sha256
from pipeline.oracle.checkpoint import BEST, load_checkpoint, save_checkpoint
from pipeline.oracle.features import FeatureSource, load_table, open_features
from pipeline.oracle.head import BankSettings, HeadResult, score, train_bank
from pipeline.oracle import train as T
from pipeline.oracle.loop import schedule_info
from pipeline.oracle.predict import output_path, outputs_done, write_z_outputs
from pipeline.oracle.runs import (CHECKPOINTS, RunError, RunLock, StepLog, TrainingDiverged,
                                  claim_run, read_run_file, write_run_file)

# Loss parameters that may differ inside one bank (everything else is shared).
BANK_FREE = ("gamma", "alpha_pos", "alpha_neg", "pos_weight", "neg_weight", "class_balanced",
             "cb_beta", "out", "runs_root")


def bank_key(prep) -> str:
    return json.dumps({k: v for k, v in prep.config.items() if k not in BANK_FREE},
                      sort_keys=True, default=str)


@dataclass(frozen=True)
class Backbone:
    identity: dict      # features.BACKBONE_KEYS of the oracle backbone
    record: dict        # how predict rebuilds it: weights, random_init, seed, weights_sha256


_BACKBONES: dict[str, Backbone] = {}


def oracle_backbone(prep, features_root: Path) -> Backbone:
    """Build the oracle backbone once (CPU) for the identity of its weights.  A random-init
    backbone is built with the seed its feature cache was extracted with."""
    spec, preprocess = prep.spec, prep.config["preprocess"]
    seed = 0
    if spec.random_init:
        path = cache_dir_for(features_root, prep.config["oracle"], prep.train.tag)
        try:
            seed = int(ClassifierCache.open(path).manifest.get("config", {}).get("seed", 0))
        except CacheError:
            seed = 0      # open_features names the missing cache below
    key = json.dumps([spec.name, spec.kwargs, spec.weights, spec.random_init, seed, preprocess],
                     sort_keys=True, default=str)
    if key not in _BACKBONES:
        model = build_model(spec, seed=seed)
        identity = {"model": spec.name, "model_kwargs": spec.kwargs,
                    "weights_sha256": weights_sha256(model), "preprocess": preprocess,
                    "data_config": resolve_data_config(model, spec, preprocess).to_dict()}
        weights = str(Path(spec.weights).resolve()) if spec.weights else None
        _BACKBONES[key] = Backbone(identity, {"weights": weights, "random_init": spec.random_init,
                                              "seed": seed,
                                              "weights_sha256": identity["weights_sha256"]})
    return _BACKBONES[key]


def feature_source(prep, backbone: Backbone) -> FeatureSource:
    cfg = prep.config
    root = Path(cfg["features_cache"] or cfg["cache"])
    args = ["--data", cfg["data"]] if cfg["data"] else []
    if cfg["weights"]:
        args += ["--weights", cfg["weights"]]
    if cfg["random_init"]:
        args += ["--random-init", "--seed", str(backbone.record["seed"])]
    if cfg["model_kwargs"]:
        args += ["--model-kwargs", json.dumps(cfg["model_kwargs"])]
    return FeatureSource(root, cfg["oracle"], backbone.identity, tuple(args))


def bank_settings(prep, sched: dict) -> BankSettings:
    cfg, k = prep.config, prep.record["num_classes"]
    total = sched["total_steps"]
    val_every = (cfg["val_every"] or max(1, total // 4)) if len(prep.val_rows) else None
    return BankSettings(
        hyperplane=cfg["z"] == "hyperplane", lr=cfg["lr"], momentum=cfg["momentum"],
        weight_decay=cfg["weight_decay"], pct_start=sched["pct_start"],
        cycle_momentum=cfg["cycle_momentum"], seed=cfg["seed"],
        tnr_logit=math.log((1 / k) / (1 - 1 / k)) if cfg["loss"] == "tcp" and k > 1 else 0.0,
        val_every=val_every, log_every=max(1, cfg["log_every"]))


def _check_valid(fcache: ClassifierCache, split, rows: np.ndarray) -> None:
    """Rows the classifier cache scores must have features (decodable in both extractions)."""
    valid = fcache.load(["valid"])["valid"].astype(bool)
    bad = rows[~valid[rows]]
    if len(bad):
        raise CacheError(f"feature cache {fcache.path}: row {int(bad[0])} ({len(bad)} in all) is "
                         f"invalid (undecodable there) but valid in the classifier cache "
                         f"{split.cache.path}; extract both with the same data and --skip-bad")


def run_heads(preps: list, extras: list[dict], sched: dict, device: torch.device) -> list[dict]:
    """Train (or finish) the head-only runs ``preps`` of one bank; returns one summary each."""
    first = preps[0]
    backbone = oracle_backbone(first, Path(first.config["features_cache"] or first.config["cache"]))
    src = feature_source(first, backbone)
    flip = bool(first.config["flip"])
    train_fc = open_features(src, first.train, need_flip=flip)
    eval_fcs = {s.tag: open_features(src, s, need_flip=False) for s in first.evals}
    feature_caches = {tag: _feature_record(fc) for tag, fc in
                      [(first.train.tag, train_fc), *eval_fcs.items()]}
    build = {"model": first.spec.name, "model_kwargs": first.spec.kwargs,
             "data_config": backbone.identity["data_config"], "head": first.config["z"],
             "head_only": True, "backbone": backbone.record}
    extras = [{**e, "head_only": True, "feature_caches": feature_caches, "oracle_build": build}
              for e in extras]
    todo = [i for i, p in enumerate(preps) if p.state != "complete"]
    trained: dict[int, HeadResult] = {}
    timing = {}
    if todo:
        _check_valid(train_fc, first.train, np.concatenate([first.train_rows, first.val_rows]))
        table = load_table(train_fc, first.train, first.targets, flip, device)
        results, timing = train_bank(table, first.schedule, [preps[i].loss for i in todo],
                                     bank_settings(first, sched), first.val_rows)
        trained = dict(zip(todo, results))
    out = []
    for i, prep in enumerate(preps):
        extra = {**extras[i], "timing": timing} if i in trained else extras[i]
        if i in trained and not _write_trained(prep, trained[i], extra, sched):
            out.append({"run_dir": str(prep.run_dir), "status": "failed",
                        "error": read_error(prep.run_dir), "total_steps": sched["total_steps"]})
            continue
        out.append(_finish(prep, eval_fcs, extra, sched, device, already=i not in trained))
    return out


def read_error(run_dir: Path) -> str:
    return read_run_file(run_dir).get("error", "")


def _feature_record(fc: ClassifierCache) -> dict:
    """The feature cache's identity as run.json records it (what the head was trained on)."""
    keys = ("model", "model_kwargs", "weights_sha256", "preprocess", "data_config", "precision",
            "dataset_fingerprint", "split", "corruption", "num_rows", "features_flip")
    return {"path": str(fc.path.resolve()), **{k: fc.identity.get(k) for k in keys}}


def _write_trained(prep, res: HeadResult, extra: dict, sched: dict) -> bool:
    """log.jsonl and best.pt of a freshly trained head; False (run.json 'failed') if diverged."""
    log = StepLog(prep.run_dir, None, True)
    for entry in res.log:
        log.write(entry)
    total = sched["total_steps"]
    if res.diverged_at is not None:
        err = TrainingDiverged(
            f"the loss became non-finite at step {res.diverged_at} of {total} (head-only run; "
            "nothing was kept). Lower --lr or check the features.")
        write_run_file(prep.run_dir, prep.record, "failed", step=res.diverged_at, error=str(err),
                       **extra)
        return False
    state, step, score_, metric = res.best_state, res.best_step, res.best_score, "val_aupr_error"
    if state is None:      # no held-out rows (or no defined score): the final head
        state, step, score_, metric = res.final_state, total, None, "final"
    save_checkpoint(prep.run_dir / CHECKPOINTS / BEST, {
        "head": state, "head_only": True, "step": step, "score": score_, "metric": metric,
        "group": prep.record["group"], "seed": prep.record["seed"]})
    write_run_file(prep.run_dir, prep.record, "scoring", step=total,
                   best={"step": step, "val_aupr_error": score_}, **extra)
    return True


def _finish(prep, eval_fcs: dict, extra: dict, sched: dict, device, already: bool) -> dict:
    """Outputs of every eval split from the chosen head (missing ones only); run complete."""
    ckpt = load_checkpoint(prep.run_dir / CHECKPOINTS / BEST)
    if not ckpt.get("head_only"):
        raise CacheError(f"{prep.run_dir / CHECKPOINTS / BEST} is not a head-only checkpoint")
    w = ckpt["head"]["linear.weight"].to(device)
    b = ckpt["head"]["linear.bias"].to(device)
    run = read_run_file(prep.run_dir)
    outputs, results = dict(run.get("outputs", {})), []
    info = dist.info()
    for split in prep.evals:
        path = output_path(prep.run_dir, split.tag)
        if outputs_done(path, classifier_ref(split.cache.path, split.cache.identity), prep.record):
            results.append({"split": split.tag, "path": str(path), "already_complete": True})
        else:
            cols = split.cache.load(["valid", "correct", "label", "pred", "p_true"])
            rows = np.flatnonzero(cols["valid"] == 1)
            fc = eval_fcs[split.tag]
            _check_valid(fc, split, rows)
            table = load_table(fc, split, {"correct": cols["correct"], "p_true": cols["p_true"]},
                               False, device)
            z = score(table, rows, w, b, prep.config["z"] == "hyperplane")[:, 0]
            results.append(write_z_outputs(split, cols, rows, z, path, prep.record, info))
        outputs[split.tag] = str(path)
    best = run.get("best") or {"step": ckpt.get("step"), "val_aupr_error": ckpt.get("score")}
    summary = {"run_dir": str(prep.run_dir), "status": "complete", "best": best,
               "outputs": results, "total_steps": sched["total_steps"], "already_complete": already,
               "resumed_at": 0, "head_only": True}
    if already and all(r.get("already_complete") for r in results):
        return summary            # nothing new: run.json stays as it was
    keep = {k: v for k, v in extra.items() if k not in ("best", "step", "outputs")}
    if already and "timing" in run:
        keep["timing"] = run["timing"]
    write_run_file(prep.run_dir, prep.record, "complete", step=sched["total_steps"], best=best,
                   outputs=outputs, **keep)
    return summary


# Settings of the fine-tuned loop that have no meaning for a head-only run (refused if set).
NOT_HEAD_ONLY = {"accum_steps": 1, "compile": False, "stop_at_step": None, "resume": False}


def train_head_only(cfgs: list) -> list[dict]:
    """Head-only runs in this process: each run directory claimed like any run (a complete one
    is skipped, an incomplete one trained again: it takes seconds), runs differing only in loss
    parameters trained as one bank.  Returns one summary per config, in order."""
    info, device = dist.init(cfgs[0].device)
    if info.world > 1:
        raise RunError("--head-only trains in one process (an epoch is a few matrix products): "
                       "launch it without torchrun")
    for cfg in cfgs:
        wrong = [k for k, v in NOT_HEAD_ONLY.items() if getattr(cfg, k) != v]
        if not cfg.head_only or wrong:
            raise RunError(f"not a head-only config: head_only={cfg.head_only}, "
                           f"{', '.join('--' + k.replace('_', '-') for k in wrong)} set "
                           "(they apply to fine-tuning only)")
    preps = [T.prepare(cfg, info) for cfg in cfgs]
    banks: dict[str, list[int]] = {}
    for i, prep in enumerate(preps):
        banks.setdefault(bank_key(prep), []).append(i)
    summaries: dict[int, dict] = {}
    with ExitStack() as stack:
        for prep in preps:
            stack.enter_context(RunLock(prep.run_dir))
            prep.state = claim_run(prep.run_dir, prep.record, False)
        for members in banks.values():
            bank = [preps[i] for i in members]
            first = bank[0]
            sched = schedule_info(first.config, first.schedule.total_steps,
                                  first.schedule.steps_per_epoch, 1)
            extras = [T.run_extras(p, sched) for p in bank]
            for p, extra in zip(bank, extras):
                if p.state != "complete":
                    T.write_val_split(p, info)
                    write_run_file(p.run_dir, p.record, "running", step=0, **extra)
            for i, summary in zip(members, run_heads(bank, extras, sched, device)):
                summaries[i] = summary
    return [summaries[i] for i in range(len(cfgs))]
