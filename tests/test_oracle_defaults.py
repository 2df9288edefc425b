"""Defaults that fit any backbone and any size: the oracle starts from the weights the
classifier cache recorded, SS's slopes for a backbone the paper did not train, a split too small
for the paper's protocol, too few held-out rows, fit-classifier's split, and the hints that name
--weights and --data.  Each message is listed in docs/BAD_INPUT.md."""
from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_error
from oracle_fixtures import CLASSIFIER, TINY_VIT_KWARGS, run_cli, train_args, write_colour_tree

CLASSIFIER_KWARGS = {**TINY_VIT_KWARGS, "num_classes": 3}


def save_weights(path: Path, seed: int) -> Path:
    import timm
    import torch

    torch.manual_seed(seed)
    torch.save(timm.create_model(CLASSIFIER, **CLASSIFIER_KWARGS).state_dict(), path)
    return path


def extract_with(data: Path, cache: Path, weights: Path, *extra):
    """The classifier from a weights file, as a user with their own classifier extracts it."""
    return run_cli(["extract", "--classifier", CLASSIFIER, "--weights", weights, "--model-kwargs",
                    json.dumps(CLASSIFIER_KWARGS), "--data", data, "--out", cache, "--split",
                    "train", "--split", "val", "--workers", 0, "--precision", "fp32",
                    "--no-progress", *extra])


def without_random_init(args: list) -> list:
    return [a for a in args if a != "--random-init"]


def run_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.glob("*/run.json"))


@pytest.fixture(scope="module")
def stage1(tmp_path_factory):
    base = tmp_path_factory.mktemp("defaults")
    data = write_colour_tree(base / "colours", {"train": 12, "val": 4})
    weights = save_weights(base / "classifier.pth", seed=0)   # mixed predictions
    extract_with(data, base / "cache", weights)
    return data, base / "cache", weights


