"""The head-only step captured in one CUDA graph (pipeline/oracle/headonly/graph.py) against the
eager step: bit for bit (every log entry, counts, best step and score, best and final heads) for the
linear and the ConfidNet head, with flips, 2 epochs, momentum, weight decay and cycled momentum,
one step a replay and several;
the candidates for SGD's ``p -= lr b`` with the lr on the device, against torch's own update; the
CLI's step_path and identical outputs with --cuda-graph off.
Skipped without a GPU (CI); on a GPU box: ``python -m pytest -q tests/test_head_graph_cuda.py``."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from cache.outputs import read_outputs
from oracle_fixtures import CLASSIFIER, TINY_VIT_KWARGS, extract, run_cli, step_losses, \
    write_colour_tree
from pipeline.oracle.loop import capture
from test_head_only_step import (assert_close_runs, assert_identical, check_sgd_step,
                                 feature_table, run_bank)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = torch.device("cuda")


@pytest.mark.parametrize("loss,arch,per_replay", [
    ("ss", "linear", 1), ("tcp", "linear", 1), ("ss", "confidnet", 1), ("tcp", "confidnet", 1),
    ("ss", "linear", 4), ("tcp", "confidnet", 32)])
def test_the_graphed_step_equals_the_eager_step_bit_for_bit(loss, arch, per_replay):
    """One step a replay, and several (up to the loop's next sync and the epoch's end)."""
    table = feature_table(CUDA)
    eager = run_bank(table, loss, arch, "eager", epochs=2)
    graph = run_bank(table, loss, arch, "graph", epochs=2, per_replay=per_replay)
    assert_identical(eager, graph)
    losses = [e["loss"] for e in eager["logs"][0] if "loss" in e]
    assert losses[0] != losses[-1]


def test_the_compiled_graphed_step_trains_the_same_heads_up_to_rounding():
    """--compile on a GPU: the head's forward and the loss compiled inside the graph."""
    table = feature_table(CUDA)
    assert_close_runs(run_bank(table, "ss", "linear", "compiled graph", epochs=2),
                      run_bank(table, "ss", "linear", "eager", epochs=2))


def test_sgd_step_equals_torch_sgd_on_cuda():
    check_sgd_step(CUDA)


def test_lr_update_candidates_against_torchs_fused_update():
    """torch.optim.SGD's foreach update ends with ``p.add_(b, alpha=-lr)``; with -lr a 0-d device
    tensor each candidate of ``capture.LR_UPDATES`` is compared with it on random tensors.
    LR_UPDATE must match bit for bit; the mismatches of every candidate are printed (-s)."""
    g = torch.Generator().manual_seed(0)
    bad = dict.fromkeys(capture.LR_UPDATES, 0)
    for trial in range(200):
        shape = [(3, 768), (100,), (1, 400, 400), (5, 37)][trial % 4]
        p = torch.randn(shape, generator=g).to(CUDA)
        b = (torch.randn(shape, generator=g) * 10.0 ** (trial % 7 - 3)).to(CUDA)
        lr = float(torch.rand((), generator=g)) * 10.0 ** -(trial % 5)
        ref = p.clone()
        torch._foreach_add_([ref], [b], alpha=-lr)
        neg_lr = torch.tensor(-lr, dtype=torch.float32, device=CUDA)
        for name, update in capture.LR_UPDATES.items():
            ours = p.clone()
            update(ours, b, neg_lr)
            bad[name] += int(not torch.equal(ours, ref))
    print(f"\nlr update candidates, trials (of 200) not bit-identical to torch's: {bad}")
    assert bad[capture.LR_UPDATE] == 0, bad


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("headgraph")
    data = write_colour_tree(root / "data", {"train": 40, "val": 12})
    extract(data, root / "cache", extra=("--features",))
    return root, data


@pytest.mark.parametrize("arch", ["linear", "confidnet"])
def test_the_cli_records_the_graph_and_off_gives_the_same_run(tree, tmp_path, arch):
    root, data = tree
    runs = {}
    for mode in ("auto", "off"):
        out = tmp_path / mode
        kwargs = json.dumps({**TINY_VIT_KWARGS, "num_classes": 3})
        run_cli(["train-oracle", "--classifier", CLASSIFIER, "--oracle", CLASSIFIER,
                 "--random-init", "--model-kwargs", kwargs,
                 "--data", data, "--cache", root / "cache", "--loss", "ss", "--batch-size", 8,
                 "--log-every", 3, "--no-progress", "--head-only", "--epochs", 2, "--lr", 0.05,
                 "--momentum", 0.9, "--head-arch", arch, "--device", "cuda", "--cuda-graph", mode,
                 "--out", out])
        doc = json.loads((out / "run.json").read_text())
        runs[mode] = (doc, step_losses(out), read_outputs(out / "outputs" / "val.h5").columns["z"])
    assert runs["auto"][0]["step_path"] == {"mode": "cuda_graph", "requested": "auto"}
    assert runs["off"][0]["step_path"] == {"mode": "eager", "requested": "off"}
    assert runs["auto"][0]["best"] == runs["off"][0]["best"]
    assert runs["auto"][1] == runs["off"][1]
    assert np.array_equal(runs["auto"][2], runs["off"][2])
