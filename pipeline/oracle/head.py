"""Head-only training: the oracle's scalar head on cached backbone features, P heads at once.

The oracle backbone is frozen, so its pooled features are a fixed function of (image, view):
``cli.py extract --features [--flip-view]`` of the oracle's model stores them.  A training step is
then the head alone: gather the batch's rows (the flipped view's features where the schedule
flips), one (B, D) x (D, P) product, the loss and its gradient — no images, no DataLoader.

Heads that differ only in their loss parameters (the points of a sweep) share the row order, the
flips, the initialisation and the OneCycle schedule, so they train together in the same products.
SGD (momentum, weight decay) acts element by element and each head's loss depends on its own
parameters only, so every head follows the trajectory it would follow alone.

Shapes: ``x`` (2N, D) float16/float32 features (rows [0, N) the plain view, [N, 2N) the flipped
one; one copy of the plain rows when there is no flipped view), ``W`` (P, D), ``b`` (P,),
``z`` (B, P).  Everything stays on the device between validations; a step never syncs the host.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.oracle.losses import LossConfig
from pipeline.oracle.model import HYPERPLANE_EPS, ScalarHead
from pipeline.oracle.sampler import StepSchedule
from pipeline.oracle.step import val_metrics


@dataclass(frozen=True)
class FeatureTable:
    """A split's features and targets on the device, both views stacked (see module docstring)."""
    x: torch.Tensor              # (2N, D) or (N, D) without a flipped view
    correct: torch.Tensor        # (2N,) or (N,) float32
    p_true: torch.Tensor         # (2N,) or (N,) float32
    num_rows: int                # N
    has_flip: bool

    def index(self, rows: torch.Tensor, flips: torch.Tensor | None) -> torch.Tensor:
        """Row positions of the view shown: the flipped copy (row + N) where flipped."""
        if flips is None:
            return rows
        if not self.has_flip:
            raise ValueError("flipped rows requested from features without a flipped view")
        return rows + flips.to(rows.dtype) * self.num_rows


class BankLoss:
    """The per-sample losses of ``pipeline.oracle.losses`` for P configurations of ONE loss,
    evaluated on z of shape (B, P); returns (B, P).  Same formulas and float32 operations as
    ``per_sample_loss`` (a test checks every loss, weighting and the broadcast variant)."""

    def __init__(self, losses: list[LossConfig], device: torch.device):
        names = {(c.name, c.broadcast) for c in losses}
        if len(names) != 1:
            raise ValueError(f"one bank trains one loss form; got {sorted(names)}")
        self.name, self.broadcast = next(iter(names))
        vec = lambda values: torch.tensor(values, dtype=torch.float32, device=device)  # noqa: E731
        self.w_pos = vec([c.pos_weight for c in losses])
        self.w_neg = vec([c.neg_weight for c in losses])
        if self.name == "focal":
            self.gamma = vec([c.gamma for c in losses])
        if self.name == "ss":
            self.a_pos = vec([c.alpha_pos for c in losses])
            self.a_neg = vec([c.alpha_neg for c in losses])
            # python-float exp rounded to float32, as ``steep_slope`` subtracts math.exp(-alpha)
            self.shift_pos = vec([math.exp(-c.alpha_pos) for c in losses])
            self.shift_neg = vec([math.exp(-c.alpha_neg) for c in losses])

    def __call__(self, z: torch.Tensor, o: torch.Tensor, p_true: torch.Tensor,
                 broadcast: bool | None = None) -> torch.Tensor:
        broadcast = self.broadcast if broadcast is None else broadcast
        z = z.float()
        if self.name == "tcp":
            return (torch.sigmoid(z) - p_true[:, None]).pow(2)
        o = o.float()[:, None]
        c_pos, c_neg = o * self.w_pos, (1 - o) * self.w_neg
        if broadcast:   # the authors' B x B broadcasting: every output meets the batch's mean
            c_pos, c_neg = c_pos.mean(0).expand_as(z), c_neg.mean(0).expand_as(z)
        if self.name == "ce":
            return -c_pos * F.logsigmoid(z) - c_neg * F.logsigmoid(-z)
        if self.name == "focal":
            p = torch.sigmoid(z)
            return (-c_pos * (1 - p).pow(self.gamma) * F.logsigmoid(z)
                    - c_neg * p.pow(self.gamma) * F.logsigmoid(-z))
        s = z / (1 + z.abs())
        return (c_pos * (torch.exp(-self.a_pos * s) - self.shift_pos)
                + c_neg * (torch.exp(self.a_neg * s) - self.shift_neg))


