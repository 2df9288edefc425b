"""trust_oracles.training: runs trained from Python as the command line trains them, a loss of
your own through the same loop (fine-tuned and head-only), a head on features in memory, and
the refusals of what cannot be trained."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from oracle_fixtures import (CLASSIFIER, TINY_VIT_KWARGS, extract, run_cli, step_losses,
                             train_args, write_colour_tree)

ORACLE_KWARGS = {**TINY_VIT_KWARGS, "num_classes": 3}


# ------------------------------------------------------------- losses defined here, by users --
def ce_on_z(z, correct):
    """The built-in CE (unit weights), written as a user would: the same operations, so a run
    trained with it must equal a --loss ce run bit for bit."""
    return (-correct * F.logsigmoid(z) - (1 - correct) * F.logsigmoid(-z)).mean()


def squared_hinge(z, correct):
    sign = 2 * correct - 1                                   # +1 right, -1 wrong
    return torch.relu(1 - sign * z).pow(2).mean()


class CountingHinge(torch.nn.Module):
    """A squared hinge with a margin buffer, counting the training calls it serves."""

    def __init__(self, margin: float = 1.0):
        super().__init__()
        self.register_buffer("margin", torch.tensor(margin))
        self.training_calls = 0

    def forward(self, z, correct):
        self.training_calls += int(z.requires_grad)
        return torch.relu(self.margin - (2 * correct - 1) * z).pow(2).mean()


def per_row(z, correct):                 # forgets the mean: (B,), not a scalar
    return F.binary_cross_entropy_with_logits(z, correct, reduction="none")


def nan_loss(z, correct):
    return (z * float("nan")).mean()


def detached(z, correct):
    return squared_hinge(z.detach(), correct)


def as_float(z, correct):
    return squared_hinge(z, correct).item()


# ---------------------------------------------------------------------------- fixtures --
def api_settings(data: Path, cache: Path, **extra):
    """train_args' tiny fine-tuned run as settings(...)."""
    from trust_oracles.training import settings

    base = dict(classifier=CLASSIFIER, oracle=CLASSIFIER, random_init=True,
                model_kwargs=TINY_VIT_KWARGS, data=data, cache=cache, loss="ce", batch_size=8,
                workers=0, precision="fp32", log_every=1, progress=False, epochs=1)
    return settings(**{**base, **extra})


def head_settings(root: Path, data: Path, **extra):
    """test_head_only's head_args as settings(...)."""
    from trust_oracles.training import settings

    base = dict(classifier=CLASSIFIER, oracle=CLASSIFIER, random_init=True,
                model_kwargs=ORACLE_KWARGS, data=data, cache=root / "cache", loss="ce",
                batch_size=8, log_every=1, progress=False, head_only=True,
                runs_root=root / "runs", epochs=1)
    return settings(**{**base, **extra})


def head_cli(root: Path, data: Path, *extra) -> list:
    return ["train-oracle", "--classifier", CLASSIFIER, "--oracle", CLASSIFIER, "--random-init",
            "--model-kwargs", json.dumps(ORACLE_KWARGS), "--data", data, "--cache", root / "cache",
            "--loss", "ce", "--batch-size", 8, "--log-every", 1, "--no-progress", "--head-only",
            "--runs-root", root / "runs", "--epochs", 1, *extra]


@pytest.fixture(scope="module")
def colours(tmp_path_factory):
    """The tiny fine-tuning tree (8 train / 4 val images per class) and its cache."""
    root = tmp_path_factory.mktemp("api-colours")
    data = write_colour_tree(root / "data", {"train": 8, "val": 4})
    extract(data, root / "cache")
    return root, data


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """test_head_only's tree: features and both views of a random tiny ViT."""
    root = tmp_path_factory.mktemp("api-head")
    data = write_colour_tree(root / "data", {"train": 40, "val": 12})
    extract(data, root / "cache", extra=("--features",))
    return root, data


def val_log(run: Path) -> list[dict]:
    lines = (run / "log.jsonl").read_text().splitlines()
    return [json.loads(line)["val"] for line in lines if "val" in json.loads(line)]


def output_z(run: Path, tag: str) -> np.ndarray:
    from cache.outputs import read_outputs
    return read_outputs(run / "outputs" / f"{tag}.h5").columns["z"]


def cli_run(output: str) -> Path:
    return Path(next(l for l in output.splitlines() if "run: " in l).split("run: ")[1].strip())


