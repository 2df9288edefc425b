"""The training loop of ``cli.py train-oracle``: objects, schedule, loop, validation, checkpoints.

Sync points (every ``log_every`` steps, before a validation or checkpoint, at the end) are the
only places the host waits for the device: the window's losses are checked for NaN/inf there,
logged, and shown in the progress bar.  A checkpoint is written only after such a check, so
``last.pt`` never holds weights updated by a non-finite loss.
"""
from __future__ import annotations

import math
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from pipeline.core import dist
from pipeline.core.models import DataConfig
from pipeline.core.precision import grad_scaler
from pipeline.data.images import GpuNormalize, ImageRows, make_loader, transform_for
from pipeline.oracle.checkpoint import BEST, LAST, load_checkpoint, save_checkpoint, unwrap
from pipeline.oracle.losses import per_sample_loss
from pipeline.oracle.model import build_oracle
from pipeline.oracle.predict import oracle_z
from pipeline.oracle.runs import CHECKPOINTS, RunError, StepLog, TrainingDiverged
from pipeline.oracle.sampler import loader_batches, micro_slices
from pipeline.oracle.step import (TargetTable, TrainObjects, first_non_finite, global_mean,
                                  global_sum, restore_training_state, save_training_state,
                                  train_step, val_metrics)

MAX_WARMUP_FRACTION = 0.3      # OneCycleLR's own default pct_start
GRAD_NORM_DEFINITION = (
    "mean over training samples of ||dL/dx_out_i||_2: x_out_i = sample i's pooled backbone "
    "output (the head's input), L = the optimizer step's loss (mean over the global batch, as "
    "optimised); x batch size = the per-sample-loss gradient (paper App., 'Analysis of Gradients')")


def schedule_info(config: dict, total_steps: int, steps_per_epoch: int, world: int) -> dict:
    """The effective OneCycle schedule; warm-up is capped at 30% of a short run (noted)."""
    if total_steps < 3:
        raise RunError(
            f"{total_steps} optimizer step(s) are too few for the OneCycle schedule (>= 3 "
            "needed): use more training rows (--train-limit), more --epochs or a smaller "
            "--batch-size")
    if config["batch_size"] % (world * config["accum_steps"]):
        raise RunError(f"--batch-size {config['batch_size']} is not divisible by {world} "
                       f"process(es) x --accum-steps {config['accum_steps']}")
    warm = config["warmup_steps"]
    cap = max(2, int(MAX_WARMUP_FRACTION * total_steps))
    eff = min(max(warm, 2), cap, total_steps - 1)
    return {"total_steps": total_steps, "steps_per_epoch": steps_per_epoch,
            "warmup_steps": warm, "warmup_steps_effective": eff, "pct_start": eff / total_steps,
            "world_size": world, "micro_batch": config["batch_size"] // (world * config["accum_steps"]),
            "cycle_momentum": config["cycle_momentum"],
            "momentum": "0.85-0.95 (cycled)" if config["cycle_momentum"] else config["momentum"]}


def build_objects(prep, info: dist.DistInfo, device: torch.device,
                  sched: dict) -> tuple[TrainObjects, DataConfig]:
    cfg = prep.config
    model, data_cfg = build_oracle(prep.spec, cfg["z"], cfg["preprocess"], cfg["seed"])
    model = model.to(device)
    if cfg["channels_last"]:
        model = model.to(memory_format=torch.channels_last)
    ddp = None
    step_model = model
    if info.enabled:
        step_model = ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    if cfg["compile"]:
        step_model = torch.compile(step_model)
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"],
                          weight_decay=cfg["weight_decay"])
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=cfg["lr"], total_steps=sched["total_steps"], pct_start=sched["pct_start"],
        cycle_momentum=cfg["cycle_momentum"])
    k = prep.record["num_classes"]
    tnr_logit = math.log((1 / k) / (1 - 1 / k)) if cfg["loss"] == "tcp" and k > 1 else 0.0
    objs = TrainObjects(model, step_model, ddp, opt, scheduler, grad_scaler(cfg["precision"], device),
                        GpuNormalize(data_cfg, device, cfg["channels_last"]), prep.loss,
                        cfg["precision"], device, info, tnr_logit)
    return objs, data_cfg


