"""``cli.py export``: a finished run's oracle as a Hugging Face Hub-layout folder, loaded back by
``load_oracle`` and ``predict --images`` (from the folder and from an offline hub cache) with the
run's scores bit for bit; every bad input refused in one line naming the file and the fix."""
from __future__ import annotations

import csv
import json
import shutil
import sys

import numpy as np
import pytest
import torch

from cache.export import CARD, CONFIG, EXPORT_KIND, EXPORT_VERSION, WEIGHTS
from cache.integrity import file_sha256 as sha256_file
from cache.outputs import output_paths, read_outputs
from oracle_fixtures import CLASSIFIER, TINY_VIT_KWARGS, extract, run_cli, train_args, \
    trained_colour_run
from trust_oracles import load_oracle, open_cache, open_run
from trust_oracles.errors import CacheMismatch

FAST = ("--workers", 0, "--no-progress")
REV = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    base = tmp_path_factory.mktemp("export")
    data, cache, run = trained_colour_run(base)
    run_cli(["export", run, "--out", base / "shared", "--resamples", 50])
    return data, cache, run, base / "shared"


def val_files(data) -> list[str]:
    return sorted(str(p) for p in (data / "val").rglob("*.JPEG"))


def cli_error(args, code: int = 1) -> str:
    """The one line cli.py prints for a user's mistake (no traceback), without ``error: ``."""
    result = run_cli(args, expect=code)
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, result.output
    return lines[0][len("error: "):]


def table(path) -> dict[str, dict]:
    with open(path, newline="") as fh:
        return {r["path"]: r for r in csv.DictReader(fh)}


def hub_cache(root, shared, repo="org/tiny-oracle"):
    """The standard Hugging Face cache layout holding ``shared`` as ``repo``'s main revision."""
    folder = root / f"models--{repo.replace('/', '--')}"
    shutil.copytree(shared, folder / "snapshots" / REV)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(REV)
    return root


@pytest.fixture
def offline_hub(trained, tmp_path, monkeypatch):
    root = hub_cache(tmp_path / "hf", trained[3])
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return root


# --------------------------------------------------------------------------- the folder --
def test_the_folder_holds_weights_config_and_card(trained):
    _, cache, run, shared = trained
    assert sorted(p.name for p in shared.iterdir()) == sorted([WEIGHTS, CONFIG, CARD])
    config = json.loads((shared / CONFIG).read_text())
    assert config["kind"] == EXPORT_KIND and config["version"] == EXPORT_VERSION
    for name in (WEIGHTS, CARD):
        assert config["files"][name]["sha256"] == sha256_file(shared / name)
    ident = open_cache(cache / CLASSIFIER / "train").identity
    assert config["classifier"]["identity"]["weights_sha256"] == ident["weights_sha256"]
    assert config["training_data"]["dataset_fingerprint"] == ident["dataset_fingerprint"]
    assert config["oracle"]["model"] == CLASSIFIER and config["loss"]["name"] == "ce"
    assert config["threshold"]["chosen_by"] == "tpr=0.95"
    card = (shared / CARD).read_text()
    assert f"trust_oracles_weights_sha256: {sha256_file(shared / WEIGHTS)}" in card
    assert "| val | 12 |" in card and "## Limitations" in card
    assert config["metrics"]["splits"]["val"]["metrics"]["auc"]["low"] is not None
    assert not list(shared.parent.glob(".shared.*"))        # no temporary folder left


def test_the_exported_oracle_scores_as_its_run_bit_for_bit(trained):
    data, _, run, shared = trained
    files = val_files(data)
    mine = load_oracle(run, device="cpu", batch_size=5).score_files(files)
    theirs = load_oracle(shared, device="cpu", batch_size=5).score_files(files)
    for name in ("z", "confidence", "msp", "pred", "trust"):
        np.testing.assert_array_equal(getattr(theirs, name), getattr(mine, name))
    assert theirs.threshold == mine.threshold
    # the labelled split: the run's own outputs of it, as load_oracle compares with them
    stored = open_run(run).scores("val")
    written = dict(zip(stored.paths, stored.confidence))
    np.testing.assert_allclose(theirs.confidence, [written[p] for p in files], atol=1e-6)