# ----------------------------------------------------------------- settings = the command line --
def test_settings_are_the_command_lines_config(tmp_path):
    from pipeline.oracle.command import train_oracle
    from pipeline.oracle.settings.given import config_from_params
    from trust_oracles.training import TrainConfig, settings

    assert settings() == TrainConfig()
    args = ["--data", str(tmp_path), "--loss", "focal", "--gamma", "0.5", "--epochs", "2",
            "--model-kwargs", '{"depth": 2}', "--no-progress", "--eval-split", "a", "--no-flip"]
    cli = config_from_params(train_oracle.make_context("train-oracle", args).params)
    api = settings(data=tmp_path, loss="focal", gamma=0.5, epochs=2, model_kwargs={"depth": 2},
                   progress=False, eval_splits="a", flip=False)
    assert api == cli and api.eval_splits == ("a",) and api.model_kwargs == {"depth": 2}


@pytest.mark.parametrize("options,message", [
    ({"epochs": 0}, "epochs=0"), ({"bogus": 1}, "'bogus'"), ({"loss": "hinge"}, "hinge"),
    ({"loss": squared_hinge}, "train(settings, loss=fn)"),
    ({"head_only": True, "workers": 2}, "--workers does not apply to --head-only"),
    ({"head_arch": "confidnet"}, "--head-arch applies to --head-only runs only"),
    ({"hub_weights": True, "random_init": True}, "--hub-weights excludes")])
def test_settings_refuse_what_the_command_line_refuses(options, message):
    from trust_oracles.errors import InputError
    from trust_oracles.training import settings

    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        settings(**options)


# ------------------------------------------------------- your own loss, fine-tuned on images --
def test_a_users_ce_trains_the_fine_tuned_run_of_the_built_in_ce_bit_for_bit(colours):
    from trust_oracles.training import RunResult, train

    root, data = colours
    # a user's loss runs eagerly; on a GPU the built-in run's step would be a CUDA graph, whose
    # kernels round differently from the eager step's: eager both, to compare like with like
    opts = ("--val-fraction", 0.25, "--batch-size", 4, "--lr", 0.05, "--cuda-graph", "off")
    run_cli(train_args(data, root / "cache", root / "cli-ce", *opts))
    result = train(api_settings(data, root / "cache", val_fraction=0.25, batch_size=4, lr=0.05,
                                cuda_graph="off", out=root / "api-ce"), loss=ce_on_z)
    assert isinstance(result, RunResult) and result.status == "complete"
    assert result.run.loss == result.settings.loss == "custom:test_api_training.ce_on_z"
    assert result.run.loss_label == result.run.loss and not result.head_only
    assert result.step_path == "eager" and result.settings.z == "linear"
    built_in = step_losses(root / "cli-ce")
    assert step_losses(result.run_dir) == built_in and len(built_in) == result.total_steps == 4
    api_val, cli_val = val_log(result.run_dir), val_log(root / "cli-ce")
    if torch.cuda.is_available():   # a user's loss validates where its module lives (the GPU),
        for a, b in zip(api_val, cli_val):      # the built-in on the CPU: float rounding apart
            assert a.pop("loss") == pytest.approx(b.pop("loss"), rel=1e-6)
    assert api_val == cli_val                                          # held-out metrics
    np.testing.assert_array_equal(output_z(result.run_dir, "val"), output_z(root / "cli-ce", "val"))
    cli_json = json.loads((root / "cli-ce" / "run.json").read_text())
    assert result.best_step == cli_json["best"]["step"] and result.outputs["val"].is_file()
    assert result.heldout_output.is_file() and (result.train_rows, result.val_rows) == (18, 6)
    assert result.run.group != cli_json["run"]["group"]              # another loss, another run


def test_ss_on_a_backbone_without_slopes_says_what_the_command_line_says(colours, capfd):
    """The notes of prepare (SS's slopes chosen for an unknown backbone, too few held-out rows)
    come from the same code, word for word."""
    from pipeline.oracle.settings import defaults
    from trust_oracles.training import train

    root, data = colours
    extra = ("--stop-at-step", 1, "--val-fraction", 0.25, "--batch-size", 4)
    args = train_args(data, root / "cache", root / "cli-ss", *extra, loss="ss")
    args[args.index("--oracle") + 1] = "test_convnext"
    args[args.index("--model-kwargs") + 1] = "{}"
    defaults._SAID.clear()
    said_cli = [l for l in run_cli(args).output.splitlines() if l.startswith(("note:", "warning:"))]
    defaults._SAID.clear()
    capfd.readouterr()
    result = train(api_settings(data, root / "cache", loss="ss", oracle="test_convnext",
                                model_kwargs={}, stop_at_step=1, val_fraction=0.25, batch_size=4,
                                out=root / "api-ss"))
    said_api = [l for l in capfd.readouterr().err.splitlines()
                if l.startswith(("note:", "warning:"))]
    assert any("SS slopes alpha+ = 2, alpha- = 5 for oracle test_convnext" in l for l in said_cli)
    assert any(l.startswith("warning: only 6 held-out row(s)") for l in said_cli)
    assert said_api == said_cli
    assert result.status == "stopped" and result.step == 1 and result.outputs == {}


