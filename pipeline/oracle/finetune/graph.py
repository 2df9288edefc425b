"""The training step captured in one CUDA graph (``train-oracle --cuda-graph``).

At the paper's batch of 40 the eager step is launch-bound: the GPU waits for Python to queue
its ~1,000 small kernels.  One replay of a graph that holds the whole optimizer step -- normalise,
flip, forward, loss, backward, the logged counts and gradient norms, the SGD update -- costs one
launch.  What changes from step to step lives in static device tensors the graph reads: the
uint8 batch, its targets and flips, and the scheduler's lr and momentum (OneCycleLR still runs on
the host after every step, as in the eager path, and its values are copied in before the next).

The SGD update.  ``torch.optim.SGD`` turns a tensor lr into a Python float (a host sync that
capture refuses, and a constant the graph would keep), so the graph runs SGD's update on device
scalars, the one both graphed steps run (``pipeline.oracle.loop.capture.sgd_step``: torch's
kernels, ``p += -lr b`` rounded once as torch's ``add_(b, alpha=-lr)``), here compiled into one
pass over the weights (``capture.fused_sgd_step``; ``step_path["sgd_update"]`` says which ran).
The momentum buffers are the optimizer's own state tensors, created as zeros where missing
(``m 0 + g = g`` is torch's first step exactly), so ``last.pt`` is the same object as in eager
mode and a run resumes in either mode.

Several processes (torchrun).  DDP all-reduces gradients from autograd hooks on the host, which a
graph cannot hold, so the graphed step runs the model without DDP (``finetune.distribute``) and
averages the gradients itself inside the graph: one all-reduce of all gradients flattened into
one buffer (divided by the world size first, as DDP does), then the same SGD update on every
process; BatchNorm's running statistics are broadcast from rank 0 after the step (DDP broadcasts
them before each forward).  NCCL collectives are captured like any kernel (NCCL >= 2.9.6).
Every process must take the same path: the requested mode and whether capture is possible are
compared across processes before any step (``agree``), and a capture that fails in one process
stops every process with one message (a process that fell back alone would wait forever for the
others' collectives).

Capture.  Warm-up steps on a side stream (cuBLAS/cuDNN set-up, autograd's buffers), then the
capture.  The warm-up steps would move the weights, so every parameter, buffer and momentum
buffer and the RNG state are copied before and put back after: the first replay is the real
step, and a resumed run (captured afresh at its first step) replays exactly what an
uninterrupted one does.  The schedule drops the last partial batch, so every step has the
captured shape; a batch of another shape would run eagerly (never happens in ``train-oracle``).
"""
from __future__ import annotations

import sys
import warnings
from typing import Callable, Iterator

import numpy as np
import torch
from torch.optim.optimizer import _default_to_fused_or_foreach

from cache.runs import RunError
from pipeline.core import dist
from pipeline.oracle.finetune.step import TargetTable, TrainObjects, forward_backward, train_step
from pipeline.oracle.loop.capture import (GRAPH_MODES, capture, device_unsupported, fell_back,
                                          fused_sgd_step, not_capturable, restore, snapshot,
                                          warm_up)
from pipeline.oracle.nets.losses import CUSTOM_EAGER, eager_only
from pipeline.oracle.settings.sampler import StepSchedule, derive_seed


def unsupported(objs: TrainObjects, accum_steps: int) -> str | None:
    """Why this run's step cannot be captured, or None.  (A torch.compile'd model is captured
    too: inductor's kernels run inside the graph, compiled during the warm-up steps.)"""
    group = objs.optimizer.param_groups
    if why := device_unsupported(objs.device):
        return why
    if eager_only(objs.loss):
        return CUSTOM_EAGER
    if accum_steps != 1:
        return "--accum-steps > 1"
    if objs.scaler.is_enabled():
        return "fp16: the GradScaler checks for inf/NaN gradients on the host every step"
    if (len(group) != 1 or not isinstance(objs.optimizer, torch.optim.SGD)
            or group[0]["nesterov"] or group[0]["dampening"] or group[0]["maximize"]):
        return "the optimizer is not plain SGD with one parameter group"
    return None


