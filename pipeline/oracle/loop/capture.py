"""What the two CUDA-graphed training steps share (``pipeline.oracle.finetune.graph``: a fine-tuned
oracle's step, one process or several; ``pipeline.oracle.headonly.graph``: a bank of head-only
heads): the modes of ``--cuda-graph``, why a device cannot capture, warm-up on a side stream, the
capture, the snapshot/restore of what the warm-up steps moved (the first replay is the real step),
and the one SGD update both graphs run with the lr and momentum on the device (``sgd_step``;
the fine-tuned graph runs it compiled, ``fused_sgd_step``)."""
from __future__ import annotations

from functools import cache
from typing import Any, Callable, Sequence

import torch

from cache.runs import RunError

GRAPH_MODES = ("auto", "on", "off")


def fell_back(path: dict, why: str) -> dict:
    """run.json's ``step_path`` after a capture under ``auto`` failed: a new record (the one
    chosen before training stays as it was), eager, with the reason."""
    return {**path, "mode": "eager", "reason": f"capture failed: {why}"}


def current_path(step, chosen: dict) -> dict:
    """run.json's ``step_path`` as it stands: a graphed step's own (``path``, which a failed
    capture under ``auto`` replaces), else the one chosen before training."""
    return getattr(step, "path", chosen)
WARMUP_STEPS = 2


def device_unsupported(device: torch.device) -> str | None:
    """Why a step on ``device`` cannot be captured, or None."""
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


def warm_up(body: Callable[[], Any], reset: Callable[[], None], device: torch.device) -> None:
    """``body`` run WARMUP_STEPS times on a side stream (cuBLAS/cuDNN set-up, autograd's
    buffers, inductor's compilation); ``reset()`` before each call (gradients to None)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(WARMUP_STEPS):
            reset()
            body()
    torch.cuda.current_stream(device).wait_stream(side)


def capture(body: Callable[[], Any], reset: Callable[[], None],
            device: torch.device) -> tuple[torch.cuda.CUDAGraph, Any]:
    """(the graph of one call of ``body``, its outputs: static tensors every replay rewrites)."""
    reset()
    graph = torch.cuda.CUDAGraph()
    # thread_local: the DataLoader's pin-memory thread keeps calling CUDA meanwhile
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        outputs = body()
    return graph, outputs


def warm_up_and_capture(body: Callable[[], Any], reset: Callable[[], None],
                        device: torch.device) -> tuple[torch.cuda.CUDAGraph, Any]:
    """``warm_up`` then ``capture`` (one process; the caller snapshots and restores what the
    warm-up moved)."""
    warm_up(body, reset, device)
    return capture(body, reset, device)


# p -= lr b with the lr on the device: the candidates (tests/test_head_graph_cuda.py compares
# them with torch's update on the GPU); LR_UPDATE is the one sgd_step uses.
LR_UPDATES: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]] = {
    "addcmul": lambda p, b, neg_lr: p.addcmul_(b, neg_lr),     # p + b * neg_lr, one rounding
    "mul_add": lambda p, b, neg_lr: p.add_(b * neg_lr),        # two roundings
}
LR_UPDATE = "addcmul"


@torch.no_grad()
def sgd_step(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor],
             bufs: Sequence[torch.Tensor] | None, neg_lr: torch.Tensor, momentum: torch.Tensor,
             weight_decay: float, foreach: bool) -> None:
    """torch.optim.SGD's step (no dampening, Nesterov or maximize) with -lr and the momentum in
    0-d float32 device tensors: ``g += wd p; b = m b + g; p += -lr b`` with torch's foreach
    kernels (``foreach``, torch's choice on CUDA) or its per-tensor ops.  ``bufs``: the momentum
    buffers (-0.0 before the first step), None for momentum 0."""
    if foreach:
        if weight_decay:
            grads = torch._foreach_add(grads, params, alpha=weight_decay)
        if bufs is not None:
            torch._foreach_mul_(bufs, momentum)
            torch._foreach_add_(bufs, grads)
            grads = bufs
    else:
        if weight_decay:
            grads = [g.add(p, alpha=weight_decay) for p, g in zip(params, grads)]
        if bufs is not None:
            for b, g in zip(bufs, grads):
                b.mul_(momentum).add_(g)
            grads = bufs
    update = LR_UPDATES[LR_UPDATE]
    for p, g in zip(params, grads):
        update(p, g, neg_lr)


def momentum_buffers(params: Sequence[torch.Tensor], moms: Sequence[float]
                     ) -> list[torch.Tensor] | None:
    """``sgd_step``'s momentum buffers before the first step: -0.0, so that ``-0 m + g`` is torch's
    first-step copy of g, signed zeros included; None where torch keeps none (momentum 0: OneCycle's
    momentum is constant, or cycled within 0.85-0.95)."""
    return [torch.full_like(p, -0.0) for p in params] if any(moms) else None


def fused_sgd_step() -> tuple[Callable[..., None], str | None]:
    """(the SGD update a fine-tuned oracle's graph runs, why it is not the fused one or None).

    ``sgd_step`` compiled by inductor: its passes over the weights (weight decay, momentum, the
    lr's update) fused into one, about 0.7 ms of a ViT-B/16@384 step at batch 40 and 0.45 ms of
    a ResNet-50's on an H200 (bench/step_levers.py, ``foreach-sgd``).  It need not equal
    torch.optim.SGD bit for bit (a multiply and an add fused into one rounding where torch's
    foreach kernels round twice): the fine-tuned graph already differs from its eager step by the
    model's own rounding (within the tolerance of tests/test_graph_cuda.py), while the head-only
    graph, bit for bit with its eager step, keeps ``sgd_step``.  Without Triton (inductor's GPU
    backend), ``sgd_step`` as it is."""
    from torch.utils._triton import has_triton

    if not has_triton():
        return sgd_step, "Triton (inductor's GPU code generator) is not installed"
    return _compiled_sgd_step(), None


@cache
def _compiled_sgd_step() -> Callable[..., None]:
    # once per process: inductor's compiled code is cached by the function, per shape of its inputs
    return torch.compile(sgd_step, dynamic=False)
