"""`cli.py attack` on the GPU (bf16 autocast): the attack lowers the classifier's accuracy and
`extract` on the GPU reproduces the outputs it logged from the stored PNGs.  Skipped where no GPU
is present (CI); run on a GPU box with ``python -m pytest -q tests/test_attack_cuda.py``."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from cache.reader import ClassifierCache
from oracle_fixtures import CLASSIFIER, TINY_VIT_KWARGS, run_cli, write_colour_tree

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
KW = json.dumps({**TINY_VIT_KWARGS, "num_classes": 3})


def test_attack_on_cuda_and_extract_reproduces_it(tmp_path):
    from pipeline.data.sources import list_split

    tree = write_colour_tree(tmp_path / "data", {"val": 40})
    common = ["--classifier", CLASSIFIER, "--random-init", "--model-kwargs", KW, "--device",
              "cuda", "--batch-size", 64, "--no-progress"]
    run_cli(["attack", *common, "--data", tree, "--split", "val", "--out", tmp_path / "adv",
             "--name", "val-adv", "--eps", "16/255", "--step-size", "4/255", "--workers", 2])
    split_dir = tmp_path / "adv" / "val-adv"
    doc = json.loads((split_dir / ".attack" / "manifest.json").read_text())
    s = doc["summary"]
    assert s["rows"] == 120 and doc["identity"]["precision"] == "bf16"
    assert s["stored_accuracy"] < s["clean_accuracy"] or s["clean_accuracy"] == 0
    run_cli(["extract", *common, "--data", tmp_path / "adv", "--split", "val-adv", "--out",
             tmp_path / "cache", "--workers", 2])
    cache = ClassifierCache.open(tmp_path / "cache" / CLASSIFIER / "val-adv")
    cols = cache.load(["logits", "pred"])
    names = list_split(str(tmp_path / "adv"), "val-adv").names
    row = {n: i for i, n in enumerate(names)}
    files, logits, pred = [], [], []
    for path in sorted((split_dir / ".attack").glob("shard-*.npz")):
        with np.load(path) as z:
            files += z["files"].tolist()
            logits.append(z["stored_logits"])
            pred.append(z["stored_pred"])
    order = np.array([row[f] for f in files])
    # bf16 on the GPU: kernels may differ with batch shapes; a borderline row may flip
    assert (cols["pred"][order] == np.concatenate(pred)).mean() >= 0.97
    np.testing.assert_allclose(cols["logits"][order].astype(np.float32), np.concatenate(logits),
                               atol=0.1, rtol=0.05)


def test_recoloradv_on_cuda_then_on_the_cpu_of_the_same_process(tmp_path):
    """The authors' package on the GPU (bf16 classifier, its colour map in fp32 on the current
    device), then `--device cpu` in the same process: its device flag follows each batch's
    device (left at True after the GPU run, the CPU run would put its grid on the GPU)."""
    pytest.importorskip("recoloradv", reason="the recoloradv extra is not installed: "
                        "pip install '.[recoloradv]'")
    tree = write_colour_tree(tmp_path / "data", {"val": 8})
    common = ["--classifier", CLASSIFIER, "--random-init", "--model-kwargs", KW, "--data", tree,
              "--split", "val", "--out", tmp_path / "adv", "--attack", "recoloradv", "--steps",
              "5", "--batch-size", "12", "--no-progress"]
    for device in ("cuda", "cpu"):
        run_cli(["attack", *common, "--device", device, "--name", f"val-{device}"])
        doc = json.loads((tmp_path / "adv" / f"val-{device}" / ".attack" / "manifest.json")
                         .read_text())
        assert doc["summary"]["rows"] == 24 and doc["identity"]["library"] == "recoloradv 0.0.1"
        assert doc["identity"]["precision"] == ("bf16" if device == "cuda" else "fp32")
