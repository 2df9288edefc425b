"""Head-only oracles in the loop: a bank of P heads on the oracle backbone's cached features.

The oracle backbone is frozen, so its pooled features are a fixed function of (image, view):
``cli.py extract --features [--flip-view]`` of the oracle's model stores them.  A training step is
then the head alone: gather the batch's rows (the flipped view's features where the schedule
flips), one (B, D) x (D, P) product, the loss and its gradient -- no images, no DataLoader.

Runs that differ only in their loss parameters (the points of a sweep) share the row order, the
flips, the initialisation and the OneCycle schedule, so their heads train together in the same
products (``pipeline.oracle.nets.model.Head`` with P outputs,
``pipeline.oracle.nets.losses.HeadLoss``).
SGD (momentum, weight decay) acts element by element and each head's loss depends on its own
parameters only, so every head follows the trajectory it would follow alone.  Everything stays
on the device between the loop's sync points.  On a CUDA device the step is one CUDA graph
(``pipeline.oracle.headonly.graph``, ``--cuda-graph``), bit for bit this eager step.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from pipeline.core import dist
from pipeline.core.losses import Loss
from pipeline.oracle.headonly.features import FeatureTable
from pipeline.oracle.headonly.graph import STEPS_PER_REPLAY, GraphedHeadStep, HeadStep
from pipeline.oracle.loop.fit import fit
from pipeline.oracle.loop.state import LoopSettings, LoopState
from pipeline.oracle.loop.log import step_counts
from pipeline.oracle.loop.schedule import sgd_onecycle
from pipeline.oracle.nets.heads import make_head
from pipeline.oracle.nets.losses import make_loss
from pipeline.oracle.settings.sampler import StepSchedule, batches


@torch.no_grad()
def score(table: FeatureTable, rows: np.ndarray, head: torch.nn.Module,
          chunk: int = 65536) -> np.ndarray:
    """z (len(rows), P) float32 of the plain view of ``rows``, in chunks of ``chunk`` rows."""
    idx = torch.as_tensor(np.asarray(rows, np.int64), device=table.x.device)
    out = [head(table.inputs(idx[i:i + chunk])) for i in range(0, len(idx), chunk)]
    if not out:
        return np.zeros((0, head.heads), np.float32)
    return torch.cat(out).cpu().numpy()


def epoch_batches(schedule: StepSchedule, step: int, device: torch.device
                  ) -> tuple[int, torch.Tensor, torch.Tensor | None]:
    """(first step, rows, flips) of ``step``'s epoch, on the device at once (the eager step)."""
    first = step - step % schedule.steps_per_epoch
    rows, flips = batches(schedule, range(first, min(schedule.total_steps,
                                                     first + schedule.steps_per_epoch)))
    return (first, torch.as_tensor(rows, device=device),
            None if flips is None else torch.as_tensor(flips, device=device))


