"""What a finished run loads is checked, and gives the run's own numbers back: its training cache
taken by identity (not by path) wherever it is found, a head-only oracle bit for bit its run's
scores, each stored score's device and precision recorded (a note when scoring elsewhere), the
API's errors typed with the fix in its words.  Each case as a user meets it."""
from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest
import torch

from cache.outputs import MadeOn, read_outputs
from conftest import assert_error
from oracle_fixtures import CLASSIFIER, TINY_VIT_KWARGS, extract, run_cli, train_args, \
    write_colour_tree
from trust_oracles import open_run
from trust_oracles.errors import CacheMismatch, ModelError, OtherDeviceNote, RunError
from trust_oracles.oracles import load_oracle

FAST = ("--workers", 0, "--no-progress")
KWARGS = {**TINY_VIT_KWARGS, "num_classes": 3}      # the classifier's own: a head-only O = C


def head_only_args(data, cache, out, *extra):
    return ["train-oracle", "--classifier", CLASSIFIER, "--oracle", CLASSIFIER, "--random-init",
            "--model-kwargs", json.dumps(KWARGS), "--data", data, "--cache", cache, "--loss",
            "ss", "--batch-size", 4, "--no-progress", "--head-only", "--no-flip", "--epochs", 2,
            "--lr", 0.05, "--val-fraction", 0.25, "--out", out, *extra]


def trained(base, features: bool = True):
    """A colour tree, its fp32 cache (train, val; features), a fine-tuned CE run and a head-only
    SS run on it, each holding out a quarter of the training rows: (data, cache, fine, head)."""
    data = write_colour_tree(base / "data", {"train": 8, "val": 4})
    extract(data, base / "cache", flip_view=False, extra=("--features",) if features else ())
    fine = base / "fine"
    run_cli(train_args(data, base / "cache", fine, "--lr", 0.05, "--val-fraction", 0.25,
                       "--batch-size", 4))
    head = base / "head"
    if features:
        run_cli(head_only_args(data, base / "cache", head))
    return data, base / "cache", fine, head


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return trained(tmp_path_factory.mktemp("loads"))


def val_files(data) -> list[str]:
    return sorted(str(p) for p in (data / "val").rglob("*.JPEG"))


