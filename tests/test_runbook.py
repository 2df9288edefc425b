"""docs/IMAGENET.md cannot rot: its ```bash blocks run as written, in order, in one shell, on a
generated ImageNet-layout tree (3 wnids, colour-coded classes), a generated ImageNet-C tree and
tiny models (tests/runbook_shim.py stands in for `python` / `torchrun`: tiny project
checkpoints instead of hub downloads, torchrun as 2 gloo processes). Only the settings change
(paths, and a smaller grid: one seed, one loss per loop, one ImageNet-C corruption, a generated
Stylized-ImageNet val).
The disk figures of the runbook are checked against the cache schema."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cache.outputs import read_outputs
from cache.reader import ClassifierCache
from cache.schema import CLASSIFIER_COLUMNS, FLIP_COLUMNS, ORACLE_COLUMNS
from bench.runbook import DOC, bash_blocks, shell_script
from conftest import ROOT
from oracle_fixtures import PALETTE, TINY_VIT_KWARGS, write_colour_tree

SHIM = ROOT / "tests" / "runbook_shim.py"
TINY_MODELS = {  # name in the runbook -> tiny timm model standing in for the hub weights
    "vit": ("vit_tiny_patch16_224", {**TINY_VIT_KWARGS, "num_classes": 3}, (0.5,) * 3, (0.5,) * 3),
    "resnet": ("resnet10t", {"num_classes": 3}, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
}
OFFLINE_NAMES = {"vit": "vit_base_patch16_384.orig_in21k_ft_in1k.pth",
                 "resnet": "resnet50.tv_in1k.pth"}


def mixed_correctness_seed(spec) -> tuple[int, object]:
    """A random init whose predictions on the tree's class colours (the runbook's paper
    preprocessing, mean = std = 0.5) are right for some classes and wrong for others, so every
    split has both correct and incorrect rows for the oracles to tell apart."""
    import torch

    from pipeline.core.models import build_model
    colours = torch.tensor(PALETTE, dtype=torch.float32)[:, :, None, None] / 255
    x = ((colours - 0.5) / 0.5).expand(-1, -1, 32, 32)
    for seed in range(50):
        model = build_model(spec, seed=seed)
        with torch.no_grad():
            right = (model(x).argmax(1) == torch.arange(len(PALETTE))).sum().item()
        if 0 < right < len(PALETTE):
            return seed, model
    raise AssertionError(f"no seed < 50 gives {spec.name} mixed predictions")


def write_tiny_checkpoints(out: Path) -> None:
    from pipeline.core.models import DataConfig
    from pipeline.classifier.checkpoint import save_checkpoint
    from pipeline.core.models import ModelSpec

    for name, (model, kwargs, mean, std) in TINY_MODELS.items():
        spec = ModelSpec(model, kwargs, None, True)
        data_cfg = DataConfig((3, 32, 32), "bilinear", 1.0, "center", mean, std)
        seed, net = mixed_correctness_seed(spec)
        save_checkpoint(out / f"{name}.pth", net, spec, data_cfg,
                        {"note": f"tiny stand-in for the runbook test, init seed {seed}"})


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("runbook")
    write_colour_tree(tmp / "imagenet", {"train": 45, "val": 8})   # 3 steps of 40 after 5% held out
    write_colour_tree(tmp / "imagenet-c" / "defocus_blur", {"5": 6}, seed=1)
    write_colour_tree(tmp / "stylized-imagenet", {"val": 4}, seed=2)   # Stylized-ImageNet's layout
    write_tiny_checkpoints(tmp / "tiny")
    (tmp / "weights").mkdir()
    for name, file in OFFLINE_NAMES.items():
        shutil.copy(tmp / "tiny" / f"{name}.pth", tmp / "weights" / file)
    return {"tmp": tmp, "IMAGENET": tmp / "imagenet", "IMAGENET_C": tmp / "imagenet-c",
            "STYLIZED": tmp / "stylized-imagenet", "WEIGHTS": tmp / "weights", "TINY": tmp / "tiny"}


def run_script(world: dict, body: str, settings: dict, name: str) -> subprocess.CompletedProcess:
    script = shell_script(body, settings, sys.executable, SHIM)
    (world["tmp"] / f"{name}.sh").write_text(script)
    env = {**os.environ, "RUNBOOK_TINY": str(world["TINY"]), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(["bash", str(world["tmp"] / f"{name}.sh")], cwd=world["tmp"], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def small_grid(world: dict, out: Path, **extra) -> dict:
    return {"IMAGENET": world["IMAGENET"], "IMAGENET_C": world["IMAGENET_C"],
            "STYLIZED": world["STYLIZED"], "WEIGHTS": world["WEIGHTS"], "OUT": out, "SEEDS": "0", "ORACLES": "vit",
            "LOSSES": "ss", "BROADCAST_LOSSES": "ce", "CORRUPTIONS_C": "defocus_blur", **extra}


def test_settings_block_comes_first_and_names_every_placeholder():
    blocks = bash_blocks()
    assert blocks[0][0].startswith("0. Settings")
    settings = set(re.findall(r"^(\w+)=", blocks[0][1], re.M))
    used = set(re.findall(r"\$(\w+)", "\n".join(code for _, code in blocks[1:])))
    loop_vars = {"clf", "oracle", "loss", "seed", "corruption", "run"}
    assert used - loop_vars <= settings, used - loop_vars - settings
    for _, code in blocks[1:]:   # every command is cli.py through $LAUNCH or python
        for line in code.splitlines():
            if "cli.py" in line:
                assert re.match(r"\s*(\$LAUNCH|python) cli\.py ", line), line


@pytest.mark.slow  # ~2.5 min, estimated: 34 cli.py processes, each importing torch + timm
def test_runbook_runs_as_written(world):
    out = world["tmp"] / "out"
    blocks = bash_blocks()[1:]
    proc = run_script(world, "\n".join(code for _, code in blocks), small_grid(world, out), "all")
    prep = out / "paper"                                          # PREP as the runbook sets it
    for clf in ("vit", "resnet"):
        for tag, rows in (("train", 135), ("val", 24), ("val-defocus_blur-5", 24)):
            cache = ClassifierCache.open(prep / "cache" / clf / tag)
            assert cache.num_rows == rows and cache.identity["preprocess"] == "paper"
            assert bool(cache.identity["flip_view"]) == (tag != "val-defocus_blur-5")
        c = ClassifierCache.open(prep / "cache-c" / "defocus_blur" / clf / "5")
        assert c.num_rows == 18 and c.identity["corruption"] == "none"
        s = ClassifierCache.open(prep / "cache-stylized" / clf / "val")
        assert s.num_rows == 12 and s.identity["dataset"] == "imagenet"
    # section 4's tree for users without the ImageNet-C download: val's 24 images, 224-px JPEGs
    local = sorted((out / "imagenet-c-local" / "defocus_blur" / "5").rglob("*.JPEG"))
    assert len(local) == 24 and {p.parent.name for p in local} == \
        {p.name for p in (world["IMAGENET"] / "val").iterdir()}
    runs = sorted(p.name for p in (prep / "runs").iterdir())
    # the grid (2 classifiers x vit oracle x {ss, ce broadcast}) + section 5's offline run
    assert len(runs) == 5, runs
    assert sum("_ce_broadcast_seed0_" in r for r in runs) == 2
    offline = [r for r in runs if r.startswith("resnet-vit_ss_seed0_")]
    assert len(offline) == 1
    for run in runs:
        record = json.loads((prep / "runs" / run / "run.json").read_text())
        assert record["status"] == "complete"
        assert record["run"]["config"]["lr"] == 1e-5 and record["run"]["config"]["batch_size"] == 40
        expected = {"val", "val-defocus_blur-5", "stylized-val", "val-pgd_linf"} | (
            {"defocus_blur_5"} if run not in offline else set())
        assert {p.stem for p in (prep / "runs" / run / "outputs").glob("*.h5")} == expected
    # predict's ImageNet-C outputs are aligned with their classifier's cache
    for run in runs:
        if run in offline:
            continue
        clf = run.split("-", 1)[1].split("_")[0]
        cache = ClassifierCache.open(prep / "cache-c" / "defocus_blur" / clf / "5")
        outs = read_outputs(prep / "runs" / run / "outputs" / "defocus_blur_5.h5")
        np.testing.assert_array_equal(outs.columns["index"], np.arange(18))
        np.testing.assert_array_equal(outs.columns["correct"], cache.load(["correct"])["correct"])
    # section 6: each classifier's val attacked against it, cached, every run scored on it
    for clf in ("vit", "resnet"):
        adv = ClassifierCache.open(prep / "cache" / clf / f"val-pgd_linf-{clf}")
        assert adv.num_rows == 24 and adv.identity["preprocess"] == "paper"
        attack = json.loads((prep / "adversarial" / f"val-pgd_linf-{clf}" / ".attack" /
                             "manifest.json").read_text())
        assert attack["identity"]["classifier"]["weights_sha256"] == \
            ClassifierCache.open(prep / "cache" / clf / "val").identity["weights_sha256"]
        # extract's accuracy on the stored PNGs is the one the attack logged
        assert adv.manifest["summary"]["accuracy"] == \
            pytest.approx(attack["summary"]["stored_accuracy"], abs=1 / 24 + 1e-9)
    report = json.loads((prep / "report" / "report.json").read_text())
    splits = {s["split"]: s for s in report["splits"]}
    assert set(splits) == {"val", "val-defocus_blur-5", "defocus_blur_5", "stylized-val",
                           "val-pgd_linf"}
    # the last report (section 7) has all 5 runs (section 4's predictions predate section 5's
    # run) + 8 baselines x 2 classifiers (no TrustScore: the runbook extracts no features)
    runs_in = {"val": 5, "val-defocus_blur-5": 5, "defocus_blur_5": 4, "val-pgd_linf": 5,
               "stylized-val": 5}
    for name, split in splits.items():
        assert len(split["rows"]) == runs_in[name] + 2 * 8, name
    oracle_rows = [r for r in splits["val"]["rows"] if r["kind"] == "oracle"]
    assert {r["loss_label"] for r in oracle_rows} == {"SS", "CE (broadcast)"}
    md = (prep / "report" / "report.md").read_text()
    # the appendix's ImageNet-C table: one block per corruption and severity (both sources here)
    table = md.split("## Shifted splits (paper appendix ImageNet-C layout)")[1].split("\n## ")[0]
    assert "| defocus_blur | 5 | `defocus_blur_5` |" in table
    assert "| defocus_blur | 5 | `val-defocus_blur-5` |" in table
    assert "## Gradient magnitudes" in md and "## Inference time" in md
    assert "+ cli.py train-oracle" in proc.stdout
    # section 8: head-only runs and a sweep per classifier on the features, fd-shifts' files
    head = sorted(p.name for p in (prep / "runs-head").iterdir())
    assert [r.split("_seed")[0] for r in head] == ["resnet-resnet_ss_head-only", "vit-vit_ss_head-only"]
    for clf in ("vit", "resnet"):
        assert "features" in ClassifierCache.open(prep / "features" / clf / "train").manifest["columns"]
        assert (prep / f"sweep-{clf}" / "sweep.json").is_file()
        assert len(list((prep / "report-head" / "fd-shifts" / clf).iterdir())) == 1


@pytest.mark.slow  # ~40 s: torchrun launches 2 interpreters per command
def test_runbook_stages_1_and_2_under_torchrun(world):
    """The same blocks with the multi-GPU launcher of the settings' comment (2 gloo processes)."""
    blocks = dict(bash_blocks())
    launch = re.search(r'LAUNCH="(torchrun [^"]+)"', bash_blocks()[0][1]).group(1)
    out = world["tmp"] / "out-ddp"
    body = "\n".join(code for heading, code in blocks.items() if heading[:2] in ("1.", "2."))
    settings = small_grid(world, out, LAUNCH=launch, CLASSIFIERS="vit", BROADCAST_LOSSES="")
    proc = run_script(world, body, settings, "ddp")
    assert proc.stdout.count("[train] 135 rows") == 1                 # one summary, from rank 0
    (run,) = (out / "paper" / "runs").iterdir()
    record = json.loads((run / "run.json").read_text())
    assert record["status"] == "complete" and record["schedule"]["world_size"] == 2
    assert record["schedule"]["micro_batch"] == 20