def choose_step(objs: TrainObjects, mode: str, accum_steps: int,
                say: Callable[[str], None] = lambda m: print(m, file=sys.stderr)
                ) -> tuple[Callable, dict]:
    """(the step function the loop calls, run.json's ``step_path`` record).  ``auto``: the graph
    where possible, else eager with one line saying why; ``on``: refuse where impossible."""
    if mode not in GRAPH_MODES:
        raise RunError(f"--cuda-graph {mode!r}: expected one of {GRAPH_MODES}")
    why = agree(objs.info, mode, None if mode == "off" else unsupported(objs, accum_steps))
    if mode == "off":
        return train_step, {"mode": "eager", "requested": mode}
    if why is None:
        graphed = GraphedStep(objs, mode, say)
        return graphed, graphed.path
    if mode == "on":
        raise not_capturable(why)
    if objs.device.type == "cuda" and objs.info.is_main:   # on a CPU there is nothing to miss
        say(f"note: training step not captured in a CUDA graph ({why}); running it eagerly")
    return train_step, {"mode": "eager", "requested": mode, "reason": why}


def agree(info: dist.DistInfo, mode: str, why: str | None) -> str | None:
    """The reason the step cannot be captured in ANY process (prefixed with its rank), or None;
    refuses processes launched with different --cuda-graph modes."""
    if not info.enabled:
        return why
    views = dist.gather_objects(info, (mode, why))
    modes = sorted({m for m, _ in views})
    if len(modes) > 1:
        raise dist.EveryRankError("the processes were launched with different --cuda-graph modes ("
                       + ", ".join(f"rank {r}: {m}" for r, (m, _) in enumerate(views))
                       + "); launch every process with the same --cuda-graph")
    reasons = {r: w for r, (_, w) in enumerate(views) if w is not None}
    if len(set(reasons.values())) == 1 and len(reasons) == info.world:
        return next(iter(reasons.values()))            # the same reason everywhere
    return "; ".join(f"rank {r}: {w}" for r, w in reasons.items()) or None


