"""A head trained on features held in memory: no cache, no run directory (the public API's
``trust_oracles.training.train_head``).

The same bank, session and loop as a ``--head-only`` run (``bank.train_heads``), on a
``FeatureTable`` built from the arrays instead of a feature cache; the log stays in memory
(``loop.log.MemoryLog``) and the chosen head is returned, nothing is written.  Given the same
features, trust labels and settings it is a head-only run's head: the rows are carved as
``prepare`` carves a split's valid rows (``sampler.carve_rows`` seeded by ``split_seed``), the order
and the initialisation follow ``seed``, the OneCycle schedule is ``loop.schedule.schedule_info``'s;
there is no flipped view (a run with ``--no-flip``).

Shapes: ``x`` (N, D) float16/float32 features, ``correct`` (N,) float32 trust labels (1 = the
classifier is right), ``p_true`` (N,) float32 the classifier's probability of the true class
(TCP's target; zeros for the other losses), all on one device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from pipeline.core.losses import Loss
from pipeline.oracle.headonly.bank import BankOptim, train_heads
from pipeline.oracle.headonly.features import FeatureTable
from pipeline.oracle.headonly.graph import head_step_path
from pipeline.oracle.loop.state import LoopSettings, LoopState
from pipeline.oracle.loop.log import MemoryLog
from pipeline.oracle.loop.schedule import schedule_info
from pipeline.oracle.nets.heads import head_from_checkpoint
from pipeline.oracle.settings.sampler import StepSchedule, carve_rows


@dataclass(frozen=True)
class HeadSettings:
    """What a head-only run's options say of its head, its loss and its optimisation."""
    loss: Loss
    hyperplane: bool = False      # z = (w.x + b) / (|w| + 1e-7) (SS's head), else w.x + b
    arch: str = "linear"          # pipeline.oracle.nets.heads: linear or confidnet
    lr: float = 1e-2
    momentum: float = 0.9
    weight_decay: float = 0.0
    warmup_steps: int = 100       # capped at 30% of a short run (schedule_info)
    cycle_momentum: bool = False
    batch_size: int = 128
    epochs: int = 2
    seed: int = 0                 # the head's initialisation and the row order
    val_every: int | None = None  # None: 4 times per run (and at the end)
    log_every: int = 10
    cuda_graph: str = "auto"      # the step as one CUDA graph on a CUDA device (built-in losses)
    compile: bool = False         # the head's forward and the loss torch.compile'd (not bitwise)


@dataclass
class TrainedHead:
    """The chosen head (one head, z (B,), on the CPU, in eval mode) and how it was chosen."""
    head: torch.nn.Module
    best_step: int                # the step of the head kept (the last one without held-out rows)
    val_aupr_error: float | None  # its held-out AUPR-Error (None: no held-out rows)
    total_steps: int
    train_rows: np.ndarray        # row positions trained on
    val_rows: np.ndarray          # row positions held out
    log: list[dict]               # log.jsonl's entries: per step {"step", "loss", ...}, {"val"}
    state: LoopState              # the loop's record (counts, divergence)
    step_path: dict               # eager or cuda_graph, and why


def split_rows(n: int, val_fraction: float, split_seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(training rows, held-out rows) of N rows, as ``prepare`` carves a split's valid rows."""
    return carve_rows(np.arange(n), val_fraction, None, split_seed)


def train_on_arrays(x: torch.Tensor, correct: torch.Tensor, p_true: torch.Tensor,
                    train_rows: np.ndarray, val_rows: np.ndarray, s: HeadSettings,
                    loss_fn: Callable | None = None) -> TrainedHead:
    """Train one head on ``train_rows`` of ``x`` through the head-only loop (module docstring),
    choosing the step kept on ``val_rows`` (``split_rows``); ``loss_fn``: a user's loss
    (``pipeline.oracle.nets.losses.CustomLoss``, ``s.loss`` named ``custom:...``).  A diverged
    head is returned with ``state.heads[0].diverged_at`` set."""
    n = len(correct)
    schedule = StepSchedule(train_rows, s.batch_size, s.epochs, s.seed, False)
    total = schedule.total_steps
    sched = schedule_info({"batch_size": s.batch_size, "accum_steps": 1,
                           "warmup_steps": s.warmup_steps, "cycle_momentum": s.cycle_momentum,
                           "momentum": s.momentum}, total, schedule.steps_per_epoch, 1)
    table = FeatureTable(x, correct, p_true, n, False)
    optim = BankOptim(s.seed, s.hyperplane, s.lr, s.momentum, s.weight_decay, sched["pct_start"],
                      s.cycle_momentum, s.arch)
    val_every = (s.val_every or max(1, total // 4)) if len(val_rows) else None
    settings = LoopSettings(total, s.batch_size, max(1, s.log_every), val_every, None, None,
                            False, "train_head")
    log = MemoryLog()
    step_path = head_step_path(x.device, s.cuda_graph, loss_fn is not None, s.compile)
    # TNR in the log counts z < 0 (confidence < 0.5): the classes behind TCP's 1/K are unknown
    state, session = train_heads(table, schedule, [s.loss], optim, val_rows, 0.0, settings, [log],
                                 step_path, loss_fn)
    head = state.heads[0]
    chosen = session.best[0]
    if chosen is None:         # no held-out rows (or no defined score): the final head
        chosen = session.head.state_of(0)
    kept = head_from_checkpoint({"head": chosen, "arch": s.arch}, s.hyperplane).eval()
    return TrainedHead(kept, head.best_step if session.best[0] is not None else total,
                       head.best_score if session.best[0] is not None else None, total,
                       train_rows, val_rows, log.entries, state, step_path)
