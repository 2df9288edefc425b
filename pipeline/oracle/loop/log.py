"""The one log writer of every training run: log.jsonl (``cache.runs``) and, when the optional
``tensorboard`` package is installed, TensorBoard event files beside it; ``MemoryLog``, the same
entries in memory for a head trained without a run directory."""
from __future__ import annotations

import math
from typing import Mapping

import torch

from cache.runs import RunDir


class StepLog:
    """log.jsonl of one run (``cache.runs``): one JSON line per logged step or validation.  On
    resume, lines after the checkpoint's step are dropped, so the log equals an uninterrupted
    run's.

    When the ``tensorboard`` package is installed (extra ``tensorboard``), the same numbers also
    go to TensorBoard event files in RUN_DIR/tensorboard/ (``train/<key>`` per logged step,
    ``val/<metric>`` per validation); on resume, events after the checkpoint's step are purged
    the same way (``purge_step``)."""

    def __init__(self, run: RunDir, resume_step: int | None, enabled: bool):
        self.run, self.enabled, self.tb = run, enabled, None
        if enabled:
            run.restart_log(resume_step)
            self.tb = tensorboard_writer(run, resume_step)

    @property
    def writes(self) -> bool:
        return self.enabled or self.tb is not None

    def write(self, *entries: Mapping) -> None:
        """Append ``entries`` (one file append for all of them)."""
        if self.enabled:
            self.run.append_log(*entries)
        if self.tb is not None:
            for entry in entries:
                step = int(entry["step"])
                for tag, value in scalars(entry):
                    self.tb.add_scalar(tag, value, step)
                if "val" in entry:
                    self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None


class MemoryLog:
    """A log kept in memory, for a head trained without a run directory
    (``pipeline.oracle.headonly.arrays``): the entries ``StepLog`` would write, in order."""

    writes = True

    def __init__(self):
        self.entries: list[dict] = []

    def write(self, *entries: Mapping) -> None:
        self.entries.extend(dict(e) for e in entries)

    def close(self) -> None:
        """Nothing to flush."""


def tensorboard_writer(run: RunDir, resume_step: int | None):
    """A SummaryWriter, or None when the optional ``tensorboard`` package is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:     # torch's writer needs the tensorboard package: the extra
        return None
    purge = resume_step + 1 if resume_step else None
    return SummaryWriter(str(run.tensorboard_dir), purge_step=purge)


def scalars(entry: Mapping) -> list[tuple[str, float]]:
    """(tag, value) of the finite numbers of a log entry: ``train/loss`` ... ``val/auc``."""
    out = []
    for key, value in entry.items():
        if key == "step":
            continue
        items = value.items() if isinstance(value, Mapping) else [(None, value)]
        for sub, v in items:
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                out.append((f"{key}/{sub}" if sub else f"train/{key}", float(v)))
    return out


def step_counts(z: torch.Tensor, o: torch.Tensor, tnr_logit: float) -> torch.Tensor:
    """(4, P) float: TP, P, TN, N of one batch, z (B, P) and trust labels o (B,) (z > 0 counts as
    trusted; TNR below ``tnr_logit``)."""
    z = z.float()
    pos = (o > 0.5)[:, None]
    n = z.shape[1]
    return torch.stack([((z > 0) & pos).sum(0), pos.sum(0).expand(n),
                        ((z < tnr_logit) & ~pos).sum(0), (~pos).sum(0).expand(n)]).float()
