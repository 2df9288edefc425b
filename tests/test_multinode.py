"""Several nodes through torchrun's own multi-node launch (``--nnodes 2``, c10d rendezvous), on
the CPU with gloo: two torchrun agents on this host as two nodes of two processes each train as
one agent of four processes does; nodes launched with different settings refuse together; a node
whose partner never joins stops at the stated timeout; processes sharing a GPU are refused by
name (docs/IMAGENET.md, "On a cluster")."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cache.outputs import read_outputs
from oracle_fixtures import extract, step_losses, train_args, write_colour_tree

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


@pytest.fixture(scope="module")
def stage1(tmp_path_factory):
    base = tmp_path_factory.mktemp("nodes")
    data = write_colour_tree(base / "colours", {"train": 16, "val": 8})
    extract(data, base / "cache")
    return data, base / "cache"


def two_nodes(args: list, port: int, extra: tuple = (), second: list | None = None,
              timeout: int = 300) -> list[subprocess.CompletedProcess]:
    """The same command on two torchrun agents of two processes each (``second``: node 1's
    command, where it differs), meeting at one c10d rendezvous on this host."""
    launch = [*TORCHRUN, "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"job{port}",
              "--rdzv-conf", "join_timeout=120", *extra]
    procs = [subprocess.Popen([*launch, "--node-rank", str(node), "cli.py",
                               *map(str, second if node and second else args)],
                              cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for node in (0, 1)]
    return [subprocess.CompletedProcess(p.args, p.wait(timeout), p.communicate()[0], "")
            for p in procs]


def test_two_nodes_of_two_processes_train_as_one_node_of_four(stage1, tmp_path):
    data, cache = stage1
    common = ("--lr", 0.05, "--epochs", 2, "--val-fraction", 0.25, "--device", "cpu")
    one = subprocess.run([*TORCHRUN, "--standalone", "--nproc-per-node", "4", "cli.py",
                          *map(str, train_args(data, cache, tmp_path / "one", *common))],
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stdout + one.stderr
    nodes = two_nodes(train_args(data, cache, tmp_path / "two", *common), 29561)
    assert all(n.returncode == 0 for n in nodes), [n.stdout for n in nodes]
    run = json.loads((tmp_path / "two" / "run.json").read_text())
    assert run["status"] == "complete" and run["schedule"]["world_size"] == 4
    assert run["schedule"]["micro_batch"] == 2           # the global batch of 8, over 4 ranks
    a, b = step_losses(tmp_path / "one"), step_losses(tmp_path / "two")
    assert a.keys() == b.keys() and max(abs(a[k] - b[k]) for k in a) < 1e-5
    za = read_outputs(tmp_path / "one" / "outputs" / "val.h5").columns["z"]
    zb = read_outputs(tmp_path / "two" / "outputs" / "val.h5").columns["z"]
    assert np.allclose(za, zb, atol=1e-4)
    # global rank 0 alone writes: one log line per step, the lock released
    lines = [json.loads(l) for l in (tmp_path / "two" / "log.jsonl").read_text().splitlines()]
    steps = [e["step"] for e in lines if "loss" in e]
    assert len(steps) == len(set(steps)) and not (tmp_path / "two" / ".lock").exists()


def test_nodes_launched_with_different_settings_refuse_together(stage1, tmp_path):
    data, cache = stage1
    common = ("--epochs", 1, "--val-fraction", 0.25, "--device", "cpu")
    nodes = two_nodes(train_args(data, cache, tmp_path / "run", "--lr", 0.05, *common), 29563,
                      second=train_args(data, cache, tmp_path / "run", "--lr", 0.01, *common))
    assert all(n.returncode != 0 for n in nodes)
    said = "".join(n.stdout for n in nodes)
    assert said.count("error: the processes were launched with different train-oracle "
                      "settings") == 1, said
    assert re.search(r"  lr: (0\.05|0\.01) on rank\(s\) \d, \d; (0\.01|0\.05) on rank", said), said
    assert "Start every node with the same command" in said
    assert "terminate called" not in said
    assert not (tmp_path / "run").exists()               # refused before the run was claimed


def test_a_node_whose_partner_never_joins_stops_at_the_join_timeout(tmp_path):
    """torchrun's own rendezvous bound (docs: --rdzv-conf join_timeout=S): one node of two
    waits S seconds, then stops with torchrun's RendezvousTimeoutError; nothing of ours ran."""
    started = time.monotonic()
    alone = subprocess.run([*TORCHRUN, "--nnodes", "2", "--nproc-per-node", "1",
                            "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29565",
                            "--rdzv-id", "alone", "--rdzv-conf", "join_timeout=5",
                            "cli.py", "report", "--out", str(tmp_path / "never")],
                           cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert alone.returncode != 0 and time.monotonic() - started < 60
    assert "RendezvousTimeoutError" in alone.stdout + alone.stderr
    assert not (tmp_path / "never").exists()


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a GPU")
def test_two_processes_on_one_gpu_are_refused_by_rank(stage1, tmp_path):
    """Two "nodes" started by hand on one host, LOCAL_RANK 0 each: both would take cuda:0.
    Refused together naming the ranks and the GPU, never NCCL's duplicate-GPU traceback."""
    data, cache = stage1
    env = {**ENV, "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29567", "LOCAL_RANK": "0"}
    procs = [subprocess.Popen([sys.executable, "cli.py", *map(str, train_args(
        data, cache, tmp_path / "run", "--device", "cuda", "--precision", "bf16"))],
        cwd=ROOT, env={**env, "RANK": str(rank)}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    said = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 1 for p in procs), said
    assert "ranks 0, 1 share one GPU (cuda:0 of host" in said[0], said[0]
    assert "Duplicate GPU" not in said[0] + said[1] and "Traceback" not in said[0]
    assert "error:" not in said[1]
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a GPU")
def test_a_local_rank_past_the_nodes_gpus_is_refused_naming_the_count(stage1, tmp_path):
    import torch

    data, cache = stage1
    n = torch.cuda.device_count()
    env = {**ENV, "WORLD_SIZE": str(n + 1), "RANK": str(n), "LOCAL_RANK": str(n),
           "LOCAL_WORLD_SIZE": str(n + 1), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29569"}
    proc = subprocess.run([sys.executable, "cli.py", *map(str, train_args(
        data, cache, tmp_path / "run", "--device", "cuda"))], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"this node has {n} GPU(s), so local rank {n} has none. Launch at most {n} " \
           "process(es) on this node" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_extract_on_nodes_launched_differently_refuses_together(tmp_path):
    """Two processes as two nodes' single ranks (torchrun's environment set by hand), extract
    with different --batch-size: both stop, one message naming the setting, no cache claimed."""
    data = write_colour_tree(tmp_path / "colours", {"val": 4})
    env = {**ENV, "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29571", "LOCAL_RANK": "0"}
    kwargs = json.dumps({"img_size": 32, "patch_size": 8, "depth": 1, "embed_dim": 16,
                         "num_heads": 2, "num_classes": 3})
    procs = [subprocess.Popen(
        [sys.executable, "cli.py", "extract", "--classifier", "vit_tiny_patch16_224",
         "--random-init", "--model-kwargs", kwargs, "--data", str(data), "--split", "val",
         "--out", str(tmp_path / "cache"), "--device", "cpu", "--workers", "0",
         "--batch-size", str(batch), "--no-progress"],
        cwd=ROOT, env={**env, "RANK": str(rank)}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True) for rank, batch in enumerate((4, 8))]
    said = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 1 for p in procs), said
    assert "error: the processes were launched with different extract settings:\n  " \
           "batch_size: 4 on rank(s) 0; 8 on rank(s) 1" in said[0], said[0]
    assert "error:" not in said[1] and "Traceback" not in said[0] + said[1]
    assert not (tmp_path / "cache").exists()
