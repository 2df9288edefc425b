"""A fine-tuned oracle in the loop (``pipeline.oracle.loop.fit``): its training objects, and the
session that steps it on images and validates it on the held-out rows' images.

The step is ``pipeline.oracle.finetune.step.train_step`` or, on a CUDA device, that step captured in
a CUDA graph (``pipeline.oracle.finetune.graph``); checkpoints (``last.pt``, ``best.pt``) are
written atomically, so a killed run resumes exactly.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from cache.runs import BEST, LAST, RunDir, RunError
from pipeline.core import dist
from pipeline.core.catalog import BEST_KEY
from pipeline.core.losses import tnr_logit
from pipeline.core.models import DataConfig
from pipeline.core.precision import grad_scaler
from pipeline.data.images import GpuNormalize, ImageRows, transform_for
from pipeline.data.loader import make_loader
from pipeline.oracle.finetune.step import (TargetTable, TrainObjects, restore_training_state,
                                           save_training_state)
from pipeline.oracle.loop.state import LoopState, TrainingDiverged
from pipeline.oracle.loop.outputs import oracle_z
from pipeline.oracle.loop.schedule import sgd_onecycle
from pipeline.oracle.nets.checkpoint import load_checkpoint, save_checkpoint, unwrap
from pipeline.oracle.nets.losses import HeadLoss, make_loss
from pipeline.oracle.nets.model import build_oracle
from pipeline.oracle.settings.prepare import Prepared
from pipeline.oracle.settings.sampler import loader_batches, micro_slices


def build_objects(prep: Prepared, info: dist.DistInfo, device: torch.device,
                  sched: dict) -> tuple[TrainObjects, DataConfig]:
    cfg = prep.cfg
    model, data_cfg = build_oracle(prep.spec, cfg.z, cfg.preprocess, cfg.seed)
    model = model.to(device)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    step_model = torch.compile(model) if cfg.compile else model   # DDP comes with the step
    opt, scheduler = sgd_onecycle(model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                                  weight_decay=cfg.weight_decay,
                                  total_steps=sched["total_steps"], pct_start=sched["pct_start"],
                                  cycle_momentum=cfg.cycle_momentum)
    objs = TrainObjects(model, step_model, None, opt, scheduler, grad_scaler(cfg.precision, device),
                        GpuNormalize(data_cfg, device, cfg.channels_last),
                        make_loss([prep.loss], device, prep.loss_fn), cfg.precision, device, info,
                        tnr_logit(prep.record["tnr"], prep.record["num_classes"]))
    return objs, data_cfg


def distribute(objs: TrainObjects, graphed: bool) -> TrainObjects:
    """The objects for several processes (torchrun); one process: unchanged.  The eager step
    runs through DDP (its hooks all-reduce the gradients).  The graphed step averages them
    itself (``pipeline.oracle.finetune.graph``), and DDP must not wrap it: DDP keeps the parameters'
    AccumulateGrad nodes from its construction on the default stream, and backward on the capture
    stream would then sync with the default stream, which invalidates the capture.  So only what
    DDP's construction does is done: rank 0's weights and buffers broadcast to the others."""
    if not objs.info.enabled:
        return objs
    if graphed:
        dist.broadcast_flat([*objs.model.parameters(), *objs.model.buffers()])
        return objs
    ddp = DDP(objs.step_model, device_ids=[objs.device.index] if objs.device.type == "cuda"
              else None)
    return replace(objs, step_model=ddp, ddp=ddp)


def save_best(run: RunDir, objs: TrainObjects, record: dict, step: int, score: float | None,
              metric: str) -> None:
    """best.pt: the chosen model (rank 0)."""
    if objs.info.is_main:
        save_checkpoint(run.checkpoint(BEST), {
            "model": unwrap(objs.model).state_dict(), "step": step, "score": score,
            "metric": metric, "group": record["group"], "seed": record["seed"]})
    dist.barrier(objs.info)


def resume_state(run: RunDir, objs: TrainObjects, group: str) -> LoopState:
    """Load last.pt into the objects; drop a best.pt the checkpoint does not know about (it
    came from steps after the checkpoint and will be recomputed identically)."""
    ckpt = load_checkpoint(run.checkpoint(LAST))
    if ckpt.get("group") != group:
        raise RunError(f"{run.checkpoint(LAST)} belongs to group {ckpt.get('group')}, "
                       f"not {group}; delete the run directory to start over")
    restore_training_state(objs, ckpt)
    state = LoopState.from_checkpoint(ckpt)
    best = run.checkpoint(BEST)
    if objs.info.is_main and best.exists() and \
            load_checkpoint(best).get("step") != state.heads[0].best_step:
        best.unlink()
    dist.barrier(objs.info)
    return state


class ImageSession:
    """The loop's session for a fine-tuned oracle (``pipeline.oracle.loop.state.Session``)."""

    def __init__(self, prep: Prepared, objs: TrainObjects, data_cfg: DataConfig,
                 step_fn: Callable):
        self.prep, self.objs, self.data_cfg, self.step_fn = prep, objs, data_cfg, step_fn
        self.info, self.tnr_logit = objs.info, objs.tnr_logit
        self.val_correct = prep.targets["correct"][prep.val_rows]
        # validation runs on the CPU's arrays; a user's loss on the training's device, where
        # its own tensors (an nn.Module's buffers) are
        self.val_loss = objs.loss if prep.loss_fn is not None else HeadLoss([prep.loss])

    def start(self, step: int) -> None:
        """The DataLoader from ``step`` on (inside the loop's signal handlers: its workers
        inherit them)."""
        prep, objs = self.prep, self.objs
        self.slices = micro_slices(prep.schedule.batch_size, self.info.world, self.info.rank,
                                   prep.cfg.accum_steps)
        self.table = TargetTable.from_arrays(prep.targets)
        dataset = ImageRows(prep.train.samples, transform_for(prep.train.samples, self.data_cfg),
                            prep.train.corrupt_fn())
        loader = make_loader(dataset, loader_batches(prep.schedule, step, self.slices),
                             prep.cfg.workers, pin_memory=objs.device.type == "cuda")
        self.batches = iter(loader)
        self._reset()

    def _reset(self) -> None:
        self.counts = torch.zeros(4, 1, device=self.objs.device)
        self.grads = torch.zeros(2, device=self.objs.device)

    def steps(self, done: int, last: int) -> torch.Tensor:
        """One optimizer step (whatever ``last``); its (1, 1) loss."""
        loss, counts, grads = self.step_fn(self.objs, self.batches, done, self.prep.schedule,
                                           self.slices, self.table)
        self.counts += counts
        self.grads += grads
        return loss[None]

    def drain(self) -> tuple[torch.Tensor, torch.Tensor]:
        out = (self.counts, self.grads)
        self._reset()
        return out

    def lr(self) -> float:
        return self.objs.optimizer.param_groups[0]["lr"]

    def validate(self) -> tuple[np.ndarray, np.ndarray]:
        prep, objs = self.prep, self.objs
        rows = prep.val_rows
        z = oracle_z(objs.model, prep.train, rows, self.data_cfg,
                     batch_size=prep.cfg.eval_batch_size, workers=prep.cfg.workers,
                     precision=objs.precision, device=objs.device, info=self.info)
        o, pt = prep.targets["correct"][rows], prep.targets["p_true"][rows]
        dev = objs.device if prep.loss_fn is not None else torch.device("cpu")
        loss = self.val_loss.batch_mean(*(torch.from_numpy(a).to(dev) for a in (z[:, None], o, pt)),
                                        broadcast=False)
        return z[:, None], loss.cpu().numpy()

    def keep_best(self, head: int, step: int, score: float) -> None:
        save_best(self.prep.run, self.objs, self.prep.record, step, score, BEST_KEY)

    def save_last(self, step: int, state: LoopState) -> None:
        save_training_state(self.prep.run.checkpoint(LAST), self.objs, step, {
            **state.checkpoint_record(), "group": self.prep.record["group"],
            "config": self.prep.config})

    def diverged(self, value: float, step: int, state: LoopState) -> None:
        where = (f"the last good checkpoint is {self.prep.run.checkpoint(LAST)} (step "
                 f"{state.last_ckpt_step})" if state.last_ckpt_step else "no checkpoint was written")
        fp32 = "" if self.objs.precision == "fp32" else "use --precision fp32, "  # not to an fp32 run
        err = TrainingDiverged(f"the loss became {value} at step {step} of "
                               f"{self.prep.schedule.total_steps}; training stopped and {where}. "
                               f"Lower --lr, {fp32}or check the targets.")
        # The losses are means over ranks and every rank settles the same windows
        # (loop.window), so under torchrun every process raises this alike: one message.
        err.quiet_off_rank0 = self.info.enabled
        raise err

    def finish(self) -> None:
        self.batches = None
