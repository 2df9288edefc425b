"""The head-only step captured in one CUDA graph (``train-oracle --head-only --cuda-graph``).

An ImageNet-sized head-only run is ~30,000 steps of batch 40, each a few dozen tiny kernels plus
torch.optim.SGD and OneCycleLR on the host: the eager step (``pipeline.oracle.headonly.bank``) is
launch-bound, the GPU mostly waits for Python.  Here the whole step -- the batch's rows and view,
forward, loss, backward, SGD's update -- is one graph, replayed once per step.

Static state.  A graph replays fixed addresses, so everything a step reads is a device tensor read
through device counters, never a Python int (a slice offset would be frozen into the graph): the
epoch's rows (steps, B) as the table's positions of the views shown (``FeatureTable.index``: a
flipped row's flipped copy), filled by the host in chunks computed ahead on a background thread
(``sampler.Ahead``), read at ``pos`` (the position in the epoch, reset by the host at each new epoch);
the run's lr and momentum of every step, read at ``at`` (the global step); the counters advanced
inside the graph.  Each step's losses, z and rows go into window buffers at ``win``: ``steps``
returns their rows of losses, and ``drain`` counts TP/P/TN/N over the window with the eager drain's
own function, so the loop sees what the eager session gives it.  The drain is a graph too, one
replay instead of a dozen eager ops at every sync: it counts the whole window buffer with its
rows past ``win`` masked out (counts are sums of 0s and 1s, exact in float32 to 2**24, so the
mask changes no bit).

The lr and momentum are those torch.optim.SGD reads under the run's OneCycleLR: the host steps a
throw-away OneCycleLR of the same settings once before training (``bank.onecycle_values``), and the
device holds float32(-lr) and float32(momentum), the values torch's kernels compute with.

Bit for bit.  The body runs the eager step's ops on the same values (an index read through a
counter is the same index), and ``sgd_step`` is torch.optim.SGD's update: torch's foreach kernels
on CUDA, its per-tensor ops on the CPU, as torch chooses; ``p += lr b`` as ``addcmul`` with the
device lr (one rounding, as torch's ``add_(b, alpha=-lr)``; ``p + b * lr`` rounds twice).  The
momentum buffers start as -0.0: ``-0 m + g`` is ``g`` exactly, signed zeros included (torch's first
step copies g).  A graphed run equals the eager run in its losses, counts, best and final heads
(tests/test_head_graph_cuda.py).

Several steps per replay (``per_replay``): graphs of 1, 2, 4, ... ``per_replay`` steps in a
row; a replay runs as many steps as fit before the loop's next sync (``LoopSettings.next_sync``,
which the loop passes to ``steps``) and the epoch's end, and the loop takes their losses at
once.  The same kernels on the same values: bit for bit the same run.  Measured on an H200
(bench/NOTES.md, "Head-only runs and sweeps"), a graph's own pace is the GPU's busy time at
every length and the loop's extra time is the host's work at its syncs, so longer replays buy
nothing there: one step a replay is the default.

Compiled (``--compile``): the head's forward and the loss are torch.compile'd (inductor fuses
their element-wise ops, forward and backward, into a few kernels; the update and the window's
bookkeeping stay as above), captured in the graph on a CUDA device or run as the body without
one elsewhere.  Fewer kernels, but not bit for bit: the fused kernels compute the same formulas
in another order of floating-point operations, so losses and heads differ from the eager step's
in the last bits (and, through them, a chosen step may differ).

Capture (``pipeline.oracle.loop.capture``): warm-up steps on a side stream, capture, then every
tensor the warm-up moved is put back, so the first replay is step 0.  Under ``auto`` a failed
capture falls back to the eager step with one note.
"""
from __future__ import annotations

import sys
from typing import Callable

import torch
from torch.optim.optimizer import _default_to_fused_or_foreach

