"""`torchrun --nproc-per-node 2` (gloo, CPU) writes the same cache as one process: rows split
across ranks by shard, no padding, no duplicated rows."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from cache.reader import ClassifierCache
from cli import cli
from conftest import ROOT, TINY_VIT, make_imagenet_tree
from pipeline.data.labels import imagenet_synsets

COLUMNS = ["index", "label", "valid", "logits", "pred", "correct", "p_true", "p_max",
           "logits_flip", "pred_flip", "correct_flip", "p_true_flip", "p_max_flip"]
MC = ["mcd_msp", "mcd_entropy", "mcd_mi"]


@pytest.mark.slow  # ~20 s each: three interpreters import torch + timm on 2 cores
@pytest.mark.parametrize("mc", [[], ["--mc-dropout", "3", "--mc-dropout-rate", "0.3"]],
                         ids=["plain", "mc-dropout"])   # MC-Dropout's masks: seeded per batch
def test_torchrun_two_processes_equal_one(tmp_path, mc):
    tree = make_imagenet_tree(tmp_path / "inet", list(imagenet_synsets()[:4]), per_class=5,
                              splits=("val",))  # 20 rows -> shards of 6, 6, 6, 2
    args = ["extract", "--classifier", TINY_VIT[0], "--model-kwargs", json.dumps(TINY_VIT[1]),
            "--random-init", "--data", str(tree), "--split", "val", "--device", "cpu",
            "--precision", "fp32", "--workers", "1", "--batch-size", "4", "--shard-size", "6",
            "--flip-view", "--no-progress", *mc]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as torchrun's OMP_NUM_THREADS=1 per process: the same kernels
    try:
        one = CliRunner().invoke(cli, [*args, "--out", str(tmp_path / "one")])
    finally:
        torch.set_num_threads(threads)
    assert one.exit_code == 0, one.output
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", str(ROOT / "cli.py"), *args,
                          "--out", str(tmp_path / "two")],
                         env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert two.returncode == 0, two.stderr
    assert two.stdout.count("[val] 20 rows") == 1  # one summary, from rank 0
    a = ClassifierCache.open(tmp_path / "one" / TINY_VIT[0] / "val")
    b = ClassifierCache.open(tmp_path / "two" / TINY_VIT[0] / "val")
    assert a.manifest["info"]["world_size"] == 1 and b.manifest["info"]["world_size"] == 2
    assert a.identity == b.identity and a.manifest["shards"] == b.manifest["shards"]
    assert b.manifest["summary"]["computed_rows"] == 20  # every row once, none padded
    # the steady throughput counts both ranks' rows after their first batch of 4 (rank 0's
    # alone would be 12 - 4 = 8: a per-process rate labelled as the command's)
    assert a.manifest["summary"]["steady_rows"] == 16
    assert b.manifest["summary"]["steady_rows"] == 20 - 4 - 4
    columns = COLUMNS + (MC if mc else [])
    ca, cb = a.load(columns), b.load(columns)
    np.testing.assert_array_equal(cb["index"], np.arange(20))
    for name in columns:
        np.testing.assert_array_equal(ca[name], cb[name], err_msg=name)
