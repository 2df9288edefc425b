"""The loop's sync points on the host (``pipeline.oracle.loop.fit``): a window of steps collected
from the device without waiting (``collect``), settled once it has arrived (``settle_window``:
NaN check, counts, log lines, progress), at most ``AHEAD`` windows pending."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.core import dist
from pipeline.oracle.loop.log import StepLog
from pipeline.oracle.loop.state import HeadState, LoopState, Session

# The most windows collected and not yet settled: the host may run this many syncs ahead of the
# device, so that a pause of the host (a thread switch, a collection) does not leave a device
# working through short steps idle; waiting for each window at the next sync would keep the host
# within one window (1 ms of head-only steps) of the device.
AHEAD = 8


@dataclass
class Window:
    """The results of the steps since the last sync, on their way to the host (``collect``)."""
    first: int                      # its first step (1-based)
    losses: torch.Tensor            # (steps, P) global losses, host
    counts: torch.Tensor            # (4, P) global TP, P, TN, N
    grads: torch.Tensor | None      # (2,) global gradient-norm sums, or None
    lr: float                       # the lr after the window's last step
    ready: torch.cuda.Event | None  # recorded after the copies (None: on the host already)

    def arrived(self) -> bool:
        return self.ready is None or self.ready.query()


def collect(session: Session, window: list, step: int) -> Window:
    """The global losses, counts and gradient sums of the steps since the last sync (``window``:
    the losses ``Session.steps`` returned), copied to the host without waiting: the device goes
    on with the next steps while the host settles windows before."""
    info = session.info
    losses = dist.global_mean(info, torch.cat(window))
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
    return Window(step - len(losses) + 1, *host[:3], session.lr(), ready)


def settle_window(session: Session, state: LoopState, w: Window, logs: list[StepLog], bar,
                  t0: float, batch_size: int) -> float:
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
    state.add_counts(counts)
    finite = np.isfinite(losses)
    for p in np.flatnonzero(~finite.all(axis=0)):      # a bank's heads checked at once
        head, bad = state.heads[p], int(np.argmin(finite[:, p]))
        if head.diverged_at is None:
            diverge(session, state, head, first + bad, float(losses[bad, p]))
    now = time.perf_counter()
    steps = len(losses)
    img_s = steps * batch_size / max(now - t0, 1e-9)
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
    if bar.disable:
        return now
    tp, pos, tn, neg = state.heads[0].counts
    bar.set_postfix(loss=f"{losses[:, 0].mean():.4f}", img_s=f"{img_s:.0f}",
                    tpr=f"{tp / pos if pos else math.nan:.3f}",
                    tnr=f"{tn / neg if neg else math.nan:.3f}", refresh=False)
    return now


def diverge(session: Session, state: LoopState, head: HeadState, step: int,
             value: float) -> None:
    """A head's loss (or, at a validation, its output) became non-finite at ``step``: marked,
    then the session decides (a fine-tuned run stops with the one message, a bank goes on)."""
    head.diverged_at, head.diverged_value = step, value
    session.diverged(value, step, state)