from cache.runs import RunError
from pipeline.core.losses import Loss
from pipeline.oracle.headonly.features import FeatureTable
from pipeline.oracle.loop.capture import (GRAPH_MODES, WARMUP_STEPS, capture, device_unsupported,
                                          fell_back, momentum_buffers, not_capturable, restore,
                                          sgd_step, snapshot, warm_up_and_capture)
from pipeline.oracle.loop.log import step_counts
from pipeline.oracle.nets.losses import CUSTOM_EAGER, HeadLoss
from pipeline.oracle.settings.sampler import Ahead, StepSchedule

STEPS_PER_REPLAY = 1        # steps a replay runs at most (module docstring: longer ones measured)


def head_step_path(device: torch.device, mode: str, custom_loss: bool = False,
                   compiled: bool = False) -> dict:
    """run.json's ``step_path`` of a head-only run, decided before anything is written: the graph
    on a CUDA device unless ``off``; elsewhere, or with a user's loss (``CUSTOM_EAGER``), eager
    (``auto``, silently: on a CPU there is nothing to miss) or refused (``on``).  ``compiled``
    (``--compile``): the same, with ``"compiled": True``; refused with a user's loss."""
    if mode not in GRAPH_MODES:
        raise RunError(f"--cuda-graph {mode!r}: expected one of {GRAPH_MODES}")
    if compiled and custom_loss:
        raise RunError(f"--compile: {CUSTOM_EAGER}; leave --compile out")
    tag = {"compiled": True} if compiled else {}
    if mode == "off":
        return {"mode": "eager", "requested": mode, **tag}
    why = device_unsupported(device) or (CUSTOM_EAGER if custom_loss else None)
    if why is None:
        return {"mode": "cuda_graph", "requested": mode, **tag}
    if mode == "on":
        raise not_capturable(why)
    return {"mode": "eager", "requested": mode, "reason": why, **tag}


