"""The new-class shift: a classifier fitted without some classes (`fit-classifier
--holdout-classes`), its known classes' caches, the held-out classes' rows as `test-newclass`
(`extract --new-classes`, every prediction wrong), a head-only oracle trained on the known rows
and scored there, the report on an all-wrong split; and the bad inputs of docs/BAD_INPUT.md
("Held-out classes")."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from cli import cli
from conftest import assert_error
from fmnist_subset import write_fmnist_subset

CPU = ["--device", "cpu", "--no-progress"]
HELD = (8, 9)                     # Bag, Ankle boot: by name and by index below
HOLDOUT = "Bag,9"


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def ok(*args) -> str:
    result = run(*args)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A classifier fitted without Bag and Ankle boot; the caches of train, test and
    test-newclass; a head-only SS oracle evaluated on test and test-newclass."""
    root = tmp_path_factory.mktemp("newclass")
    data = write_fmnist_subset(root / "data", n_train=12_300, n_test=200)  # oracles' train: 300
    ckpt = root / "vit.pt"
    ok("fit-classifier", "--classifier", "vit", "--data", data, "--max-samples", 300,
       "--epochs", 1, "--holdout-classes", HOLDOUT, "--out-file", ckpt, *CPU)
    common = ["--classifier", "vit", "--weights", ckpt, "--data", data, "--out", root / "cache",
              "--features", "--flip-view", "--shard-size", 64, *CPU]
    ok("extract", *common, "--split", "train", "--split", "test")
    out = ok("extract", *common, "--split", "test", "--new-classes")
    assert "[test-newclass]" in out and "accuracy 0.00%" in out
    trained = ok("train-oracle", "--head-only", "--classifier", "vit", "--oracle", "vit",
                 "--weights", ckpt, "--loss", "ss", "--data", data, "--cache", root / "cache",
                 "--eval-split", "test", "--eval-split", "test-newclass", "--runs-root",
                 root / "runs", "--epochs", 2, *CPU)
    return root, data, ckpt, trained


def cache_of(root, tag):
    from cache.reader import ClassifierCache
    return ClassifierCache.open(root / "cache" / "vit" / tag)


def test_the_checkpoint_records_the_held_out_classes_and_never_predicts_them(work):
    from pipeline.core.heldout import HELD_OUT_LOGIT
    from pipeline.core.models import build_model, held_out_classes, resolve_spec
    from pipeline.data.newclass import select_classes
    from pipeline.data.sources import fashion_mnist

    root, data, ckpt, _ = work
    meta = torch.load(ckpt, map_location="cpu", weights_only=True)["meta"]
    assert meta["held_out_classes"] == list(HELD)
    assert meta["held_out_class_names"] == ["Bag", "Ankle boot"]
    assert meta["num_classes"] == 10 and meta["config"]["holdout_classes"] == ["Bag", "9"]
    known = select_classes(fashion_mnist(data, "clf-train"), range(8))
    assert meta["dataset_fingerprint"] == known.fingerprint                 # known rows only
    assert meta["train_rows"] + meta["held_out_rows"] == 300                # --max-samples
    assert held_out_classes(str(ckpt)) == HELD
    model = build_model(resolve_spec("vit", True, str(ckpt)))   # the one place: every stage
    with torch.no_grad():
        logits = model(torch.rand(5, 1, 28, 28))
    assert torch.isfinite(logits).all()
    assert (logits[:, list(HELD)] == HELD_OUT_LOGIT).all()
    assert not np.isin(logits.argmax(1).numpy(), HELD).any()


def test_known_caches_hold_no_held_out_class_and_newclass_only_those(work):
    root = work[0]
    for tag in ("train", "test"):
        cache = cache_of(root, tag)
        cols = cache.load(["label", "pred", "logits"])
        assert cache.identity["classes_kept"] == [k for k in range(10) if k not in HELD]
        assert not np.isin(cols["label"], HELD).any()
        assert not np.isin(cols["pred"], HELD).any()
        assert np.isfinite(cols["logits"]).all()
    new = cache_of(root, "test-newclass")
    cols = new.load(["label", "pred", "correct", "p_true"])
    assert new.identity["classes_kept"] == list(HELD) and new.identity["split"] == "test"
    assert set(np.unique(cols["label"]).tolist()) == set(HELD)
    assert cols["correct"].sum() == 0 and (cols["p_true"] == 0).all()
    assert new.manifest["summary"]["accuracy"] == 0
    whole = 200
    assert new.num_rows + cache_of(root, "test").num_rows == whole   # the split, parted
    assert new.identity["dataset_fingerprint"] != cache_of(root, "test").identity[
        "dataset_fingerprint"]


