"""Head-only runs finish as fine-tuned ones do (one training stack): a full disk gives the one
clear message and a resumable run, the outputs' digests are recorded and checked by `report`, a
failed start leaves no folder, and the features loaded for a run leave memory with it."""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import warnings

import h5py
import pytest

from conftest import ROOT
from oracle_fixtures import CLASSIFIER, TINY_VIT_KWARGS, extract, run_cli, write_colour_tree
from test_disk_full import assert_clean_failure, file_size_limit, temporaries

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("headcore")
    data = write_colour_tree(root / "data", {"train": 40, "val": 12})
    extract(data, root / "cache", extra=("--features",))
    return root, data


def head_args(root, data, out, *extra) -> list[str]:
    return [str(a) for a in [
        "train-oracle", "--classifier", CLASSIFIER, "--oracle", CLASSIFIER, "--random-init",
        "--model-kwargs", json.dumps({**TINY_VIT_KWARGS, "num_classes": 3}), "--data", data,
        "--cache", root / "cache", "--loss", "ss", "--batch-size", 8, "--log-every", 1,
        "--no-progress", "--head-only", "--out", out, "--epochs", 1, *extra]]


def test_a_full_disk_fails_cleanly_and_the_same_command_finishes(tree, tmp_path):
    from cache.integrity import file_digest

    root, data = tree
    probe = tmp_path / "probe"
    run_cli(head_args(root, data, probe))
    out_size = (probe / "outputs" / "val.h5").stat().st_size
    json_size = (probe / "run.json").stat().st_size
    assert json_size + 1500 < out_size - 200      # run.json (and its error) fit, outputs not
    run = tmp_path / "run"
    args = head_args(root, data, run)
    proc = subprocess.run([sys.executable, str(ROOT / "cli.py"), *args], capture_output=True,
                          text=True, env=ENV, timeout=300,
                          preexec_fn=file_size_limit(out_size - 200))
    assert_clean_failure(proc, r"error: disk full while writing \S*outputs/val.h5: free space, "
                               r"then re-run the same command; .*\(file size limit reached\)")
    record = json.loads((run / "run.json").read_text())
    assert record["status"] == "failed" and "disk full" in record["error"]
    assert not temporaries(run)
    run_cli(args)
    record = json.loads((run / "run.json").read_text())
    assert record["status"] == "complete"
    assert record["output_files"] == {"val": file_digest(run / "outputs" / "val.h5")}


def test_report_checks_head_only_outputs_against_their_digests(tree, tmp_path):
    root, data = tree
    run = tmp_path / "run"
    run_cli(head_args(root, data, run))
    output = run / "outputs" / "val.h5"
    with h5py.File(output, "r") as fh:
        offset = fh["z"].id.get_offset()
    data_bytes = bytearray(output.read_bytes())
    data_bytes[offset + 1] ^= 0x01                 # z changed, its column hash fixed up nowhere
    output.write_bytes(bytes(data_bytes))
    res = run_cli(["report", run, "--out", tmp_path / "rep", "--no-figures", "--no-ci",
                   "--format", "json", "--jobs", 1], expect=1)
    assert "is damaged" in res.output and "val.h5" in res.output
    # the same train-oracle command recomputes it from the kept head
    again = run_cli(head_args(root, data, run))
    assert "outputs already written" not in again.output
    run_cli(["report", run, "--out", tmp_path / "rep", "--no-figures", "--no-ci",
             "--format", "json", "--jobs", 1])


def test_a_failed_start_leaves_no_run_folder(tree, tmp_path):
    root, data = tree
    run = tmp_path / "run"
    res = run_cli(head_args(root, data, run, "--features-cache", tmp_path / "nothing"), expect=1)
    assert "feature cache" in res.output
    assert not run.exists()


def test_features_leave_memory_with_the_run_unless_a_memo_keeps_them(tree, tmp_path):
    from pipeline.oracle.settings.config import TrainConfig
    from pipeline.oracle.headonly.features import FeatureMemo, FeatureTable
    from pipeline.oracle.headonly.train import train_head_only

    root, data = tree
    cfg = TrainConfig(classifier=CLASSIFIER, oracle=CLASSIFIER, random_init=True,
                      model_kwargs={**TINY_VIT_KWARGS, "num_classes": 3}, data=str(data),
                      cache=str(root / "cache"), batch_size=8, head_only=True, progress=False,
                      runs_root=str(tmp_path / "runs"))
    def alive():
        with warnings.catch_warnings():     # isinstance on torch's deprecated module proxies
            warnings.simplefilter("ignore")
            return [o for o in gc.get_objects() if isinstance(o, FeatureTable)]

    gc.collect()
    before = len(alive())
    train_head_only([cfg])
    gc.collect()
    assert len(alive()) == before
    memo = FeatureMemo()
    train_head_only([cfg], memo)             # complete already: scores nothing, loads nothing
    from dataclasses import replace
    train_head_only([replace(cfg, seed=1)], memo)
    assert memo.tables and len(memo.tables) <= memo.limit
    memo.clear()
    gc.collect()
    assert len(alive()) == before
