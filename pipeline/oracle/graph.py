"""The training step captured in one CUDA graph (``train-oracle --cuda-graph``).

At the paper's batch of 40 the eager step is launch-bound: the GPU waits for Python to queue
its ~1,000 small kernels.  One replay of a graph that holds the whole optimizer step -- normalise,
flip, forward, loss, backward, the logged counts and gradient norms, the SGD update -- costs one
launch.  What changes from step to step lives in static device tensors the graph reads: the
uint8 batch, its targets and flips, and the scheduler's lr and momentum (OneCycleLR still runs on
the host after every step, as in the eager path, and its values are copied in before the next).

The SGD update.  ``torch.optim.SGD`` turns a tensor lr into a Python float (a host sync that
capture refuses, and a constant the graph would keep), so the graph runs SGD's update with
foreach kernels on device scalars: ``g += wd p; b = m b + g; p -= lr b``.  The momentum buffers
are the optimizer's own state tensors, created as zeros where missing (``m 0 + g = g`` is torch's
first step exactly), so ``last.pt`` is the same object as in eager mode and a run resumes in
either mode.  ``p -= lr b`` rounds twice where torch's fused ``add_(b, alpha=-lr)`` may round
once: graphed and eager runs agree to the last bits of some weights, not bit for bit.

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
from typing import Any, Callable, Iterator

import numpy as np
import torch

from cache.runs import RunError
from pipeline.oracle.sampler import StepSchedule, derive_seed
from pipeline.oracle.step import TargetTable, TrainObjects, forward_backward, train_step

GRAPH_MODES = ("auto", "on", "off")
WARMUP_STEPS = 2


def unsupported(objs: TrainObjects, accum_steps: int) -> str | None:
    """Why this run's step cannot be captured, or None.  (A torch.compile'd model is captured
    too: inductor's kernels run inside the graph, compiled during the warm-up steps.)"""
    group = objs.optimizer.param_groups
    if why := device_unsupported(objs.device):
        return why
    if objs.info.enabled:
        return "several processes: DDP all-reduces gradients from host-side hooks"
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
    if mode == "off":
        return train_step, {"mode": "eager", "requested": mode}
    why = unsupported(objs, accum_steps)
    if why is None:
        graphed = GraphedStep(objs, mode, say)
        return graphed, graphed.record
    if mode == "on":
        raise not_capturable(why)
    if objs.device.type == "cuda" and objs.info.is_main:   # on a CPU there is nothing to miss
        say(f"note: training step not captured in a CUDA graph ({why}); running it eagerly")
    return train_step, {"mode": "eager", "requested": mode, "reason": why}


def device_unsupported(device: torch.device) -> str | None:
    """Why a step on ``device`` cannot be captured, or None (shared with the head-only step,
    ``pipeline.oracle.headgraph``)."""
    if device.type != "cuda":
        return f"the device is {device.type} (CUDA graphs need a CUDA device)"
    return None


def not_capturable(why: str) -> RunError:
    """``--cuda-graph on``'s refusal of a step that cannot be captured."""
    return RunError(f"--cuda-graph on: this run's step cannot be captured: {why}. Use "
                    "--cuda-graph auto (falls back to the eager step) or off")


def snapshot(tensors: list[torch.Tensor], device: torch.device) -> dict:
    """Copies of ``tensors`` and of the RNG states: what warm-up steps move, for ``restore``."""
    return {"tensors": [(t, t.detach().clone()) for t in tensors],
            "cpu_rng": torch.get_rng_state(), "cuda_rng": torch.cuda.get_rng_state(device)}


def restore(saved: dict, device: torch.device) -> None:
    with torch.no_grad():
        for live, copy in saved["tensors"]:
            live.copy_(copy)
    torch.set_rng_state(saved["cpu_rng"])
    torch.cuda.set_rng_state(saved["cuda_rng"], device)


