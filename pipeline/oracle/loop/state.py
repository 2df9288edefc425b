"""What the loop runs on: its settings (``LoopSettings``: when it syncs, validates, checkpoints),
its running state (``LoopState``, one ``HeadState`` per head of a bank), the ``Session`` protocol a
fine-tuned or head-only run implements, and ``TrainingDiverged``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol

import numpy as np
import torch

from cache.runs import RunError
from pipeline.core import dist

GRAD_NORM_DEFINITION = (
    "mean over training samples of ||dL/dx_out_i||_2: x_out_i = sample i's pooled backbone "
    "output (the head's input), L = the optimizer step's loss (mean over the global batch, as "
    "optimised); x batch size = the per-sample-loss gradient (paper App., 'Analysis of Gradients')")


class TrainingDiverged(RunError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


@dataclass
class HeadState:
    """One head's running record: its training TPR/TNR counts, best validation, divergence."""
    counts: np.ndarray = field(default_factory=lambda: np.zeros(4))   # TP, P, TN, N
    best_score: float | None = None
    best_step: int | None = None
    diverged_at: int | None = None       # first step with a non-finite loss (1-based)
    diverged_value: float | None = None  # that loss (nan or inf)


@dataclass
class LoopState:
    step: int = 0
    heads: list[HeadState] = field(default_factory=lambda: [HeadState()])
    last_ckpt_step: int | None = None
    grads: np.ndarray = field(default_factory=lambda: np.zeros(2))    # sum of norms, samples
    bank: np.ndarray | None = None      # (P, 4): the heads' counts are its rows (``for_heads``)

    @classmethod
    def for_heads(cls, count: int) -> "LoopState":
        bank = np.zeros((count, 4))
        return cls(heads=[HeadState(bank[p]) for p in range(count)], bank=bank)

    def add_counts(self, counts: np.ndarray) -> None:
        """A window's (4, P) TP, P, TN, N added to each head's: one operation for a bank (a
        grid's 100 heads one by one cost the loop about 90 µs at every sync, 3 µs at once)."""
        if self.bank is not None:
            self.bank += counts.T
        else:
            for p, head in enumerate(self.heads):
                head.counts += counts[:, p]

    @classmethod
    def from_checkpoint(cls, ckpt: Mapping) -> "LoopState":
        """The state ``last.pt`` recorded (``checkpoint_record``)."""
        head = HeadState(np.asarray(ckpt["counts"], np.float64), ckpt["best_score"],
                         ckpt["best_step"])
        return cls(int(ckpt["step"]), [head], int(ckpt["step"]),
                   np.asarray(ckpt.get("grads", (0.0, 0.0)), np.float64))

    def checkpoint_record(self) -> dict:
        """What ``last.pt`` records of the loop (one head: a fine-tuned run)."""
        head = self.heads[0]
        return {"counts": head.counts.tolist(), "grads": self.grads.tolist(),
                "best_score": head.best_score, "best_step": head.best_step}

    def grad_norm(self) -> dict:
        """run.json's ``grad_norm``: the run mean of the per-sample head-input gradient norm."""
        total, n = self.grads
        return {"mean": float(total / n) if n else None, "samples": int(n),
                "definition": GRAD_NORM_DEFINITION}


@dataclass(frozen=True)
class LoopSettings:
    total: int                    # optimizer steps
    batch_size: int               # global batch (rows per step, for img/s)
    log_every: int
    val_every: int | None         # None: no held-out validation
    ckpt_every: int | None        # None: no mid-run checkpoints (head-only: a re-run retrains)
    stop_at_step: int | None
    progress: bool
    desc: str

    def validates(self, step: int) -> bool:
        """Whether the loop validates after its ``step``-th step."""
        return self.val_every is not None and (step % self.val_every == 0 or step == self.total)

    def checkpoints(self, step: int) -> bool:
        """Whether the loop writes ``last.pt`` after its ``step``-th step."""
        return self.ckpt_every is not None and (
            step % self.ckpt_every == 0 or step == self.total or step == self.stop_at_step)

    def syncs(self, step: int) -> bool:
        """Whether the loop waits for the device after its ``step``-th step: every ``log_every``
        steps, before a validation or a checkpoint, at the end (a stop signal adds one where
        checkpoints are kept, ``fit``)."""
        return (step % self.log_every == 0 or step == self.total or self.validates(step)
                or self.checkpoints(step))

    def next_sync(self, done: int) -> int:
        """The first step after ``done`` steps at which the loop syncs (signals aside), as
        ``syncs`` says, in constant time (the loop asks after every call to a session's
        ``steps``): a session may run the steps up to it without returning to the host."""
        every = [e for e in (self.log_every, self.val_every, self.ckpt_every) if e is not None]
        marks = [(done // e + 1) * e for e in every] + [self.total]
        if self.ckpt_every is not None and self.stop_at_step is not None \
                and self.stop_at_step > done:
            marks.append(self.stop_at_step)
        return min(marks)


class Session(Protocol):
    """What a loop drives (see the module docstring).  ``steps(done, last)`` runs the steps after
    ``done`` steps, at least one and at most up to the ``last``-th (the loop's next sync), and
    returns their losses (k, P): a graphed head-only session runs several in one replay, so the
    loop pays its host work once for them."""
    info: dist.DistInfo
    tnr_logit: float              # TNR counts z below this (0, or logit(1/K) for TCP)
    val_correct: np.ndarray       # (n,) trust labels of the held-out rows

    def start(self, step: int) -> None: ...
    def steps(self, done: int, last: int) -> torch.Tensor: ...  # (k, P) losses, on the device
    def drain(self) -> tuple[torch.Tensor, torch.Tensor | None]: ...   # counts (4, P), grads (2,)
    def lr(self) -> float: ...
    def validate(self) -> tuple[np.ndarray, np.ndarray]: ...  # z (n, P), loss (P,)
    def keep_best(self, head: int, step: int, score: float) -> None: ...
    def save_last(self, step: int, state: LoopState) -> None: ...
    def diverged(self, value: float, step: int, state: LoopState) -> None: ...
    def finish(self) -> None: ...
