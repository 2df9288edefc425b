"""``cli.py predict --images``: new, unlabelled image files through the classifier and the run's
oracle, one row per file.  The numbers are checked against what other code computed on the same
files: the classifier cache (``extract``'s pred and MSP) and the run's own output file
(``train-oracle``'s oracle confidence), matched by file content, not by order."""
from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pytest
import torch

from cache.integrity import file_digest
from cache.outputs import output_paths, read_outputs, write_outputs
from cache.reader import ClassifierCache
from conftest import assert_error
from oracle_fixtures import CLASSIFIER, TINY_VIT_KWARGS, run_cli, train_args, trained_colour_run
from pipeline.data.labels import _synset_lemmas, imagenet_synsets

FAST = ("--workers", 0, "--no-progress")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    base = tmp_path_factory.mktemp("deploy")
    return trained_colour_run(base)


def read_csv(path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def shuffled_copy(data, dest, seed=0) -> dict:
    """The val images under new, nested names whose sorted order is not the cache's: {new path:
    original path}."""
    files = sorted((data / "val").rglob("*.JPEG"))
    order = np.random.default_rng(seed).permutation(len(files))
    mapping = {}
    for new, old in zip(order, files):
        path = dest / f"d{new % 3}" / ("deep" if new % 2 else "") / f"img{new:03d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(old, path)
        mapping[str(path)] = str(old)
    return mapping


def test_each_row_is_the_classifier_and_the_oracle_on_its_own_file(trained, tmp_path):
    data, cache, run = trained
    mapping = shuffled_copy(data, tmp_path / "new")
    result = run_cli(["predict", "--run", run, "--images", tmp_path / "new", "--batch-size", 5,
                      *FAST])
    table = run / "predictions" / "new.csv"
    assert str(table) in result.output and "12 image(s)" in result.output
    rows = read_csv(table)
    assert sorted(r["path"] for r in rows) == sorted(mapping)
    # what extract and train-oracle computed on the original files, by their paths
    val = ClassifierCache.open(cache / CLASSIFIER / "val")
    cols = val.load(["pred", "p_max"])
    oracle = read_outputs(run / "outputs" / "val.h5")
    by_path = {p: i for i, p in enumerate(output_paths(oracle))}
    lemmas = _synset_lemmas()
    threshold = json.loads((run / "predictions" / "new.meta.json").read_text())["trust"]["threshold"]
    for row in rows:
        i = by_path[mapping[row["path"]]]
        assert int(row["pred"]) == cols["pred"][i]
        assert float(row["msp"]) == pytest.approx(float(cols["p_max"][i]), abs=1e-6)
        assert float(row["confidence"]) == pytest.approx(float(oracle.columns["confidence"][i]),
                                                         abs=1e-6)
        assert row["class_name"] == lemmas[imagenet_synsets()[int(row["pred"])]]
        assert row["trust"] == ("true" if float(row["confidence"]) >= threshold else "false")
        assert row["error"] == ""


def test_labelled_outputs_name_each_rows_file(trained):
    data, cache, run = trained
    out = read_outputs(run / "outputs" / "val.h5")
    paths = output_paths(out)
    files = sorted(str(p) for p in (data / "val").rglob("*.JPEG"))
    assert paths == files
    # row i is the file whose pixels gave the cache's row i: a direct forward of the classifier
    from pipeline.core.models import DataConfig
    from pipeline.data.images import GpuNormalize, ResizeCrop, decode_file
    from pipeline.oracle.deploy.rebuild import load_classifier
    val = ClassifierCache.open(cache / CLASSIFIER / "val")
    model = load_classifier(val, None)
    cfg = DataConfig.from_dict(val.identity["data_config"])
    x = torch.stack([ResizeCrop(cfg)(decode_file(p)) for p in paths])
    with torch.inference_mode():
        pred = model(GpuNormalize(cfg, torch.device("cpu"))(x)).argmax(-1).numpy()
    np.testing.assert_array_equal(pred, out.columns["pred"])


def write_heldout(run, conf, correct):
    """Replace the run's held-out scores by ``conf``/``correct`` on its first held-out rows (a
    real output file, its digest recorded in run.json as train-oracle records it)."""
    record = json.loads((run / "run.json").read_text())
    path = run / "heldout" / f"{record['heldout_output']['split']}.h5"
    out = read_outputs(path)
    cols = dict(out.columns)
    rows = np.flatnonzero(cols["valid"] == 1)
    assert len(rows) >= len(conf)
    cols["valid"] = np.zeros_like(cols["valid"])
    cols["valid"][rows[:len(conf)]] = 1
    cols["confidence"] = np.zeros_like(cols["confidence"])
    cols["confidence"][rows[:len(conf)]] = conf
    cols["correct"][rows[:len(conf)]] = correct
    write_outputs(path, cols, out.classifier, out.run, out.made_on)
    record["heldout_output"] = {"split": record["heldout_output"]["split"], **file_digest(path)}
    (run / "run.json").write_text(json.dumps(record))


@pytest.mark.parametrize("target, expected", [
    ("tpr=0.95", 0.6), ("tpr=0.6", 0.8), ("risk=0.3", 0.6), ("risk=0", 0.8), ("risk=0.45", 0.5)])
def test_a_target_picks_the_threshold_on_the_held_out_rows(trained, tmp_path, target, expected):
    data, _, run = trained
    copy = shutil.copytree(run, tmp_path / "run")
    # descending confidence; correct 1 1 0 1 0 0: risk 0 0 .33 .25 .4 .5, TPR .33 .67 .67 1 1 1
    write_heldout(copy, np.float32([0.9, 0.8, 0.7, 0.6, 0.5, 0.4]), [1, 1, 0, 1, 0, 0])
    out = tmp_path / "p.jsonl"
    result = run_cli(["predict", "--run", copy, "--images", data / "val", "--target", target,
                      "--out", out, *FAST])
    meta = json.loads((tmp_path / "p.meta.json").read_text())
    assert meta["trust"]["threshold"] == pytest.approx(expected)
    assert meta["trust"]["chosen_by"] == target and meta["trust"]["reached"]["rows"] == 6
    assert f"--target {target} on 6 held-out rows" in result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 12
    assert all(r["trust"] == (r["confidence"] >= meta["trust"]["threshold"]) for r in rows)


def test_a_given_threshold_is_used_as_is(trained, tmp_path):
    data, _, run = trained
    run_cli(["predict", "--run", run, "--images", data / "val", "--threshold", 0.31,
             "--out", tmp_path / "t.csv", *FAST])
    rows = read_csv(tmp_path / "t.csv")
    assert {r["trust"] for r in rows} == {"true", "false"} or len(rows) == 12
    assert all((r["trust"] == "true") == (float(r["confidence"]) >= 0.31) for r in rows)
    meta = json.loads((tmp_path / "t.meta.json").read_text())
    assert meta["trust"]["threshold"] == 0.31 and meta["trust"]["chosen_by"] == "--threshold"


def test_a_target_the_held_out_rows_cannot_reach_is_refused(trained, tmp_path):
    data, _, run = trained
    copy = shutil.copytree(run, tmp_path / "run")
    write_heldout(copy, np.float32([0.9, 0.8, 0.7, 0.6, 0.5, 0.4]), [0, 1, 1, 0, 1, 1])
    result = run_cli(["predict", "--run", copy, "--images", data / "val", "--target", "risk=0.2",
                      *FAST], expect=None)
    assert_error(result, r"--target risk=0.2 cannot be reached on the 6 held-out rows of run .*"
                         r"most confident 16.7% of them have a selective risk of 1.000.*"
                         r"--threshold X")
    assert not (copy / "predictions" / "val.csv").exists()


def test_options_of_the_other_mode_and_two_thresholds_are_usage_errors(trained, tmp_path):
    data, _, run = trained
    for args, pattern in [
            (["--images", data / "val", "--split", "val"], r"--split does not apply to --images"),
            (["--threshold", 0.5], r"--threshold does not apply without --images"),
            (["--images", data / "val", "--threshold", 0.5, "--target", "tpr=0.9"],
             r"--threshold and --target both set the trust threshold: give one"),
            (["--images", data / "val", "--target", "fpr=0.1"], r"not a target: expected tpr=T"),
            (["--images", data / "val", "--name", "a", "--out", tmp_path / "b.csv"],
             r"--name and --out both name the predictions table: give one"),
            (["--images", data / "val", "--threshold", 1.5], r"1.5 is not in the range")]:
        assert_error(run_cli(["predict", "--run", run, *args, *FAST], expect=None), pattern, 2)
    assert not (run / "predictions" / "val.csv").exists()


def test_folders_and_globs_without_images_are_refused(trained, tmp_path):
    _, _, run = trained
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.heic").write_bytes(b"x")
    for spec, pattern in [(tmp_path / "empty", r"--images .*empty: no image files \(extensions"),
                          (tmp_path / "notes", r"no image files .* 1 other file\(s\) \(\.heic\)"),
                          (f"{tmp_path}/empty/*.jpg", r"no image files"),
                          (tmp_path / "nowhere", r"no such file or folder")]:
        assert_error(run_cli(["predict", "--run", run, "--images", spec, *FAST], expect=None),
                     pattern)
    assert not (run / "predictions").exists() or not any((run / "predictions").glob("empty*"))


def test_a_glob_and_the_output_formats(trained, tmp_path):
    data, _, run = trained
    spec = f"{data}/val/*/*_[01].JPEG"
    run_cli(["predict", "--run", run, "--images", spec, "--out-file", tmp_path / "g.jsonl", *FAST])
    rows = [json.loads(line) for line in (tmp_path / "g.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all(r["path"].endswith(("_0.JPEG", "_1.JPEG")) for r in rows)
    assert set(rows[0]) == {"path", "pred", "class_name", "msp", "confidence", "trust", "error"}
    result = run_cli(["predict", "--run", run, "--images", spec, "--out-file", tmp_path / "g.txt",
                      *FAST], expect=None)
    assert_error(result, r"--out-file .*g.txt: unknown table format '.txt'; name the file .csv, "
                         r"\.jsonl \(JSON lines\) or \.parquet")
    result = run_cli(["predict", "--run", run, "--images", spec, "--out-file", tmp_path / "g.parquet",
                      *FAST], expect=None)
    try:
        import pyarrow.parquet as pq
    except ImportError:
        assert_error(result, r"writing Parquet needs pyarrow, which is not installed")
        return
    assert result.exit_code == 0, result.output
    table = pq.read_table(tmp_path / "g.parquet")
    assert table.column("path").to_pylist() == [r["path"] for r in rows]
    assert "trust_oracles" in {k.decode() for k in table.schema.metadata}


def test_undecodable_files_stop_the_run_unless_skip_bad_lists_them(trained, tmp_path):
    data, _, run = trained
    shutil.copytree(data / "val", tmp_path / "imgs")
    bad = tmp_path / "imgs" / "zz" / "broken.jpg"
    bad.parent.mkdir()
    bad.write_bytes((data / "val").rglob("*.JPEG").__next__().read_bytes()[:150])
    result = run_cli(["predict", "--run", run, "--images", tmp_path / "imgs", *FAST], expect=None)
    assert_error(result, rf"cannot decode {bad} .*--skip-bad")
    assert not (run / "predictions" / "imgs.csv").exists()
    result = run_cli(["predict", "--run", run, "--images", tmp_path / "imgs", "--skip-bad",
                      "--workers", 1, "--no-progress"])
    assert "1 undecodable" in result.output and f"undecodable: {bad}" in result.output
    rows = {r["path"]: r for r in read_csv(run / "predictions" / "imgs.csv")}
    assert len(rows) == 13 and rows[str(bad)]["pred"] == "" and rows[str(bad)]["trust"] == ""
    assert rows[str(bad)]["error"]
    assert all(r["error"] == "" and r["pred"] != "" for p, r in rows.items() if p != str(bad))


def test_image_kinds_a_fixed_size_model_reads_and_the_one_it_refuses(trained, tmp_path):
    """The transform resizes every image to the classifier's fixed 32 x 32: grey, 16-bit, CMYK,
    alpha, palette and 1-pixel images all get a row equal to their 8-bit RGB version's; only an
    extremely elongated strip (its resize before the crop would take gigabytes) is refused."""
    from PIL import Image

    _, _, run = trained
    rgb = np.random.default_rng(0).integers(0, 255, (30, 40, 3)).astype(np.uint8)
    folder = tmp_path / "kinds"
    folder.mkdir()
    grey = Image.fromarray(rgb[..., 0])
    grey.save(folder / "grey.png")
    Image.fromarray(rgb[..., 0].astype(np.uint16) * 257).save(folder / "grey16.png")
    Image.fromarray(rgb).convert("CMYK").save(folder / "cmyk.jpg", quality=100)
    Image.fromarray(rgb).convert("RGBA").save(folder / "rgba.png")
    Image.fromarray(rgb).convert("P").save(folder / "palette.gif")
    Image.fromarray(rgb[:1, :1]).save(folder / "pixel.png")
    Image.fromarray(rgb).save(folder / "rgb.png")
    run_cli(["predict", "--run", run, "--images", folder, "--out", tmp_path / "k.csv", *FAST])
    rows = {r["path"].rsplit("/", 1)[1]: r for r in read_csv(tmp_path / "k.csv")}
    assert all(r["error"] == "" for r in rows.values())
    assert rows["grey16.png"]["confidence"] == rows["grey.png"]["confidence"]
    strip = tmp_path / "strip" / "strip.png"
    strip.parent.mkdir()
    Image.fromarray(np.zeros((1, 3000, 3), np.uint8)).save(strip)
    result = run_cli(["predict", "--run", run, "--images", strip, *FAST], expect=None)
    assert_error(result, r"cannot use .*strip.png \(row 0\): its 3000x1 pixels \(aspect ratio "
                         r"3000:1\) would be resized to 105000x35 before the model's 32x32 centre "
                         r"crop \(11 MiB, more than 64 times the crop\); crop the image")
    run_cli(["predict", "--run", run, "--images", strip.parent, "--skip-bad", *FAST])
    row, = read_csv(run / "predictions" / "strip.csv")
    assert "aspect ratio 3000:1" in row["error"] and row["pred"] == ""


@pytest.fixture(scope="module")
def weights_run(trained, tmp_path_factory):
    """A run whose classifier came from a weights file (--weights), as a user's own would."""
    import timm

    data, _, _ = trained
    base = tmp_path_factory.mktemp("weights")
    torch.manual_seed(5)
    model = timm.create_model(CLASSIFIER, pretrained=False, num_classes=3, **TINY_VIT_KWARGS)
    torch.save(model.state_dict(), base / "mine.pth")
    cache = base / "cache"
    run_cli(["extract", "--classifier", CLASSIFIER, "--weights", base / "mine.pth",
             "--model-kwargs", json.dumps(TINY_VIT_KWARGS), "--data", data, "--out", cache,
             "--split", "train", "--split", "val", "--precision", "fp32", *FAST])
    run = base / "run"
    run_cli(train_args(data, cache, run, "--val-fraction", 0.25, "--batch-size", 4))
    return data, base, run


def test_a_run_whose_classifier_weights_are_gone_names_the_file_and_weights(weights_run,
                                                                           tmp_path):
    data, base, run = weights_run
    moved = tmp_path / "moved.pth"
    shutil.move(base / "mine.pth", moved)
    try:
        result = run_cli(["predict", "--run", run, "--images", data / "val", "--threshold", 0.5,
                          *FAST], expect=None)
        assert_error(result, rf"the classifier's weights file .*mine.pth \(recorded by cache "
                             rf".*\) is not there now \(moved or deleted\): pass --weights FILE")
        run_cli(["predict", "--run", run, "--images", data / "val", "--weights", moved,
                 "--threshold", 0.5, *FAST])
        assert len(read_csv(run / "predictions" / "val.csv")) == 12
        other = tmp_path / "other.pth"
        torch.manual_seed(6)
        import timm
        torch.save(timm.create_model(CLASSIFIER, pretrained=False, num_classes=3,
                                     **TINY_VIT_KWARGS).state_dict(), other)
        result = run_cli(["predict", "--run", run, "--images", data / "val", "--weights", other,
                          "--threshold", 0.5,
                          "--out", tmp_path / "x.csv", *FAST], expect=None)
        assert_error(result, r"--weights .*other.pth is not the weights file the classifier of "
                             r"cache .* was extracted with: its sha256 is [0-9a-f]{12}\.\.\., the "
                             r"cache records [0-9a-f]{12}\.\.\. \(for .*mine.pth\): pass --weights "
                             r"FILE with the file the cache")
        assert not (tmp_path / "x.csv").exists()
    finally:
        shutil.move(moved, base / "mine.pth")


def test_a_run_without_held_out_rows_needs_a_threshold(trained, tmp_path):
    data, cache, _ = trained
    run = tmp_path / "run0"
    run_cli(train_args(data, cache, run, "--val-fraction", 0, "--batch-size", 4, "--epochs", 1))
    result = run_cli(["predict", "--run", run, "--images", data / "val", *FAST], expect=None)
    assert_error(result, r"--target needs the oracle's scores of run .*run0's held-out rows, but it "
                         r"held out no training rows \(--val-fraction 0\); pass --threshold X")
    run_cli(["predict", "--run", run, "--images", data / "val", "--threshold", 0.5, *FAST])
    assert len(read_csv(run / "predictions" / "val.csv")) == 12


def test_an_all_wrong_held_out_set_and_a_moved_training_cache_are_named(weights_run, tmp_path):
    data, base, run = weights_run
    result = run_cli(["predict", "--run", run, "--images", data / "val", *FAST], expect=None)
    assert_error(result, r"--target tpr=0.95: the classifier is wrong on every one of the 6 "
                         r"held-out rows of run .*so no TPR exists; pass --threshold X instead")
    shutil.move(base / "cache", tmp_path / "cache")
    try:
        result = run_cli(["predict", "--run", run, "--images", data / "val", "--threshold", 0.5,
                          *FAST], expect=None)
        assert_error(result, r"run .* was trained on the classifier cache .*cache/"
                             rf"{CLASSIFIER}/train, which is not there now \(moved or deleted\)")
    finally:
        shutil.move(tmp_path / "cache", base / "cache")


def test_a_run_written_with_relative_paths_is_found_from_any_folder(weights_run, tmp_path,
                                                                   monkeypatch):
    """extract and train-oracle given relative --weights, --cache and --out: predict from another
    folder finds the run's training cache (run.json records it absolutely and from the run) and
    gives the same table; a run that recorded only the typed path (older runs) is found relative
    to a folder above it; moved away, the message names each place looked in."""
    data, base, _ = weights_run
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(base / "mine.pth", work / "mine.pth")
    monkeypatch.chdir(work)
    run_cli(["extract", "--classifier", CLASSIFIER, "--weights", "mine.pth", "--model-kwargs",
             json.dumps(TINY_VIT_KWARGS), "--data", data, "--out", "cache", "--split", "train",
             "--split", "val", "--precision", "fp32", *FAST])
    run_cli(train_args(data, "cache", "run", "--val-fraction", 0.25, "--batch-size", 4))
    run_cli(["predict", "--run", "run", "--images", data / "val", "--threshold", 0.5, *FAST])
    here = read_csv(work / "run" / "predictions" / "val.csv")
    record = json.loads((work / "run" / "run.json").read_text())
    assert record["train_cache"] == str(work / "cache" / CLASSIFIER / "train")
    assert record["train_cache_from_run"] == f"../cache/{CLASSIFIER}/train"
    assert record["train_cache_given"] == f"cache/{CLASSIFIER}/train"
    monkeypatch.chdir(tmp_path)
    run_cli(["predict", "--run", work / "run", "--images", data / "val", "--threshold", 0.5,
             "--out", tmp_path / "there.csv", *FAST])
    assert read_csv(tmp_path / "there.csv") == here
    old = {k: v for k, v in record.items() if k not in ("train_cache_from_run", "train_cache_given")}
    (work / "run" / "run.json").write_text(json.dumps({**old, "train_cache": f"cache/{CLASSIFIER}/train"}))
    run_cli(["predict", "--run", work / "run", "--images", data / "val", "--threshold", 0.5,
             "--out", tmp_path / "older.csv", *FAST])
    assert read_csv(tmp_path / "older.csv") == here
    shutil.move(work / "cache", tmp_path / "elsewhere")
    result = run_cli(["predict", "--run", work / "run", "--images", data / "val", "--threshold",
                      0.5, *FAST], expect=None)
    assert_error(result, rf"trained on the classifier cache .*/cache/{CLASSIFIER}/train, which is "
                         rf"not there now \(moved or deleted; nor at .*work/cache/{CLASSIFIER}/train")


def test_an_oracle_of_another_input_size_gets_its_own_view_of_each_file(trained, tmp_path):
    """Classifier at 32 x 32, oracle at 48 x 48: each file is decoded once and resized for each
    model; every row still equals extract's and train-oracle's numbers for that file."""
    data, cache, _ = trained
    run = tmp_path / "run48"
    run_cli(train_args(data, cache, run, "--val-fraction", 0.25, "--batch-size", 4,
                       "--model-kwargs", json.dumps({**TINY_VIT_KWARGS, "img_size": 48})))
    build = json.loads((run / "run.json").read_text())["oracle_build"]
    assert build["data_config"]["input_size"] == [3, 48, 48]
    run_cli(["predict", "--run", run, "--images", data / "val", "--batch-size", 5, *FAST])
    rows = read_csv(run / "predictions" / "val.csv")
    cols = ClassifierCache.open(cache / CLASSIFIER / "val").load(["pred", "p_max"])
    oracle = read_outputs(run / "outputs" / "val.h5")
    by_path = {p: i for i, p in enumerate(output_paths(oracle))}
    for row in rows:
        i = by_path[row["path"]]
        assert int(row["pred"]) == cols["pred"][i]
        assert float(row["msp"]) == pytest.approx(float(cols["p_max"][i]), abs=1e-6)
        assert float(row["confidence"]) == pytest.approx(float(oracle.columns["confidence"][i]),
                                                         abs=1e-6)
