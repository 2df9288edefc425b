"""Deterministic training order, micro-batch split and held-out rows
(pipeline/oracle/settings/sampler.py), and the targets of the view actually shown
(pipeline/engine.TargetTable)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.oracle.settings.sampler import StepSchedule, carve_rows, loader_batches, micro_slices
from pipeline.oracle.finetune.step import TargetTable


def test_carve_rows_is_seeded_disjoint_and_limited():
    rows = np.arange(1000)
    train, val = carve_rows(rows, 0.1, None, split_seed=0)
    assert len(val) == 100 and len(train) == 900
    assert not set(train) & set(val) and set(train) | set(val) == set(rows)
    again = carve_rows(rows, 0.1, None, split_seed=0)
    assert np.array_equal(again[1], val)
    assert not np.array_equal(carve_rows(rows, 0.1, None, split_seed=1)[1], val)
    t, v = carve_rows(rows, 0.25, 200, split_seed=0)
    assert len(t) + len(v) == 200 and len(v) == 50
    assert carve_rows(rows[:3], 0.01, None, 0)[1].size == 1     # a requested fraction is never 0


def test_schedule_is_a_function_of_seed_and_step():
    s1 = StepSchedule(np.arange(100) * 3, batch_size=8, epochs=2, seed=5, flip=True)
    s2 = StepSchedule(np.arange(100) * 3, batch_size=8, epochs=2, seed=5, flip=True)
    assert s1.steps_per_epoch == 12 and s1.total_steps == 24
    for step in (17, 3, 0, 23):                       # any order, fresh or cached
        assert np.array_equal(s1.batch_rows(step), s2.batch_rows(step))
        assert np.array_equal(s1.batch_flips(step), s2.batch_flips(step))
    epoch0 = np.concatenate([s1.batch_rows(k) for k in range(12)])
    assert len(set(epoch0)) == 96 and set(epoch0) <= set(np.arange(100) * 3)
    assert not np.array_equal(s1.batch_rows(0), s1.batch_rows(12))       # reshuffled per epoch
    other = StepSchedule(np.arange(100) * 3, batch_size=8, epochs=2, seed=6, flip=True)
    assert not np.array_equal(other.batch_rows(0), s1.batch_rows(0))
    flips = np.concatenate([s1.batch_flips(k) for k in range(24)])
    assert 0.3 < flips.mean() < 0.7
    assert not StepSchedule(np.arange(100), 8, 1, 5, flip=False).batch_flips(0).any()


@pytest.mark.parametrize("world, accum", [(1, 1), (2, 1), (2, 2), (4, 1), (1, 4)])
def test_ranks_and_micro_batches_tile_the_global_batch(world, accum):
    schedule = StepSchedule(np.arange(64), batch_size=16, epochs=1, seed=0, flip=True)
    per_rank = [loader_batches(schedule, 1, micro_slices(16, world, r, accum))
                for r in range(world)]
    for step in range(1, schedule.total_steps):
        k = step - 1
        got = [b for r in range(world) for b in per_rank[r][k * accum:(k + 1) * accum]]
        assert np.array_equal(np.concatenate(got), schedule.batch_rows(step))


def test_indivisible_batch_is_refused():
    with pytest.raises(ValueError, match="not divisible"):
        micro_slices(10, 4, 0, 1)


def test_targets_follow_the_view_shown():
    table = TargetTable.from_arrays({
        "correct": np.array([1, 0, 1], np.float32), "correct_flip": np.array([0, 0, 1], np.float32),
        "p_true": np.array([.9, .1, .8], np.float32),
        "p_true_flip": np.array([.3, .2, .7], np.float32)})
    o, pt = table.lookup(np.array([0, 1, 2, 0]), np.array([True, True, False, False]))
    assert o.tolist() == [0, 0, 1, 1]
    assert torch.allclose(pt, torch.tensor([.3, .2, .8, .9]))


def test_validation_score_is_the_standard_aupr_error():
    from sklearn.metrics import average_precision_score, roc_auc_score

    from pipeline.oracle.loop.validation import validation_metrics as val_metrics

    rng = np.random.default_rng(0)
    o = rng.random(500) < 0.8
    z = rng.normal(size=500) + 1.5 * o
    m = val_metrics(z.astype(np.float32), o.astype(np.float32), 0.1, 0.0)
    assert m["aupr_error"] == pytest.approx(average_precision_score(~o, -z.astype(np.float32)))
    assert m["auc"] == pytest.approx(roc_auc_score(o, z.astype(np.float32)))
    assert m["tpr"] == pytest.approx((z[o] > 0).mean()) and m["tnr"] == pytest.approx((z[~o] < 0).mean())
    assert np.isnan(val_metrics(z, np.ones(500), 0.1, 0.0)["aupr_error"])   # no errors: undefined


def test_run_lock_refuses_a_live_owner_and_takes_over_a_dead_one(tmp_path):
    import json
    import os
    import socket
    import subprocess

    from cache.runs import RunError, RunLock

    lock = tmp_path / "run" / ".lock"
    with RunLock(tmp_path / "run"):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        with pytest.raises(RunError, match="in use by another process"):
            RunLock(tmp_path / "run").__enter__()
    assert not lock.exists()
    dead = subprocess.Popen(["true"])
    dead.wait()
    lock.write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}))
    with RunLock(tmp_path / "run"):
        assert json.loads(lock.read_text())["pid"] == os.getpid()


def test_onecycle_schedule_follows_the_paper_and_caps_short_warmups():
    from cache.runs import RunError
    from pipeline.oracle.loop.schedule import schedule_info

    cfg = {"warmup_steps": 100, "batch_size": 40, "accum_steps": 1, "cycle_momentum": False,
           "momentum": 0.05}
    full = schedule_info(cfg, 32029, 32029, 1)              # ImageNet train / 40
    assert full["warmup_steps_effective"] == 100 and full["pct_start"] == 100 / 32029
    short = schedule_info(cfg, 50, 50, 1)
    assert short["warmup_steps_effective"] == 15           # 30% of a 50-step run
    assert schedule_info({**cfg, "accum_steps": 2}, 50, 50, 2)["micro_batch"] == 10
    with pytest.raises(RunError, match="too few"):
        schedule_info(cfg, 2, 2, 1)
    with pytest.raises(RunError, match="not divisible"):
        schedule_info(cfg, 50, 50, 3)