@dataclass
class LoopState:
    step: int = 0
    counts: np.ndarray = field(default_factory=lambda: np.zeros(4))   # TP, P, TN, N
    best_score: float | None = None
    best_step: int | None = None
    last_ckpt_step: int | None = None
    grads: np.ndarray = field(default_factory=lambda: np.zeros(2))    # sum of norms, samples

    def grad_norm(self) -> dict:
        """run.json's ``grad_norm``: the run mean of the per-sample head-input gradient norm."""
        total, n = self.grads
        return {"mean": float(total / n) if n else None, "samples": int(n),
                "definition": GRAD_NORM_DEFINITION}

    def extra(self, prep) -> dict:
        return {"counts": self.counts.tolist(), "grads": self.grads.tolist(),
                "best_score": self.best_score,
                "best_step": self.best_step, "group": prep.record["group"],
                "config": prep.config}


class StopSignals:
    """SIGINT/SIGTERM ask the loop to stop after the current step (checkpoint written).
    Installed before the DataLoader forks, so its workers inherit the handler and keep running."""

    def __enter__(self):
        self.requested = False
        self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def _handle(self, signum, frame):
        if self.requested:  # second signal: stop now
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)
        return False


@dataclass(frozen=True)
class LoopSettings:
    run_dir: Path
    log_every: int
    val_every: int | None         # None: no held-out validation
    ckpt_every: int
    stop_at_step: int | None
    workers: int
    eval_batch_size: int
    progress: bool


def fit(prep, objs: TrainObjects, data_cfg: DataConfig, state: LoopState,
        s: LoopSettings, step_fn=train_step) -> str:
    """Train from ``state.step`` to the end, to --stop-at-step ('stopped') or to a SIGINT/SIGTERM
    ('interrupted'); a checkpoint is written in the last two cases.  Returns the outcome.
    log.jsonl (and TensorBoard events, when installed) record every logged step.  ``step_fn``:
    ``train_step`` or a ``pipeline.oracle.graph.GraphedStep`` (same signature and results)."""
    log = StepLog(s.run_dir, state.step, objs.info.is_main)
    try:
        return _fit(prep, objs, data_cfg, state, s, log, step_fn)
    finally:
        log.close()          # flushes the TensorBoard event file


def _fit(prep, objs: TrainObjects, data_cfg: DataConfig, state: LoopState, s: LoopSettings,
         log: StepLog, step_fn) -> str:
    info, schedule = objs.info, prep.schedule
    total = schedule.total_steps
    slices = micro_slices(schedule.batch_size, info.world, info.rank, prep.config["accum_steps"])
    table = TargetTable.from_arrays(prep.targets)
    bar = tqdm(total=total, initial=state.step, unit="step", desc=f"train {prep.record['loss']}",
               disable=not (s.progress and info.is_main), dynamic_ncols=True)
    window: list[torch.Tensor] = []
    counts = torch.zeros(4, device=objs.device)
    grads = torch.zeros(2, device=objs.device)
    t0 = time.perf_counter()
    with StopSignals() as stop:
        dataset = ImageRows(prep.train.samples, transform_for(prep.train.samples, data_cfg),
                            prep.train.corrupt_fn())
        loader = make_loader(dataset, loader_batches(schedule, state.step, slices), s.workers,
                             pin_memory=objs.device.type == "cuda")
        batches = iter(loader)
        while state.step < total:
            loss, c, g = step_fn(objs, batches, state.step, schedule, slices, table)
            state.step += 1
            window.append(loss)
            counts += c
            grads += g
            step = state.step
            val_now = s.val_every is not None and (step % s.val_every == 0 or step == total)
            ckpt_now = step % s.ckpt_every == 0 or step == total or step == s.stop_at_step
            if not (step % s.log_every == 0 or val_now or ckpt_now or step == total
                    or (stop.requested and not info.enabled)):
                continue
            t0 = _sync(prep, objs, state, window, counts, grads, log, bar, t0)
            window, counts, grads = [], torch.zeros(4, device=objs.device), torch.zeros_like(grads)
            if val_now:
                validate(prep, objs, data_cfg, state, log, s)
            signalled = not dist.all_ok(info, not stop.requested)
            if ckpt_now or signalled:
                save_training_state(s.run_dir / CHECKPOINTS / LAST, objs, step, state.extra(prep))
                state.last_ckpt_step = step
            if (signalled or step == s.stop_at_step) and step < total:
                bar.close()
                return "interrupted" if signalled else "stopped"
    bar.close()
    return "trained"