def test_readers_list_the_same_rows_and_refuse_a_cache_whose_selection_was_edited(work):
    import json

    from cache.schema import CacheError
    from pipeline.oracle.settings.targets import open_split

    root, data, _, _ = work
    split = open_split(str(data), root / "cache", "vit", "test-newclass")
    assert len(split.samples) == split.cache.num_rows
    assert set(split.samples.labels.tolist()) == set(HELD)
    edited = root / "edited"
    import shutil
    shutil.copytree(root / "cache" / "vit" / "test-newclass", edited / "vit" / "test-newclass")
    manifest = edited / "vit" / "test-newclass" / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["identity"]["classes_kept"] = [8]         # another selection: other rows, other hash
    manifest.write_text(json.dumps(doc))
    with pytest.raises(CacheError, match="dataset_fingerprint"):
        open_split(str(data), edited, "vit", "test-newclass")


def test_a_head_only_oracle_trains_on_the_known_rows_and_is_scored_on_new_classes(work):
    from cache.outputs import read_outputs

    root, _, _, trained = work
    assert "[test-newclass]" in trained and "classifier accuracy 0.00%" in trained
    assert "mean confidence correct n/a" in trained
    run_dir = next((root / "runs").iterdir())
    out = read_outputs(run_dir / "outputs" / "test-newclass.h5")
    assert set(np.unique(out.columns["label"]).tolist()) == set(HELD)
    assert out.columns["correct"].sum() == 0 and np.isfinite(out.columns["z"]).all()


def test_the_report_says_auc_is_undefined_on_an_all_wrong_split(work):
    root = work[0]
    out = ok("report", root / "runs", "--out", root / "report")
    text = (root / "report" / "report.md").read_text()
    assert "## Split `test-newclass`" in text and "wrote" in out
    assert "TrustScore left out" not in text        # fitted on the known classes' rows only
    part = text.split("## Split `test-newclass`")[1]
    assert "|  | TrustScore | 0.00 |" in part
    assert "AUC is undefined: no correct predictions in the split" in part
    row = next(line for line in part.splitlines() if "| SS (head-only) |" in line
               and "1000.00" in line)                      # AURC x10^3: every kept row wrong
    assert "| 0.00 |" in row


# ------------------------------------------------------------------------------ bad input --
def test_a_held_out_class_the_data_lack_is_refused_listing_the_classes(work, tmp_path):
    data = work[1]
    for given in ("Hat", "12"):
        result = run("fit-classifier", "--classifier", "vit", "--data", data, "--holdout-classes",
                     given, "--out-file", tmp_path / "x.pt", *CPU)
        assert_error(result, rf"--holdout-classes: the data have no class '{given}'.*"
                             r"0 T-shirt/top, 1 Trouser.*9 Ankle boot")
    assert not (tmp_path / "x.pt").exists()


@pytest.mark.parametrize("given, left", [("0,1,2,3,4,5,6,7,8,9", 0), ("0,1,2,3,4,5,6,7,Bag", 1)])
def test_holding_out_all_classes_or_all_but_one_is_refused(work, tmp_path, given, left):
    result = run("fit-classifier", "--classifier", "vit", "--data", work[1], "--holdout-classes",
                 given, "--out-file", tmp_path / "x.pt", *CPU)
    assert_error(result, rf"--holdout-classes holds out {10 - left} of the data's 10 classes, "
                         rf"leaving {left} to fit on: hold out at most 8")


def test_new_classes_with_a_classifier_that_holds_out_none_is_refused(work, tmp_path):
    data = work[1]
    result = run("extract", "--classifier", "vit", "--random-init", "--data", data, "--split",
                 "test", "--new-classes", "--out", tmp_path / "cache", *CPU)
    assert_error(result, r"--new-classes caches the rows of the classes a classifier was fitted "
                         r"without, but --classifier vit .* holds out no class: fit one with "
                         r"`cli.py fit-classifier --holdout-classes LIST`")
    assert not (tmp_path / "cache" / "vit").exists()


def test_an_existing_checkpoint_of_other_held_out_classes_is_kept_and_flagged(work):
    root, data, ckpt, _ = work
    before = ckpt.read_bytes()
    out = ok("fit-classifier", "--classifier", "vit", "--data", data, "--max-samples", 300,
             "--epochs", 1, "--holdout-classes", "Coat", "--out-file", ckpt, *CPU)
    assert "nothing to do" in out and "classes held out: [8, 9] (now [4])" in out
    assert ckpt.read_bytes() == before
    same = ok("fit-classifier", "--classifier", "vit", "--data", data, "--max-samples", 300,
              "--epochs", 1, "--holdout-classes", HOLDOUT, "--out-file", ckpt, *CPU)
    assert "nothing to do" in same and "differs" not in same