class HeadStep:
    """The eager step of ``bank.FeatureSession`` on static state (module docstring): the body a
    graph captures.  Run as it is (``steps``), it is that body without a graph."""

    def __init__(self, table: FeatureTable, schedule: StepSchedule, head: torch.nn.Module,
                 losses: list[Loss], values: tuple[list[float], list[float]],
                 weight_decay: float, window: int, tnr_logit: float, chunk: int = 1024,
                 compiled: bool = False):
        dev = table.x.device
        self.table, self.schedule, self.head, self.tnr_logit = table, schedule, head, tnr_logit
        self.loss = HeadLoss(losses, dev)
        # the step's own callables: compiled ones leave the head (which validation scores with
        # at other batch sizes) and the loss object as they are
        self.forward, self.batch_mean = head, self.loss.batch_mean
        if compiled:
            self.forward = torch.compile(head.forward, dynamic=False)
            self.batch_mean = torch.compile(self.loss.batch_mean, dynamic=False)
        lrs, moms = values
        total = schedule.total_steps
        self.lrs, self.weight_decay, self.window = lrs, weight_decay, window
        # one tensor each, so that one kernel reads (or advances) them all: position in the
        # epoch, global step, position in the window; (-lr, momentum) of every step
        self.counters = torch.zeros(3, dtype=torch.long, device=dev)
        self.pos, self.at, self.win = (self.counters[i:i + 1] for i in range(3))
        self.lr_mom = torch.tensor([[-lr, m] for lr, m in zip(lrs[:total], moms[:total])],
                                   dtype=torch.float32, device=dev)
        self.params = list(head.parameters())
        self.bufs = momentum_buffers(self.params, moms[:total])
        self.foreach = bool(_default_to_fused_or_foreach(self.params, False, False)[1])
        p, b = len(losses), schedule.batch_size
        # the capture's warm-up runs WARMUP_STEPS steps without a drain or a new epoch: room for
        # them however short the window (--log-every 1) or the epoch (its rows are put back after)
        rows = max(window, WARMUP_STEPS)
        self.losses = torch.zeros(rows, p, device=dev)
        self.z = torch.zeros(rows, b, p, device=dev)
        self.idx = torch.zeros(rows, b, dtype=torch.long, device=dev)
        self.slots = torch.arange(rows, device=dev)[:, None]      # window rows, against ``win``
        self.tally = torch.zeros(4, p, device=dev)
        self.rows = torch.zeros(max(schedule.steps_per_epoch, WARMUP_STEPS), b, dtype=torch.long,
                                device=dev)
        self.chunk, self.ahead, self.ready = chunk, None, 0
        self.count = self.done = 0

    def prepare(self, step: int) -> bool:
        """Ready to run from ``step`` (False: run the eager step instead)."""
        self.at.fill_(step)
        self.win.zero_()
        self.pos.fill_(step % self.schedule.steps_per_epoch)
        self.ahead = Ahead(self.schedule, step, self.table.num_rows, self.chunk)
        self.ready = step
        self._fill(step)
        return True

    def close(self) -> None:
        if self.ahead is not None:
            self.ahead.close()

    def steps(self, done: int, last: int) -> torch.Tensor:
        """The step after ``done`` steps (one, whatever ``last``); its (1, P) losses, a row of
        the window (``pipeline.oracle.loop.state.Session``)."""
        self._enter(done)
        self._no_grads()
        self.body()
        return self._out(done, 1)

    def drain(self) -> torch.Tensor:
        """TP, P, TN, N of the window's steps (4, P), counted as the eager drain counts them; the
        window restarts.  The tensor is the step's own: the next drain rewrites it."""
        self.count_window()
        self.count = 0
        return self.tally

    def count_window(self) -> None:
        """The window's counts into ``tally``, the window restarted: device state only (the rows
        past ``win`` masked out), so that a graph can hold it."""
        p, b = self.losses.shape[1], self.schedule.batch_size
        keep = (self.slots < self.win).expand(-1, b).reshape(-1)
        o = self.table.correct[self.idx.reshape(-1)]
        self.tally.copy_(step_counts(self.z.reshape(-1, p), o, self.tnr_logit, keep))
        self.win.zero_()

    def lr(self) -> float:
        return self.lrs[self.done]

    def body(self) -> None:
        """One step, reading and advancing the device counters only."""
        t = self.table
        idx = self.rows.index_select(0, self.pos)[0]
        z = self.forward(t.inputs(idx))
        per_head = self.batch_mean(z, t.correct[idx], t.p_true[idx])
        per_head.sum().backward()
        with torch.no_grad():
            self.losses.index_copy_(0, self.win, per_head[None])
            self.z.index_copy_(0, self.win, z[None])
            self.idx.index_copy_(0, self.win, idx[None])
            neg_lr, momentum = self.lr_mom.index_select(0, self.at)[0]
            sgd_step(self.params, [q.grad for q in self.params], self.bufs, neg_lr, momentum,
                     self.weight_decay, self.foreach)
            self.counters += 1

    def _fill(self, step: int) -> None:
        """The chunks up to ``step``'s into the epoch buffer (same shape every epoch: the
        schedule drops the last partial batch).  Stream-ordered after the replays before them,
        so a chunk of the next epoch overwrites only what was read; copied from pinned memory
        without waiting (a copy from pageable memory would wait for every queued replay)."""
        per_epoch = self.schedule.steps_per_epoch
        while self.ready <= step:
            first, positions = self.ahead.next()
            at = first % per_epoch
            host = torch.from_numpy(positions)
            if self.rows.is_cuda:       # from pageable memory copy_ waits for the device
                host = host.pin_memory()
            self.rows[at:at + len(positions)].copy_(host, non_blocking=True)
            self.ready = first + len(positions)

    def _enter(self, step: int, steps: int = 1) -> None:
        """Ready the device for ``steps`` steps from ``step`` (one epoch's)."""
        if step + steps > self.ready:
            self._fill(step + steps - 1)
        if step % self.schedule.steps_per_epoch == 0:
            self.pos.zero_()            # a new epoch
        if self.count + steps > self.window:
            raise RuntimeError(f"step {step + steps}: more than {self.window} steps between two "
                               "drains (the loop syncs every --log-every steps)")

    def _out(self, done: int, k: int) -> torch.Tensor:
        out = self.losses[self.count:self.count + k]
        self.count, self.done = self.count + k, done + k
        return out

    def _no_grads(self) -> None:
        for q in self.params:
            q.grad = None


