"""The training step captured in a CUDA graph (pipeline/oracle/finetune/graph.py) against the eager
step: the same losses and weights on fixed batches within bf16 tolerance (ViT with LayerNorm, ResNet
with BatchNorm; fp32 and bf16), exact resume across a captured step, and the refusals/fallbacks of
--cuda-graph.
Skipped without a GPU (CI); run on a GPU box with ``python -m pytest -q tests/test_graph_cuda.py``."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from cache.outputs import read_outputs
from oracle_fixtures import (CLASSIFIER, TINY_VIT_KWARGS, extract, run_cli, step_losses,
                             train_args, write_colour_tree)
from pipeline.core import dist
from pipeline.core.models import ModelSpec
from pipeline.core.precision import grad_scaler
from pipeline.data.images import GpuNormalize
from pipeline.oracle.finetune.graph import GraphedStep, choose_step
from pipeline.core.losses import Loss, get
from pipeline.oracle.nets.model import build_oracle
from pipeline.oracle.settings.sampler import StepSchedule, micro_slices
from pipeline.oracle.finetune.step import TargetTable, TrainObjects

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
MODELS = {"vit": (CLASSIFIER, TINY_VIT_KWARGS),
          "resnet": ("resnet10t", {"stem_width": 8, "channels": (8, 16, 32, 64)})}
BATCH, STEPS = 16, 6


def objects(model: str, precision: str, loss: Loss):
    name, kw = MODELS[model]
    spec = ModelSpec(name, dict(kw), None, True, {"input_size": (3, 32, 32), "interpolation": "bilinear",
                                                  "crop_pct": 1.0, "crop_mode": "center",
                                                  "mean": (0.5,) * 3, "std": (0.5,) * 3})
    dev = torch.device("cuda")
    net, data_cfg = build_oracle(spec, "hyperplane" if loss.name == "ss" else "linear", "model", 0)
    net = net.to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=STEPS,
                                                pct_start=0.3, cycle_momentum=True)
    return TrainObjects(net, net, None, opt, sched, grad_scaler(precision, dev),
                        GpuNormalize(data_cfg, dev), loss, precision, dev, dist.DistInfo(), 0.0)


def feed(schedule: StepSchedule, images: torch.Tensor):
    for step in range(STEPS):
        rows = schedule.batch_rows(step)
        yield images[torch.from_numpy(rows)].pin_memory(), torch.from_numpy(rows), None


@pytest.mark.parametrize("model,precision,loss", [
    ("vit", "fp32", get("ss")({"alpha_pos": 1.0, "alpha_neg": 3.0})),
    ("vit", "bf16", get("ce")(broadcast=True)),
    ("resnet", "fp32", get("focal")({"gamma": 2.0})),
    ("resnet", "bf16", get("ss")({"alpha_pos": 2.0, "alpha_neg": 5.0}))])
def test_graphed_step_matches_eager_on_fixed_batches(model, precision, loss):
    n = BATCH * 3
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g)
    rng = np.random.default_rng(0)
    targets = TargetTable.from_arrays({k: (rng.random(n) > 0.4).astype(np.float32)
                                       if "correct" in k else rng.random(n).astype(np.float32)
                                       for k in ("correct", "correct_flip", "p_true", "p_true_flip")})
    schedule = StepSchedule(np.arange(n), BATCH, 2, 0, True)
    slices = micro_slices(BATCH, 1, 0, 1)
    runs = {}
    for mode in ("eager", "graph"):
        objs = objects(model, precision, loss)
        step_fn, record = choose_step(objs, "off" if mode == "eager" else "on", 1)
        assert isinstance(step_fn, GraphedStep) == (mode == "graph")
        batches = feed(schedule, images)
        losses = [step_fn(objs, batches, s, schedule, slices, targets)[0].item()
                  for s in range(STEPS)]
        runs[mode] = (losses, [p.detach().float().cpu() for p in objs.model.parameters()],
                      [b.float().cpu() for b in objs.model.buffers()])
    (le, pe, be), (lg, pg, bg) = runs["eager"], runs["graph"]
    # bf16 tolerance for both precisions: the graph's SGD update rounds p - lr*b twice, and
    # cuDNN's fp32 convolutions (TF32, atomics in the weight gradients) vary in the last bits
    tol = dict(rtol=2e-2, atol=2e-3)
    np.testing.assert_allclose(lg, le, **tol)
    assert len(set(le)) > 1                              # the weights did move
    for a, b in zip(pg + bg, pe + be):                   # BatchNorm running stats too
        torch.testing.assert_close(a, b, **tol)


@pytest.fixture(scope="module")
def stage1(tmp_path_factory):
    base = tmp_path_factory.mktemp("graphcuda")
    data = write_colour_tree(base / "colours", {"train": 16, "val": 8})
    extract(data, base / "cache")
    return data, base / "cache"


@pytest.mark.parametrize("extra", [(), ("--compile",)], ids=["graph", "compiled+graph"])
def test_resume_across_a_captured_step_is_exact(stage1, tmp_path, extra):
    data, cache = stage1
    common = ("--lr", 0.05, "--epochs", 2, "--val-fraction", 0.25, "--val-every", 3,
              "--device", "cuda", "--precision", "bf16", "--cuda-graph", "on", *extra)
    run_cli(train_args(data, cache, tmp_path / "a", *common, loss="ss"))
    assert json.loads((tmp_path / "a" / "run.json").read_text())["step_path"]["mode"] == "cuda_graph"
    b = tmp_path / "b"
    run_cli(train_args(data, cache, b, *common, "--stop-at-step", 4, loss="ss"))
    resumed = run_cli(train_args(data, cache, b, *common, "--workers", 2, loss="ss"))
    assert "resumed at step 4" in resumed.output
    assert step_losses(b) == step_losses(tmp_path / "a")
    za = read_outputs(tmp_path / "a" / "outputs" / "val.h5").columns["z"]
    zb = read_outputs(b / "outputs" / "val.h5").columns["z"]
    assert np.array_equal(za, zb)


def test_impossible_capture_is_refused_when_asked_and_noted_in_auto(stage1, tmp_path):
    data, cache = stage1
    common = ("--epochs", 2, "--device", "cuda", "--accum-steps", 2)
    refused = run_cli(train_args(data, cache, tmp_path / "on", *common, "--cuda-graph", "on"),
                      expect=None)
    assert refused.exit_code != 0 and "--accum-steps" in refused.output
    assert "Traceback" not in refused.output and not (tmp_path / "on").exists()
    auto = run_cli(train_args(data, cache, tmp_path / "auto", *common))
    assert "not captured in a CUDA graph (--accum-steps > 1)" in auto.output
    step_path = json.loads((tmp_path / "auto" / "run.json").read_text())["step_path"]
    assert step_path == {"mode": "eager", "requested": "auto", "reason": "--accum-steps > 1"}


def test_the_fused_sgd_update_equals_torchs_up_to_one_rounding():
    """capture.fused_sgd_step (sgd_step compiled: one pass over the weights) against torch's
    foreach update (sgd_step itself), weight decay and momentum on, over three steps: the weights
    and momentum buffers agree to float32 rounding (a fused multiply-add rounds once where the
    foreach kernels round twice), and the graphed fine-tuned step records which update it ran."""
    from pipeline.oracle.loop.capture import fused_sgd_step, sgd_step

    fused, why = fused_sgd_step()
    assert why is None and fused is not sgd_step          # Triton is there on a GPU box
    g = torch.Generator().manual_seed(0)
    shapes = [(768, 3072), (3072,), (64, 3, 16, 16), (1,)]
    runs = {}
    for name, update in (("foreach", sgd_step), ("fused", fused)):
        params = [torch.randn(s, generator=g.manual_seed(1)).cuda() for s in shapes]
        bufs = [torch.full_like(p, -0.0) for p in params]
        for step in range(3):
            grads = [torch.randn(s, generator=g.manual_seed(10 + step)).cuda() for s in shapes]
            update(params, grads, bufs, torch.tensor(-0.05, device="cuda"),
                   torch.tensor(0.9, device="cuda"), 1e-4, True)
        runs[name] = params + bufs
    for a, b in zip(runs["fused"], runs["foreach"]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    objs = objects("vit", "bf16", get("ss")({"alpha_pos": 1.0, "alpha_neg": 3.0}))
    assert choose_step(objs, "on", 1)[1]["sgd_update"] == "fused"