def test_predict_images_on_the_folder_writes_the_runs_table(trained, tmp_path):
    data, _, run, shared = trained
    run_cli(["predict", "--run", run, "--images", data / "val", "--out-file",
             tmp_path / "run.csv", *FAST])
    run_cli(["predict", "--run", shared, "--images", data / "val", "--out-file",
             tmp_path / "shared.csv", *FAST])
    assert table(tmp_path / "shared.csv") == table(tmp_path / "run.csv")
    meta = json.loads((tmp_path / "shared.meta.json").read_text())
    assert meta["trust"]["threshold"] == json.loads(
        (tmp_path / "run.meta.json").read_text())["trust"]["threshold"]
    message = cli_error(["predict", "--run", shared, "--images", data / "val", *FAST])
    assert "is an exported oracle" in message and "--out-file FILE" in message


def test_predict_a_labelled_split_with_the_folder_writes_the_runs_outputs(trained, tmp_path):
    data, cache, run, shared = trained
    run_cli(["predict", "--run", shared, "--split", "val", "--data", data, "--cache", cache,
             "--out-file", tmp_path / "val.h5", *FAST])
    mine, theirs = read_outputs(run / "outputs" / "val.h5"), read_outputs(tmp_path / "val.h5")
    for column in ("z", "confidence", "valid", "correct", "index", "pred"):
        np.testing.assert_array_equal(theirs.columns[column], mine.columns[column])
    assert output_paths(theirs) == output_paths(mine)
    message = cli_error(["predict", "--run", shared, "--split", "val", "--data", data, *FAST])
    assert "--cache ROOT" in message and "--out-file FILE.h5" in message
    message = cli_error(["predict", "--run", shared, "--split", "train", "--data", data,
                         "--cache", cache, "--out-file", tmp_path / "train.h5", *FAST])
    assert "lists the images the exported oracle" in message


# ------------------------------------------------------------------------------ the hub --
def test_an_offline_hub_cache_loads_and_predicts(trained, offline_hub, tmp_path):
    data, _, run, _ = trained
    files = val_files(data)
    hub = load_oracle("hf-hub:org/tiny-oracle", device="cpu").score_files(files)
    mine = load_oracle(run, device="cpu").score_files(files)
    np.testing.assert_array_equal(hub.confidence, mine.confidence)
    run_cli(["predict", "--run", "hf-hub:org/tiny-oracle", "--images", data / "val",
             "--out-file", tmp_path / "hub.csv", *FAST])
    assert len(table(tmp_path / "hub.csv")) == 12


def test_a_hub_id_not_in_the_offline_cache_fails_at_once(trained, offline_hub):
    message = cli_error(["predict", "--run", "hf-hub:org/absent", "--images",
                         trained[0] / "val", "--out-file", "x.csv", *FAST])
    assert "hf-hub:org/absent is not in the local Hugging Face cache" in message
    assert "HF_HUB_OFFLINE" in message and str(offline_hub) in message