# ---------------------------------------------------- your own loss, head-only on features --
def test_a_users_ce_trains_the_head_only_run_of_the_built_in_ce_bit_for_bit(tree):
    from trust_oracles.training import train

    root, data = tree
    cli = cli_run(run_cli(head_cli(root, data, "--lr", 0.05)).output)
    result = train(head_settings(root, data, lr=0.05), loss=ce_on_z)
    assert result.head_only and result.run.variant == "head-only"
    assert result.run_dir.name.startswith("vit_tiny_patch16_224-vit_tiny_patch16_224_custom-"
                                          "test_api_training.ce_on_z_head-only_seed0_")
    assert step_losses(result.run_dir) == step_losses(cli)
    assert val_log(result.run_dir) == val_log(cli)
    np.testing.assert_array_equal(output_z(result.run_dir, "val"), output_z(cli, "val"))
    again = train(head_settings(root, data, lr=0.05), loss=ce_on_z)      # found complete
    assert again.already_complete and again.run_dir == result.run_dir


def test_a_bank_applies_a_users_loss_to_each_head(tree):
    """Two runs that differ only in their folder train as one bank of two heads: each head's
    column gets the loss, as it would alone."""
    from pipeline.oracle.headonly.train import train_head_only
    from trust_oracles.training import custom_loss_name, train

    root, data = tree
    alone = train(head_settings(root, data, out=root / "hinge-alone"), loss=squared_hinge)
    cfg = replace(head_settings(root, data), loss=custom_loss_name(squared_hinge))
    bank = train_head_only([replace(cfg, out=str(root / f"hinge-{i}")) for i in range(2)],
                           loss_fn=squared_hinge)
    expected = step_losses(alone.run_dir)
    for summary in bank:      # a column of (B, 2) products rounds as (B, 1)'s to float32 only
        got = step_losses(Path(summary["run_dir"]))
        assert got.keys() == expected.keys()
        np.testing.assert_allclose(list(got.values()), list(expected.values()), rtol=1e-5)


def test_a_module_loss_is_called_once_per_training_step_and_names_its_run(tree):
    from trust_oracles.training import train

    root, data = tree
    hinge = CountingHinge()
    result = train(head_settings(root, data, epochs=2), loss=hinge, loss_name="hinge-m1")
    assert hinge.training_calls == result.total_steps > 0
    assert result.run.loss == "custom:hinge-m1" and "custom-hinge-m1" in result.run_dir.name
    other = train(head_settings(root, data, epochs=2), loss=CountingHinge(2.0),
                  loss_name="hinge-m2")
    assert other.run.group != result.run.group and other.run_dir != result.run_dir
    assert step_losses(other.run_dir) != step_losses(result.run_dir)


def test_loss_options_of_the_built_in_losses_are_refused_with_a_users_loss(tree):
    from trust_oracles.training import LossOptionError, train

    root, data = tree
    with pytest.raises(LossOptionError, match="--pos-weight does not apply to the custom loss "
                                              "custom:test_api_training.squared_hinge"):
        train(head_settings(root, data, pos_weight=2.0), loss=squared_hinge)


@pytest.mark.parametrize("loss,message", [
    (per_row, r"returned shape \(8,\): expected a scalar"),
    (nan_loss, "returned nan on the first training batch"),
    (detached, "without a gradient"), (as_float, "returned a float, not a torch.Tensor")])
def test_a_loss_that_returns_no_usable_number_is_named(tree, loss, message):
    from trust_oracles.training import CustomLossError, train

    root, data = tree
    with pytest.raises(CustomLossError, match=f"custom loss custom:test_api_training"
                                              f".{loss.__name__} .*{message}"):
        train(head_settings(root, data, runs_root=root / "bad"), loss=loss)


def test_runs_that_cannot_name_or_find_their_loss_are_refused(tree):
    from cache.runs import RunError
    from trust_oracles.errors import InputError
    from trust_oracles.training import train

    root, data = tree
    cfg = head_settings(root, data)
    with pytest.raises(InputError, match="loss_name="):
        train(cfg, loss=lambda z, c: squared_hinge(z, c))
    with pytest.raises(RunError, match="train it from Python"):
        train(replace(cfg, loss="custom:test_api_training.squared_hinge"))


# ------------------------------------------------------------- a head on arrays in memory --
def separable(n=600, d=12, seed=0):
    rng = np.random.default_rng(seed)
    correct = rng.random(n) < 0.7
    x = rng.normal(size=(n, d)).astype(np.float32)
    x[:, 0] += np.where(correct, 2.5, -2.5)
    return x, correct