class FeatureSession:
    """The loop's session for a bank of head-only heads (``pipeline.oracle.loop.state.Session``).
    ``head``: a head of P outputs (``pipeline.oracle.nets.heads``) initialised for the runs' seed,
    on the table's device.  ``fast``: the same step on static state
    (``pipeline.oracle.headonly.graph``, a CUDA graph), used from ``start`` on unless its capture
    falls back.  ``loss_fn``: a user's loss for every head
    (``pipeline.oracle.nets.losses.CustomLoss``) instead of ``losses``' own."""

    def __init__(self, table: FeatureTable, schedule: StepSchedule, losses: list[Loss],
                 head: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler,
                 val_rows: np.ndarray, tnr_logit: float, fast: HeadStep | None = None,
                 loss_fn: Callable | None = None):
        if schedule.flip and not table.has_flip:
            raise ValueError("the schedule flips rows but the features have no flipped view")
        self.table, self.schedule, self.head = table, schedule, head
        self.optimizer, self.scheduler = optimizer, scheduler
        self.loss = make_loss(losses, table.x.device, loss_fn)
        self.info, self.tnr_logit = dist.DistInfo(), tnr_logit
        self.val_rows = np.asarray(val_rows, np.int64)
        self.val_correct = (table.correct[torch.as_tensor(self.val_rows, device=table.x.device)]
                            .cpu().numpy() if len(self.val_rows) else np.zeros(0, np.float32))
        self.best: list[dict | None] = [None] * len(losses)
        self.train_s = self.val_s = 0.0
        self.fast = fast

    def start(self, step: int) -> None:
        # a step's ops are (B, D) x (D, P): on the CPU, intra-op threads only add
        # synchronisation (5-15x slower steps measured on a busy 2-core machine); validation
        # keeps every thread
        self.threads = torch.get_num_threads()
        self.epoch, self.window = None, []
        self.t0 = time.perf_counter()
        if self.fast is not None and not self.fast.prepare(step):
            self.fast.close()
            self.fast = None            # its capture fell back (auto): the eager step

    def steps(self, done: int, last: int) -> torch.Tensor:
        """(k, P) losses of the next k steps: those of one graph replay (``fast``), else one."""
        if self.table.x.device.type == "cpu" and torch.get_num_threads() != 1:
            torch.set_num_threads(1)
        if self.fast is not None:
            return self.fast.steps(done, last)
        if self.epoch is None or not 0 <= done - self.epoch[0] < len(self.epoch[1]):
            self.epoch = epoch_batches(self.schedule, done, self.table.x.device)
        first, rows, flips = self.epoch
        i = done - first
        idx = self.table.index(rows[i], None if flips is None else flips[i])
        z = self.head(self.table.inputs(idx))
        per_head = self.loss.batch_mean(z, self.table.correct[idx], self.table.p_true[idx])
        self.optimizer.zero_grad(set_to_none=True)
        per_head.sum().backward()
        self.optimizer.step()
        self.scheduler.step()
        self.window.append((z.detach(), idx))
        return per_head.detach()[None]

    def drain(self) -> tuple[torch.Tensor, None]:
        """TP, P, TN, N of the steps since the last drain (4, P), counted once per window."""
        if self.fast is not None:
            return self.fast.drain(), None
        z = torch.cat([w[0] for w in self.window])
        o = self.table.correct[torch.cat([w[1] for w in self.window])]
        self.window = []
        return step_counts(z, o, self.tnr_logit), None

    def lr(self) -> float:
        return self.fast.lr() if self.fast is not None else self.optimizer.param_groups[0]["lr"]

    def validate(self) -> tuple[np.ndarray, np.ndarray]:
        t = time.perf_counter()
        torch.set_num_threads(self.threads)
        z = score(self.table, self.val_rows, self.head)
        idx = torch.as_tensor(self.val_rows, device=self.table.x.device)
        # the validation loss is per sample, also for the broadcast variant (as fine-tuning)
        loss = self.loss.batch_mean(torch.from_numpy(z).to(self.table.x.device),
                                    self.table.correct[idx], self.table.p_true[idx],
                                    broadcast=False).cpu().numpy()
        self.val_s += time.perf_counter() - t
        return z, loss

    def keep_best(self, head: int, step: int, score_: float) -> None:
        self.best[head] = self.head.state_of(head)

    def save_last(self, step: int, state: LoopState) -> None:
        """Never called: head-only runs keep no mid-run checkpoint (a re-run retrains)."""

    def diverged(self, value: float, step: int, state: LoopState) -> None:
        """A diverged head is marked by the loop; the others go on."""

    def finish(self) -> None:
        if self.fast is not None:
            self.fast.close()
        torch.set_num_threads(self.threads)
        self.train_s = time.perf_counter() - self.t0 - self.val_s

    def timing(self, heads: int) -> dict:
        return {"train_s": self.train_s, "val_s": self.val_s, "steps": self.schedule.total_steps,
                "heads": heads}


@dataclass(frozen=True)
class BankOptim:
    """How every head of a bank is initialised and optimised (the runs' shared settings)."""
    seed: int
    hyperplane: bool
    lr: float
    momentum: float
    weight_decay: float
    pct_start: float
    cycle_momentum: bool
    arch: str = "linear"          # --head-arch (pipeline.oracle.nets.heads)


