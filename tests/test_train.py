"""Stage 2 end to end on generated images: training from cached targets, outputs aligned with
the cache, exact resume, DDP (gloo), accumulation, NaN guard, and refusals
(pipeline/oracle/finetune/train.py)."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from cache.runs import RunDir
from cache.outputs import classifier_ref, read_outputs
from cache.reader import ClassifierCache
from oracle_fixtures import (CLASSIFIER, extract, run_cli, step_losses, train_args,
                             write_colour_tree)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def stage1(tmp_path_factory):
    """48 training and 24 val images of 3 colour-coded classes, cached with --flip-view."""
    base = tmp_path_factory.mktemp("stage2")
    data = write_colour_tree(base / "colours", {"train": 16, "val": 8})
    cache = base / "cache"
    extract(data, cache)
    return data, cache


def val_cache(cache: Path) -> ClassifierCache:
    return ClassifierCache.open(cache / CLASSIFIER / "val")


def test_end_to_end_lowers_loss_and_writes_aligned_outputs(stage1, tmp_path):
    data, cache = stage1
    out = tmp_path / "run"
    args = train_args(data, cache, out, "--lr", 0.05, "--epochs", 4, "--val-fraction", 0.25)
    run_cli(args)
    losses = list(step_losses(out).values())
    assert len(losses) == 4 * (36 // 8)
    assert np.mean(losses[-3:]) < 0.3 * np.mean(losses[:3])
    vc = val_cache(cache)
    outputs = read_outputs(out / "outputs" / "val.h5",
                           expect_classifier=classifier_ref(vc.path, vc.identity))
    cols = vc.load(["valid", "correct", "label", "pred"])
    assert np.array_equal(outputs.columns["index"], np.arange(vc.num_rows))
    for name in ("valid", "correct", "label", "pred"):
        assert np.array_equal(outputs.columns[name], cols[name]), name
    z, conf = outputs.columns["z"], outputs.columns["confidence"]
    assert np.allclose(conf, 1 / (1 + np.exp(-z)), atol=1e-6)
    o = cols["correct"].astype(bool)
    assert conf[o].min() > conf[~o].max()          # the colour rule was learned
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "complete"
    assert set(run["run"]) == {"oracle", "oracle_model", "classifier", "loss", "variant",
                               "loss_label", "seed", "group", "dataset", "num_classes", "tnr",
                               "config"}
    assert outputs.run == run["run"]
    assert (run["run"]["loss_label"], run["run"]["variant"], run["run"]["num_classes"]) == ("CE", "", 3)
    val = json.loads((out / "val_split.json").read_text())
    assert val["num_val_rows"] == 12 and val["num_train_rows"] == 36
    assert len(set(val["val_rows"])) == 12 and max(val["val_rows"]) < 48
    ckpt = torch.load(out / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["step"] == 16 and {"optimizer", "scheduler", "scaler", "rng"} <= set(ckpt)
    again = run_cli(args)
    assert "already complete" in again.output and "outputs already written" in again.output


def test_resume_reproduces_the_uninterrupted_run(stage1, tmp_path):
    data, cache = stage1
    common = ("--lr", 0.05, "--epochs", 2, "--val-fraction", 0.25, "--val-every", 3)
    run_cli(train_args(data, cache, tmp_path / "a", *common, loss="ss"))
    b = tmp_path / "b"
    stopped = run_cli(train_args(data, cache, b, *common, "--stop-at-step", 4, loss="ss"))
    assert "stopped after step 4" in stopped.output
    assert json.loads((b / "run.json").read_text())["status"] == "stopped"
    assert max(step_losses(b)) == 4
    # continue with DataLoader workers this time: the order must not depend on them
    resumed = run_cli(train_args(data, cache, b, *common, "--workers", 2, loss="ss"))
    assert "resumed at step 4" in resumed.output
    assert step_losses(b) == step_losses(tmp_path / "a")
    za = read_outputs(tmp_path / "a" / "outputs" / "val.h5").columns["z"]
    zb = read_outputs(b / "outputs" / "val.h5").columns["z"]
    assert np.array_equal(za, zb)
    # TensorBoard events (optional extra): the same losses, the resumed run's steps purged
    if importlib.util.find_spec("tensorboard") is not None:
        for run in (tmp_path / "a", b):
            tb = tensorboard_scalars(run / "tensorboard")
            assert {s: v for s, v in tb["train/loss"]} == pytest.approx(step_losses(run))
            assert "val/auc" in tb and "train/lr" in tb


def tensorboard_scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_two_process_torchrun_matches_one_process(stage1, tmp_path):
    data, cache = stage1
    common = ("--lr", 0.05, "--epochs", 2, "--val-fraction", 0.25)
    run_cli(train_args(data, cache, tmp_path / "one", *common))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", "29517", "cli.py", *map(str, train_args(data, cache, tmp_path / "two",
                                                                    *common))]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = json.loads((tmp_path / "two" / "run.json").read_text())
    assert run["status"] == "complete" and run["schedule"]["world_size"] == 2
    assert run["schedule"]["micro_batch"] == 4         # the global batch of 8 is preserved
    one, two = step_losses(tmp_path / "one"), step_losses(tmp_path / "two")
    assert one.keys() == two.keys()
    assert max(abs(one[k] - two[k]) for k in one) < 1e-5
    z1 = read_outputs(tmp_path / "one" / "outputs" / "val.h5").columns["z"]
    z2 = read_outputs(tmp_path / "two" / "outputs" / "val.h5").columns["z"]
    assert np.allclose(z1, z2, atol=1e-4)


def test_a_loss_that_becomes_nan_under_torchrun_stops_every_process_with_its_step(stage1,
                                                                                  tmp_path):
    """Every rank settles the same windows at the same sync (pipeline.oracle.loop.fit), so a NaN
    stops both processes with the step's message; none is left waiting in a collective."""
    data, cache = stage1
    out = tmp_path / "nan2"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", "29519", "cli.py",
           *map(str, train_args(data, cache, out, "--lr", 1e30, "--log-every", 1,
                                "--val-fraction", 0))]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    said = proc.stdout + proc.stderr
    assert said.count("the loss became nan at step 2") == 1, said      # rank 0's line only
    assert "terminate called" not in said, said      # (torchrun prints its own traceback)
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "failed" and "step 2" in run["error"]