@pytest.mark.parametrize("loss", ["ss", "ce", squared_hinge])
def test_train_head_separates_separable_features(loss):
    from pipeline.core.metrics import auc
    from trust_oracles.training import HeadOracle, train_head

    x, correct = separable()
    oracle = train_head(x, correct, loss=loss, batch_size=32, device="cpu")
    assert isinstance(oracle, HeadOracle) and oracle.total_steps == 2 * (570 // 32)
    x_new, correct_new = separable(seed=1)
    conf = oracle.score(x_new)
    assert conf.shape == (600,) and conf.dtype == np.float32 and ((conf > 0) & (conf < 1)).all()
    assert auc(conf, correct_new) > 0.99
    assert oracle.val_aupr_error is not None and len(oracle.val_rows) == 30
    assert [e["step"] for e in oracle.log if "loss" in e] == list(range(1, oracle.total_steps + 1))


def test_train_head_is_the_head_only_run_on_the_same_features(tree):
    """The run's own features and labels, in memory: the same steps, the same head kept, the
    same scores (a --no-flip run: arrays have one view)."""
    from cache.reader import ClassifierCache
    from trust_oracles.training import train_head

    root, data = tree
    opts = ("--loss", "ss", "--no-flip", "--lr", 0.05, "--momentum", 0.9, "--weight-decay", 0,
            "--warmup-steps", 100, "--epochs", 3, "--val-fraction", 0.25, "--seed", 1,
            "--runs-root", root / "runs-arrays", "--device", "cpu")    # as train_head below
    run = cli_run(run_cli(head_cli(root, data, *opts)).output)
    caches = root / "cache" / CLASSIFIER
    train = ClassifierCache.open(caches / "train").load(["features", "correct"])
    val = ClassifierCache.open(caches / "val").load(["features"])
    oracle = train_head(train["features"].astype(np.float32), train["correct"].astype(bool),
                        loss="ss", lr=0.05, momentum=0.9, weight_decay=0.0, warmup_steps=100,
                        batch_size=8, epochs=3, val_fraction=0.25, seed=1, log_every=1,
                        device="cpu")
    losses = {e["step"]: e["loss"] for e in oracle.log if "loss" in e}
    assert losses == step_losses(run)
    assert [e["val"] for e in oracle.log if "val" in e] == val_log(run)
    doc = json.loads((run / "run.json").read_text())
    assert oracle.best_step == doc["best"]["step"]
    val_z = oracle.z(val["features"].astype(np.float32))
    np.testing.assert_array_equal(val_z, output_z(run, "val"))


def test_train_head_refuses_arrays_it_cannot_train_on():
    from trust_oracles.errors import InputError
    from trust_oracles.training import CustomLossError, LossOptionError, train_head

    x, correct = separable(n=200)
    cases = [((x[:, 0], correct), {}, r"features: got float32 of shape \(200,\)"),
             ((x, correct[:-1]), {}, r"correct: got shape \(199,\); expected \(200,\)"),
             ((x, np.full(200, 2)), {}, "values other than 0 and 1"),
             ((x, np.ones(200, bool)), {}, "only correct rows"),
             ((x, correct), {"loss": "tcp"}, "the target of loss 'tcp'"),
             ((x, correct), {"head": "round"}, "head: got 'round'"),
             ((x, correct), {"epochs": 1, "batch_size": 128}, "1 optimizer step"),
             ((np.where(np.arange(200)[:, None] == 7, np.nan, x), correct), {}, "row 7")]
    for args, kwargs, message in cases:
        with pytest.raises(InputError, match=message):
            train_head(*args, device="cpu", **kwargs)
    with pytest.raises(LossOptionError, match="--gamma does not apply to --loss ce"):
        train_head(x, correct, loss="ce", loss_options={"gamma": 1.0}, batch_size=32,
                   device="cpu")
    with pytest.raises(CustomLossError, match="custom loss custom:test_api_training.per_row"):
        train_head(x, correct, loss=per_row, batch_size=32, device="cpu")
    oracle = train_head(x, correct, loss="ce", batch_size=32, device="cpu")
    with pytest.raises(InputError, match="11 columns; expected 12"):
        oracle.score(x[:, 1:])


def test_a_users_loss_is_applied_to_each_column_of_a_bank():
    from pipeline.oracle.nets.losses import CustomLoss

    g = torch.Generator().manual_seed(0)
    z = torch.randn(16, 3, generator=g, requires_grad=True)
    o = (torch.rand(16, generator=g) < 0.6).float()
    got = CustomLoss(squared_hinge, "custom:h").batch_mean(z, o, torch.zeros(16))
    assert got.shape == (3,)
    for p in range(3):
        assert got[p] == squared_hinge(z[:, p], o)
