"""What the two CUDA-graphed training steps share (``pipeline.oracle.graph``: a fine-tuned
oracle's step, one process or several; ``pipeline.oracle.headgraph``: a bank of head-only heads):
the modes of ``--cuda-graph``, why a device cannot capture, warm-up on a side stream, the capture,
and the snapshot/restore of what the warm-up steps moved (the first replay is the real step)."""
from __future__ import annotations

from typing import Any, Callable

import torch

from cache.runs import RunError

GRAPH_MODES = ("auto", "on", "off")
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
