"""Numeric precision, chosen once per run: an autocast context and whether a GradScaler is on."""
from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

PRECISIONS = ("bf16", "fp16", "fp32")
# The one default of every command's --precision (predict: the run's own).  bf16 autocast on the
# CPU is slower than fp32 there and moves logits visibly, so the CPU gets fp32.
PRECISION_RULE = ("Autocast of the forward passes: bf16, fp16 or fp32. Default: bf16 on a CUDA "
                  "device, fp32 on the CPU.")


def default_precision(precision: str | None, device: torch.device) -> str:
    """``precision`` as given, else PRECISION_RULE's choice for ``device``."""
    if precision is not None:
        return precision
    return "bf16" if device.type == "cuda" else "fp32"


def autocast(precision: str, device: torch.device, cache: bool = True):
    """Context manager for forward passes. fp32 is a no-op; fp16 on CPU falls back to bf16,
    which CPUs support natively (fp16 autocast on CPU is slow and rarely what anyone means).
    ``cache=False`` for code captured in a CUDA graph (autocast's weight-cast cache must not
    outlive the capture); the numbers are the same either way."""
    import torch  # lazily: cli.py imports PRECISIONS, and `report` never needs torch

    if precision not in PRECISIONS:
        raise ValueError(f"--precision {precision!r}: expected one of {PRECISIONS}")
    if precision == "fp32":
        return nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    if device.type == "cpu" and dtype == torch.float16:
        dtype = torch.bfloat16
    return torch.autocast(device_type=device.type, dtype=dtype, cache_enabled=cache)


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """Loss scaling is needed only for fp16 on CUDA; elsewhere the scaler is a pass-through."""
    import torch

    return torch.amp.GradScaler(device.type, enabled=(precision == "fp16" and device.type == "cuda"))