def test_processes_disagreeing_on_the_graph_mode_all_stop_with_one_message(stage1, tmp_path):
    """Two hosts' launches (torchrun's environment set by hand, as each node's torchrun would)
    with different --cuda-graph: both stop before any step, one message, nothing written.  Each
    "host" on the CPU: on one machine with GPUs both would take cuda:0 (LOCAL_RANK 0 each),
    which tests/test_multinode.py checks is refused."""
    data, cache = stage1
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29531", "LOCAL_RANK": "0"}
    procs = [subprocess.Popen(
        [sys.executable, "cli.py", *map(str, train_args(data, cache, tmp_path / "run",
                                                        "--cuda-graph", mode, "--device", "cpu"))],
        cwd=ROOT, env={**env, "RANK": str(rank)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True) for rank, mode in enumerate(("auto", "off"))]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 1 for p in procs), outs
    said = [out + err for out, err in outs]
    assert "rank 0: auto, rank 1: off" in said[0] and "Traceback" not in said[0], said[0]
    assert "error:" not in said[1] and "Traceback" not in said[1], said[1]
    assert not (tmp_path / "run").exists()     # refused before the run was written


def test_gradient_accumulation_keeps_the_global_batch(stage1, tmp_path):
    data, cache = stage1
    common = ("--lr", 0.05, "--val-fraction", 0)
    run_cli(train_args(data, cache, tmp_path / "a1", *common))
    run_cli(train_args(data, cache, tmp_path / "a2", *common, "--accum-steps", 2))
    one, two = step_losses(tmp_path / "a1"), step_losses(tmp_path / "a2")
    assert max(abs(one[k] - two[k]) for k in one) < 1e-5
    best = torch.load(tmp_path / "a1" / "checkpoints" / "best.pt", weights_only=True)
    assert best["metric"] == "final" and best["step"] == 6   # no held-out rows: final model


def test_default_run_dir_skip_and_variant_naming(stage1, tmp_path, monkeypatch):
    data, cache = stage1
    monkeypatch.chdir(tmp_path)
    args = train_args(data, cache, None, "--authors-broadcast", "--val-fraction", 0.25,
                      "--train-limit", 40)
    run_cli(args)
    runs = list((tmp_path / "artifacts" / "colours" / "runs").iterdir())
    assert len(runs) == 1
    name = runs[0].name
    assert name.startswith(f"{CLASSIFIER}-{CLASSIFIER}_ce_broadcast_seed0_")
    record = json.loads((runs[0] / "run.json").read_text())["run"]
    assert record["loss_label"] == "CE (broadcast)" and name.endswith(record["group"])
    assert "already complete" in run_cli(args).output
    run_cli(args + ["--seed", 1])
    names = sorted(p.name for p in runs[0].parent.iterdir())
    assert len(names) == 2 and names[1].endswith(record["group"])   # same group, other seed


