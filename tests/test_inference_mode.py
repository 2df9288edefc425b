"""Scoring is one path: every loader hands out a model ready to score (eval mode, frozen), so an
oracle with BatchNorm gives an image the same confidence whatever shares its batch, equal to what
train-oracle wrote for that image, from the command line and from Python, and scoring leaves the
model's buffers as they were."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from cache.runs import RunDir
from cache.outputs import output_paths, read_outputs
from oracle_fixtures import CLASSIFIER, extract, run_cli, write_colour_tree

# on the CPU wherever the tests run: the numbers compared here are computed by several commands
FAST = ("--workers", 0, "--no-progress", "--device", "cpu")
BN_ORACLE = "resnet10t"           # BatchNorm throughout; random init is enough to see the mode


@pytest.fixture(scope="module")
def bn_run(tmp_path_factory):
    """A fine-tuned resnet10t oracle (BatchNorm) of the tiny ViT classifier: (data, run)."""
    base = tmp_path_factory.mktemp("bn")
    data = write_colour_tree(base / "colours", {"train": 8, "val": 4})
    extract(data, base / "cache", flip_view=False)
    run = base / "run"
    run_cli(["train-oracle", "--classifier", CLASSIFIER, "--oracle", BN_ORACLE, "--random-init",
             "--model-kwargs", json.dumps({"num_classes": 3}), "--preprocess", "paper",
             "--data", data, "--cache", base / "cache", "--loss", "ce", "--batch-size", 4,
             "--epochs", 1, "--lr", 0.05, "--val-fraction", 0.25, "--precision", "fp32",
             "--out", run, *FAST])
    return data, run


def confidences(table) -> dict[str, float]:
    with open(table, newline="") as fh:
        return {r["path"]: float(r["confidence"]) for r in csv.DictReader(fh)}


def written(run) -> dict[str, float]:
    """train-oracle's confidence of each val image, by its path."""
    out = read_outputs(run / "outputs" / "val.h5")
    return dict(zip(output_paths(out), out.columns["confidence"].astype(float)))


def test_predict_images_scores_each_image_alone_as_train_oracle_did(bn_run, tmp_path):
    data, run = bn_run
    tables = {}
    for batch in (1, 64):
        tables[batch] = tmp_path / f"b{batch}.csv"
        run_cli(["predict", "--run", run, "--images", data / "val", "--batch-size", batch,
                 "--precision", "fp32", "--out", tables[batch], *FAST])
    one, many, ref = confidences(tables[1]), confidences(tables[64]), written(run)
    assert sorted(one) == sorted(many) == sorted(ref) and len(ref) == 12
    spread = np.ptp([ref[p] for p in ref])
    assert spread > 1e-4, "a constant oracle could not show a batch effect"
    for path in ref:
        assert one[path] == pytest.approx(many[path], abs=1e-6)
        assert one[path] == pytest.approx(ref[path], abs=1e-6)


def test_the_python_loader_gives_a_model_ready_to_score(bn_run):
    from pipeline.core.models import DataConfig
    from pipeline.data.images import GpuNormalize, ResizeCrop, decode_file
    from pipeline.oracle.nets.model import load_trained_oracle

    _, run = bn_run
    oracle, data_cfg, _ = load_trained_oracle(run, RunDir(run).record())
    assert not oracle.training and not any(p.requires_grad for p in oracle.parameters())
    before = {k: v.clone() for k, v in oracle.state_dict().items()}
    ref = written(run)
    paths = sorted(ref)
    norm = GpuNormalize(data_cfg, torch.device("cpu"))
    x = norm(torch.stack([ResizeCrop(data_cfg)(decode_file(p)) for p in paths]))
    z_all = oracle(x)                          # as the module's docstring shows: no context
    z_one = torch.cat([oracle(x[i:i + 1]) for i in range(len(paths))])
    assert not z_all.requires_grad
    np.testing.assert_allclose(z_one.numpy(), z_all.numpy(), atol=1e-6)
    np.testing.assert_allclose(torch.sigmoid(z_all).numpy(), [ref[p] for p in paths], atol=1e-6)
    after = oracle.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "scoring moved BatchNorm stats"
    assert isinstance(DataConfig.from_dict(data_cfg.to_dict()), DataConfig)


def test_build_model_is_ready_to_score_unless_asked_for_training():
    from pipeline.core.inference import scoring
    from pipeline.core.models import ModelSpec, build_model

    spec = ModelSpec(BN_ORACLE, {"num_classes": 3}, None, True, None)
    frozen = build_model(spec, seed=0)
    assert not frozen.training and not any(p.requires_grad for p in frozen.parameters())
    trainable = build_model(spec, seed=0, train=True)
    assert trainable.training and all(p.requires_grad for p in trainable.parameters())
    with scoring(trainable) as model:          # validation in the middle of training
        assert not model.training and torch.is_inference_mode_enabled()
    assert trainable.training
