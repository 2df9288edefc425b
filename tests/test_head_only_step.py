"""The head-only step on static state (pipeline/oracle/headonly/graph.py), the body a CUDA graph
captures, run eagerly on the CPU: bit for bit the eager FeatureSession (losses, lr, counts, best
step and score, best and final heads) over several epochs with flips, momentum, weight decay and
cycled momentum; its SGD update is torch.optim.SGD's; the lr/momentum precomputed on the host are
OneCycleLR's.  The graph itself: tests/test_head_graph_cuda.py."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from pipeline.core.losses import Context, get
from pipeline.oracle.headonly.bank import (BankOptim, FeatureSession, make_bank, onecycle_values,
                                  bank_optimizer)
from pipeline.oracle.headonly.features import FeatureTable
from pipeline.oracle.headonly.graph import GraphedHeadStep, HeadStep, momentum_buffers, sgd_step
from pipeline.oracle.loop.fit import fit
from pipeline.oracle.loop.state import LoopSettings, LoopState
from pipeline.oracle.settings.sampler import StepSchedule

ROWS, DIM, BATCH, LOG_EVERY = 1200, 16, 16, 7
CHUNK = 16            # the epoch buffer filled in chunks of 16 steps: 4 and a partial one
VAL = np.arange(0, 100)


class Log:
    """A StepLog's write(), kept in memory; img/s (a timing) left out."""

    writes = True

    def __init__(self):
        self.entries = []

    def write(self, *entries: dict) -> None:
        self.entries += [{k: v for k, v in e.items() if k != "img_per_s"} for e in entries]

    def flush(self) -> None:
        """Nothing to flush: the entries stay in memory for the test."""

    def close(self) -> None:
        """Nothing to close: the entries stay in memory for the test."""


def feature_table(device: torch.device, stacked: bool = False) -> FeatureTable:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2 * ROWS, DIM, generator=g).half()
    correct = (x[:, :4].float().sum(1) + torch.randn(2 * ROWS, generator=g) > -1).float()
    p_true = torch.rand(2 * ROWS, generator=g)
    return FeatureTable(x.to(device), correct.to(device), p_true.to(device), ROWS, True)