def _sync(prep, objs: TrainObjects, state: LoopState, window: list, counts: torch.Tensor,
          grads: torch.Tensor, log: StepLog, bar, t0: float) -> float:
    """Check the window's global losses for NaN/inf, then log them; returns the new t0."""
    losses = global_mean(objs.info, torch.stack(window)).cpu().numpy().astype(np.float64)
    state.counts += global_sum(objs.info, counts).cpu().numpy()
    g_sum, g_n = global_sum(objs.info, grads).cpu().numpy().astype(np.float64)
    state.grads += (g_sum, g_n)
    first = state.step - len(window) + 1
    bad = first_non_finite(losses)
    if bad is not None:
        where = (f"the last good checkpoint is {prep.run_dir / CHECKPOINTS / LAST} (step "
                 f"{state.last_ckpt_step})" if state.last_ckpt_step else "no checkpoint was written")
        fp32 = "" if objs.precision == "fp32" else "use --precision fp32, "  # not to an fp32 run
        raise TrainingDiverged(f"the loss became {losses[bad]} at step {first + bad} of "
                               f"{prep.schedule.total_steps}; training stopped and {where}. Lower "
                               f"--lr, {fp32}or check the targets.")
    now = time.perf_counter()
    img_s = len(window) * prep.schedule.batch_size / max(now - t0, 1e-9)
    tp, p, tn, n = state.counts
    tpr, tnr = (tp / p if p else math.nan), (tn / n if n else math.nan)
    lr = objs.optimizer.param_groups[0]["lr"]
    for i, value in enumerate(losses):
        entry = {"step": first + i, "loss": float(value)}
        if i == len(losses) - 1:
            entry.update(lr=lr, img_per_s=round(img_s, 1), tpr=tpr, tnr=tnr,
                         grad_norm=float(g_sum / g_n) if g_n else None)
        log.write(entry)
    bar.update(len(window))
    bar.set_postfix(loss=f"{losses.mean():.4f}", img_s=f"{img_s:.0f}", tpr=f"{tpr:.3f}",
                    tnr=f"{tnr:.3f}", refresh=False)
    return now


def validate(prep, objs: TrainObjects, data_cfg: DataConfig, state: LoopState, log: StepLog,
             s: LoopSettings) -> dict:
    """Score the held-out rows; keep best.pt on the highest AUPR-Error (standard definition)."""
    rows = prep.val_rows
    z = oracle_z(objs.model, prep.train, rows, data_cfg, batch_size=s.eval_batch_size,
                 workers=s.workers, precision=objs.precision, device=objs.device, info=objs.info)
    o, pt = prep.targets["correct"][rows], prep.targets["p_true"][rows]
    loss = per_sample_loss(objs.loss, torch.from_numpy(z), torch.from_numpy(o),
                           torch.from_numpy(pt)).mean().item()
    metrics = val_metrics(z, o, loss, objs.tnr_logit)
    log.write({"step": state.step, "val": metrics})
    score = metrics["aupr_error"]
    if math.isfinite(score) and (state.best_score is None or score > state.best_score):
        state.best_score, state.best_step = score, state.step
        save_best(s.run_dir, objs, prep, state.step, score, "val_aupr_error")
    return metrics


def save_best(run_dir: Path, objs: TrainObjects, prep, step: int, score: float | None,
              metric: str) -> None:
    if objs.info.is_main:
        save_checkpoint(run_dir / CHECKPOINTS / BEST, {
            "model": unwrap(objs.model).state_dict(), "step": step, "score": score,
            "metric": metric, "group": prep.record["group"], "seed": prep.record["seed"]})
    dist.barrier(objs.info)


def resume_state(run_dir: Path, objs: TrainObjects, prep) -> LoopState:
    """Load last.pt into the objects; drop a best.pt the checkpoint does not know about (it
    came from steps after the checkpoint and will be recomputed identically)."""
    ckpt = load_checkpoint(run_dir / CHECKPOINTS / LAST)
    if ckpt.get("group") != prep.record["group"]:
        raise RunError(f"{run_dir / CHECKPOINTS / LAST} belongs to group {ckpt.get('group')}, "
                       f"not {prep.record['group']}; delete the run directory to start over")
    restore_training_state(objs, ckpt)
    state = LoopState(int(ckpt["step"]), np.asarray(ckpt["counts"], np.float64),
                      ckpt["best_score"], ckpt["best_step"], int(ckpt["step"]),
                      np.asarray(ckpt.get("grads", (0.0, 0.0)), np.float64))
    best = run_dir / CHECKPOINTS / BEST
    if objs.info.is_main and best.exists() and load_checkpoint(best).get("step") != state.best_step:
        best.unlink()
    dist.barrier(objs.info)
    return state