def quiet_load(run, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error", OtherDeviceNote)     # none expected: same device, precision
        return load_oracle(run, device="cpu", **kw)


# ------------------------------------------------------------ the training cache, by identity --
def test_a_training_cache_re_extracted_with_another_classifier_is_refused(tmp_path):
    """The same extract command with other weights (here another --seed of a random init) into
    the run's training cache folder: every path that loads the run's classifier refuses, naming
    both weights hashes; nothing is written."""
    data, cache, fine, _ = trained(tmp_path, features=False)
    before = json.loads((fine / "run.json").read_text())["classifier_identity"]["weights_sha256"]
    shutil.rmtree(cache)
    extract(data, cache, seed=1, flip_view=False)
    with pytest.raises(CacheMismatch) as err:
        load_oracle(fine, device="cpu")
    message = str(err.value)
    assert f"run {fine} was trained on the classifier cache {cache / CLASSIFIER / 'train'} as " \
           "it was then, but that folder now holds another classifier's cache" in message
    assert f'the run recorded "{before}"' in message and "weights_sha256: cache has" in message
    assert "Restore the cache the run was trained on" in message
    result = run_cli(["predict", "--run", fine, "--images", data / "val", "--threshold", 0.5,
                      *FAST], expect=None)
    assert_error(result, r"now holds another classifier's cache.*weights_sha256: cache has")
    assert not (fine / "predictions").exists()
    result = run_cli(["predict", "--run", fine, "--data", data, "--cache", cache, "--split",
                      "val", "--out-name", "again", *FAST], expect=None)
    assert_error(result, r"weights_sha256.*extracted with another classifier than the training")
    assert not (fine / "outputs" / "again.h5").exists()


def test_the_reports_held_out_fits_need_the_rows_the_run_held_out(tmp_path):
    """The training split re-extracted in place with the same classifier over other images: the
    run's held-out row numbers name other images there, so the report fits nothing on them."""
    data, cache, fine, _ = trained(tmp_path, features=False)
    out = tmp_path / "report"
    run_cli(["report", fine, "--out", out, "--resamples", 10])
    fits = json.loads((out / "report.json").read_text())["fits"]
    assert any(f.get("train_cache") for f in fits.values()), fits
    write_colour_tree(data, {"train": 9}, seed=3)       # one more image a class, others changed
    shutil.rmtree(cache / CLASSIFIER / "train")
    extract(data, cache, splits=("train",), flip_view=False)
    run_cli(["report", fine, "--out", tmp_path / "again", "--resamples", 10])
    fits = json.loads((tmp_path / "again" / "report.json").read_text())["fits"]
    assert not any(f.get("train_cache") for f in fits.values()), fits
    assert "with the rows its runs trained on was not found" in json.dumps(fits)


# ----------------------------------------------------------- a run gives its numbers back --
def test_a_head_only_oracle_gives_its_runs_scores_bit_for_bit(runs, tmp_path):
    """The head was trained and scored on the cache's float16 features; the deployed oracle
    rounds its backbone's features alike, so load_oracle, predict --images and predict --split
    on the same images at the same precision give the run's stored scores exactly."""
    data, cache, _, head = runs
    stored = open_run(head).scores("val")
    assert stored.made_on == MadeOn(*MadeOn.from_dict(stored.made_on.to_dict()).to_dict().values())
    oracle = quiet_load(head)
    files = val_files(data)
    got = oracle.score_files(files)
    np.testing.assert_array_equal(got.z, stored.z)
    np.testing.assert_array_equal(got.confidence, stored.confidence)
    np.testing.assert_array_equal(got.pred, stored.pred)
    run_cli(["predict", "--run", head, "--data", data, "--cache", cache, "--split", "val",
             "--out-name", "val-again", *FAST])
    again = read_outputs(head / "outputs" / "val-again.h5").columns
    np.testing.assert_array_equal(again["z"], stored.z)
    # without the rounding the same head gives other numbers: the rule is what makes them equal
    model = oracle._models.oracle.model
    model.feature_dtype = None
    try:
        assert not np.array_equal(oracle.score_files(files).z, stored.z)
    finally:
        model.feature_dtype = torch.float16


def test_a_fine_tuned_oracle_gives_its_runs_scores_bit_for_bit(runs):
    data, _, fine, _ = runs
    stored = open_run(fine).scores("val")
    got = quiet_load(fine).score_files(val_files(data))
    np.testing.assert_array_equal(got.z, stored.z)


# ------------------------------------------------------------ what made each stored score --
def test_every_stored_score_records_its_device_and_precision(runs):
    data, cache, fine, head = runs
    here = MadeOn.from_dict(json.loads((fine / "run.json").read_text())["made_on"])
    assert here.device == "cpu" and here.precision == "fp32" and here.inputs == "images"
    assert here.isa == torch.backends.cpu.get_cpu_capability() and here.name
    for split in ("val",):
        assert open_run(fine).scores(split).made_on == here
    features = json.loads((cache / CLASSIFIER / "val" / "manifest.json").read_text())
    assert MadeOn.from_dict(features["info"]["made_on"]) == here
    head_made = open_run(head).scores("val").made_on
    assert head_made.inputs == "cached features" and head_made.precision == "fp32"
    assert head_made.same_numerics(here)
    held = open_run(fine)
    assert held.scores(held.heldout).made_on == here
    assert quiet_load(fine).made_on == here


def test_scoring_in_another_precision_says_so_once(runs, tmp_path):
    data, cache, fine, _ = runs
    with pytest.warns(OtherDeviceNote, match=r"stored scores were made on cpu \(.*\) at fp32; "
                                             r"these are made on cpu \(.*\) at fp16"):
        oracle = load_oracle(fine, device="cpu", precision="fp16")
    assert oracle.made_on.precision == "fp16"
    result = run_cli(["predict", "--run", fine, "--data", data, "--cache", cache, "--split",
                      "val", "--out-name", "val-bf16", "--precision", "bf16", *FAST])
    notes = [l for l in result.output.splitlines() if l.startswith("note: ") and "at bf16" in l]
    assert len(notes) == 1, result.output
    assert "docs/METRICS.md" in notes[0] and "differ from the run's" in notes[0]
    made = read_outputs(fine / "outputs" / "val-bf16.h5").made_on
    assert made.precision == "bf16" and made.device == "cpu"
    table = tmp_path / "t.csv"
    result = run_cli(["predict", "--run", fine, "--images", data / "val", "--threshold", 0.5,
                      "--out-file", table, *FAST])
    assert "note: " not in result.output          # the run's own device and precision
    meta = json.loads(table.with_suffix(".meta.json").read_text())
    assert meta["oracle"]["made_on"]["precision"] == "fp32"


# ------------------------------------------------------------------------- the API's errors --
def test_load_oracle_on_a_folder_that_is_no_run_raises_run_error(runs, tmp_path):
    _, cache, _, _ = runs
    for path, what in ((tmp_path / "nothing", "is not there"),
                       (cache / CLASSIFIER / "val", "is a classifier cache, not a train-oracle "
                                                    "run directory"),
                       (tmp_path, r"is not a train-oracle run directory \(no run.json\)")):
        with pytest.raises(RunError, match=rf"{what}: pass the folder train-oracle wrote"):
            load_oracle(path, device="cpu")
        with pytest.raises(RunError, match=what):
            open_run(path)


def weights_run(base):
    """A run whose classifier came from a weights file (``extract --weights``), and the file of
    another model, a ResNet's: (run, other)."""
    import timm

    data = write_colour_tree(base / "data", {"train": 8, "val": 4})
    torch.manual_seed(5)
    mine = base / "mine.pth"
    torch.save(timm.create_model(CLASSIFIER, pretrained=False, **KWARGS).state_dict(), mine)
    run_cli(["extract", "--classifier", CLASSIFIER, "--weights", mine, "--model-kwargs",
             json.dumps(TINY_VIT_KWARGS), "--data", data, "--out", base / "cache", "--split",
             "train", "--split", "val", "--precision", "fp32", *FAST])
    run_cli(train_args(data, base / "cache", base / "run", "--val-fraction", 0.25,
                       "--batch-size", 4))
    other = base / "resnet.pth"
    torch.save(timm.create_model("resnet10t", pretrained=False, num_classes=3).state_dict(), other)
    return base / "run", other


def test_weights_of_another_model_are_named_before_any_model_is_built(tmp_path, monkeypatch):
    """load_oracle(weights=) with another classifier's file: the file and both sha256 named,
    compared before a model is built (timm is never asked for one)."""
    import timm

    run, other = weights_run(tmp_path)
    built = []
    monkeypatch.setattr(timm, "create_model", lambda *a, **k: built.append(a) or 1 / 0)
    with pytest.raises(ModelError) as err:
        load_oracle(run, device="cpu", weights=other)
    assert built == []
    message = str(err.value)
    assert f"load_oracle(weights={other}) is not the weights file the classifier of cache" in message
    assert "its sha256 is" in message and "the cache records" in message
    assert "load_oracle(weights=FILE)" in message and "--model-kwargs" not in message


def test_a_cache_without_the_files_hash_names_another_models_file(tmp_path):
    """A cache written before it recorded its weights file's hash: a file that is not the
    classifier's is still named (it does not fit the model), never blamed on --model-kwargs."""
    run, other = weights_run(tmp_path)
    manifest = tmp_path / "cache" / CLASSIFIER / "train" / "manifest.json"
    doc = json.loads(manifest.read_text())
    del doc["weights_file_sha256"]
    manifest.write_text(json.dumps(doc))
    with pytest.raises(ModelError, match=rf"load_oracle\(weights={other}\) does not hold the "
                                         r"weights of the classifier of cache .*\(vit_tiny"):
        load_oracle(run, device="cpu", weights=other)


def test_rows_of_idx_arrays_have_no_paths(tmp_path):
    """Fashion-MNIST's rows are idx arrays, not files: a run's scores of them have no paths
    (None, as documented), and a file written with their idx names (runs before) reads as None."""
    from fmnist_subset import write_fmnist_subset

    data = write_fmnist_subset(tmp_path / "fm", n_train=40, n_test=20)
    grey = json.dumps({"img_size": 28, "patch_size": 7, "in_chans": 1, "num_classes": 10,
                       "embed_dim": 32, "depth": 1, "num_heads": 2})
    model = ["--classifier", CLASSIFIER, "--random-init", "--model-kwargs", grey]
    run_cli(["extract", *model, "--data", data, "--split", "clf-train", "--split", "test",
             "--out", tmp_path / "cache", "--precision", "fp32", *FAST])
    run_cli(["train-oracle", *model, "--oracle", CLASSIFIER, "--data", data, "--cache",
             tmp_path / "cache", "--train-split", "clf-train", "--batch-size", 8, "--epochs", 1,
             "--precision", "fp32", "--out", tmp_path / "run", *FAST])
    scores = open_run(tmp_path / "run").scores("test")
    assert scores.paths is None and len(scores.z) == 20
    from cache.outputs import OracleOutputs, output_paths
    names = np.array([f"t10k-images-idx3-ubyte[{i}]".encode() for i in range(3)], dtype=bytes)
    old = OracleOutputs(tmp_path / "x.h5", {"path_root": str(data / "test")}, {"path": names})
    assert output_paths(old) is None


def test_fp32_is_ieee_float32_on_every_device():
    """PyTorch's default runs float32 convolutions on CUDA in TF32; the first forward pass turns
    that off for the process (core/precision.py), so fp32 means float32 on a GPU too."""
    from pipeline.core.precision import autocast

    with autocast("fp32", torch.device("cpu")):
        pass
    assert torch.backends.cudnn.allow_tf32 is False and torch.backends.cuda.matmul.allow_tf32 \
        is False                                  # readable: no mix of torch's two flag APIs
