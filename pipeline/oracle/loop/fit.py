"""The one training loop of ``cli.py train-oracle``, fine-tuned or head-only.

A session does the work that differs: ``pipeline.oracle.finetune.objects.ImageSession`` runs one
optimizer step of a fine-tuned oracle on images (eagerly or as a CUDA graph) and validates it on
held-out images; ``pipeline.oracle.headonly.bank.FeatureSession`` steps a bank of P heads on cached
features (one per run that differs only in loss parameters) and validates them on the held-out rows'
features.  The loop decides the rest, the same way for both: when to sync, the NaN check, the log
entries, validation and the best checkpoint of each head, mid-run checkpoints, stopping.

Sync points (every ``log_every`` steps, before a validation or checkpoint, at the end) are the
only places the host hears from the device: the window's losses, counts and gradient sums are
copied to the host there without waiting, and the host settles the window before -- checks its
losses for NaN/inf, logs them, shows them in the progress bar -- while the device runs the next
steps (a head-only step is shorter than a sync's host work: a wait at every sync left the GPU
idle).  Before a validation, a checkpoint, a stop and at the end the host waits and settles
every window, so a checkpoint is written only after its steps' check: ``last.pt`` never holds
weights updated by a non-finite loss.  A fine-tuned run stops at a non-finite loss
(``TrainingDiverged``, naming its step), at most one window after it; a head of a bank is marked
diverged at the step it diverged and the others go on.
"""
from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Mapping, Protocol

import numpy as np
import torch
from tqdm import tqdm

from cache.runs import RunError
from pipeline.core import dist
from pipeline.core.catalog import CHECKPOINT_METRIC, log_name
from pipeline.core.stop import StopSignals
from pipeline.oracle.loop.log import StepLog
from pipeline.oracle.loop.validation import metrics_of_heads

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

    @classmethod
    def for_heads(cls, count: int) -> "LoopState":
        return cls(heads=[HeadState() for _ in range(count)])

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
        """The first step after ``done`` steps at which the loop syncs (signals aside): a session
        may run the steps up to it without returning to the host in between."""
        step = done + 1
        while not self.syncs(step):
            step += 1
        return step


class Session(Protocol):
    """What a loop drives (see the module docstring)."""
    info: dist.DistInfo
    tnr_logit: float              # TNR counts z below this (0, or logit(1/K) for TCP)
    val_correct: np.ndarray       # (n,) trust labels of the held-out rows

    def start(self, step: int) -> None: ...
    def step(self, step: int) -> torch.Tensor: ...           # (P,) losses, on the device
    def drain(self) -> tuple[torch.Tensor, torch.Tensor | None]: ...   # counts (4, P), grads (2,)
    def lr(self) -> float: ...
    def validate(self) -> tuple[np.ndarray, np.ndarray]: ...  # z (n, P), loss (P,)
    def keep_best(self, head: int, step: int, score: float) -> None: ...
    def save_last(self, step: int, state: LoopState) -> None: ...
    def diverged(self, value: float, step: int, state: LoopState) -> None: ...
    def finish(self) -> None: ...


def fit(session: Session, state: LoopState, s: LoopSettings, logs: list[StepLog]) -> str:
    """Train from ``state.step`` to the end ('trained'), to --stop-at-step ('stopped'), to a
    SIGINT/SIGTERM ('interrupted', only where checkpoints are kept) or until every head of a bank
    diverged ('diverged').  A checkpoint is written in the second and third cases."""
    info = session.info
    bar = tqdm(total=s.total, initial=state.step, unit="step", desc=s.desc,
               disable=not (s.progress and info.is_main), dynamic_ncols=True)
    window: list[torch.Tensor] = []
    pending: _Window | None = None      # a window collected, not yet settled
    t0 = time.perf_counter()
    with StopSignals() if s.ckpt_every is not None else nullcontext() as stop:
        requested = lambda: stop is not None and stop.requested  # noqa: E731

        def settle() -> None:
            nonlocal pending, t0
            if pending is not None:
                t0, pending = _settle(session, state, pending, logs, bar, t0, s), None

        session.start(state.step)
        try:
            while state.step < s.total:
                window.append(session.step(state.step))
                state.step += 1
                step = state.step
                if not (s.syncs(step) or (requested() and not info.enabled)):
                    continue
                val_now, ckpt_now = s.validates(step), s.checkpoints(step)
                collected = _collect(session, window, step)
                window = []
                settle()                # the window before: on the host by now
                pending = collected
                # the loop acts on this window now (a signal under torchrun: once all ranks
                # know, below, so that every rank checks the same windows before all_ok)
                local_stop = requested() and not info.enabled
                if val_now or ckpt_now or local_stop or step in (s.total, s.stop_at_step):
                    settle()
                if val_now:
                    _validate(session, state, logs)
                signalled = not dist.all_ok(info, not requested())
                if ckpt_now or signalled:
                    settle()
                    for log in logs:     # the checkpoint's steps are in its log first
                        log.flush()
                    session.save_last(step, state)
                    state.last_ckpt_step = step
                if (signalled or step == s.stop_at_step) and step < s.total:
                    return "interrupted" if signalled else "stopped"
                if all(h.diverged_at is not None for h in state.heads):
                    settle()
                    return "diverged"
        finally:
            bar.close()
            for log in logs:
                log.flush()
            session.finish()
    return "trained"


