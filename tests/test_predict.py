"""``cli.py predict``: a finished run's oracle over a split, and the refusals around it."""
from __future__ import annotations

import json

import numpy as np
import pytest

from cache.outputs import read_outputs
from oracle_fixtures import extract, run_cli, train_args, trained_colour_run


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    base = tmp_path_factory.mktemp("predict")
    return trained_colour_run(base)


def test_predict_reproduces_the_run_outputs(trained):
    data, cache, run = trained
    result = run_cli(["predict", "--run", run, "--split", "val", "--name", "again",
                      "--workers", 0, "--precision", "fp32", "--no-progress"])
    assert "again.h5" in result.output
    first = read_outputs(run / "outputs" / "val.h5")
    again = read_outputs(run / "outputs" / "again.h5")
    assert np.array_equal(first.columns["z"], again.columns["z"])
    assert again.run == json.loads((run / "run.json").read_text())["run"]
    rerun = run_cli(["predict", "--run", run, "--split", "val", "--name", "again",
                     "--workers", 0, "--no-progress"])
    assert "already written" in rerun.output


def test_predict_refuses_a_cache_of_another_classifier(trained, tmp_path):
    data, _, run = trained
    extract(data, tmp_path / "cache", splits=("val",), seed=3, flip_view=False)
    result = run_cli(["predict", "--run", run, "--data", data, "--cache", tmp_path / "cache",
                      "--split", "val", "--name", "x", "--workers", 0, "--no-progress"], expect=1)
    assert "weights_sha256" in result.output
    assert not (run / "outputs" / "x.h5").exists()


def test_predict_refuses_an_unfinished_run(trained, tmp_path):
    data, cache, _ = trained
    out = tmp_path / "half"
    run_cli(train_args(data, cache, out, "--stop-at-step", 1, "--val-fraction", 0))
    result = run_cli(["predict", "--run", out, "--split", "val", "--no-progress"], expect=1)
    assert "not complete" in result.output


def test_outputs_of_another_run_are_not_overwritten(trained):
    data, cache, run = trained
    other = run.parent / "other"
    run_cli(train_args(data, cache, other, "--lr", 0.05, "--val-fraction", 0.25, "--seed", 1,
                      "--batch-size", 4))
    # copy the first run's output file into the second run under the same name
    (other / "outputs" / "val.h5").write_bytes((run / "outputs" / "val.h5").read_bytes())
    result = run_cli(["predict", "--run", other, "--split", "val", "--workers", 0,
                      "--no-progress"], expect=1)
    assert "holds other outputs" in result.output and "seed" in result.output


def test_predict_on_another_data_root_gets_its_own_file(trained, tmp_path):
    import shutil

    data, cache, run = trained
    elsewhere = shutil.copytree(data, tmp_path / "shifted")     # same listing, another root
    result = run_cli(["predict", "--run", run, "--data", elsewhere, "--cache", cache,
                      "--split", "val", "--workers", 0, "--precision", "fp32", "--no-progress"])
    assert "shifted_val.h5" in result.output
    assert np.array_equal(read_outputs(run / "outputs" / "shifted_val.h5").columns["z"],
                          read_outputs(run / "outputs" / "val.h5").columns["z"])


def test_predict_without_precision_reproduces_a_bf16_run_bit_for_bit(trained, tmp_path):
    """predict's default precision is the run's own (bf16 here), not the device's default (fp32
    on the CPU): its outputs of the run's own split equal train-oracle's, bit for bit."""
    data, cache, _ = trained
    run = tmp_path / "bf16"
    args = train_args(data, cache, run, "--lr", 0.05, "--val-fraction", 0.25, "--batch-size", 4)
    args[args.index("--precision") + 1] = "bf16"
    run_cli(args)
    run_cli(["predict", "--run", run, "--split", "val", "--name", "again", "--workers", 0,
             "--no-progress"])
    first = read_outputs(run / "outputs" / "val.h5").columns
    again = read_outputs(run / "outputs" / "again.h5").columns
    for column in ("z", "confidence"):
        assert first[column].tobytes() == again[column].tobytes(), column