class GraphedHeadStep(HeadStep):
    """``HeadStep``'s body captured in CUDA graphs at ``prepare``, replayed by ``steps``: graphs
    of 1, 2, 4, ... ``per_replay`` steps (at most the window), a replay running the longest that
    ends by the loop's next sync and within the epoch.  ``record``: run.json's ``step_path`` as
    chosen; ``path``: as it stands (a capture under ``auto`` that falls back replaces it)."""

    def __init__(self, *args, record: dict,
                 say: Callable[[str], None] = lambda m: print(m, file=sys.stderr),
                 per_replay: int = STEPS_PER_REPLAY, **kwargs):
        super().__init__(*args, **kwargs)
        if per_replay < 1:
            raise ValueError(f"per_replay={per_replay}: expected 1 or more steps a replay")
        self.path, self.say = record, say
        longest = min(per_replay, self.window)
        self.sizes = [1 << i for i in range(longest.bit_length())]   # 1, 2, 4, ... <= longest
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.drain_graph: torch.cuda.CUDAGraph | None = None

    def prepare(self, step: int) -> bool:
        super().prepare(step)
        dev = self.table.x.device
        saved = snapshot(self.params + (self.bufs or []) + [
            self.counters, self.losses, self.z, self.idx], dev)
        try:
            self.graphs = {1: warm_up_and_capture(self.body, self._no_grads, dev)[0]}
            for k in self.sizes[1:]:    # capturing runs nothing: no warm-up to put back
                self.graphs[k] = capture(lambda k=k: self._bodies(k), self._no_grads, dev)[0]
            self.drain_graph = capture(super().count_window, lambda: None, dev)[0]
        except torch.cuda.OutOfMemoryError:
            self.graphs, self.drain_graph = {}, None
            restore(saved, dev)
            raise                       # as in eager mode
        except Exception as err:        # an op that syncs or cannot be captured
            self.graphs, self.drain_graph = {}, None
            restore(saved, dev)
            self._no_grads()
            if self.path["requested"] == "on":
                raise RunError(f"--cuda-graph on: capturing the head-only step failed ({err}); "
                               "use --cuda-graph off") from err
            self.path = {k: v for k, v in fell_back(self.path, err).items() if k != "compiled"}
            self.say(f"note: capturing the head-only step in a CUDA graph failed ({err}); "
                     "running it eagerly")
            return False
        restore(saved, dev)
        return True

    def steps(self, done: int, last: int) -> torch.Tensor:
        """One replay: the steps after ``done`` up to the ``last``-th at most; their (k, P)
        losses, rows of the window."""
        k = self._replay_size(done, last)
        self._enter(done, k)
        self.graphs[k].replay()
        return self._out(done, k)

    def count_window(self) -> None:
        """The drain's graph (``HeadStep.count_window`` captured at ``prepare``)."""
        self.drain_graph.replay()

    def _replay_size(self, done: int, last: int) -> int:
        """The longest graph whose steps end by the ``last``-th and within the epoch."""
        per_epoch = self.schedule.steps_per_epoch
        room = min(last - done, per_epoch - done % per_epoch)
        if room < 1:
            raise ValueError(f"steps after {done} up to {last}: expected last > done")
        return max(k for k in self.sizes if k <= room)

    def _bodies(self, k: int) -> None:
        """``k`` steps in a row, as ``HeadStep.steps`` runs them one by one."""
        for i in range(k):
            if i:
                self._no_grads()
            self.body()