@dataclass
class _Window:
    """The results of the steps since the last sync, on their way to the host (``_collect``)."""
    first: int                      # its first step (1-based)
    losses: torch.Tensor            # (steps, P) global losses, host
    counts: torch.Tensor            # (4, P) global TP, P, TN, N
    grads: torch.Tensor | None      # (2,) global gradient-norm sums, or None
    lr: float                       # the lr after the window's last step
    ready: torch.cuda.Event | None  # recorded after the copies (None: on the host already)


def _collect(session: Session, window: list, step: int) -> _Window:
    """The window's global losses, counts and gradient sums, copied to the host without waiting:
    the device goes on with the next window's steps while the host settles the one before."""
    info = session.info
    losses = dist.global_mean(info, torch.stack(window))
    counts, grads = session.drain()
    parts = [losses, dist.global_sum(info, counts)]
    if grads is not None:
        parts.append(dist.global_sum(info, grads))
    # copy=True: a session's drain may return a buffer its next drain rewrites (the CPU too)
    host = [t.to("cpu", non_blocking=True, copy=True) for t in parts] + [None]
    ready = None
    if losses.device.type == "cuda":
        ready = torch.cuda.Event()
        ready.record()
    return _Window(step - len(window) + 1, *host[:3], session.lr(), ready)


def _settle(session: Session, state: LoopState, w: _Window, logs: list[StepLog], bar,
            t0: float, s: LoopSettings) -> float:
    """Check a collected window's losses (steps, P) for NaN/inf, count and log them; returns
    the new t0."""
    if w.ready is not None:
        w.ready.synchronize()
    losses = w.losses.numpy().astype(np.float64)
    counts = w.counts.numpy().astype(np.float64)
    g_sum = g_n = None
    if w.grads is not None:
        g_sum, g_n = w.grads.numpy().astype(np.float64)
        state.grads += (g_sum, g_n)
    first = w.first
    for p, head in enumerate(state.heads):
        head.counts += counts[:, p]
    finite = np.isfinite(losses)
    for p in np.flatnonzero(~finite.all(axis=0)):      # a bank's heads checked at once
        head, bad = state.heads[p], int(np.argmin(finite[:, p]))
        if head.diverged_at is None:
            _diverge(session, state, head, first + bad, float(losses[bad, p]))
    now = time.perf_counter()
    steps = len(losses)
    img_s = steps * s.batch_size / max(now - t0, 1e-9)
    for p, (head, log) in enumerate(zip(state.heads, logs)):
        if not log.writes:
            continue
        tp, pos, tn, neg = head.counts
        tpr, tnr = (tp / pos if pos else math.nan), (tn / neg if neg else math.nan)
        entries = [{"step": first + i, "loss": v} for i, v in enumerate(losses[:, p].tolist())]
        entries[-1].update(lr=w.lr, img_per_s=round(img_s, 1), tpr=tpr, tnr=tnr)
        if w.grads is not None:
            entries[-1]["grad_norm"] = float(g_sum / g_n) if g_n else None
        log.write(*entries)     # a bank: P logs per window
    bar.update(steps)
    tp, pos, tn, neg = state.heads[0].counts
    bar.set_postfix(loss=f"{losses[:, 0].mean():.4f}", img_s=f"{img_s:.0f}",
                    tpr=f"{tp / pos if pos else math.nan:.3f}",
                    tnr=f"{tn / neg if neg else math.nan:.3f}", refresh=False)
    return now


def _validate(session: Session, state: LoopState, logs: list[StepLog]) -> None:
    """Score the held-out rows with every live head; keep each head's best on the highest
    AUPR-Error (standard definition).  A diverged head is never validated or chosen again."""
    z, loss = session.validate()
    live = []
    for p, head in enumerate(state.heads):
        if head.diverged_at is not None:
            continue
        bad = ~np.isfinite(z[:, p])
        if bad.any():     # the step's loss was finite, its update was not: the next loss is nan
            _diverge(session, state, head, state.step, float(z[bad, p][0]))
            continue
        live.append(p)
    scored = metrics_of_heads(z, session.val_correct, loss, session.tnr_logit, live)
    for p, metrics in zip(live, scored):
        head = state.heads[p]
        logs[p].write({"step": state.step, "val": metrics})
        score = metrics[log_name(CHECKPOINT_METRIC)]
        if math.isfinite(score) and (head.best_score is None or score > head.best_score):
            head.best_score, head.best_step = score, state.step
            session.keep_best(p, state.step, score)


def _diverge(session: Session, state: LoopState, head: HeadState, step: int,
             value: float) -> None:
    """A head's loss (or, at a validation, its output) became non-finite at ``step``: marked,
    then the session decides (a fine-tuned run stops with the one message, a bank goes on)."""
    head.diverged_at, head.diverged_value = step, value
    session.diverged(value, step, state)
