"""train-oracle --head-only: the head on cached oracle features, against references computed
directly from the cached arrays; the O != C join; refusals; predict and report on such runs."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from oracle_fixtures import CLASSIFIER, TINY_VIT_KWARGS, extract, run_cli, step_losses, \
    write_colour_tree

ORACLE_KWARGS = {**TINY_VIT_KWARGS, "num_classes": 3}


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """Colour images; C = a random tiny ViT (seed 0) with features and both views; O = another
    random tiny ViT (seed 1, features in a separate root)."""
    root = tmp_path_factory.mktemp("head")
    data = write_colour_tree(root / "data", {"train": 40, "val": 12})
    extract(data, root / "cache", extra=("--features",))
    extract(data, root / "ofeat", seed=1, extra=("--features",))
    return root, data


def head_args(root: Path, data: Path, *extra, loss="ss", cache="cache", seed=0):
    return ["train-oracle", "--classifier", CLASSIFIER, "--oracle", CLASSIFIER, "--random-init",
            "--model-kwargs", json.dumps(ORACLE_KWARGS), "--data", data, "--cache", root / cache,
            "--loss", loss, "--batch-size", 8, "--log-every", 1, "--no-progress", "--head-only",
            "--seed", seed, "--runs-root", root / "runs", "--epochs", 1, *extra]


def only_run(summary_output: str) -> Path:
    line = next(l for l in summary_output.splitlines() if "run: " in l)
    return Path(line.split("run: ")[1].strip())


# ------------------------------------------------------------------ the loss, bank vs single --
@pytest.mark.parametrize("loss,opts", [
    ("ss", {}), ("ss", {"pos_weight": 2.0, "neg_weight": 0.5}), ("ce", {}), ("ce", {"broadcast": True}),
    ("focal", {}), ("focal", {"broadcast": True, "neg_weight": 3.0}), ("tcp", {}),
    ("ce", {"class_balanced": True})])
def test_bank_loss_equals_per_sample_loss_column_by_column(loss, opts):
    from pipeline.core.losses import Context, get
    from pipeline.oracle.nets.losses import (HeadLoss as BankLoss, broadcast_coefficients,
                                             per_sample_loss)

    g = torch.Generator().manual_seed(0)
    z = torch.randn(64, 3, generator=g) * 3
    o = (torch.rand(64, generator=g) < 0.7).float()
    pt = torch.rand(64, generator=g)
    variants = [dict(opts, alpha_pos=a, alpha_neg=b) if loss == "ss" else
                dict(opts, gamma=a) if loss == "focal" else dict(opts)
                for a, b in ((1.0, 3.0), (2.0, 5.0), (0.5, 8.0))]
    cfgs = [get(loss).resolve(v, Context((1.0, 3.0)), (20, 44)) for v in variants]
    bank = BankLoss(cfgs, torch.device("cpu"))(z, o, pt)
    for p, cfg in enumerate(cfgs):
        coef = broadcast_coefficients(cfg, o, len(o)) if cfg.broadcast else None
        ref = per_sample_loss(cfg, z[:, p], o, pt, coef)
        torch.testing.assert_close(bank[:, p], ref, rtol=1e-6, atol=1e-7)


# --------------------------------------------- the SS loss curve against a direct reference --
def reference_ss_curve(feats, feats_flip, o, o_flip, schedule, cfg, pct_start) -> np.ndarray:
    """SS with the hyperplane head, SGD with momentum, OneCycle — written out from the arrays."""
    torch.manual_seed(cfg["seed"])
    lin = torch.nn.Linear(feats.shape[1], 1)           # the head's initialisation for the seed
    w, b = lin.weight.detach().clone()[0], lin.bias.detach().clone()[0]
    dummy = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=cfg["lr"])
    lrs = torch.optim.lr_scheduler.OneCycleLR(dummy, max_lr=cfg["lr"],
                                              total_steps=schedule.total_steps,
                                              pct_start=pct_start, cycle_momentum=False)
    buf_w = buf_b = None
    ap, an, mom = cfg["alpha_pos"], cfg["alpha_neg"], cfg["momentum"]
    curve = []
    for step in range(schedule.total_steps):
        rows, flips = schedule.batch_rows(step), schedule.batch_flips(step)
        x = torch.from_numpy(np.where(flips[:, None], feats_flip[rows], feats[rows])).float()
        t = torch.from_numpy(np.where(flips, o_flip[rows], o[rows])).float()
        w_, b_ = w.clone().requires_grad_(), b.clone().requires_grad_()
        z = (x @ w_ + b_) / (w_.norm() + 1e-7)
        s = z / (1 + z.abs())
        loss = (t * (torch.exp(-ap * s) - math.exp(-ap))
                + (1 - t) * (torch.exp(an * s) - math.exp(-an))).mean()
        loss.backward()
        curve.append(loss.item())
        lr = dummy.param_groups[0]["lr"]
        gw, gb = w_.grad + cfg["weight_decay"] * w, b_.grad + cfg["weight_decay"] * b
        buf_w = gw.clone() if buf_w is None else mom * buf_w + gw
        buf_b = gb.clone() if buf_b is None else mom * buf_b + gb
        w, b = w - lr * buf_w, b - lr * buf_b
        dummy.step()
        lrs.step()
    return np.array(curve)


def test_head_only_ss_loss_curve_equals_reference_from_the_arrays(tree):
    from cache.reader import ClassifierCache
    from pipeline.oracle.settings.sampler import StepSchedule

    root, data = tree
    res = run_cli(head_args(root, data, "--lr", "0.05", "--momentum", "0.9", "--epochs", "3"))
    run = only_run(res.output)
    got = step_losses(run)
    doc = json.loads((run / "run.json").read_text())
    assert doc["status"] == "complete" and doc["head_only"] is True
    assert doc["run"]["config"]["head_only"] is True and doc["run"]["variant"] == "head-only"
    assert doc["feature_caches"]["train"]["path"] == str((root / "cache" / CLASSIFIER / "train").resolve())
    cfg = doc["run"]["config"]
    cache = ClassifierCache.open(root / "cache" / CLASSIFIER / "train")
    cols = cache.load(["features", "features_flip", "correct", "correct_flip"])
    val = json.loads((run / "val_split.json").read_text())
    rows = np.setdiff1d(np.arange(cache.num_rows), val["val_rows"])
    schedule = StepSchedule(rows, cfg["batch_size"], cfg["epochs"], cfg["seed"], cfg["flip"])
    assert schedule.flip and schedule.batch_flips(0).any()       # both views are exercised
    ref = reference_ss_curve(cols["features"], cols["features_flip"], cols["correct"],
                             cols["correct_flip"], schedule, cfg, doc["schedule"]["pct_start"])
    assert len(got) == len(ref) == schedule.total_steps
    np.testing.assert_allclose([got[k + 1] for k in range(len(ref))], ref, rtol=0, atol=1e-6)
    assert ref[-1] != ref[0]                                     # the head did move


# ---------------------------------------------------------------------- O != C: the join --
def test_oracle_features_of_another_model_are_joined_by_global_index(tree):
    from cache.outputs import read_outputs
    from cache.reader import ClassifierCache
    from pipeline.oracle.nets.checkpoint import load_checkpoint

    root, data = tree
    # O = the seed-1 ViT: its cache has other weights, so its features come from --features-cache
    res = run_cli(head_args(root, data, "--features-cache", root / "ofeat", "--no-flip",
                            "--runs-root", root / "runs-oc"))
    run = only_run(res.output)
    doc = json.loads((run / "run.json").read_text())
    fc = ClassifierCache.open(root / "ofeat" / CLASSIFIER / "val")
    c = ClassifierCache.open(root / "cache" / CLASSIFIER / "val")
    assert fc.identity["weights_sha256"] != c.identity["weights_sha256"]
    assert doc["feature_caches"]["val"]["weights_sha256"] == fc.identity["weights_sha256"]
    assert doc["oracle_build"]["backbone"]["seed"] == 1
    # targets are C's: the output file's correctness is C's, z is the head on O's features
    out = read_outputs(run / "outputs" / "val.h5").columns
    np.testing.assert_array_equal(out["correct"], c.load(["correct"])["correct"])
    head = load_checkpoint(run / "checkpoints" / "best.pt")["head"]
    x = torch.from_numpy(fc.load(["features"])["features"]).float()
    w, b = head["linear.weight"][0], head["linear.bias"][0]
    z = (x @ w + b) / (w.norm() + 1e-7)
    np.testing.assert_allclose(out["z"], z.numpy(), rtol=1e-5, atol=1e-5)
    counts = doc["class_counts"]
    tr = ClassifierCache.open(root / "cache" / CLASSIFIER / "train").load(["correct"])["correct"]
    assert counts["correct"] + counts["incorrect"] == doc["rows"]["train"]
    assert counts["correct"] <= int(tr.sum())


def test_features_of_other_samples_are_refused_with_the_extract_command(tree, tmp_path):
    root, data = tree
    other = write_colour_tree(tmp_path / "other", {"train": 41, "val": 12}, seed=5)
    extract(other, tmp_path / "feat", extra=("--features",))
    res = run_cli(head_args(root, data, "--features-cache", tmp_path / "feat", "--no-flip",
                            "--runs-root", tmp_path / "runs"), expect=1)
    assert "dataset_fingerprint" in res.output and "python cli.py extract" in res.output
    assert "--features" in res.output and str(tmp_path / "feat") in res.output


# ------------------------------------------------------------------------------ bad input --
def test_missing_and_featureless_caches_are_refused_naming_the_command(tree, tmp_path):
    root, data = tree
    res = run_cli(head_args(root, data, "--features-cache", tmp_path / "none",
                            "--runs-root", tmp_path / "runs"), expect=1)
    assert "feature cache" in res.output and "python cli.py extract" in res.output
    extract(data, tmp_path / "plain", splits=("train", "val"))              # no --features
    res = run_cli(head_args(root, data, "--features-cache", tmp_path / "plain",
                            "--runs-root", tmp_path / "runs"), expect=1)
    assert "holds no features" in res.output and "--features-cache" in res.output


def test_flip_without_flipped_features_is_refused_and_no_flip_trains(tree, tmp_path):
    root, data = tree
    extract(data, tmp_path / "f1", flip_view=False, extra=("--features",))
    args = head_args(root, data, "--features-cache", tmp_path / "f1", "--runs-root", tmp_path / "r")
    res = run_cli(args, expect=1)
    assert "flipped view" in res.output and "--no-flip" in res.output
    run_cli(args + ["--no-flip"])


def test_non_finite_features_are_refused_naming_the_row(tree, tmp_path):
    import shutil

    from cache.integrity import column_hash
    from cache.schema import from_attr, to_attr
    from cache.shards import HASHES

    root, data = tree
    shutil.copytree(root / "cache", tmp_path / "c")
    shard = sorted((tmp_path / "c" / CLASSIFIER / "train").glob("shard-*.h5"))[0]
    with h5py.File(shard, "r+") as fh:     # as an extraction that overflowed writes it
        feats = fh["features"][...]
        feats[7, 3] = np.nan
        fh["features"][...] = feats
        hashes = from_attr(fh.attrs[HASHES])
        fh.attrs[HASHES] = to_attr({**hashes, "features": column_hash(feats)})
        start = json.loads(fh.attrs["start"])
    manifest = shard.parent / "manifest.json"      # which records the shard's checksums too
    m = json.loads(manifest.read_text())
    m["shards"][0][HASHES]["features"] = column_hash(feats)
    manifest.write_text(json.dumps(m))
    res = run_cli(head_args(root, data, "--features-cache", tmp_path / "c",
                            "--runs-root", tmp_path / "r"), expect=1)
    assert f"row {start + 7} (plain view)" in res.output


@pytest.mark.parametrize("option", [["--precision", "bf16"], ["--workers", "2"],
                                    ["--accum-steps", "2"], ["--stop-at-step", "3"], ["--resume"]])
def test_fine_tune_only_options_are_refused_by_name(tree, option):
    root, data = tree
    res = run_cli(head_args(root, data, *option), expect=2)
    assert option[0] in res.output and "--head-only" in res.output


def test_features_cache_without_head_only_is_refused(tree):
    root, data = tree
    args = [a for a in head_args(root, data, "--features-cache", root / "ofeat")
            if a != "--head-only"]
    res = run_cli(args, expect=2)
    assert "--features-cache" in res.output


# ------------------------------------------------- predict and report use these runs as is --
def test_predict_runs_the_frozen_backbone_and_head_on_images(tree, tmp_path):
    from cache.outputs import read_outputs

    root, data = tree
    run = only_run(run_cli(head_args(root, data, "--runs-root", tmp_path / "runs")).output)
    from_features = read_outputs(run / "outputs" / "val.h5").columns["z"]
    res = run_cli(["predict", "--run", run, "--data", data, "--cache", root / "cache",
                   "--split", "val", "--name", "val_images", "--precision", "fp32",
                   "--workers", 0, "--no-progress"])
    assert "val_images.h5" in res.output
    from_images = read_outputs(run / "outputs" / "val_images.h5").columns["z"]
    # the same function; the cached features were rounded to float16
    np.testing.assert_allclose(from_images, from_features, atol=5e-3)
    assert np.abs(from_features).max() > 0.05


def test_report_labels_head_only_rows(tree, tmp_path):
    root, data = tree
    for loss in ("ss", "ce"):
        run_cli(head_args(root, data, "--runs-root", tmp_path / "runs", loss=loss))
    run_cli(["report", tmp_path / "runs", "--out", tmp_path / "rep", "--no-figures",
             "--format", "json", "--jobs", 1])
    doc = json.loads((tmp_path / "rep" / "report.json").read_text())
    labels = {r["loss_label"] for s in doc["splits"] for r in s["rows"]}
    assert {"SS (head-only)", "CE (head-only)"} <= labels, labels


def test_a_complete_head_only_run_is_skipped(tree, tmp_path):
    root, data = tree
    args = head_args(root, data, "--runs-root", tmp_path / "runs", loss="tcp")
    run = only_run(run_cli(args).output)
    before = (run / "run.json").read_text()
    res = run_cli(args)
    assert "already complete" in res.output and (run / "run.json").read_text() == before


def test_fine_tuned_runs_keep_their_group_and_head_only_runs_get_their_own():
    """Run directories written before --head-only existed are found again (same group hash)."""
    from dataclasses import asdict

    from pipeline.oracle.settings.config import TrainConfig
    from pipeline.oracle.settings.record import group_hash

    ident = {"model": "m", "weights_sha256": "w", "dataset_fingerprint": "f", "split": "train",
             "corruption": "none"}
    new = asdict(TrainConfig())
    before = {k: v for k, v in new.items() if k not in ("head_only", "features_cache")}
    assert group_hash(new, ident) == group_hash(before, ident)
    assert group_hash({**new, "features_cache": "/elsewhere"}, ident) == group_hash(before, ident)
    assert group_hash({**new, "head_only": True}, ident) != group_hash(before, ident)


# ------------------------------------------------------------- --cuda-graph (head-only step) --
def test_cuda_graph_on_a_cpu_is_refused_before_anything_is_written_and_auto_runs_eagerly(tree,
                                                                                        tmp_path):
    """--cuda-graph applies to head-only runs (pipeline/oracle/headonly/graph.py): on a CPU ``on``
    is refused with the reason, ``auto`` and ``off`` run the eager step; run.json says which ran."""
    root, data = tree
    refused = run_cli(head_args(root, data, "--device", "cpu", "--cuda-graph", "on", "--out",
                                tmp_path / "on"), expect=1)
    assert ("error: --cuda-graph on: this run's step cannot be captured: the device is cpu "
            "(CUDA graphs need a CUDA device). Use --cuda-graph auto") in refused.output
    assert "Traceback" not in refused.output and not (tmp_path / "on").exists()
    paths = {}
    for mode in ("auto", "off"):
        res = run_cli(head_args(root, data, "--device", "cpu", "--cuda-graph", mode, "--out",
                                tmp_path / mode))
        assert "note:" not in res.output          # on a CPU there is nothing to miss
        paths[mode] = json.loads((tmp_path / mode / "run.json").read_text())["step_path"]
    assert paths["auto"] == {"mode": "eager", "requested": "auto",
                             "reason": "the device is cpu (CUDA graphs need a CUDA device)"}
    assert paths["off"] == {"mode": "eager", "requested": "off"}
    assert step_losses(tmp_path / "auto") == step_losses(tmp_path / "off")


@pytest.mark.skipif(not (shutil.which("c++") or shutil.which("g++")),
                    reason="torch.compile on the CPU (inductor) needs a C++ compiler")
def test_compile_applies_to_head_only_runs_and_says_so(tree, tmp_path):
    """--head-only --compile: the head's forward and the loss compiled (the step's body without
    a graph on a CPU); run.json records it; the losses are the eager run's up to rounding."""
    root, data = tree
    for name, extra in (("plain", ()), ("compiled", ("--compile",))):
        run_cli(head_args(root, data, "--device", "cpu", *extra, "--out", tmp_path / name))
    path = json.loads((tmp_path / "compiled" / "run.json").read_text())["step_path"]
    assert path == {"mode": "eager", "requested": "auto", "compiled": True,
                    "reason": "the device is cpu (CUDA graphs need a CUDA device)"}
    ours, theirs = step_losses(tmp_path / "compiled"), step_losses(tmp_path / "plain")
    assert ours.keys() == theirs.keys()
    assert np.allclose(list(ours.values()), list(theirs.values()), rtol=1e-4, atol=1e-6)
