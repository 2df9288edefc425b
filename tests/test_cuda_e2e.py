"""The CUDA code paths end to end: extract (bf16, compile, both decoders), train-oracle (bf16 +
compile, fp16 + GradScaler), predict-free scoring, report; and, with two or more GPUs, NCCL DDP
under torchrun against one process.  Skipped where no GPU is present (CI); run on a GPU box with
``python -m pytest -q tests/test_cuda_e2e.py``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from cache.outputs import read_outputs
from cache.reader import ClassifierCache
from conftest import ROOT
from oracle_fixtures import CLASSIFIER, TINY_VIT_KWARGS, run_cli, step_losses, write_colour_tree

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
KW = json.dumps({**TINY_VIT_KWARGS, "num_classes": 3})
COLUMNS = ["index", "label", "valid", "logits", "pred", "correct", "p_true", "p_max",
           "logits_flip", "correct_flip", "p_true_flip"]


def _extract(data, out, *extra):
    return run_cli(["extract", "--classifier", CLASSIFIER, "--random-init", "--model-kwargs", KW,
                    "--data", data, "--out", out, "--split", "train", "--split", "val",
                    "--flip-view", "--device", "cuda", "--workers", 2, "--batch-size", 64,
                    "--shard-size", 100, "--no-progress", *extra])


def _train(data, cache, out, precision, *extra):
    return run_cli(["train-oracle", "--classifier", CLASSIFIER, "--oracle", CLASSIFIER,
                    "--random-init", "--model-kwargs", json.dumps(TINY_VIT_KWARGS), "--data", data,
                    "--cache", cache, "--out", out, "--loss", "ss", "--batch-size", 32,
                    "--epochs", 3, "--lr", 1e-2, "--momentum", 0.9, "--warmup-steps", 3,
                    "--device", "cuda", "--precision", precision, "--workers", 2,
                    "--log-every", 1, "--no-progress", *extra])


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return write_colour_tree(tmp_path_factory.mktemp("cuda") / "data", {"train": 120, "val": 40})


def test_extract_on_cuda_matches_fp32_and_decoders_agree(tree, tmp_path):
    _extract(tree, tmp_path / "ref", "--precision", "fp32")
    _extract(tree, tmp_path / "bf16", "--precision", "bf16", "--compile")
    _extract(tree, tmp_path / "gpu", "--precision", "bf16", "--decode", "gpu")
    ref, bf16, gpu = (ClassifierCache.open(tmp_path / d / CLASSIFIER / "val").load(COLUMNS)
                      for d in ("ref", "bf16", "gpu"))
    np.testing.assert_array_equal(ref["index"], np.arange(120))
    for other in (bf16, gpu):
        np.testing.assert_array_equal(other["label"], ref["label"])
        assert other["valid"].all()
        diff = np.abs(other["logits"].astype(np.float32) - ref["logits"].astype(np.float32))
        assert np.isfinite(other["logits"].astype(np.float32)).all()
        assert diff.max() < 0.1, diff.max()             # bf16 / decoder rounding, not other rows
        assert (other["pred"] == ref["pred"]).mean() > 0.9


@pytest.mark.parametrize("precision,extra", [("bf16", ("--compile",)), ("fp16", ())])
def test_train_oracle_on_cuda(tree, tmp_path, precision, extra):
    cache = tmp_path / "cache"
    _extract(tree, cache, "--precision", "bf16")
    run_dir = tmp_path / f"run-{precision}"
    _train(tree, cache, run_dir, precision, *extra)
    losses = step_losses(run_dir)
    assert len(losses) >= 9 and all(np.isfinite(list(losses.values())))
    first, last = np.mean(list(losses.values())[:3]), np.mean(list(losses.values())[-3:])
    assert last < first, (first, last)                   # colour-coded correctness is learnable
    cached = ClassifierCache.open(cache / CLASSIFIER / "val")
    out = read_outputs(run_dir / "outputs" / "val.h5")
    np.testing.assert_array_equal(out.columns["index"], np.arange(cached.num_rows))
    np.testing.assert_array_equal(out.columns["correct"], cached.load(["correct"])["correct"])
    assert np.isfinite(out.columns["z"]).all()
    run_cli(["report", str(run_dir), "--out", tmp_path / "report", "--no-figures", "--jobs", 1])
    assert (tmp_path / "report" / "report.json").exists()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_torchrun_nccl_matches_one_process(tree, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "2"}

    def torchrun(*args):
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               "--nproc-per-node", "2", str(ROOT / "cli.py"), *map(str, args)],
                              env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-4000:]

    _extract(tree, tmp_path / "one", "--precision", "fp32")
    torchrun("extract", "--classifier", CLASSIFIER, "--random-init", "--model-kwargs", KW,
             "--data", tree, "--out", tmp_path / "two", "--split", "train", "--split", "val",
             "--flip-view", "--workers", 2, "--batch-size", 64, "--shard-size", 100,
             "--precision", "fp32", "--no-progress")
    a = ClassifierCache.open(tmp_path / "one" / CLASSIFIER / "train")
    b = ClassifierCache.open(tmp_path / "two" / CLASSIFIER / "train")
    assert b.manifest["info"]["world_size"] == 2 and b.manifest["summary"]["computed_rows"] == 360
    ca, cb = a.load(COLUMNS), b.load(COLUMNS)
    for name in ("index", "label", "pred", "correct"):
        np.testing.assert_array_equal(ca[name], cb[name], err_msg=name)
    np.testing.assert_allclose(ca["p_true"], cb["p_true"], atol=1e-4)

    common = ["--classifier", CLASSIFIER, "--oracle", CLASSIFIER, "--random-init",
              "--model-kwargs", json.dumps(TINY_VIT_KWARGS), "--data", tree, "--cache",
              tmp_path / "one", "--loss", "ce", "--batch-size", 32, "--lr", 1e-2,
              "--warmup-steps", 3, "--precision", "fp32", "--workers", 2, "--log-every", 1,
              "--no-progress", "--epochs", 1]
    # eager like the two DDP processes (which cannot be captured): only the process count differs
    run_cli(["train-oracle", *common, "--device", "cuda", "--cuda-graph", "off", "--out",
             tmp_path / "r1"])
    torchrun("train-oracle", *common, "--out", tmp_path / "r2")
    l1, l2 = step_losses(tmp_path / "r1"), step_losses(tmp_path / "r2")
    assert l1.keys() == l2.keys()
    np.testing.assert_allclose(list(l2.values()), list(l1.values()), rtol=2e-3, atol=1e-4)
