"""The captured training step's pieces that run anywhere (pipeline/oracle/finetune/graph.py): its
SGD update (``loop.capture.sgd_step``, the one both graphed steps run, on the optimizer's
zero-started buffers) equals torch.optim.SGD's under OneCycleLR (momentum cycling and weight decay
included), the choice of step path, and the refusals of ``--cuda-graph on``.  The capture itself is
tested on a GPU (tests/test_graph_cuda.py)."""
from __future__ import annotations

import json

import pytest
import torch

from oracle_fixtures import extract, run_cli, train_args, write_colour_tree
from pipeline.oracle.loop.capture import sgd_step


@pytest.mark.parametrize("weight_decay,cycle,foreach", [(0.0, False, True), (0.05, True, True),
                                                         (0.05, True, False)])
def test_sgd_update_on_device_scalars_equals_torch_sgd(weight_decay, cycle, foreach):
    g = torch.Generator().manual_seed(0)
    shapes = [(7, 5), (5,), (3, 2, 4)]
    ref = [torch.randn(s, generator=g) for s in shapes]
    ours = [p.clone() for p in ref]
    opt = torch.optim.SGD([torch.nn.Parameter(p) for p in ref], lr=0.1, momentum=0.9,
                          weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=12, pct_start=0.3,
                                                cycle_momentum=cycle)
    bufs = [torch.zeros_like(p) for p in ours]           # zeros: torch's first step exactly
    neg_lr, mom = torch.zeros(()), torch.zeros(())
    for _ in range(10):
        grads = [torch.randn(s, generator=g) for s in shapes]
        for p, gr in zip(opt.param_groups[0]["params"], grads):
            p.grad = gr.clone()
        group = opt.param_groups[0]
        neg_lr.fill_(-group["lr"])
        mom.fill_(group["momentum"])
        opt.step()
        sgd_step(ours, grads, bufs, neg_lr, mom, weight_decay, foreach)
        sched.step()
    for p, q in zip(opt.param_groups[0]["params"], ours):
        torch.testing.assert_close(q, p.detach(), rtol=1e-6, atol=1e-7)
    for p, b in zip(opt.param_groups[0]["params"], bufs):
        torch.testing.assert_close(b, opt.state[p]["momentum_buffer"], rtol=1e-6, atol=1e-7)


@pytest.fixture(scope="module")
def stage1(tmp_path_factory):
    base = tmp_path_factory.mktemp("graph")
    data = write_colour_tree(base / "colours", {"train": 8, "val": 4})
    extract(data, base / "cache")
    return data, base / "cache"


def test_cpu_run_records_the_eager_path_and_on_is_refused(stage1, tmp_path):
    data, cache = stage1
    run_cli(train_args(data, cache, tmp_path / "auto", "--epochs", 2, "--device", "cpu"))
    step_path = json.loads((tmp_path / "auto" / "run.json").read_text())["step_path"]
    assert step_path["mode"] == "eager" and "cpu" in step_path["reason"]
    refused = run_cli(train_args(data, cache, tmp_path / "on", "--epochs", 2, "--device", "cpu",
                                 "--cuda-graph", "on"), expect=None)
    assert refused.exit_code != 0
    assert "--cuda-graph on" in refused.output and "cpu" in refused.output
    assert "Traceback" not in refused.output
    assert not (tmp_path / "on").exists()               # a refused start leaves nothing



def test_the_fused_update_falls_back_to_torchs_with_the_reason_where_triton_is_missing(
        monkeypatch):
    """capture.fused_sgd_step: without Triton (inductor's GPU backend), the foreach update and
    the line the graphed step prints; the fused one is compared with torch's on a GPU
    (tests/test_graph_cuda.py)."""
    import torch.utils._triton as triton_probe

    from pipeline.oracle.loop import capture

    monkeypatch.setattr(triton_probe, "has_triton", lambda: False)
    update, why = capture.fused_sgd_step()
    assert update is capture.sgd_step and "Triton" in why