def bank_setup(loss: str, arch: str, epochs: int = 3):
    schedule = StepSchedule(np.arange(100, ROWS), BATCH, epochs, 0, True)
    params = [{"alpha_pos": a, "alpha_neg": b} for a, b in ((1, 3), (2, 5), (0.5, 8))]
    losses = [get(loss).resolve(p if loss == "ss" else {}, Context((1.0, 3.0)), None)
              for p in params]
    opt = BankOptim(0, loss == "ss", 0.05, 0.9, 1e-3, 0.3, True, arch)
    total = schedule.total_steps
    settings = LoopSettings(total, BATCH, LOG_EVERY, max(1, total // 4), None, None, False, "t")
    return schedule, losses, opt, settings


def run_bank(table: FeatureTable, loss: str, arch: str, step: str, epochs: int = 3,
             per_replay: int = 1) -> dict:
    """One bank through the loop: ``step`` 'eager' (today's FeatureSession), 'body' (HeadStep
    without a graph) or 'graph' (GraphedHeadStep, CUDA graphs running up to ``per_replay`` steps
    a replay); the epoch buffer filled in chunks of CHUNK steps."""
    schedule, losses, opt, settings = bank_setup(loss, arch, epochs)
    logs = [Log() for _ in losses]
    head, sgd, sched = make_bank(table, schedule, losses, opt)
    args = (table, schedule, head, losses, onecycle_values(opt, schedule.total_steps),
            opt.weight_decay, LOG_EVERY, 0.0)
    path = {"mode": "cuda_graph", "requested": "on"}
    graphed = {"chunk": CHUNK, "record": path, "per_replay": per_replay}
    fast = {"eager": lambda: None, "body": lambda: HeadStep(*args, chunk=CHUNK),
            "compiled": lambda: HeadStep(*args, chunk=CHUNK, compiled=True),
            "compiled graph": lambda: GraphedHeadStep(*args, **graphed, compiled=True),
            "graph": lambda: GraphedHeadStep(*args, **graphed)}[step]()
    session = FeatureSession(table, schedule, losses, head, sgd, sched, VAL, 0.0, fast)
    state = LoopState.for_heads(len(losses))
    fit(session, state, settings, logs)
    assert (session.fast is not None) == (step != "eager") and path["mode"] == "cuda_graph"
    return {"logs": [log.entries for log in logs], "state": state.heads, "best": session.best,
            "final": [session.head.state_of(p) for p in range(len(losses))],
            "steps": schedule.total_steps}


def assert_identical(a: dict, b: dict) -> None:
    """Bit for bit: every log entry (losses, lr, TPR/TNR, validation), counts, best step and
    score, best and final heads."""
    assert a["logs"] == b["logs"]
    for ha, hb in zip(a["state"], b["state"]):
        assert np.array_equal(ha.counts, hb.counts)
        assert (ha.best_step, ha.best_score, ha.diverged_at) == \
            (hb.best_step, hb.best_score, hb.diverged_at)
    for side in ("best", "final"):
        for sa, sb in zip(a[side], b[side]):
            assert sa.keys() == sb.keys()
            for k in sa:
                assert torch.equal(sa[k], sb[k]), (side, k)


@pytest.mark.parametrize("loss,arch", [("ss", "linear"), ("tcp", "linear"), ("ss", "confidnet")])
def test_the_graphs_body_run_eagerly_equals_the_eager_session_bit_for_bit(loss, arch):
    table = feature_table(torch.device("cpu"))
    eager = run_bank(table, loss, arch, "eager")
    body = run_bank(table, loss, arch, "body")
    assert eager["steps"] > 200 and eager["steps"] % LOG_EVERY       # a partial last window
    assert (eager["steps"] // 3) % CHUNK                               # a partial last chunk
    assert_identical(eager, body)
    losses = [e["loss"] for e in eager["logs"][0] if "loss" in e]
    assert losses[0] != losses[-1] and all(h.best_step for h in eager["state"])


@pytest.mark.skipif(not (shutil.which("c++") or shutil.which("g++")),
                    reason="torch.compile on the CPU (inductor) needs a C++ compiler")
def test_the_compiled_body_trains_the_same_heads_up_to_rounding():
    """--compile: the head's forward and the loss compiled (inductor's fused kernels) -- the
    same formulas in another order of operations: the losses, counts and heads of the eager
    session up to float rounding, not bit for bit; the eager head and loss objects untouched."""
    table = feature_table(torch.device("cpu"))
    assert_close_runs(run_bank(table, "ss", "linear", "compiled", epochs=1),
                      run_bank(table, "ss", "linear", "eager", epochs=1))


def assert_close_runs(a: dict, b: dict) -> None:
    """The same training up to float rounding: losses, final heads, counts within 2 rows."""
    ours, theirs = ([e["loss"] for e in r["logs"][0] if "loss" in e] for r in (a, b))
    assert np.allclose(ours, theirs, rtol=1e-4, atol=1e-6) and len(ours) == len(theirs)
    for x, y in zip(a["final"], b["final"]):
        for k in x:
            assert torch.allclose(x[k], y[k], rtol=1e-4, atol=1e-6), k
    counts = [np.abs(x.counts - y.counts).max() for x, y in zip(a["state"], b["state"])]
    assert max(counts) <= 2          # a z within rounding of the threshold may flip a count


@pytest.mark.parametrize("log_every,val_every,per_replay", [(7, 101, 4), (10, 76, 32),
                                                            (1, 50, 8), (64, 1000, 32)])
def test_multi_step_replays_end_at_every_sync_and_epoch_start(log_every, val_every, per_replay):
    """The replay plan of ``GraphedHeadStep`` (no device needed to plan): the steps of each
    replay are consecutive, none crosses a sync of the loop or the start of an epoch, the
    window never overflows, and replays are as long as the graphs allow."""
    schedule = StepSchedule(np.arange(100, ROWS), BATCH, 3, 0, True)     # 68 steps an epoch
    total, per_epoch = schedule.total_steps, schedule.steps_per_epoch
    settings = LoopSettings(total, BATCH, log_every, val_every, None, None, False, "t")
    syncs = {t for t in range(1, total + 1) if settings.syncs(t)}
    table = feature_table(torch.device("cpu"))
    head, *_ = make_bank(table, schedule, [get("ss").resolve({}, Context((1.0, 3.0)), None)],
                         BankOptim(0, True, 0.05, 0.9, 0.0, 0.3, False))
    step = GraphedHeadStep(table, schedule, head, [get("ss").resolve({}, Context((1.0, 3.0)), None)],
                           ([0.1] * (total + 1), [0.9] * (total + 1)), 0.0,
                           min(log_every, total), 0.0, record={}, per_replay=per_replay)
    assert step.sizes == [1 << i for i in range(min(per_replay, log_every).bit_length())]
    done, replays = 0, []
    while done < total:
        k = step._replay_size(done, settings.next_sync(done))
        assert k in step.sizes
        last = done + k                 # steps done after this replay
        assert not any(t in syncs for t in range(done + 1, last))       # only its last may sync
        assert done // per_epoch == (last - 1) // per_epoch              # within one epoch
        assert k == max(s for s in step.sizes
                        if s <= min(settings.next_sync(done), (done // per_epoch + 1) * per_epoch)
                        - done)
        replays.append(k)
        done = last
    assert done == total and len(replays) < total or per_replay == 1 or log_every == 1


def test_the_loops_sync_points():
    s = LoopSettings(100, 8, 10, 25, None, None, False, "t")
    assert [t for t in range(1, 101) if s.syncs(t)] == \
        [10, 20, 25, 30, 40, 50, 60, 70, 75, 80, 90, 100]
    assert [s.next_sync(d) for d in (0, 9, 10, 20, 24, 25, 99)] == [10, 10, 20, 25, 25, 30, 100]
    c = LoopSettings(30, 8, 7, None, 12, 16, False, "t")
    assert [t for t in range(1, 31) if c.syncs(t)] == [7, 12, 14, 16, 21, 24, 28, 30]
    for total, log, val, ckpt, stop in [(100, 10, 25, None, None), (30, 7, None, 12, 16),
                                        (97, 1000, 13, 40, 55), (50, 3, 50, None, 20),
                                        (61, 61, None, None, None), (40, 9, None, 11, 40)]:
        t = LoopSettings(total, 8, log, val, ckpt, stop, False, "t")
        for done in range(total):       # the first sync after ``done``, as ``syncs`` defines it
            assert t.next_sync(done) == next(u for u in range(done + 1, total + 1) if t.syncs(u))


def test_compiled_with_a_users_loss_is_refused():
    from cache.runs import RunError
    from pipeline.oracle.headonly.graph import head_step_path

    with pytest.raises(RunError, match="--compile: .*leave --compile out"):
        head_step_path(torch.device("cpu"), "auto", custom_loss=True, compiled=True)
    assert head_step_path(torch.device("cpu"), "off", compiled=True) == \
        {"mode": "eager", "requested": "off", "compiled": True}


def test_the_precomputed_schedule_is_onecycles_and_sgd_step_is_torchs_update():
    check_sgd_step(torch.device("cpu"))


def check_sgd_step(device: torch.device) -> None:
    """``sgd_step`` with the precomputed lr/momentum (as device scalars) = torch.optim.SGD under
    OneCycleLR, bit for bit, with the kernels torch chooses on ``device`` (foreach on CUDA):
    cycled momentum and weight decay; momentum 0 keeps no buffer, as torch."""
    for momentum, cycle in ((0.9, True), (0.05, False), (0.0, False)):
        opt = BankOptim(0, True, 0.1, momentum, 0.01, 0.3, cycle)
        total = 12
        lrs, moms = onecycle_values(opt, total)
        g = torch.Generator().manual_seed(0)
        ref = [torch.randn(s, generator=g).to(device) for s in ((3, 5), (3,))]
        ref[0][0, 0] = -0.0           # with a -0.0 gradient: a -0.0 buffer after step 0
        sgd, sched = bank_optimizer([torch.nn.Parameter(p.clone()) for p in ref], opt, total)
        ours = [p.clone() for p in ref]
        bufs = momentum_buffers(ours, moms[:total])
        for k in range(total):
            grads = [torch.randn(p.shape, generator=g).to(device) for p in ref]
            if k == 0:
                grads[0][0, 0] = -0.0
            group = sgd.param_groups[0]
            assert (group["lr"], group["momentum"]) == (lrs[k], moms[k])
            for p, gr in zip(group["params"], grads):
                p.grad = gr.clone()
            sgd.step()
            sched.step()
            sgd_step(ours, grads, bufs, torch.tensor(-lrs[k], device=device),
                     torch.tensor(moms[k], device=device), opt.weight_decay,
                     foreach=device.type == "cuda")
            for p, q in zip(group["params"], ours):
                assert torch.equal(p.detach(), q)
            if bufs is None:
                assert not sgd.state[group["params"][0]]
            else:
                state = [sgd.state[p]["momentum_buffer"] for p in group["params"]]
                assert all(torch.equal(a, b) and torch.equal(a.signbit(), b.signbit())
                           for a, b in zip(state, bufs))
        assert sgd.param_groups[0]["lr"] == lrs[total]
