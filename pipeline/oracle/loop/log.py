"""The one log writer of every training run: log.jsonl (``cache.runs``) and, when the optional
``tensorboard`` package is installed, TensorBoard event files beside it; ``MemoryLog``, the same
entries in memory for a head trained without a run directory."""
from __future__ import annotations

import math
import time
from typing import Mapping

import torch

from cache.runlog import log_line
from cache.runs import RunDir

FLUSH_S = 2.0       # the longest a written entry waits in memory before it reaches log.jsonl


class StepLog:
    """log.jsonl of one run (``cache.runs``): one JSON line per logged step or validation.  On
    resume, lines after the checkpoint's step are dropped, so the log equals an uninterrupted
    run's.

    Entries are appended to the file at most ``FLUSH_S`` seconds after they are written, at a
    validation entry, and at every ``flush`` (the loop flushes before each checkpoint, so a
    checkpoint never holds steps its log lacks, and when it ends): a sweep's bank of 100 heads
    would otherwise open 100 files at every sync.

    When the ``tensorboard`` package is installed (extra ``tensorboard``), the same numbers also
    go to TensorBoard event files in RUN_DIR/tensorboard/ (``train/<key>`` per logged step,
    ``val/<metric>`` per validation); on resume, events after the checkpoint's step are purged
    the same way (``purge_step``)."""

    def __init__(self, run: RunDir, resume_step: int | None, enabled: bool):
        self.run, self.enabled, self.tb = run, enabled, None
        self.lines: list[str] = []
        self.since = time.monotonic()
        if enabled:
            run.restart_log(resume_step)
            self.tb = tensorboard_writer(run, resume_step)

    @property
    def writes(self) -> bool:
        return self.enabled or self.tb is not None

    def write(self, *entries: Mapping) -> None:
        """Append ``entries`` (to the file within ``FLUSH_S`` seconds, or at the next ``flush``)."""
        if self.enabled:
            self.lines.extend(log_line(e) + "\n" for e in entries)
            if "val" in entries[-1] or time.monotonic() - self.since >= FLUSH_S:
                self.flush()
        if self.tb is not None:
            for entry in entries:
                step = int(entry["step"])
                for tag, value in scalars(entry):
                    self.tb.add_scalar(tag, value, step)
                if "val" in entry:
                    self.tb.flush()

    def flush(self) -> None:
        """The entries written so far into log.jsonl (one append)."""
        if self.lines:
            self.run.append_log("".join(self.lines))
            self.lines = []
        self.since = time.monotonic()

    def close(self) -> None:
        self.flush()
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

    def flush(self) -> None:
        """Nothing to flush."""

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


def step_counts(z: torch.Tensor, o: torch.Tensor, tnr_logit: float,
                keep: torch.Tensor | None = None) -> torch.Tensor:
    """(4, P) float: TP, P, TN, N of one batch, z (B, P) and trust labels o (B,) (z > 0 counts as
    trusted; TNR below ``tnr_logit``); ``keep`` (B,) bool: only those rows (None: all)."""
    z = z.float()
    pos = o > 0.5
    neg = ~pos
    if keep is not None:
        pos, neg = pos & keep, neg & keep
    pos, neg = pos[:, None], neg[:, None]
    n = z.shape[1]
    return torch.stack([((z > 0) & pos).sum(0), pos.sum(0).expand(n),
                        ((z < tnr_logit) & neg).sum(0), neg.sum(0).expand(n)]).float()