class GraphedStep:
    """``train_step``'s signature and results; captures at its first call (after any resume)."""

    def __init__(self, objs: TrainObjects, mode: str, say: Callable[[str], None]):
        self.objs, self.mode, self.say = objs, mode, say      # never DDP-wrapped (finetune.distribute)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.update, why = fused_sgd_step()
        # run.json's step_path
        self.path = {"mode": "cuda_graph", "requested": mode, "sgd_update": "foreach" if why
                     else "fused"}
        if why and objs.info.is_main:
            say(f"note: the SGD update runs unfused ({why})")

    def __call__(self, objs: TrainObjects, batches: Iterator, step: int, schedule: StepSchedule,
                 slices: list[slice], targets: TargetTable):
        if self.path["mode"] == "eager":       # capture failed earlier (auto, one process)
            return train_step(objs, batches, step, schedule, slices, targets)
        rows, flips = schedule.batch_rows(step), schedule.batch_flips(step)
        o_all, _ = targets.lookup(rows, flips)     # the global batch's (broadcast variant)
        rows, flips = rows[slices[0]], flips[slices[0]]     # this process's share
        o, pt = targets.lookup(rows, flips)
        images, got, _ = next(batches)
        if not np.array_equal(got.numpy(), rows):
            raise RuntimeError(f"step {step + 1}: loader delivered rows out of schedule")
        inputs = (images, o, pt, torch.from_numpy(flips), o_all)
        if self.graph is None:
            if not self._capture(inputs, step, schedule):
                return train_step(objs, iter([(images, got, None)]), step, schedule, slices,
                                  targets)
        if images.shape != self.static[0].shape:        # not in train-oracle's schedule
            return train_step(objs, iter([(images, got, None)]), step, schedule, slices, targets)
        self._load(inputs, step, schedule)
        self.graph.replay()
        with warnings.catch_warnings():   # "lr_scheduler.step() before optimizer.step()": the
            warnings.simplefilter("ignore", UserWarning)     # graph runs SGD's update itself
            objs.scheduler.step()
        return tuple(t.clone() for t in self.outputs)

    # -- the captured body and its inputs ---------------------------------------------------
    def _load(self, inputs, step: int, schedule: StepSchedule) -> None:
        for dst, src in zip(self.static, inputs):
            dst.copy_(src, non_blocking=True)
        group = self.objs.optimizer.param_groups[0]
        self.neg_lr.fill_(-group["lr"])
        self.momentum.fill_(group["momentum"])
        torch.manual_seed(derive_seed(schedule.seed, "torch", step, self.objs.info.rank))

    def _body(self, collectives: bool = True):
        """One step; ``collectives=False`` (warm-up) leaves out the cross-process averaging."""
        objs = self.objs
        images, o, pt, flip, o_all = self.static
        coef = objs.loss.broadcast_coefficients(o_all, len(o)) if objs.loss.broadcast else None
        loss, counts, grads = forward_backward(objs, images, o, pt, flip, coef, 1,
                                               autocast_cache=False)
        params = [p for p in objs.optimizer.param_groups[0]["params"] if p.grad is not None]
        g = [p.grad for p in params]
        if objs.info.enabled and collectives:
            g = dist.mean_flat(g, objs.info.world)
        state = objs.optimizer.state
        self.update(params, g, [state[p]["momentum_buffer"] for p in params], self.neg_lr,
                    self.momentum, objs.optimizer.param_groups[0]["weight_decay"], self.foreach)
        if objs.info.enabled and collectives:
            dist.broadcast_flat(list(objs.model.buffers()))
        return loss, counts, grads

    def _capture(self, inputs, step: int, schedule: StepSchedule) -> bool:
        """Warm up, capture, restore the state the warm-up moved.  False: fell back (auto, one
        process).  Under torchrun every process learns whether all captured before any goes on."""
        objs, dev = self.objs, self.objs.device
        opt = objs.optimizer
        for p in opt.param_groups[0]["params"]:
            if opt.state[p].get("momentum_buffer") is None:
                opt.state[p]["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        self.static = [t.to(dev).clone() for t in inputs]
        self.neg_lr = torch.zeros((), device=dev)
        params = opt.param_groups[0]["params"]    # torch's own kernel choice for them
        self.foreach = bool(_default_to_fused_or_foreach(params, False, False)[1])
        self.momentum = torch.zeros((), device=dev)
        saved = _snapshot(objs)
        reset = lambda: opt.zero_grad(set_to_none=True)  # noqa: E731
        error = None
        try:
            self._load(inputs, step, schedule)
            warm_up(lambda: self._body(collectives=False), reset, dev)
        except Exception as err:       # OOM, or an op that syncs or cannot run
            error = err
        # capture only where every process warmed up (the captured all-reduce is collective;
        # NCCL's communicator already exists: the weights' broadcast created it)
        if dist.all_ok(objs.info, error is None):
            try:
                self.graph, self.outputs = capture(self._body, reset, dev)
            except Exception as err:   # an op that syncs or cannot be captured
                error = err
        failed = self._agree_on_capture(error)
        _restore(objs, saved)
        if failed is None:
            return True
        self.graph = None
        opt.zero_grad(set_to_none=True)
        if isinstance(error, torch.cuda.OutOfMemoryError) and not objs.info.enabled:
            raise error
        if self.mode == "on" or objs.info.enabled:
            how = "every process stopped; " if objs.info.enabled else ""
            raise (dist.EveryRankError if objs.info.enabled else RunError)(
                f"--cuda-graph {self.mode}: capturing the training step failed ({failed}); "
                f"{how}use --cuda-graph off") from error
        self.path = fell_back(self.path, failed)
        self.say(f"note: capturing the training step in a CUDA graph failed ({failed}); "
                 "running it eagerly")
        return False

    def _agree_on_capture(self, error: Exception | None) -> str | None:
        """None when every process captured; else the failures, named by rank."""
        if not self.objs.info.enabled:
            return None if error is None else str(error)
        errors = dist.gather_objects(self.objs.info, None if error is None else str(error))
        bad = [f"rank {r}: {e}" for r, e in enumerate(errors) if e is not None]
        return "; ".join(bad) or None


def _snapshot(objs: TrainObjects) -> dict:
    opt = objs.optimizer
    return snapshot(list(objs.model.parameters()) + list(objs.model.buffers()) + [
        opt.state[p]["momentum_buffer"] for p in opt.param_groups[0]["params"]], objs.device)


def _restore(objs: TrainObjects, saved: dict) -> None:
    restore(saved, objs.device)
