"""Numeric precision, chosen once per run: an autocast context, whether a GradScaler is on, and
the record of what made a stored score (``made_on``).

fp32 means IEEE float32 on every device: PyTorch runs float32 convolutions on CUDA in TF32 by
default (10 mantissa bits), which would make an "fp32" GPU run differ from the same run on a CPU
by about 1e-3 where float32 rounding alone differs by about 1e-6.  ``autocast`` turns TF32 off for
the process before the first forward pass (bf16 and fp16 autocast are not affected: their
convolutions and matrix products take bf16/fp16 inputs).
"""
from __future__ import annotations

import platform
from contextlib import nullcontext
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from cache.outputs import MadeOn

if TYPE_CHECKING:
    import torch

PRECISIONS = ("bf16", "fp16", "fp32")
# The one default of every command's --precision (predict: the run's own).  bf16 autocast on the
# CPU is slower than fp32 there and moves logits visibly, so the CPU gets fp32.
# Each command's --precision shows that default (or its own) as its default, not in its help.
PRECISION_RULE = "Autocast of the forward passes: bf16, fp16 or fp32."


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
    ieee_fp32()
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


@cache
def ieee_fp32() -> None:
    """float32 convolutions and matrix products in IEEE float32 on CUDA, not TF32 (module
    docstring); once per process.  Through the flags every torch version reads: with torch's
    newer per-operator settings (``cudnn.conv.fp32_precision``) set instead, any code that reads
    ``torch.backends.cudnn.allow_tf32`` afterwards (inductor, libraries) raises."""
    import torch

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


def made_on(device: torch.device, precision: str, inputs: str = "images") -> MadeOn:
    """The record of what makes scores here: ``device`` (its GPU's name, or the CPU's model and
    vector instructions) and ``precision``."""
    import torch

    if device.type == "cuda":
        return MadeOn("cuda", torch.cuda.get_device_name(device), "", precision, inputs)
    return MadeOn("cpu", cpu_name(), torch.backends.cpu.get_cpu_capability(), precision, inputs)


@cache
def cpu_name() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what the platform reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