# --------------------------------------------------------------------- the oracle's weights --
def test_an_oracle_of_the_classifiers_architecture_starts_from_the_weights_its_cache_recorded(
        stage1, tmp_path, monkeypatch):
    """It went to the hub (offline: an error asking for --weights, the file the cache records)."""
    data, cache, weights = stage1
    monkeypatch.chdir(tmp_path)      # not extract's directory: the manifest's absolute path
    runs = tmp_path / "runs"
    base = without_random_init(train_args(data, cache, None, "--runs-root", runs,
                                          "--batch-size", 4, "--val-fraction", 0))
    result = run_cli(base)
    assert (f"note: the oracle ({CLASSIFIER}, the classifier's architecture) starts from the "
            f"classifier's weights {weights.resolve()}, as cache") in result.output
    [run] = run_dirs(runs)
    record = json.loads((run / "run.json").read_text())
    config = record["run"]["config"]
    assert config["weights"] == str(weights.resolve()) and not config["hub_weights"]
    assert config["weights_sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert "starts from the classifier's weights" in record["protocol"]["notes"]["weights"]
    # the same file named with --weights: the same weights, so the same group and run
    again = run_cli(base + ["--weights", weights])
    assert "already complete" in again.output and run_dirs(runs) == [run]


def test_a_weights_file_named_relative_to_extracts_directory_is_found_from_another(
        tmp_path, monkeypatch):
    """The manifest records the file's absolute path (config.weights keeps it as given)."""
    data = write_colour_tree(tmp_path / "colours", {"train": 8, "val": 4})
    (tmp_path / "a").mkdir()
    save_weights(tmp_path / "a" / "mine.pth", seed=0)
    monkeypatch.chdir(tmp_path / "a")
    extract_with(data, tmp_path / "cache", Path("mine.pth"))
    monkeypatch.chdir(tmp_path)                       # where mine.pth is not
    out = tmp_path / "run"
    run_cli(without_random_init(train_args(data, tmp_path / "cache", out, "--batch-size", 4)))
    config = json.loads((out / "run.json").read_text())["run"]["config"]
    assert config["weights"] == str(tmp_path / "a" / "mine.pth")


def test_recorded_weights_that_changed_or_went_missing_are_refused_naming_the_fix(tmp_path):
    data = write_colour_tree(tmp_path / "colours", {"train": 8, "val": 4})
    weights = save_weights(tmp_path / "mine.pth", seed=0)
    cache, out = tmp_path / "cache", tmp_path / "run"
    extract_with(data, cache, weights)
    args = without_random_init(train_args(data, cache, out, "--batch-size", 4))
    save_weights(weights, seed=3)                                   # changed in place
    assert_error(run_cli(args, expect=None),
                 rf"cache .*train was extracted with --weights {weights.resolve()}, the weights "
                 rf"an oracle of the classifier's architecture starts from, but .*mine.pth now "
                 r"holds other weights \(sha256 [0-9a-f]{12}\.\.\., the cache recorded "
                 r"[0-9a-f]{12}\.\.\.\): restore it, or pass --weights FILE .* or --hub-weights")
    weights.unlink()                                                # gone
    assert_error(run_cli(args, expect=None), r"but .*mine.pth is missing: restore it, or pass "
                                             r"--weights FILE")
    assert not out.exists()
    # --hub-weights: the hub, refused in seconds offline with the same fix
    start = time.perf_counter()
    assert_error(run_cli(args + ["--hub-weights"], expect=None),
                 r"could not fetch pretrained weights for .*Pass --weights FILE")
    assert time.perf_counter() - start < 15, "the hub was retried"
    assert not out.exists()
    both = run_cli(args + ["--hub-weights", "--random-init"], expect=2).output
    assert "--hub-weights excludes --weights and --random-init" in both


# ----------------------------------------------------------------------------- SS's slopes --
def test_ss_slopes_of_a_backbone_the_paper_did_not_train_follow_one_stated_rule():
    from pipeline.core.presets import IMAGENET_PRESETS, SS_ALPHAS, ss_slopes

    for name in ("vit", "resnet", *IMAGENET_PRESETS.values(), "deit_small_patch16_224",
                 "resnet10t", "resnext50_32x4d"):          # the paper's: unchanged, no note
        alphas, why = ss_slopes(name)
        assert why is None and alphas in SS_ALPHAS.values(), name
    assert ss_slopes("vit")[0] == (1.0, 3.0) and ss_slopes("resnet")[0] == (2.0, 5.0)
    swin, why = ss_slopes("swin_tiny_patch4_window7_224")
    assert swin == SS_ALPHAS["vit"] and "attention model" in why and "'swin'" in why
    cnn, why = ss_slopes("mine", "efficientnet_lite0")     # a user's name, resolved to a CNN
    assert cnn == SS_ALPHAS["resnet"] and "ResNet (convolutional) values" in why


def test_a_sweep_of_an_unknown_backbone_fixes_the_rules_slopes():
    """It was refused: `oracle ... has no preset SS slopes: give --fixed-alpha-pos ...`."""
    from pipeline.oracle.settings.config import TrainConfig
    from pipeline.sweep.run import default_fixed

    assert default_fixed(TrainConfig(oracle="efficientnet_lite0")) == {"alpha_pos": 2.0,
                                                                       "alpha_neg": 5.0}
    assert default_fixed(TrainConfig(oracle="swin_tiny_patch4_window7_224")) == {
        "alpha_pos": 1.0, "alpha_neg": 3.0}
    assert default_fixed(TrainConfig(oracle="resnet")) == {"alpha_pos": 2.0, "alpha_neg": 5.0}


def test_ss_with_an_unknown_backbone_trains_with_the_rules_slopes_and_says_so(stage1, tmp_path):
    """Without held-out rows to choose the slopes on, it is refused, naming both fixes."""
    data, cache, _ = stage1
    out = tmp_path / "run"
    args = train_args(data, cache, out, "--batch-size", 4, "--val-fraction", 0, loss="ss")
    i = args.index("--oracle")
    args[i + 1] = "mobilenetv3_small_050"
    j = args.index("--model-kwargs")
    del args[j:j + 2]
    refused = run_cli(args, expect=1)
    assert ("--loss ss on oracle mobilenetv3_small_050: the paper gives SS slopes for ViT and "
            "ResNet backbones only, and --val-fraction 0 leaves no held-out rows") in refused.output
    assert "--alpha-pos and --alpha-neg" in refused.output and "cli.py sweep" in refused.output
    assert not (out / "run.json").exists()
    args[args.index("--val-fraction") + 1] = 0.25
    result = run_cli(args)
    assert ("note: SS slopes alpha+ = 2, alpha- = 5 for oracle mobilenetv3_small_050: neither a "
            "ViT nor a ResNet, nor an attention model by its name, so the paper's ResNet "
            "(convolutional) values") in result.output
    record = json.loads((out / "run.json").read_text())
    config = record["run"]["config"]
    assert (config["alpha_pos"], config["alpha_neg"]) == (2.0, 5.0)
    assert "ResNet (convolutional) values" in record["protocol"]["notes"]["ss_slopes"]
    given = run_cli(args[:-2] + ["--out", tmp_path / "given", "--alpha-pos", 1, "--alpha-neg", 4])
    assert "SS slopes" not in given.output
    labels = json.loads((tmp_path / "given" / "run.json").read_text())["run"]
    assert (labels["variant"], labels["loss_label"]) == ("a1-4", "SS (α+ 1, α− 4)")
    assert labels["group"] != record["run"]["group"]


# ------------------------------------------------------------------- steps and held-out rows --
def test_the_small_run_rule_leaves_given_epochs_and_the_embedded_preset_alone():
    from pipeline.core.presets import MAX_AUTO_EPOCHS
    from pipeline.oracle.settings.config import TrainConfig, resolve_protocol
    from pipeline.oracle.settings.defaults import small_run_epochs

    paper, origin = resolve_protocol(TrainConfig(), embedded=False)      # batch 40, 1 epoch
    raised, note = small_run_epochs(paper, origin, 100)                   # 2 steps
    assert raised.epochs == MAX_AUTO_EPOCHS and "100 training rows make 2 optimizer step(s)" in note
    assert small_run_epochs(paper, origin, 40 * 1000) == (paper, None)   # 1000 steps: the preset
    given, origin = resolve_protocol(TrainConfig(epochs=1), embedded=False)
    assert small_run_epochs(given, origin, 100) == (given, None)         # --epochs wins
    embedded, origin = resolve_protocol(TrainConfig(train_limit=0), embedded=True)
    assert small_run_epochs(embedded, origin, 300) == (embedded, None)   # tuned for its data


def test_a_preset_batch_the_rows_cannot_fill_shrinks_and_a_given_one_is_kept():
    from pipeline.oracle.settings.config import TrainConfig, resolve_protocol
    from pipeline.oracle.settings.defaults import small_run_batch

    paper, origin = resolve_protocol(TrainConfig(), embedded=False)      # batch 40
    smaller, note = small_run_batch(paper, origin, 38)                   # 38 labelled photos
    assert smaller.batch_size == 8
    assert note.startswith("38 training rows make 0 step(s) an epoch of the preset's batch of 40")
    assert small_run_batch(paper, origin, 5)[0].batch_size == 1
    assert small_run_batch(paper, origin, 63)[0].batch_size == 8        # 1 step of 40 an epoch
    assert small_run_batch(paper, origin, 160) == (paper, None)         # 4 steps of 40
    given, origin = resolve_protocol(TrainConfig(batch_size=64), embedded=False)
    assert small_run_batch(given, origin, 38) == (given, None)          # refused by prepare


def test_a_given_batch_larger_than_the_training_rows_says_what_to_pass(stage1, tmp_path):
    data, cache, _ = stage1
    result = run_cli(train_args(data, cache, tmp_path / "r", "--batch-size", 10_000), expect=None)
    assert_error(result, r"training rows, fewer than --batch-size 10000: pass a --batch-size of "
                         r"at most \d+ \(or leave it out")


def test_too_few_held_out_rows_warn_with_the_val_fraction_that_would_do():
    from pipeline.oracle.settings.config import TrainConfig
    from pipeline.oracle.settings.defaults import heldout_note

    cfg = TrainConfig(val_fraction=0.05)
    few = heldout_note(cfg, 2000, np.array([1] * 95 + [0] * 5, np.float32))
    assert few.startswith("only 100 held-out row(s) (95 correct, 5 incorrect) choose the "
                          "checkpoint")
    assert few.endswith("pass --val-fraction 0.1 (about 200 rows)")    # 10 errors at 5%
    small = heldout_note(cfg, 120, np.array([1, 0, 1, 1, 0, 1], np.float32))
    assert "only 6 held-out row(s)" in small and "pass --val-fraction 0.84" not in small
    assert "cannot spare 100" in small
    assert heldout_note(cfg, 900, np.array([1, 0, 1], np.float32)).endswith(
        "pass --val-fraction 0.12 (about 100 rows)")
    assert heldout_note(cfg, 4000, np.array([1] * 150 + [0] * 50, np.float32)) is None
    assert heldout_note(cfg, 4000, np.array([], np.float32)) is None     # --val-fraction 0


def test_a_run_with_few_held_out_rows_warns_and_the_report_says_what_its_baselines_need(
        stage1, tmp_path):
    data, cache, weights = stage1
    runs = tmp_path / "runs"
    args = without_random_init(train_args(data, cache, None, "--runs-root", runs,
                                          "--batch-size", 4, "--val-fraction", 0.2))
    result = run_cli(args)
    assert "warning: only 7 held-out row(s) (" in result.output
    assert "the report's temperature-scaled baselines are not fitted on fewer" in result.output
    report = run_cli(["report", "--runs-root", runs, "--out", tmp_path / "report", "--no-ci",
                      "--no-figures"], expect=None)
    text = (tmp_path / "report" / "report.md").read_text() if report.exit_code == 0 else ""
    assert report.exit_code == 0, report.output
    assert "7 held-out row(s)" in text and "fitting needs at least 100 rows" in text


# ------------------------------------------------ hints that name --weights and --data --
def test_errors_whose_fix_is_data_or_weights_say_so(stage1, tmp_path, monkeypatch, fmnist_dir):
    data, cache, weights = stage1
    monkeypatch.chdir(tmp_path)
    # train-oracle without --data (and --cache): it looked for the embedded dataset's caches
    args = train_args(data, cache, tmp_path / "r")
    for option in ("--data", "--cache"):
        i = args.index(option)
        del args[i:i + 2]
    assert_error(run_cli(args, expect=None),
                 r"no classifier cache for split 'train' at .*: run `python cli.py extract "
                 r"--classifier vit_tiny_patch16_224 \[--weights FILE\] --split <split> .*no "
                 r"--data was given, which means the embedded Fashion-MNIST: pass --data ROOT")
    # extract of one's own 3-class classifier without --data: the embedded 10 classes
    result = run_cli(["extract", "--classifier", CLASSIFIER, "--weights", weights,
                      "--model-kwargs", json.dumps(CLASSIFIER_KWARGS),
                      "--split", "test", "--out", tmp_path / "c", "--no-progress"], expect=None)
    assert_error(result, r"has 3 outputs but split 'test' of .* has 10 classes .* is "
                         r"Fashion-MNIST, the dataset used when no --data is given: for your own "
                         r"images pass --data ROOT\. Use a classifier of these classes "
                         r"\(--weights FILE: ")
    # an evaluation cache of other weights than the training cache's
    mixed = tmp_path / "mixed"
    shutil.copytree(cache / CLASSIFIER / "train", mixed / CLASSIFIER / "train")
    other = save_weights(tmp_path / "other.pth", seed=5)
    run_cli(["extract", "--classifier", CLASSIFIER, "--weights", other, "--model-kwargs",
             json.dumps(CLASSIFIER_KWARGS), "--data", data, "--out", mixed, "--split", "val",
             "--workers", 0, "--precision", "fp32", "--no-progress"])
    assert_error(run_cli(train_args(data, mixed, tmp_path / "r"), expect=None),
                 r"cache .*val holds a different cache:.*weights_sha256.*re-extract it with the "
                 r"same --classifier, --weights FILE, --model-kwargs and --preprocess")
    # extract into a cache of other weights
    assert_error(run_cli(["extract", "--classifier", CLASSIFIER, "--weights", weights,
                          "--model-kwargs", json.dumps(CLASSIFIER_KWARGS), "--data", data,
                          "--out", mixed, "--split", "val", "--workers", 0, "--precision",
                          "fp32", "--no-progress"], expect=None),
                 r"holds a different cache:.*weights_sha256.*To complete or reuse it, pass the "
                 r"--data, --weights FILE and other options it was extracted with")