def test_disk_figures_follow_the_cache_schema():
    text = DOC.read_text()
    size = {"int64": 8, "uint8": 1, "float32": 4}
    k = 1000
    base = sum(size[t] for c, t in CLASSIFIER_COLUMNS.items() if c != "logits") + 2 * k \
        + 16                                          # source_xxh3: the image file's XXH3-128
    flip = sum(size[CLASSIFIER_COLUMNS[c]] for c in FLIP_COLUMNS if c != "logits") + 2 * k
    oracle = sum(size[t] for t in ORACLE_COLUMNS.values())
    assert (base - 2 * k, flip - 2 * k, oracle) == (50, 17, 34)
    assert "**50 + 2K bytes**" in text and "**17 + 2K** more" in text
    assert f"{base + flip:,}" in text and f"{base:,}" in text and "34 bytes/row" in text
    for rows, per_row, shown in ((1_281_167, base + flip, "5.21 GB"), (1_281_167, base, "2.63 GB"),
                                 (50_000, base + flip, "203 MB"), (50_000, base, "102 MB")):
        value = rows * per_row / (1e9 if "GB" in shown else 1e6)
        assert f"{value:.{2 if 'GB' in shown else 0}f} {shown.split()[1]}" == shown, (rows, per_row)
        assert shown in text