def test_without_huggingface_hub_the_install_is_named(trained, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    message = cli_error(["predict", "--run", "hf-hub:org/x", "--images", trained[0] / "val",
                         "--out-file", "x.csv", *FAST])
    assert "pip install 'trust-oracles[hub]'" in message


# -------------------------------------------------------------------------- bad input --
@pytest.fixture
def copy(trained, tmp_path):
    return shutil.copytree(trained[3], tmp_path / "copy")


def predict_error(trained, folder) -> str:
    return cli_error(["predict", "--run", folder, "--images", trained[0] / "val",
                      "--out-file", folder.parent / "t.csv", *FAST])


@pytest.mark.parametrize("name", [WEIGHTS, CARD, CONFIG])
def test_a_missing_file_is_named(trained, copy, name):
    (copy / name).unlink()
    message = predict_error(trained, copy)
    assert f"{name} is missing" in message and "cli.py export" in message


def test_an_altered_file_is_named_with_both_hashes(trained, copy):
    with open(copy / WEIGHTS, "r+b") as fh:
        fh.seek(-1, 2)
        last = fh.read(1)
        fh.seek(-1, 2)
        fh.write(bytes([last[0] ^ 1]))
    message = predict_error(trained, copy)
    assert f"{WEIGHTS} was altered" in message and "--force" in message


def test_a_card_of_other_weights_is_refused(trained, copy):
    """The card names the weights its metrics belong to; config.json rewritten to match the new
    card still does not make them these weights' metrics."""
    card = (copy / CARD).read_text()
    (copy / CARD).write_text(card.replace(sha256_file(copy / WEIGHTS), "0" * 64))
    config = json.loads((copy / CONFIG).read_text())
    config["files"][CARD]["sha256"] = sha256_file(copy / CARD)
    (copy / CONFIG).write_text(json.dumps(config))
    message = predict_error(trained, copy)
    assert "its metrics do not describe these weights" in message and "000000000000" in message


def test_another_format_version_is_refused(trained, copy):
    config = json.loads((copy / CONFIG).read_text())
    (copy / CONFIG).write_text(json.dumps({**config, "version": EXPORT_VERSION + 1}))
    assert f"reads version {EXPORT_VERSION}" in predict_error(trained, copy)


def test_an_unfinished_run_is_not_exported(trained, tmp_path):
    run = shutil.copytree(trained[2], tmp_path / "run")
    record = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**record, "status": "running"}))
    message = cli_error(["export", run, "--out", tmp_path / "out"])
    assert "is not complete" in message and not (tmp_path / "out").exists()