def init_heads(dim: int, count: int, seed: int, hyperplane: bool,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(W (P, D), b (P,)): every head is the head ``build_oracle`` would create for ``seed``."""
    torch.manual_seed(seed)
    head = ScalarHead(dim, normalised=hyperplane)
    w = head.linear.weight.detach().repeat(count, 1)
    b = head.linear.bias.detach().repeat(count)
    return w.to(device).requires_grad_(), b.to(device).requires_grad_()


def head_z(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, hyperplane: bool) -> torch.Tensor:
    """z (B, P) of features ``x`` (B, D) for every head, as ``ScalarHead`` computes it."""
    z = F.linear(x.float(), w, b)
    if hyperplane:
        z = z / (w.norm(dim=1) + HYPERPLANE_EPS)
    return z


@torch.no_grad()
def score(table: FeatureTable, rows: np.ndarray, w: torch.Tensor, b: torch.Tensor,
          hyperplane: bool, chunk: int = 65536) -> np.ndarray:
    """z (len(rows), P) float32 of the plain view of ``rows``, in chunks of ``chunk`` rows."""
    idx = torch.as_tensor(np.asarray(rows, np.int64), device=table.x.device)
    out = [head_z(table.x[idx[i:i + chunk]], w, b, hyperplane) for i in range(0, len(idx), chunk)]
    if not out:
        return np.zeros((0, w.shape[0]), np.float32)
    return torch.cat(out).cpu().numpy()


@dataclass(frozen=True)
class BankSettings:
    """The optimisation of every head of a bank (the run's resolved config)."""
    hyperplane: bool
    lr: float
    momentum: float
    weight_decay: float
    pct_start: float
    cycle_momentum: bool
    seed: int
    tnr_logit: float             # TNR counts z below this (0, or logit(1/K) for TCP)
    val_every: int | None        # None: no held-out validation
    log_every: int


@dataclass
class HeadResult:
    """What one head's run directory gets."""
    losses: np.ndarray                           # (steps,) mean training loss of every step
    log: list[dict] = field(default_factory=list)     # log.jsonl entries (steps and validations)
    best_step: int | None = None
    best_score: float | None = None
    best_state: dict | None = None               # {"linear.weight" (1, D), "linear.bias" (1,)}
    final_state: dict | None = None
    diverged_at: int | None = None               # first step with a non-finite loss (1-based)


def train_bank(table: FeatureTable, schedule: StepSchedule, losses: list[LossConfig],
               s: BankSettings, val_rows: np.ndarray) -> tuple[list[HeadResult], dict]:
    """Train one head per entry of ``losses`` over ``schedule``; validate on ``val_rows`` (plain
    view) every ``val_every`` steps and at the end, keeping each head's best AUPR-Error state.
    Returns the per-head results and timing."""
    device, P = table.x.device, len(losses)
    if schedule.flip and not table.has_flip:
        raise ValueError("the schedule flips rows but the features have no flipped view")
    w, b = init_heads(table.x.shape[1], P, s.seed, s.hyperplane, device)
    total = schedule.total_steps
    opt = torch.optim.SGD([w, b], lr=s.lr, momentum=s.momentum, weight_decay=s.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=s.lr, total_steps=total,
                                                pct_start=s.pct_start,
                                                cycle_momentum=s.cycle_momentum)
    loss_fn = BankLoss(losses, device)
    step_loss = torch.zeros(total, P, device=device)
    # each step's z and rows, for the running TPR/TNR of the log (counted once at the end: two
    # copies per step instead of a dozen small kernels)
    z_hist = torch.zeros(total, schedule.batch_size, P, device=device)
    idx_hist = torch.zeros(total, schedule.batch_size, dtype=torch.int64, device=device)
    lrs = np.zeros(total)
    results = [HeadResult(np.zeros(0)) for _ in range(P)]
    val_o = table.correct[torch.as_tensor(val_rows, device=device)].cpu().numpy() \
        if len(val_rows) else None
    t0, t_val = time.perf_counter(), 0.0
    # a step's ops are (B, D) x (D, P): on the CPU, intra-op threads only add synchronisation
    # (5-15x slower steps measured on a busy 2-core machine); validation keeps every thread
    threads = torch.get_num_threads()
    try:
        for epoch_start in range(0, total, schedule.steps_per_epoch):
            steps = range(epoch_start, min(total, epoch_start + schedule.steps_per_epoch))
            rows = torch.as_tensor(np.stack([schedule.batch_rows(k) for k in steps]), device=device)
            flips = torch.as_tensor(np.stack([schedule.batch_flips(k) for k in steps]),
                                    device=device) if schedule.flip else None
            for i, step in enumerate(steps):
                if device.type == "cpu" and torch.get_num_threads() != 1:
                    torch.set_num_threads(1)
                idx = table.index(rows[i], None if flips is None else flips[i])
                step_loss[step], z_hist[step] = _step(table, idx, w, b, s, loss_fn, opt)
                idx_hist[step] = idx
                sched.step()
                lrs[step] = opt.param_groups[0]["lr"]      # as the fine-tuned loop logs it
                done = step + 1
                if s.val_every is not None and val_o is not None and (done % s.val_every == 0
                                                                      or done == total):
                    tv = time.perf_counter()
                    torch.set_num_threads(threads)
                    _validate(table, val_rows, val_o, w, b, s, loss_fn, done, results,
                              step_loss[:done])
                    t_val += time.perf_counter() - tv
    finally:
        torch.set_num_threads(threads)
    elapsed = time.perf_counter() - t0
    finite = torch.isfinite(step_loss).all(0).cpu().numpy()
    for p in np.flatnonzero(~finite):
        if results[p].diverged_at is None:
            bad = torch.nonzero(~torch.isfinite(step_loss[:, p])).flatten()
            results[p].diverged_at = int(bad[0]) + 1
    counts = _counts(table, z_hist, idx_hist, s.tnr_logit)
    _finish_logs(results, step_loss.cpu().numpy().astype(np.float64), counts, lrs, s.log_every,
                 schedule.batch_size, elapsed - t_val, w, b)
    return results, {"train_s": elapsed - t_val, "val_s": t_val, "steps": total, "heads": P}


def _step(table: FeatureTable, idx: torch.Tensor, w, b, s: BankSettings, loss_fn: BankLoss,
          opt) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step of every head on rows ``idx``; (per-head mean loss (P,), z (B, P) before
    the update), both detached and on the device."""
    o, pt = table.correct[idx], table.p_true[idx]
    z = head_z(table.x[idx], w, b, s.hyperplane)
    per_head = loss_fn(z, o, pt).mean(0)
    opt.zero_grad(set_to_none=True)
    per_head.sum().backward()
    opt.step()
    return per_head.detach(), z.detach()


@torch.no_grad()
def _counts(table: FeatureTable, z: torch.Tensor, idx: torch.Tensor, tnr_logit: float) -> np.ndarray:
    """(steps, 4, P) float64: TP, P, TN, N of every step's batch (z > 0 counts as trusted; TNR
    below ``tnr_logit``), as the fine-tuned loop counts them."""
    pos = (table.correct[idx] > 0.5)[:, :, None]                     # (steps, B, 1)
    n = z.shape[2]
    counts = torch.stack([((z > 0) & pos).sum(1), pos.sum(1).expand(-1, n),
                          ((z < tnr_logit) & ~pos).sum(1), (~pos).sum(1).expand(-1, n)], dim=1)
    return counts.cpu().numpy().astype(np.float64)


def _state(w: torch.Tensor, b: torch.Tensor, p: int) -> dict:
    return {"linear.weight": w[p:p + 1].detach().cpu().clone(),
            "linear.bias": b[p:p + 1].detach().cpu().clone()}


@torch.no_grad()
def _validate(table, val_rows, val_o, w, b, s: BankSettings, loss_fn: BankLoss, step: int,
              results: list[HeadResult], losses_so_far: torch.Tensor) -> None:
    """Score the held-out rows with every head; keep each head's best state (AUPR-Error,
    standard definition, as the fine-tuned loop).  A head whose training loss is no longer
    finite is marked diverged and never chosen again."""
    finite = torch.isfinite(losses_so_far).all(0).cpu().numpy()
    z = score(table, val_rows, w, b, s.hyperplane)
    idx = torch.as_tensor(np.asarray(val_rows, np.int64), device=table.x.device)
    # the validation loss is per sample, also for the broadcast variant (as the fine-tuned loop)
    vloss = loss_fn(torch.from_numpy(z).to(table.x.device), table.correct[idx], table.p_true[idx],
                    broadcast=False).mean(0).cpu().numpy()
    for p, res in enumerate(results):
        if res.diverged_at is not None:
            continue
        if not finite[p]:
            bad = torch.nonzero(~torch.isfinite(losses_so_far[:, p])).flatten()
            res.diverged_at = int(bad[0]) + 1
            continue
        metrics = val_metrics(z[:, p], val_o, float(vloss[p]), s.tnr_logit)
        res.log.append({"step": step, "val": metrics})
        score_ = metrics["aupr_error"]
        if math.isfinite(score_) and (res.best_score is None or score_ > res.best_score):
            res.best_score, res.best_step, res.best_state = score_, step, _state(w, b, p)


def _finish_logs(results, losses, counts, lrs, log_every: int, batch: int, train_s: float,
                 w, b) -> None:
    """Per-head loss curves and the log.jsonl step entries of the fine-tuned loop: every step's
    loss; at every ``log_every``-th step also lr, rows/s and the cumulative training TPR/TNR."""
    total = len(losses)
    cum = counts.cumsum(0)
    rate = round(total * batch / max(train_s, 1e-9), 1)
    for p, res in enumerate(results):
        res.losses = losses[:, p]
        res.final_state = _state(w, b, p)
        entries = []
        for k in range(total):
            entry = {"step": k + 1, "loss": float(losses[k, p])}
            if (k + 1) % log_every == 0 or k + 1 == total:
                tp, n_pos, tn, n_neg = (float(v) for v in cum[k, :, p])
                entry.update(lr=float(lrs[k]), img_per_s=rate,
                             tpr=tp / n_pos if n_pos else math.nan,
                             tnr=tn / n_neg if n_neg else math.nan)
            entries.append(entry)
        # validations after the step entries of their step, as the fine-tuned loop writes them
        vals = {e["step"]: e for e in res.log}
        res.log = [x for e in entries for x in ([e, vals[e["step"]]] if e["step"] in vals else [e])]