def warm_up_and_capture(body: Callable[[], Any], reset: Callable[[], None],
                        device: torch.device) -> tuple[torch.cuda.CUDAGraph, Any]:
    """``body`` run WARMUP_STEPS times on a side stream (cuBLAS/cuDNN set-up, autograd's
    buffers), then captured in a graph; ``reset()`` before each call (gradients to None).  The
    caller snapshots and restores what the warm-up moved."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(WARMUP_STEPS):
            reset()
            body()
    torch.cuda.current_stream(device).wait_stream(side)
    reset()
    graph = torch.cuda.CUDAGraph()
    # thread_local: the DataLoader's pin-memory thread keeps calling CUDA meanwhile
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        outputs = body()
    return graph, outputs


@torch.no_grad()
def sgd_update(params: list[torch.Tensor], grads: list[torch.Tensor], bufs: list[torch.Tensor],
               lr: torch.Tensor, momentum: torch.Tensor, weight_decay: float) -> None:
    """torch.optim.SGD's update (no dampening, no Nesterov) with lr and momentum on the device."""
    if weight_decay:
        grads = torch._foreach_add(grads, params, alpha=weight_decay)
    torch._foreach_mul_(bufs, momentum)
    torch._foreach_add_(bufs, grads)
    torch._foreach_add_(params, torch._foreach_mul(bufs, -lr))


class GraphedStep:
    """``train_step``'s signature and results; captures at its first call (after any resume)."""

    def __init__(self, objs: TrainObjects, mode: str, say: Callable[[str], None]):
        self.objs, self.mode, self.say = objs, mode, say
        self.graph: torch.cuda.CUDAGraph | None = None
        self.record = {"mode": "cuda_graph", "requested": mode}

    def __call__(self, objs: TrainObjects, batches: Iterator, step: int, schedule: StepSchedule,
                 slices: list[slice], targets: TargetTable):
        if self.record["mode"] == "eager":     # capture failed earlier (auto)
            return train_step(objs, batches, step, schedule, slices, targets)
        rows, flips = schedule.batch_rows(step), schedule.batch_flips(step)
        o, pt = targets.lookup(rows, flips)
        images, got, _ = next(batches)
        if not np.array_equal(got.numpy(), rows):
            raise RuntimeError(f"step {step + 1}: loader delivered rows out of schedule")
        inputs = (images, o, pt, torch.from_numpy(flips))
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
        self.lr.fill_(group["lr"])
        self.momentum.fill_(group["momentum"])
        torch.manual_seed(derive_seed(schedule.seed, "torch", step, self.objs.info.rank))

    def _body(self):
        objs = self.objs
        images, o, pt, flip = self.static
        coef = objs.loss.broadcast_coefficients(o, len(o)) if objs.loss.broadcast else None
        loss, counts, grads = forward_backward(objs, images, o, pt, flip, coef, 1,
                                               autocast_cache=False)
        params = [p for p in objs.optimizer.param_groups[0]["params"] if p.grad is not None]
        state = objs.optimizer.state
        sgd_update(params, [p.grad for p in params],
                   [state[p]["momentum_buffer"] for p in params], self.lr, self.momentum,
                   objs.optimizer.param_groups[0]["weight_decay"])
        return loss, counts, grads

    def _capture(self, inputs, step: int, schedule: StepSchedule) -> bool:
        """Warm up, capture, restore the state the warm-up moved.  False: fell back (auto)."""
        objs, dev = self.objs, self.objs.device
        opt = objs.optimizer
        for p in opt.param_groups[0]["params"]:
            if opt.state[p].get("momentum_buffer") is None:
                opt.state[p]["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        self.static = [t.to(dev).clone() for t in inputs]
        self.lr = torch.zeros((), device=dev)
        self.momentum = torch.zeros((), device=dev)
        saved = _snapshot(objs)
        try:
            self._load(inputs, step, schedule)
            self.graph, self.outputs = warm_up_and_capture(
                self._body, lambda: opt.zero_grad(set_to_none=True), dev)
        except torch.cuda.OutOfMemoryError:
            self.graph = None
            _restore(objs, saved)
            raise                  # as in eager mode: a smaller --batch-size is the fix
        except Exception as err:   # an op that syncs or cannot be captured
            self.graph = None
            _restore(objs, saved)
            opt.zero_grad(set_to_none=True)
            if self.mode == "on":
                raise RunError(f"--cuda-graph on: capturing the training step failed ({err}); "
                               "use --cuda-graph off") from err
            self.record.update(mode="eager", reason=f"capture failed: {err}")
            self.say(f"note: capturing the training step in a CUDA graph failed ({err}); "
                     "running it eagerly")
            return False
        _restore(objs, saved)
        return True


def _snapshot(objs: TrainObjects) -> dict:
    opt = objs.optimizer
    return snapshot(list(objs.model.parameters()) + list(objs.model.buffers()) + [
        opt.state[p]["momentum_buffer"] for p in opt.param_groups[0]["params"]], objs.device)


def _restore(objs: TrainObjects, saved: dict) -> None:
    restore(saved, objs.device)