def test_a_non_empty_folder_needs_force(trained, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    message = cli_error(["export", trained[2], "--out", out])
    assert f"--out {out} is a folder that is not empty" in message and "--force" in message
    assert (out / "keep.txt").read_text() == "mine"
    run_cli(["export", trained[2], "--out", out, "--force", "--resamples", 0])
    assert sorted(p.name for p in out.iterdir()) == sorted([WEIGHTS, CONFIG, CARD])


def test_a_failed_export_leaves_nothing(trained, tmp_path, monkeypatch):
    from pipeline.oracle.deploy import exported

    def full(module, path):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(exported, "save_oracle", full)
    with pytest.raises(OSError):
        from trust_oracles.export import export_oracle
        export_oracle(trained[2], tmp_path / "out", resamples=0)
    assert list(tmp_path.iterdir()) == []


def test_another_classifier_cache_is_refused_naming_both_hashes(trained, tmp_path):
    data, _, _, shared = trained
    extract(data, tmp_path / "cache", splits=("val",), seed=3, flip_view=False)
    other = open_cache(tmp_path / "cache" / CLASSIFIER / "val")
    oracle = load_oracle(shared, device="cpu")
    with pytest.raises(CacheMismatch) as err:
        oracle.check_cache(other)
    text = str(err.value)
    assert other.identity["weights_sha256"] in text
    assert oracle._classifier["weights_sha256"] in text and "--weights FILE" in text


@pytest.fixture(scope="module")
def weights_export(trained, tmp_path_factory):
    """An exported oracle whose classifier came from a weights file (--weights)."""
    import timm

    data, base = trained[0], tmp_path_factory.mktemp("export-weights")
    for seed, name in ((5, "mine.pth"), (6, "other.pth")):
        torch.manual_seed(seed)
        torch.save(timm.create_model(CLASSIFIER, pretrained=False, num_classes=3,
                                     **TINY_VIT_KWARGS).state_dict(), base / name)
    run_cli(["extract", "--classifier", CLASSIFIER, "--weights", base / "mine.pth",
             "--model-kwargs", json.dumps(TINY_VIT_KWARGS), "--data", data, "--out",
             base / "cache", "--split", "train", "--split", "val", "--precision", "fp32", *FAST])
    run_cli(train_args(data, base / "cache", base / "run", "--val-fraction", 0.25,
                       "--batch-size", 4))
    run_cli(["export", base / "run", "--out", base / "shared", "--resamples", 0,
             "--threshold", 0.5])
    return base


def test_other_classifier_weights_are_refused_naming_both_hashes(trained, weights_export):
    base = weights_export
    message = cli_error(["predict", "--run", base / "shared", "--images", trained[0] / "val",
                         "--out-file", base / "t.csv", "--weights", base / "other.pth", *FAST])
    assert sha256_file(base / "other.pth") in message and sha256_file(base / "mine.pth") in message
    assert "pass --weights FILE with that classifier's weights file" in message
    run_cli(["predict", "--run", base / "shared", "--images", trained[0] / "val",
             "--out-file", base / "t.csv", "--weights", base / "mine.pth", *FAST])


def test_an_unreachable_hub_falls_back_to_the_cache_at_once(trained, offline_hub, monkeypatch):
    """Without HF_HUB_OFFLINE but no network: one probe, then the local cache only."""
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")         # nothing listens there
    assert load_oracle("hf-hub:org/tiny-oracle", device="cpu").threshold() > 0
    message = cli_error(["predict", "--run", "hf-hub:org/absent", "--images",
                         trained[0] / "val", "--out-file", "x.csv", *FAST])
    assert "and the hub cannot be reached" in message


@pytest.fixture(scope="module")
def head_only_export(trained, tmp_path_factory):
    """A head-only run (features cached) and its export."""
    data, base = trained[0], tmp_path_factory.mktemp("export-head")
    extract(data, base / "cache", extra=("--features",), flip_view=False)
    run_cli(["train-oracle", "--classifier", CLASSIFIER, "--oracle", CLASSIFIER, "--random-init",
             "--model-kwargs", json.dumps({**TINY_VIT_KWARGS, "num_classes": 3}), "--data", data,
             "--cache", base / "cache", "--loss", "ss", "--batch-size", 4, "--no-progress",
             "--head-only", "--no-flip", "--epochs", 2, "--lr", 0.05, "--val-fraction", 0.25,
             "--out", base / "run"])
    run_cli(["export", base / "run", "--out", base / "shared", "--resamples", 0,
             "--threshold", 0.5])
    return base


def test_a_head_only_export_scores_as_its_run_bit_for_bit(trained, head_only_export):
    base, files = head_only_export, val_files(trained[0])
    config = json.loads((base / "shared" / CONFIG).read_text())
    assert config["oracle"]["head_only"] and config["threshold"]["chosen_by"] == "--threshold"
    mine = load_oracle(base / "run", device="cpu").score_files(files, threshold=0.5)
    theirs = load_oracle(base / "shared", device="cpu").score_files(files)
    np.testing.assert_array_equal(theirs.z, mine.z)
    np.testing.assert_array_equal(theirs.trust, mine.trust)


def test_the_card_shows_a_reports_rows_of_the_run(trained, tmp_path):
    run = trained[2]
    run_cli(["report", run, "--out", tmp_path / "rep", "--no-figures", "--format", "json",
             "--jobs", 1, "--resamples", 50])
    rows = json.loads((tmp_path / "rep" / "report.json").read_text())["evaluations"]
    auc = next(r for r in rows if r["kind"] == "oracle")["metrics"]["standard"]["values"]["auc"]
    run_cli(["export", run, "--out", tmp_path / "out", "--report", tmp_path / "rep" /
             "report.json"])
    config = json.loads((tmp_path / "out" / CONFIG).read_text())
    assert config["metrics"]["source"].startswith("report report.json")
    assert config["metrics"]["splits"]["val"]["metrics"]["auc"]["value"] == auc
    assert "| val | 12 |" in (tmp_path / "out" / CARD).read_text()
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"evaluations": []}))
    message = cli_error(["export", run, "--out", tmp_path / "o2", "--report", other])
    assert "evaluates no output of run" in message and not (tmp_path / "o2").exists()
