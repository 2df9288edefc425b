"""ConfidNet's head and stacked inputs as head-only oracle kinds (--head-arch, --head-inputs):
the MLP against a reference forward on fixed weights, a bank against single runs, the statistics
against numpy from the cached logits, end-to-end runs that report and predict use, refusals."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

from oracle_fixtures import CLASSIFIER, TINY_VIT_KWARGS, extract, run_cli, step_losses, \
    write_colour_tree

ORACLE_KWARGS = {**TINY_VIT_KWARGS, "num_classes": 3}


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """Colour images; C = O = a random tiny ViT with features and both views."""
    root = tmp_path_factory.mktemp("confidnet")
    data = write_colour_tree(root / "data", {"train": 40, "val": 12})
    extract(data, root / "cache", extra=("--features",))
    return root, data


def head_args(root: Path, data: Path, *extra, loss="tcp", runs="runs"):
    return ["train-oracle", "--classifier", CLASSIFIER, "--oracle", CLASSIFIER, "--random-init",
            "--model-kwargs", json.dumps(ORACLE_KWARGS), "--data", data, "--cache", root / "cache",
            "--loss", loss, "--batch-size", 8, "--log-every", 1, "--no-progress", "--head-only",
            "--runs-root", root / runs, "--epochs", 2, "--lr", 0.05, *extra]


def only_run(output: str) -> Path:
    line = next(line for line in output.splitlines() if "run: " in line)
    return Path(line.split("run: ")[1].strip())


# ------------------------------------------------------------------------ the architecture --
def reference_confidnet(x, weights, biases, normalised):
    """valeoai/ConfidNet's uncertainty network written out: ReLU after each of the four 400-wide
    layers, none after the last; the hyperplane form divides by the last layer's weight norm."""
    h = x
    for i, (w, b) in enumerate(zip(weights, biases)):
        h = h @ w.T + b
        if i < len(weights) - 1:
            h = torch.clamp(h, min=0)
    z = h[:, 0]
    return z / (weights[-1].norm() + 1e-7) if normalised else z


@pytest.mark.parametrize("normalised", [False, True])
def test_confidnet_head_equals_a_reference_forward_on_fixed_weights(normalised):
    from pipeline.oracle.nets.heads import MLPHead, make_head

    g = torch.Generator().manual_seed(0)
    dim = 12
    widths = [dim, 400, 400, 400, 400, 1]
    weights = [torch.randn(o, i, generator=g) / i ** 0.5 for i, o in zip(widths, widths[1:])]
    biases = [torch.randn(o, generator=g) * 0.1 for o in widths[1:]]
    head = make_head("confidnet", dim, normalised)
    assert isinstance(head, MLPHead)
    shapes = dict((name, tuple(t.shape)) for name, t in head.named_parameters())
    assert shapes == {**{f"w{k}": (1, i, o) for k, (i, o) in enumerate(zip(widths, widths[1:]))},
                      **{f"b{k}": (1, 1, o) for k, o in enumerate(widths[1:])}}
    with torch.no_grad():
        for i, (w, b) in enumerate(zip(weights, biases)):
            getattr(head, f"w{i}").copy_(w.T[None])
            getattr(head, f"b{i}").copy_(b[None, None])
    x = torch.randn(64, dim, generator=g)
    ref = reference_confidnet(x, weights, biases, normalised)
    torch.testing.assert_close(head(x), ref, rtol=1e-5, atol=1e-6)
    # the ReLUs sit after the four hidden layers only: a ReLU after the last layer too, or none
    # at all, gives other scores on these rows
    for relu_at in (range(5), range(0)):
        h = x
        for i, (w, b) in enumerate(zip(weights, biases)):
            h = h @ w.T + b
            h = torch.clamp(h, min=0) if i in relu_at else h
        other = h[:, 0] / ((weights[-1].norm() + 1e-7) if normalised else 1)
        assert (head(x) - other).abs().max() > 1e-3