def make_bank(table: FeatureTable, schedule: StepSchedule, losses: list[Loss],
              opt: BankOptim) -> tuple[torch.nn.Module, torch.optim.SGD,
                                       torch.optim.lr_scheduler.OneCycleLR]:
    """A head of one output per entry of ``losses`` (every head the one head ``opt.seed`` gives)
    on the table's device, its SGD and OneCycle over ``schedule``.  Stacked inputs are
    standardised by the moments of the schedule's (training) rows."""
    torch.manual_seed(opt.seed)
    head = make_head(opt.arch, table.in_features, opt.hyperplane, len(losses),
                     stacked=table.stats is not None).to(table.x.device)
    if table.stats is not None:
        head.set_stats(*table.stats_moments(schedule.rows))
    return (head, *bank_optimizer(head.parameters(), opt, schedule.total_steps))


def bank_optimizer(params, opt: BankOptim, total: int
                   ) -> tuple[torch.optim.SGD, torch.optim.lr_scheduler.OneCycleLR]:
    return sgd_onecycle(params, lr=opt.lr, momentum=opt.momentum, weight_decay=opt.weight_decay,
                        total_steps=total, pct_start=opt.pct_start,
                        cycle_momentum=opt.cycle_momentum)


def onecycle_values(opt: BankOptim, total: int) -> tuple[list[float], list[float]]:
    """The lr and momentum SGD reads at each step 0..total-1 of ``bank_optimizer``'s schedule, and
    the lr after the last step (the logs'): a throw-away SGD + OneCycleLR stepped on the host."""
    sgd, sched = bank_optimizer([torch.zeros(1, requires_grad=True)], opt, total)
    group, lrs, moms = sgd.param_groups[0], [], []
    with warnings.catch_warnings():     # "lr_scheduler.step() before optimizer.step()"
        warnings.simplefilter("ignore", UserWarning)
        for k in range(total + 1):
            lrs.append(group["lr"])
            moms.append(group["momentum"])
            if k < total:
                sched.step()
    return lrs, moms


def train_heads(table: FeatureTable, schedule: StepSchedule, losses: list[Loss],
                opt: BankOptim, val_rows: np.ndarray, tnr_logit: float, settings: LoopSettings,
                logs: list, step_path: dict | None = None, loss_fn: Callable | None = None,
                per_replay: int = STEPS_PER_REPLAY) -> tuple[LoopState, FeatureSession]:
    """One head per entry of ``losses`` (``make_bank``), trained through the loop; returns the
    loop's state (per head: counts, best step and score, divergence) and the session (best heads,
    final heads, timing).  ``step_path`` (``headgraph.head_step_path``; None: eager): the step
    captured in a CUDA graph where its mode is ``cuda_graph`` (updated if the capture falls
    back; never with ``loss_fn``, a user's loss: ``head_step_path`` says eager), with the
    head's forward and the loss compiled where it says ``compiled``, a replay running up to
    ``per_replay`` steps (``headonly.graph``; 1: a replay a step).  ``logs``: one per head
    (``pipeline.oracle.loop.log``)."""
    head, sgd, sched = make_bank(table, schedule, losses, opt)
    fast, path = None, step_path or {"mode": "eager"}
    if path["mode"] == "cuda_graph" or path.get("compiled"):
        if loss_fn is not None:
            raise ValueError("a custom loss trains eagerly: head_step_path(..., custom_loss=True)")
        args = (table, schedule, head, losses, onecycle_values(opt, schedule.total_steps),
                opt.weight_decay, min(settings.log_every, settings.total), tnr_logit)
        compiled = bool(path.get("compiled"))
        # compiled without a graph (a CPU, --cuda-graph off): the graph's body, run as it is
        fast = (GraphedHeadStep(*args, record=step_path, compiled=compiled,
                                per_replay=per_replay)
                if path["mode"] == "cuda_graph" else HeadStep(*args, compiled=compiled))
    session = FeatureSession(table, schedule, losses, head, sgd, sched, val_rows, tnr_logit, fast,
                             loss_fn)
    state = LoopState.for_heads(len(losses))
    fit(session, state, settings, logs)
    return state, session