def test_nan_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(stage1, tmp_path):
    data, cache = stage1
    out = tmp_path / "nan"
    result = run_cli(train_args(data, cache, out, "--lr", 1e30, "--ckpt-every", 1,
                                "--val-fraction", 0), expect=1)
    assert "the loss became nan at step 2" in result.output
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "failed" and "step 2" in run["error"]
    assert torch.load(out / "checkpoints" / "last.pt", weights_only=True)["step"] == 1


def test_cache_of_another_dataset_listing_is_refused(stage1, tmp_path):
    data, cache = stage1
    changed = shutil.copytree(data, tmp_path / "colours")
    first = sorted((changed / "train").iterdir())[0]
    shutil.copy(next(first.iterdir()), first / "zz_extra.JPEG")
    result = run_cli(train_args(changed, cache, tmp_path / "r"), expect=1)
    assert "dataset_fingerprint" in result.output and "num_rows" in result.output


def test_eval_split_of_another_classifier_is_refused(stage1, tmp_path):
    data, cache = stage1
    other = tmp_path / "other"
    extract(data, other, splits=("val",), seed=1, flip_view=False)   # other random weights
    shutil.copytree(cache / CLASSIFIER / "train", other / CLASSIFIER / "train")
    result = run_cli(train_args(data, other, tmp_path / "r"), expect=1)
    assert "weights_sha256" in result.output


def test_all_correct_training_split_is_refused(tmp_path):
    from pipeline.data.labels import imagenet_synsets

    data = write_colour_tree(tmp_path / "one", {"train": 10, "val": 2})
    for wnid in imagenet_synsets()[1:3]:       # keep a single class
        for split in ("train", "val"):
            shutil.rmtree(data / split / wnid)
    extract(data, tmp_path / "cache", kwargs={"num_classes": 1}, flip_view=False)
    result = run_cli(train_args(data, tmp_path / "cache", tmp_path / "r"), expect=1)
    assert "ALL correct" in result.output


@pytest.mark.parametrize("extra, match", [
    (("--alpha-pos", 1.0), "--alpha-pos does not apply to --loss ce"),
    (("--class-balanced", "--neg-weight", 5), "exclusive"),
])
def test_option_misfits_are_usage_errors(stage1, tmp_path, extra, match):
    data, cache = stage1
    result = run_cli(train_args(data, cache, tmp_path / "r", *extra), expect=2)
    assert match in result.output
    assert not (tmp_path / "r").exists()


def test_corrupted_eval_split_is_scored_on_the_same_corrupted_pixels(stage1, tmp_path):
    data, clean_cache = stage1
    cache = shutil.copytree(clean_cache, tmp_path / "cache")
    extract(data, cache, splits=("val",), flip_view=False,
            extra=("--corruption", "defocus_blur", "--severity", 5))
    out = tmp_path / "run"
    run_cli(train_args(data, cache, out, "--lr", 0.05, "--val-fraction", 0,
                       "--eval-split", "val-defocus_blur-5"))
    shifted_cache = ClassifierCache.open(cache / CLASSIFIER / "val-defocus_blur-5")
    shifted = read_outputs(out / "outputs" / "val-defocus_blur-5.h5",
                           expect_classifier=classifier_ref(shifted_cache.path,
                                                            shifted_cache.identity))
    assert shifted.attrs["corruption"] == "defocus_blur:5:seed0"
    clean = read_outputs(out / "outputs" / "val.h5").columns["z"]
    assert not np.allclose(shifted.columns["z"], clean, atol=1e-3)
    # the oracle saw exactly the pixels the classifier saw: rescoring them reproduces the file
    from pipeline.core import dist
    from pipeline.oracle.nets.model import load_trained_oracle
    from pipeline.oracle.loop.outputs import oracle_z
    from pipeline.oracle.settings.targets import open_split

    run = json.loads((out / "run.json").read_text())
    model, data_cfg, _ = load_trained_oracle(out, RunDir(out).record())
    split = open_split(str(data), cache, CLASSIFIER, "val-defocus_blur-5")
    z = oracle_z(model, split, np.arange(split.cache.num_rows), data_cfg, batch_size=8, workers=0,
                 precision="fp32", device=torch.device("cpu"), info=dist.DistInfo())
    assert split.corruption == ("defocus_blur", 5, 0)          # extract's own corruption spec
    assert np.allclose(z, shifted.columns["z"], atol=1e-5)     # deterministic per (seed, index)