def test_a_bank_of_two_confidnet_heads_equals_two_single_runs(tmp_path):
    """Each head of a bank follows the trajectory it follows alone (its own loss parameters),
    bit for bit: the same final and chosen weights (the logged losses to rounding)."""
    from cache.runs import RunDir
    from pipeline.core.losses import Context, get
    from pipeline.oracle.headonly.bank import BankOptim, train_heads
    from pipeline.oracle.headonly.features import FeatureTable
    from pipeline.oracle.loop.log import StepLog
    from pipeline.oracle.loop.state import LoopSettings
    from pipeline.oracle.settings.sampler import StepSchedule

    g = torch.Generator().manual_seed(1)
    n, dim = 96, 10
    x = torch.randn(2 * n, dim, generator=g).half()
    correct = (torch.rand(2 * n, generator=g) < 0.6).float()
    table = FeatureTable(x, correct, torch.rand(2 * n, generator=g), n, True)
    schedule = StepSchedule(np.arange(80), 16, 3, 0, True)
    opt = BankOptim(0, True, 0.05, 0.9, 1e-4, 0.3, False, "confidnet")
    settings = LoopSettings(schedule.total_steps, 16, 1, 5, None, None, False, "test")
    losses = [get("ss").resolve({"alpha_pos": a, "alpha_neg": b}, Context((1.0, 3.0)), (30, 50))
              for a, b in ((1.0, 3.0), (2.0, 6.0))]

    def final(bank, name):
        logs = [StepLog(RunDir(tmp_path / f"{name}{p}"), None, True) for p in range(len(bank))]
        _, session = train_heads(table, schedule, bank, opt, np.arange(80, 96), 0.0, settings,
                                 logs)
        curves = [step_losses(tmp_path / f"{name}{p}") for p in range(len(bank))]
        return [session.head.state_of(p) for p in range(len(bank))], session.best, curves

    together, best, curves = final(losses, "bank")
    for p, loss in enumerate(losses):
        alone, alone_best, alone_curve = final([loss], f"alone{p}-")
        assert alone_curve[0] and alone_curve[0].keys() == curves[p].keys()
        # the logged loss is a mean over a (B, P) column, summed in another order than (B, 1)
        np.testing.assert_allclose(list(alone_curve[0].values()), list(curves[p].values()),
                                   rtol=0, atol=1e-6)
        for key, value in alone[0].items():
            torch.testing.assert_close(together[p][key], value, rtol=0, atol=0)
            torch.testing.assert_close(best[p][key], alone_best[0][key], rtol=0, atol=0)
    assert not torch.allclose(together[0]["w4"], together[1]["w4"])   # the heads did differ


# ----------------------------------------------------------------------- the stacked inputs --
@pytest.mark.parametrize("arch", ["linear", "confidnet"])
def test_a_stacked_head_standardises_the_statistics_and_best_pt_carries_the_moments(arch):
    from pipeline.oracle.nets.heads import head_from_checkpoint, make_head

    g = torch.Generator().manual_seed(2)
    x = torch.randn(32, 8 + 6, generator=g)
    mean, std = torch.randn(6, generator=g), torch.rand(6, generator=g) + 0.5
    torch.manual_seed(0)
    bank = make_head(arch, 14, True, 1, stacked=True)
    bank.set_stats(mean, std)
    ckpt = {"head": bank.state_of(0), "arch": arch, "inputs": "stacked"}
    alone = head_from_checkpoint(ckpt, True)
    torch.testing.assert_close(alone(x), bank(x)[:, 0], rtol=0, atol=0)
    torch.manual_seed(0)
    plain = make_head(arch, 14, True, None)          # the same weights, no standardisation
    standardised = torch.cat([x[:, :8], (x[:, 8:] - mean) / std], dim=1)
    torch.testing.assert_close(alone(x), plain(standardised), rtol=0, atol=0)



