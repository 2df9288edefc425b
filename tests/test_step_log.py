"""log.jsonl as the loop writes it: the per-step line formatted directly is json.dumps's line,
entries reach the file by a validation, a flush or a checkpoint, and a checkpoint never holds a
step its log lacks."""
from __future__ import annotations

import json
import math
import struct

import numpy as np
import torch

from cache.runlog import finite, log_line
from cache.runs import RunDir
from pipeline.core.dist import DistInfo
from pipeline.oracle.loop.fit import fit
from pipeline.oracle.loop.state import HeadState, LoopSettings, LoopState
from pipeline.oracle.loop.log import StepLog


def _floats() -> list[float]:
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2 ** 64, size=4000, dtype=np.uint64)
    odd = [struct.unpack("<d", struct.pack("<Q", int(b)))[0] for b in bits]
    return odd + [0.0, -0.0, 5e-324, -5e-324, 1e16, 1e-7, 0.1, 1 / 3, 2.5, 1e300, -1.7976931348623157e308,
                  math.nan, math.inf, -math.inf] + rng.normal(0, 1, 2000).tolist()


def test_the_per_step_line_is_the_json_line_of_every_float():
    for i, loss in enumerate(_floats()):
        entry = {"step": i * 7919, "loss": loss}
        assert log_line(entry) == json.dumps(finite(dict(entry)), sort_keys=True), loss
        assert json.loads(log_line(entry)) == finite(entry)


def test_other_entries_go_through_json_as_they_are():
    for entry in ({"step": 3, "loss": np.float64(0.5)}, {"step": True, "loss": 0.5},
                  {"step": 3, "loss": 1}, {"step": 9, "loss": 0.25, "lr": 0.1, "tpr": math.nan},
                  {"step": 9, "val": {"auc": 0.5, "loss": math.inf}}, {"loss": 0.5, "epoch": 1}):
        assert log_line(entry) == json.dumps(finite(dict(entry)), sort_keys=True)


def test_entries_reach_the_file_at_a_validation_a_flush_and_close(tmp_path):
    run = RunDir(tmp_path / "run")
    log = StepLog(run, None, True)
    log.write({"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.25})
    assert run.log_entries() == []          # within FLUSH_S: still in memory
    log.flush()
    assert [e["step"] for e in run.log_entries()] == [1, 2]
    log.write({"step": 3, "loss": 0.125})
    log.write({"step": 3, "val": {"auc": 0.75}})
    assert [e["step"] for e in run.log_entries()] == [1, 2, 3, 3]
    log.write({"step": 4, "loss": math.nan})
    log.close()
    assert run.log_entries()[-1] == {"step": 4, "loss": None}


class _Session:
    """A loop session of one head whose checkpoints record what the log holds when written."""
    info, tnr_logit, val_correct = DistInfo(), 0.0, np.zeros(0)

    def __init__(self, run: RunDir):
        self.run, self.saved, self.done = run, [], 0

    def start(self, step): pass
    def drain(self): return torch.zeros(4, 1), None
    def lr(self): return float(self.done)         # the lr "after" the steps done so far

    def steps(self, done, last):
        self.done = done + 1
        return torch.tensor([[1.0 / (done + 1)]])
    def keep_best(self, head, step, score): pass
    def diverged(self, value, step, state): pass
    def finish(self): pass

    def save_last(self, step, state):
        self.saved.append((step, max(e["step"] for e in self.run.log_entries())))


def test_a_checkpoint_is_written_after_its_steps_are_in_the_log(tmp_path):
    run = RunDir(tmp_path / "run")
    session, log = _Session(run), StepLog(run, None, True)
    settings = LoopSettings(total=23, batch_size=4, log_every=3, val_every=None, ckpt_every=5,
                            stop_at_step=None, progress=False, desc="t")
    assert fit(session, LoopState(), settings, [log]) == "trained"
    assert session.saved == [(s, s) for s in (5, 10, 15, 20, 23)]
    entries = run.log_entries()
    assert [e["step"] for e in entries] == list(range(1, 24))   # the loop flushed
    # a window is settled while the next one runs: its lr is still the one after its own steps
    assert [(e["step"], e["lr"]) for e in entries if "lr" in e] == \
        [(s, float(s)) for s in (3, 5, 6, 9, 10, 12, 15, 18, 20, 21, 23)]


class _Bank(_Session):
    """Three heads: the second's loss is NaN from step 8 on, the third's inf at step 13 only."""

    def steps(self, done, last):
        return torch.tensor([[0.5, math.nan if done >= 7 else 0.5, math.inf if done == 12 else 0.5]])

    def drain(self):
        return torch.zeros(4, 3), None


def test_each_head_of_a_bank_diverges_at_its_first_non_finite_loss(tmp_path):
    session = _Bank(RunDir(tmp_path / "run"))
    state = LoopState.for_heads(3)
    settings = LoopSettings(total=20, batch_size=4, log_every=5, val_every=None, ckpt_every=None,
                            stop_at_step=None, progress=False, desc="t")
    assert fit(session, state, settings, [StepLog(session.run, None, False)] * 3) == "trained"
    assert state.heads[1].diverged_at == 8 and math.isnan(state.heads[1].diverged_value)
    assert (state.heads[2].diverged_at, state.heads[2].diverged_value) == (13, math.inf)
    assert state.heads[0].diverged_at is None


class _Chunks(_Session):
    """Up to three steps a call, as a graphed head-only session runs several steps a replay."""

    def __init__(self, run: RunDir, settings: LoopSettings):
        super().__init__(run)
        self.settings, self.calls = settings, []

    def steps(self, done, last):
        assert last == self.settings.next_sync(done)      # the loop's next sync, never beyond
        k = min(3, last - done)
        self.calls.append(k)
        self.done = done + k
        return torch.tensor([[1.0 / (s + 1)] for s in range(done, done + k)])


def test_steps_run_several_at_a_time_log_and_checkpoint_as_one_at_a_time(tmp_path):
    settings = LoopSettings(total=23, batch_size=4, log_every=4, val_every=None, ckpt_every=10,
                            stop_at_step=None, progress=False, desc="t")
    logs = {}
    for name, make in (("one", _Session), ("chunks", lambda r: _Chunks(r, settings))):
        run = RunDir(tmp_path / name)
        session = make(run)
        assert fit(session, LoopState(), settings, [StepLog(run, None, True)]) == "trained"
        entries = [{k: v for k, v in e.items() if k != "img_per_s"} for e in run.log_entries()]
        logs[name] = (entries, session.saved)
    assert logs["chunks"] == logs["one"]
    assert [e["step"] for e in logs["one"][0]] == list(range(1, 24))
    assert session.calls[:3] == [3, 1, 3] and len(session.calls) < 23


def test_a_banks_counts_are_added_at_once_as_head_by_head():
    counts = np.arange(12, dtype=np.float64).reshape(4, 3)
    bank, one_by_one = LoopState.for_heads(3), LoopState(heads=[HeadState() for _ in range(3)])
    for state in (bank, one_by_one):
        state.add_counts(counts)
        state.add_counts(counts * 2)
    for a, b, p in zip(bank.heads, one_by_one.heads, range(3)):
        assert np.array_equal(a.counts, b.counts) and np.array_equal(a.counts, 3 * counts[:, p])
