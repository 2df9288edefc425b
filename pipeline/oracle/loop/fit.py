"""The one training loop of ``cli.py train-oracle``, fine-tuned or head-only.

A session does the work that differs: ``pipeline.oracle.finetune.objects.ImageSession`` runs one
optimizer step of a fine-tuned oracle on images (eagerly or as a CUDA graph) and validates it on
held-out images; ``pipeline.oracle.headonly.bank.FeatureSession`` steps a bank of P heads on cached
features (one per run that differs only in loss parameters) and validates them on the held-out rows'
features.  The loop decides the rest, the same way for both: when to sync, the NaN check, the log
entries, validation and the best checkpoint of each head, mid-run checkpoints, stopping.

Sync points (every ``log_every`` steps, before a validation or checkpoint, at the end) are the
only places the host hears from the device: the window's losses, counts and gradient sums are
copied to the host there without waiting, and the host settles the windows that have arrived --
checks their losses for NaN/inf, logs them, shows them in the progress bar -- while the device
runs the next steps (a head-only step is shorter than a sync's host work: a wait at every sync
left the GPU idle), waiting only when more than ``AHEAD`` windows are pending.  Before a
validation, a checkpoint, a stop and at the end the host waits and settles every window, so a
checkpoint is written only after its steps' check: ``last.pt`` never holds weights updated by a
non-finite loss.  A fine-tuned run stops at a non-finite loss (``TrainingDiverged``, naming its
step), at most ``AHEAD`` windows after it; a head of a bank is marked diverged at the step it
diverged and the others go on.
"""
from __future__ import annotations

import math
import time
from collections import deque
from contextlib import nullcontext

import numpy as np
import torch
from tqdm import tqdm

from pipeline.core import dist
from pipeline.core.catalog import CHECKPOINT_METRIC, log_name
from pipeline.core.stop import StopSignals
from pipeline.oracle.loop.log import StepLog
from pipeline.oracle.loop.state import LoopSettings, LoopState, Session
from pipeline.oracle.loop.validation import metrics_of_heads
from pipeline.oracle.loop.window import AHEAD, Window, collect, diverge, settle_window


def fit(session: Session, state: LoopState, s: LoopSettings, logs: list[StepLog]) -> str:
    """Train from ``state.step`` to the end ('trained'), to --stop-at-step ('stopped'), to a
    SIGINT/SIGTERM ('interrupted', only where checkpoints are kept) or until every head of a bank
    diverged ('diverged').  A checkpoint is written in the second and third cases."""
    info = session.info
    bar = tqdm(total=s.total, initial=state.step, unit="step", desc=s.desc,
               disable=not (s.progress and info.is_main), dynamic_ncols=True)
    window: list[torch.Tensor] = []
    pending = _Pending(session, state, logs, bar, s.batch_size)
    with StopSignals() if s.ckpt_every is not None else nullcontext() as stop:
        requested = lambda: stop is not None and stop.requested  # noqa: E731
        session.start(state.step)
        try:
            while state.step < s.total:
                losses = session.steps(state.step, s.next_sync(state.step))
                window.append(losses)
                state.step += len(losses)
                step = state.step
                if not (s.syncs(step) or (requested() and not info.enabled)):
                    continue
                val_now, ckpt_now = s.validates(step), s.checkpoints(step)
                pending.windows.append(collect(session, window, step))
                window = []
                pending.settle(every=False)
                # the loop acts on this window now (a signal under torchrun: once all ranks
                # know, below, so that every rank checks the same windows before all_ok)
                local_stop = requested() and not info.enabled
                if val_now or ckpt_now or local_stop or step in (s.total, s.stop_at_step):
                    pending.settle()
                if val_now:
                    _validate(session, state, logs)
                signalled = not dist.all_ok(info, not requested())
                if ckpt_now or signalled:
                    pending.settle()
                    for log in logs:     # the checkpoint's steps are in its log first
                        log.flush()
                    session.save_last(step, state)
                    state.last_ckpt_step = step
                if (signalled or step == s.stop_at_step) and step < s.total:
                    return "interrupted" if signalled else "stopped"
                if all(h.diverged_at is not None for h in state.heads):
                    pending.settle()
                    return "diverged"
        finally:
            bar.close()
            for log in logs:
                log.flush()
            session.finish()
    return "trained"


class _Pending:
    """The windows collected and not yet settled, oldest first, and when the last one was settled
    (the next one's img/s in the log and the bar is measured from there)."""

    def __init__(self, session: Session, state: LoopState, logs: list[StepLog], bar,
                 batch_size: int):
        self.session, self.state, self.logs, self.bar = session, state, logs, bar
        self.batch_size = batch_size
        self.windows: deque[Window] = deque()
        self.t0 = time.perf_counter()

    def settle(self, every: bool = True) -> None:
        """Every pending window (else the oldest beyond AHEAD, and in one process those on
        the host by now: under torchrun every rank settles the same windows at the same
        sync, so that a divergence stops them all there, never one rank alone)."""
        while self.windows and (every or len(self.windows) > AHEAD or
                                (not self.session.info.enabled and self.windows[0].arrived())):
            self.t0 = settle_window(self.session, self.state, self.windows.popleft(), self.logs,
                                    self.bar, self.t0, self.batch_size)


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
            diverge(session, state, head, state.step, float(z[bad, p][0]))
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