def test_stacked_inputs_are_the_statistics_of_the_cached_logits_of_each_view(tree):
    from pipeline.core.logits import logit_stats
    from pipeline.oracle.headonly.features import load_table
    from pipeline.oracle.settings.targets import open_split, training_targets

    root, data = tree
    split = open_split(str(data), root / "cache", CLASSIFIER, "train")
    table = load_table(split.cache, split, training_targets(split), True, torch.device("cpu"),
                       stacked=True)
    cols = split.cache.load(["logits", "logits_flip", "features"])
    assert cols["logits"].dtype == np.float16
    # the numpy form of the statistics (tests/test_logit_stats.py: the torch form equals it)
    ref = np.concatenate([logit_stats(cols["logits"]), logit_stats(cols["logits_flip"])])
    np.testing.assert_allclose(table.stats.numpy(), ref, rtol=1e-5, atol=1e-5)
    n = split.cache.num_rows
    idx = torch.tensor([0, n + 3])          # a plain row and a flipped row
    got = table.inputs(idx)
    assert got.shape == (2, cols["features"].shape[1] + 6)
    np.testing.assert_array_equal(got[0, :-6].numpy(), cols["features"][0].astype(np.float32))
    np.testing.assert_allclose(got[1, -6:].numpy(), ref[n + 3], rtol=1e-5, atol=1e-5)


# ------------------------------------------------------ end to end: train, report, predict --
@pytest.mark.parametrize("loss,inputs", [("tcp", "features"), ("ss", "stacked")])
def test_a_confidnet_run_is_reported_and_scored_by_predict(tree, tmp_path, loss, inputs):
    from cache.outputs import read_outputs
    from pipeline.oracle.nets.checkpoint import load_checkpoint

    root, data = tree
    run = only_run(run_cli(head_args(root, data, "--head-arch", "confidnet", "--head-inputs",
                                     inputs, loss=loss, runs=tmp_path / "runs")).output)
    doc = json.loads((run / "run.json").read_text())
    tags = "head-only+confidnet" + ("+stacked" if inputs == "stacked" else "")
    assert doc["status"] == "complete" and doc["run"]["variant"].endswith(tags)
    assert doc["run"]["config"]["head_arch"] == "confidnet"
    ckpt = load_checkpoint(run / "checkpoints" / "best.pt")
    assert ckpt["arch"] == "confidnet" and ckpt["head"]["w1"].shape == (1, 400, 400)
    assert ("stats_mean" in ckpt["head"]) == (inputs == "stacked")
    losses = step_losses(run)
    assert len(losses) == doc["schedule"]["total_steps"] and len(set(losses.values())) > 1
    from_features = read_outputs(run / "outputs" / "val.h5").columns["z"]
    # predict on the cached split: the backbone computes the features from the images
    run_cli(["predict", "--run", run, "--data", data, "--cache", root / "cache", "--split", "val",
             "--name", "val_images", "--precision", "fp32", "--workers", 0, "--no-progress"])
    from_images = read_outputs(run / "outputs" / "val_images.h5").columns["z"]
    np.testing.assert_allclose(from_images, from_features, atol=5e-3)
    assert np.ptp(from_features) > 1e-3
    # predict --images: the classifier's logits of each image feed a stacked head
    res = run_cli(["predict", "--run", run, "--images", data / "val", "--threshold", 0.5,
                   "--out", tmp_path / "p.csv", "--precision", "fp32", "--workers", 0,
                   "--no-progress"])
    assert "image(s)" in res.output
    import csv
    rows = list(csv.DictReader((tmp_path / "p.csv").open()))
    conf = np.array([float(r["confidence"]) for r in rows])
    want = 1 / (1 + np.exp(-from_features.astype(np.float64)))
    np.testing.assert_allclose(np.sort(conf), np.sort(want), atol=2e-3)
    run_cli(["report", tmp_path / "runs", "--out", tmp_path / "rep", "--no-figures",
             "--format", "json", "--jobs", 1])
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    labels = {r["loss_label"] for s in rep["splits"] for r in s["rows"]}
    assert doc["run"]["loss_label"] in labels, labels


