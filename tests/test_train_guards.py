"""train-oracle and predict, nothing silently wrong: the oracle's weights
identified by their contents, no evaluation on the training split, one message and run.json
``failed`` on every way a run stops, and predict's default precision.  Each case is listed in
docs/BAD_INPUT.md (Training / Prediction)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from oracle_fixtures import (CLASSIFIER, TINY_VIT_KWARGS, extract, run_cli, train_args,
                             write_colour_tree)
from conftest import assert_error


@pytest.fixture(scope="module")
def stage1(tmp_path_factory):
    base = tmp_path_factory.mktemp("guards")
    data = write_colour_tree(base / "colours", {"train": 8, "val": 4})
    cache = base / "cache"
    extract(data, cache, extra=("--features",))     # the features and both views: --head-only
    return data, cache


def save_weights(path: Path, seed: int) -> Path:
    import timm
    import torch

    torch.manual_seed(seed)
    torch.save(timm.create_model(CLASSIFIER, **TINY_VIT_KWARGS).state_dict(), path)
    return path


def with_weights(args: list, weights: str) -> list:
    args = [a for a in args if a != "--random-init"]
    return args + ["--weights", weights]


def run_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.glob("*/run.json"))


# ----------------------------------------------------------------- weights by their contents --
def test_the_oracle_weights_are_identified_by_their_contents_not_their_path(stage1, tmp_path,
                                                                            monkeypatch):
    data, cache = stage1
    monkeypatch.chdir(tmp_path)
    save_weights(tmp_path / "k3.pth", seed=0)
    runs = tmp_path / "runs"
    base = train_args(data, cache, None, "--runs-root", runs, "--batch-size", 4,
                      "--val-fraction", 0)
    run_cli(with_weights(base, "k3.pth"))
    [first] = run_dirs(runs)
    record = json.loads((first / "run.json").read_text())["run"]
    assert record["config"]["weights"] == "k3.pth"                     # the path, for humans
    sha = record["config"]["weights_sha256"]
    assert len(sha) == 64
    # another spelling of the same file: the same run (its seeds would be averaged together)
    again = run_cli(with_weights(base, "./k3.pth"))
    assert "already complete" in again.output and run_dirs(runs) == [first]
    # the same path with other contents: another run, never "already complete"
    save_weights(tmp_path / "k3.pth", seed=1)
    changed = run_cli(with_weights(base, "k3.pth"))
    assert "already complete" not in changed.output
    assert len(run_dirs(runs)) == 2
    # ... and refused in the first run's directory, saying what differs and what to do
    result = run_cli(with_weights(base, "k3.pth") + ["--out", first], expect=None)
    assert_error(result, r"holds another run:.*weights_sha256: run has .*--weights file's "
                         r"contents are not the ones this run was trained with.*restore")
    assert json.loads((first / "run.json").read_text())["status"] == "complete"


# ------------------------------------------------------------- the training split evaluated --
@pytest.mark.parametrize("extra, named", [
    (("--train-split", "val"), r"--train-split val and the dataset's evaluation split 'val'.*"
                               r"Train on another split \(--train-split"),
    (("--eval-split", "train"), r"--train-split train and --eval-split train.*Drop --eval-split "
                                r"train"),
])
def test_evaluating_on_the_training_split_is_refused(stage1, tmp_path, extra, named):
    """--train-split val trained and scored the same rows, with no word."""
    data, cache = stage1
    out = tmp_path / "r"
    result = run_cli(train_args(data, cache, out, "--batch-size", 4, *extra), expect=None)
    assert_error(result, r"list the same images.*scored on the rows it is trained on")
    assert_error(result, named)
    assert not out.exists()


def test_predict_refuses_the_training_split(stage1, tmp_path):
    """predict --split train scored the rows the oracle was trained on, with no word; a run
    written before run.json recorded the training fingerprint is checked through its cache."""
    data, cache = stage1
    out = tmp_path / "r"
    run_cli(train_args(data, cache, out, "--batch-size", 4))
    args = ["predict", "--run", out, "--data", data, "--cache", cache, "--split", "train",
            "--device", "cpu", "--no-progress"]
    assert_error(run_cli(args, expect=None), r"--split train lists the images run .* was "
                 r"trained on .*training-set numbers")
    record = json.loads((out / "run.json").read_text())
    del record["train_fingerprint"]
    (out / "run.json").write_text(json.dumps(record))
    assert_error(run_cli(args, expect=None), r"--split train lists the images run")
    assert not (out / "outputs" / "train.h5").exists()
    run_cli([*args[:-4], "val", *args[-3:], "--name", "val-again"])


def test_non_finite_oracle_weights_are_refused_before_outputs_are_written(stage1, tmp_path):
    """An oracle whose weights are not finite (a final model whose last update diverged) ended
    in a traceback `confidence must be finite`; predict on such a checkpoint likewise."""
    import torch

    data, cache = stage1
    out = tmp_path / "r"
    run_cli(train_args(data, cache, out, "--batch-size", 4))
    best = out / "checkpoints" / "best.pt"
    ckpt = torch.load(best, weights_only=False)
    state = ckpt["model"] if "model" in ckpt else ckpt
    name = next(k for k, v in state.items() if v.is_floating_point())
    state[name].fill_(float("nan"))
    torch.save(ckpt, best)
    args = ["predict", "--run", out, "--data", data, "--cache", cache, "--split", "val",
            "--name", "again", "--device", "cpu", "--no-progress"]
    assert_error(run_cli(args, expect=None), r"gives non-finite scores \(NaN or inf\) on \d+ of "
                 r"\d+ rows of split 'val' .*training diverged; nothing was written")
    assert not (out / "outputs" / "again.h5").exists()


# ---------------------------------------------------- one message, run.json never `running` --
def head_only_args(data: Path, cache: Path, out: Path, *extra) -> list:
    args = train_args(data, cache, out, "--batch-size", 4, "--head-only", *extra, loss="ss")
    for option in ("--precision", "--workers"):          # fine-tuning options
        i = args.index(option)
        del args[i:i + 2]
    i = args.index("--model-kwargs")                      # the backbone of the feature cache
    args[i + 1] = json.dumps({**TINY_VIT_KWARGS, "num_classes": 3})
    return args


@pytest.mark.parametrize("head_only, lr", [(False, 1e6), (True, 1e38)])
def test_a_diverging_run_ends_in_the_nan_message_and_run_json_failed(stage1, tmp_path, head_only,
                                                                     lr):
    """--lr 1e6 ended in a traceback 'confidence must be finite' (the last finite loss's update
    made the weights non-finite, seen first by the validation), run.json left `running`."""
    data, cache = stage1
    out = tmp_path / "r"
    extra = ("--lr", lr, "--val-fraction", 0.25)
    args = head_only_args(data, cache, out, *extra) if head_only else \
        train_args(data, cache, out, "--batch-size", 4, *extra)
    result = run_cli(args, expect=None)
    assert_error(result, r"the loss became (nan|inf|-inf) at step \d+ of \d+; training stopped "
                         r"and .*Lower --lr")
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "failed" and "the loss became" in run["error"]


def test_an_unreachable_hub_fails_in_seconds_and_names_weights(stage1, tmp_path):
    """--head-only (or any pretrained build) without a reachable hub retried for about a minute.
    This machine has no network: the real hub lookup runs."""
    import time

    data, cache = stage1
    out = tmp_path / "r"
    args = [a for a in head_only_args(data, cache, out) if a != "--random-init"]
    start = time.perf_counter()
    result = run_cli(args, expect=None)
    assert time.perf_counter() - start < 15, "the hub was retried"
    assert_error(result, r"could not fetch pretrained weights for .*not in the local cache and .* "
                         r"cannot be reached.*Pass --weights FILE")
    assert not out.exists()                     # a failed start leaves no run folder


def test_any_error_after_the_claim_marks_the_run_failed(stage1, tmp_path):
    """A run that stops on an error after its directory was claimed (here: the checkpoint it
    resumes from was damaged) must not stay `running`, as if it still trained.  (An image damaged
    after extract is now refused before the claim, by the cache's image stamps.)"""
    data, cache = stage1
    out = tmp_path / "r"
    run_cli(train_args(data, cache, out, "--batch-size", 4, "--stop-at-step", 2))
    last = out / "checkpoints" / "last.pt"
    last.write_bytes(last.read_bytes()[:100])
    result = run_cli(train_args(data, cache, out, "--batch-size", 4), expect=None)
    assert_error(result, r"last\.pt")
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "failed" and "last.pt" in run["error"]
