"""One optimizer step of a fine-tuned oracle on images, and its training state on disk.

Explicit objects in, dicts/tensors out; nothing here reads the run's config.  Losses and counts
stay on the device between sync points, so the step never waits for the GPU.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from torch import nn

from pipeline.core import dist
from pipeline.core.losses import Loss
from pipeline.core.precision import autocast
from pipeline.data.images import GpuNormalize
from pipeline.oracle.loop.log import step_counts
from pipeline.oracle.nets.checkpoint import rng_state, save_checkpoint, set_rng_state, unwrap
from pipeline.oracle.nets.losses import CustomLoss, HeadLoss
from pipeline.oracle.settings.sampler import StepSchedule, derive_seed


@dataclass
class TrainObjects:
    model: nn.Module                 # the plain Oracle (state dicts, evaluation)
    step_model: nn.Module            # what a step calls: DDP- and/or compile-wrapped
    ddp: nn.Module | None            # the DDP wrapper (for no_sync during accumulation)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    normalize: GpuNormalize
    loss: HeadLoss | CustomLoss      # one head (P = 1); a Loss given becomes its HeadLoss
    precision: str
    device: torch.device
    info: dist.DistInfo
    tnr_logit: float                 # TNR counts z below this (logit of 0.5, or of 1/K for TCP)

    def __post_init__(self):
        if isinstance(self.loss, Loss):
            self.loss = HeadLoss([self.loss], self.device)


@dataclass(frozen=True)
class TargetTable:
    """Per-row targets of the training split (CPU tensors, indexed by global row)."""
    correct: torch.Tensor
    correct_flip: torch.Tensor
    p_true: torch.Tensor
    p_true_flip: torch.Tensor

    @classmethod
    def from_arrays(cls, t: dict[str, np.ndarray]) -> "TargetTable":
        return cls(*(torch.from_numpy(t[k]) for k in ("correct", "correct_flip", "p_true",
                                                      "p_true_flip")))

    def lookup(self, rows: np.ndarray, flips: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """(o, TCP target) of the view actually shown: the flipped view's where flipped."""
        r, f = torch.from_numpy(rows), torch.from_numpy(flips)
        return (torch.where(f, self.correct_flip[r], self.correct[r]),
                torch.where(f, self.p_true_flip[r], self.p_true[r]))


def train_step(objs: TrainObjects, batches: Iterator, step: int, schedule: StepSchedule,
               slices: list[slice], targets: TargetTable
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Optimizer step ``step`` (0-based).  Returns (this rank's mean loss (1,), counts (4, 1): TP,
    P, TN, N, gradient sums (2,): see ``grad_norm_sums``), on the device, not synchronised."""
    rows, flips = schedule.batch_rows(step), schedule.batch_flips(step)
    o_all, pt_all = targets.lookup(rows, flips)
    torch.manual_seed(derive_seed(schedule.seed, "torch", step, objs.info.rank))
    objs.optimizer.zero_grad(set_to_none=True)
    loss_sum = torch.zeros(1, device=objs.device)
    counts = torch.zeros(4, 1, device=objs.device)
    grads = torch.zeros(2, device=objs.device)
    for a, sl in enumerate(slices):
        images, got, _ = next(batches)
        if not np.array_equal(got.numpy(), rows[sl]):
            raise RuntimeError(f"step {step + 1}: loader delivered rows out of schedule")
        dev = lambda t: t.to(objs.device, non_blocking=True)  # noqa: E731
        o, pt, flip = dev(o_all[sl]), dev(pt_all[sl]), dev(torch.from_numpy(flips[sl]))
        coef = (objs.loss.broadcast_coefficients(dev(o_all), len(o)) if objs.loss.broadcast
                else None)
        last = a == len(slices) - 1
        sync = nullcontext() if last or objs.ddp is None else objs.ddp.no_sync()
        with sync:
            loss, c, g = forward_backward(objs, images, o, pt, flip, coef, len(slices))
        loss_sum += loss
        counts += c
        grads += g
    objs.scaler.step(objs.optimizer)
    objs.scaler.update()
    objs.scheduler.step()
    return loss_sum, counts, grads


def forward_backward(objs: TrainObjects, images: torch.Tensor, o: torch.Tensor, pt: torch.Tensor,
                     flip: torch.Tensor, coef, n_slices: int, autocast_cache: bool = True
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One micro-batch: normalise, flip, forward, loss, backward (gradients accumulate).
    Returns (loss / n_slices (1,), counts (4, 1), gradient sums (2,)), detached, on the device.
    The same code runs eagerly and inside the captured CUDA graph (pipeline.oracle.finetune.graph),
    which needs ``autocast_cache=False``."""
    x = objs.normalize(images)
    x = torch.where(flip[:, None, None, None], x.flip(-1), x)
    with autocast(objs.precision, objs.device, cache=autocast_cache):
        z = objs.step_model(x)
    z.retain_grad()        # dL/dz: the head's input gradient follows (logging only)
    loss = objs.loss.batch_mean(z[:, None], o, pt, coef) / n_slices
    objs.scaler.scale(loss.sum()).backward()
    return loss.detach(), step_counts(z.detach()[:, None], o, objs.tnr_logit), \
        grad_norm_sums(objs, z.grad)


def grad_norm_sums(objs: TrainObjects, z_grad: torch.Tensor) -> torch.Tensor:
    """(sum over this micro-batch of ||dL/dx_out_i||_2, number of samples), x_out the backbone's
    pooled output (the head's input) and L the optimizer step's loss: the mean per-sample loss
    over the global batch (every rank and accumulation slice), unscaled from the GradScaler.
    Steps the GradScaler skips (inf/NaN gradients) are left out."""
    scale = objs.scaler._get_scale_async() if objs.scaler.is_enabled() else 1.0  # no host sync
    norms = unwrap(objs.model).head.input_grad_norms(z_grad) / (scale * objs.info.world)
    finite = torch.isfinite(norms)
    return torch.stack([torch.where(finite, norms, 0.0).sum(), finite.sum().float()])


def training_state(objs: TrainObjects, step: int, extra: dict) -> dict:
    """Everything ``last.pt`` holds (tensors and plain values only: weights_only-loadable)."""
    return {"model": unwrap(objs.model).state_dict(), "optimizer": objs.optimizer.state_dict(),
            "scheduler": objs.scheduler.state_dict(), "scaler": objs.scaler.state_dict(),
            "rng": rng_state(), "step": step, **extra}


def save_training_state(path: Path, objs: TrainObjects, step: int, extra: dict) -> None:
    if objs.info.is_main:
        save_checkpoint(path, training_state(objs, step, extra))
    dist.barrier(objs.info)


def restore_training_state(objs: TrainObjects, ckpt: dict) -> None:
    unwrap(objs.model).load_state_dict(ckpt["model"])
    objs.optimizer.load_state_dict(ckpt["optimizer"])
    objs.scheduler.load_state_dict(ckpt["scheduler"])
    objs.scaler.load_state_dict(ckpt["scaler"])
    set_rng_state(ckpt["rng"])