def test_a_sweep_trains_confidnet_heads_as_one_bank_of_ordinary_runs(tree, tmp_path):
    root, data = tree
    base = [a for a in head_args(root, data, "--head-arch", "confidnet", loss="ss",
                                 runs=tmp_path / "unused")
            if a not in ("train-oracle", "--head-only")]
    base = base[:base.index("--runs-root")] + base[base.index("--runs-root") + 2:]
    out = tmp_path / "sw"
    run_cli(["sweep", "--alpha-neg", "2,6", "--alpha-pos", "1", "--mode", "grid", "--out", out,
             "--no-figures", *base])
    doc = json.loads((out / "sweep.json").read_text())
    assert len(doc["points"]) == 2 and "--head-arch confidnet" in doc["command"]
    runs = sorted((out / "runs").iterdir())
    assert len(runs) == 2
    records = [json.loads((run / "run.json").read_text()) for run in runs]
    assert all(rec["status"] == "complete" for rec in records)
    # slopes other than the ViT's (1, 3) are part of each point's variant
    assert sorted(rec["run"]["variant"] for rec in records) == [
        "a1-2+head-only+confidnet", "a1-6+head-only+confidnet"]


# ----------------------------------------------------------------------------- the group --
def test_linear_head_only_runs_keep_their_group_and_other_heads_get_their_own():
    from pipeline.oracle.settings.config import TrainConfig
    from pipeline.oracle.settings.record import group_hash

    ident = {"model": "m", "weights_sha256": "w", "dataset_fingerprint": "f", "split": "train",
             "corruption": "none"}
    new = {**asdict(TrainConfig()), "head_only": True}
    before = {k: v for k, v in new.items() if k not in ("head_arch", "head_inputs")}
    assert group_hash(new, ident) == group_hash(before, ident)
    hashes = {group_hash({**new, "head_arch": "confidnet"}, ident),
              group_hash({**new, "head_inputs": "stacked"}, ident), group_hash(before, ident)}
    assert len(hashes) == 3


# ------------------------------------------------------------------------------ bad input --
@pytest.mark.parametrize("option", [["--head-arch", "confidnet"], ["--head-inputs", "stacked"]])
def test_head_options_without_head_only_are_refused(tree, option):
    root, data = tree
    args = [a for a in head_args(root, data, *option) if a != "--head-only"]
    res = run_cli(args, expect=2)
    assert option[0] in res.output and "--head-only" in res.output


def test_confidnet_on_a_cache_without_features_names_the_extract_command(tree, tmp_path):
    root, data = tree
    extract(data, tmp_path / "plain")                                 # no --features
    res = run_cli(head_args(root, data, "--head-arch", "confidnet", "--features-cache",
                            tmp_path / "plain", runs=tmp_path / "r"), expect=1)
    assert "holds no features" in res.output and "--features" in res.output
    assert "Traceback" not in res.output


def test_stacked_flips_need_the_classifier_caches_flipped_logits(tree, tmp_path):
    root, data = tree
    extract(data, tmp_path / "c", flip_view=False, extra=("--features",))
    args = head_args(root, data, "--head-inputs", "stacked", runs=tmp_path / "r")
    args[args.index("--cache") + 1] = tmp_path / "c"
    # C's cache lacks the flipped logits, O's features (the same model, another root) have both
    # views; with --no-flip it trains
    res = run_cli(args + ["--features-cache", root / "cache"], expect=1)
    assert "no flipped view's logits" in res.output and "--no-flip" in res.output
    assert str(tmp_path / "c") in res.output and "Traceback" not in res.output
    runs = tmp_path / "r"
    assert not runs.exists() or not any(runs.iterdir())          # no run folder left behind
    run_cli(args + ["--no-flip"])
