"""The gradient magnitude of the paper's appendix (mean ||dl/dx_out||, x_out = the backbone's pooled
output), logged from the training step without a second backward: it equals a direct autograd
computation on a fixed batch, for both heads, with accumulation, and unscaled from a GradScaler."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from conftest import TINY_VIT
from oracle_fixtures import run_cli, train_args
from pipeline.core import dist
from pipeline.core.models import ModelSpec
from pipeline.data.images import GpuNormalize
from pipeline.core.losses import Loss, get
from pipeline.oracle.nets.losses import broadcast_coefficients, per_sample_loss
from pipeline.oracle.nets.model import build_oracle
from pipeline.oracle.settings.sampler import StepSchedule, micro_slices
from pipeline.oracle.finetune.step import TargetTable, TrainObjects, train_step

LOSSES = {"ce": get("ce")(), "ss": get("ss")({"alpha_pos": 1.0, "alpha_neg": 3.0}),
          "ce_broadcast": get("ce")(broadcast=True)}


def objects(head: str, loss: Loss, scaler: torch.amp.GradScaler):
    spec = ModelSpec(TINY_VIT[0], dict(TINY_VIT[1]), None, True, None)
    model, data_cfg = build_oracle(spec, head, "model", seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=10, pct_start=0.3)
    return TrainObjects(model, model, None, opt, sched, scaler,
                        GpuNormalize(data_cfg, torch.device("cpu"), channels_last=False), loss,
                        "fp32", torch.device("cpu"), dist.DistInfo(), 0.0), data_cfg


@pytest.mark.parametrize("head,loss,accum,scaled", [
    ("linear", "ce", 1, False), ("hyperplane", "ss", 2, False), ("linear", "ce_broadcast", 1, False),
    ("hyperplane", "ss", 1, True)])
def test_logged_norm_equals_direct_autograd_on_a_fixed_batch(head, loss, accum, scaled):
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, enabled=scaled)
    objs, data_cfg = objects(head, LOSSES[loss], scaler)
    before = copy.deepcopy(objs.model)
    batch = 6
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (batch, *data_cfg.input_size), dtype=torch.uint8, generator=g)
    rows = np.arange(batch)
    rng = np.random.default_rng(1)
    targets = TargetTable.from_arrays({
        "correct": (rng.random(batch) > 0.4).astype(np.float32),
        "correct_flip": (rng.random(batch) > 0.4).astype(np.float32),
        "p_true": rng.random(batch).astype(np.float32),
        "p_true_flip": rng.random(batch).astype(np.float32)})
    schedule = StepSchedule(rows, batch, 1, 0, True)
    slices = micro_slices(batch, 1, 0, accum)
    order = schedule.batch_rows(0)                     # the step's rows, in schedule order
    images = images[torch.from_numpy(order)]
    feed = iter([(images[sl], torch.from_numpy(order[sl]), torch.ones(sl.stop - sl.start))
                 for sl in slices])
    _, _, grads = train_step(objs, feed, 0, schedule, slices, targets)
    logged = (grads[0] / grads[1]).item()

    # direct: autograd of the step's loss (mean over the whole batch) w.r.t. the pooled features
    flips = torch.from_numpy(schedule.batch_flips(0))
    o, pt = targets.lookup(order, schedule.batch_flips(0))
    x = objs.normalize(images)
    x = torch.where(flips[:, None, None, None], x.flip(-1), x)
    before.train()
    torch.manual_seed(0)
    feats = before.backbone(x).float()
    coef = broadcast_coefficients(LOSSES[loss], o, batch) if LOSSES[loss].broadcast else None
    total = per_sample_loss(LOSSES[loss], before.head(feats), o, pt, coef).mean()
    (g_feats,) = torch.autograd.grad(total, feats)
    direct = g_feats.norm(dim=1).mean().item()
    assert grads[1].item() == batch
    assert logged == pytest.approx(direct, rel=1e-4)


def test_train_oracle_logs_grad_norm_and_both_stages_time_their_inference(tmp_path):
    from oracle_fixtures import extract, write_colour_tree

    data = write_colour_tree(tmp_path / "colours", {"train": 8, "val": 4})
    extract(data, tmp_path / "cache")
    out = tmp_path / "run"
    run_cli(train_args(data, tmp_path / "cache", out, "--lr", 0.05, "--epochs", 2,
                       "--log-every", 2, loss="ss"))
    entries = [json.loads(l) for l in (out / "log.jsonl").read_text().splitlines()]
    logged = [e for e in entries if "grad_norm" in e]
    assert logged and all(e["grad_norm"] > 0 for e in logged)
    run = json.loads((out / "run.json").read_text())
    g = run["grad_norm"]
    assert g["samples"] == run["schedule"]["total_steps"] * 8
    # windows are equally long here: the run mean is the mean of the window means
    assert g["mean"] == pytest.approx(np.mean([e["grad_norm"] for e in logged]), rel=1e-9)
    assert "x_out" in g["definition"]
    # inference time: the classifier's in the cache manifest, the oracle's beside its outputs
    clf = json.loads(next((tmp_path / "cache").rglob("val/manifest.json")).read_text())
    orc = json.loads((out / "outputs" / "val.timing.json").read_text())
    for t, views in ((clf["summary"]["inference"], 2), (orc, 1)):   # --flip-view: 2 per image
        assert t["model_ms_per_img"] > 0 and t["device"] == "cpu" and t["precision"] == "fp32"
        assert t["timed_images"] == 12 * views and t["batch_size"] > 0
