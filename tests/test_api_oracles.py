"""The Python API's caches and oracles (``trust_oracles.caches``, ``trust_oracles.oracles``): the
arrays are the cache reader's, the scores are ``predict --images``' numbers on the same files
(and the run's own outputs), and each bad input raises a typed error with the CLI's message."""
from __future__ import annotations

import csv
import json
import shutil
import sys
import types

import numpy as np
import pytest
import torch

from cache.outputs import output_paths, read_outputs
from cache.reader import ClassifierCache
from oracle_fixtures import CLASSIFIER, TINY_VIT_KWARGS, extract, run_cli, train_args, \
    trained_colour_run
from trust_oracles.caches import Cache, open_cache
from trust_oracles.errors import (BadImageError, CacheError, CacheMismatch, DataError,
                                  DeviceError, InputError, MissingDependencyError, ModelError,
                                  RunError)
from trust_oracles.oracles import Scores, TrustOracle, load_oracle

FAST = ("--workers", 0, "--no-progress")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return trained_colour_run(tmp_path_factory.mktemp("api"))


@pytest.fixture(scope="module")
def oracle(trained) -> TrustOracle:
    return load_oracle(trained[2], device="cpu", batch_size=5)


def val_files(data) -> list[str]:
    return sorted(str(p) for p in (data / "val").rglob("*.JPEG"))


def cli_table(run, images, out, *extra) -> dict[str, dict]:
    run_cli(["predict", "--run", run, "--images", images, "--out", out, *extra, *FAST])
    with open(out, newline="") as fh:
        return {r["path"]: r for r in csv.DictReader(fh)}


def cli_error(args) -> str:
    """The one line ``cli.py`` prints for a user's mistake, without its ``error: ``."""
    result = run_cli(args, expect=1)
    return next(line for line in result.output.splitlines()
                if line.startswith("error: "))[len("error: "):]


# ------------------------------------------------------------------------------ caches --
def test_open_cache_reads_the_readers_arrays(trained):
    data, cache_root, run = trained
    path = cache_root / CLASSIFIER / "val"
    cache = open_cache(path)
    ref = ClassifierCache.open(path)
    cols = ref.load(["logits", "pred", "label", "correct", "valid", "p_max"])
    assert isinstance(cache, Cache) and cache.num_rows == 12 and cache.classifier == CLASSIFIER
    assert cache.identity == ref.identity and cache.identity["split"] == "val"
    assert cache.logits.dtype == np.float32 and cache.logits.shape == (12, 3)
    np.testing.assert_array_equal(cache.logits, cols["logits"].astype(np.float32))
    for name, want in (("pred", cols["pred"]), ("label", cols["label"]),
                       ("correct", cols["correct"].astype(bool)),
                       ("valid", cols["valid"].astype(bool)), ("msp", cols["p_max"])):
        got = getattr(cache, name)
        assert got.dtype == want.dtype, name
        np.testing.assert_array_equal(got, want, err_msg=name)
    # row i is the file the run's outputs name for row i
    assert list(cache.paths) == output_paths(read_outputs(run / "outputs" / "val.h5"))
    assert list(cache.paths) == val_files(data)
    with pytest.raises(CacheError, match=r"holds no features \(extracted without --features\)"
                                         r".*`cli.py extract` command plus --features"):
        cache.features


def test_features_are_the_cached_column_as_float32(tmp_path, trained):
    data = trained[0]
    extract(data, tmp_path / "c", splits=("val",), flip_view=False, extra=("--features",))
    cache = open_cache(tmp_path / "c" / CLASSIFIER / "val")
    want = ClassifierCache.open(cache.path).load(["features"])["features"]
    assert cache.features.dtype == np.float32 and cache.features.shape == (12, 48)
    np.testing.assert_array_equal(cache.features, want.astype(np.float32))


def test_to_frame_needs_pandas_and_names_the_install(trained, monkeypatch):
    cache = open_cache(trained[1] / CLASSIFIER / "val")
    monkeypatch.setitem(sys.modules, "pandas", None)        # import pandas -> ImportError
    with pytest.raises(MissingDependencyError, match=r"needs pandas.*pip install pandas"):
        cache.to_frame()
    assert issubclass(MissingDependencyError, ImportError)
    # what it hands pandas: one row per cached row (a stand-in records the columns)
    fake = types.ModuleType("pandas")
    fake.DataFrame = lambda columns: dict(columns)
    monkeypatch.setitem(sys.modules, "pandas", fake)
    frame = cache.to_frame()
    assert list(frame) == ["index", "path", "label", "pred", "correct", "msp", "valid"]
    np.testing.assert_array_equal(frame["index"], np.arange(12))
    assert list(frame["path"]) == list(cache.paths)
    np.testing.assert_array_equal(frame["msp"], cache.msp)
    assert "path" not in cache.to_frame(paths=False)


def test_to_frame_with_pandas(trained):
    pd = pytest.importorskip("pandas")
    frame = open_cache(trained[1] / CLASSIFIER / "val").to_frame()
    assert isinstance(frame, pd.DataFrame) and len(frame) == 12
    assert list(frame.columns) == ["index", "path", "label", "pred", "correct", "msp", "valid"]


def test_a_cache_root_a_missing_cache_and_another_classifiers_name_are_refused(trained,
                                                                              tmp_path):
    _, cache_root, _ = trained
    with pytest.raises(CacheError, match=r"is not a cache but holds 2: pass one of them.*"
                                         rf"{CLASSIFIER}/(train|val)"):
        open_cache(cache_root)
    with pytest.raises(CacheError, match=r"no classifier cache at .*nowhere"):
        open_cache(tmp_path / "nowhere")
    moved = tmp_path / "resnet18" / "val"
    shutil.copytree(cache_root / CLASSIFIER / "val", moved)
    assert open_cache(moved).classifier == CLASSIFIER      # what extract recorded, not the folder
    with pytest.raises(CacheError, match=rf"was extracted with --classifier {CLASSIFIER} .*not "
                                         r"--classifier resnet18: it was copied or moved"):
        open_cache(moved, classifier="resnet18")


def test_paths_of_changed_images_are_refused_naming_the_extract_command(trained, tmp_path):
    """A copy of the data and its cache (the manifest pointed at the copy): one image edited."""
    from PIL import Image

    data, cache_root, _ = trained
    shutil.copytree(data, tmp_path / "data")               # copy2: the stamps are kept
    path = tmp_path / "cache" / CLASSIFIER / "val"
    shutil.copytree(cache_root / CLASSIFIER / "val", path)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["config"]["data"] = str(tmp_path / "data")
    (path / "manifest.json").write_text(json.dumps(manifest))
    assert open_cache(path).paths[0].startswith(str(tmp_path / "data"))
    edited = sorted((tmp_path / "data" / "val").rglob("*.JPEG"))[3]
    Image.fromarray(np.zeros((40, 40, 3), np.uint8)).save(edited)
    with pytest.raises(CacheError, match=r"changed since it was extracted.*Re-run the same "
                                         r"`cli.py extract` command"):
        open_cache(path).paths


# ------------------------------------------------------------------------------ scores --
def test_score_files_is_predict_images_and_the_runs_outputs(trained, oracle, tmp_path):
    data, _, run = trained
    files = val_files(data)[::-1]                           # any order: rows follow the input
    table = cli_table(run, data / "val", tmp_path / "p.csv", "--batch-size", 7)
    meta = json.loads((tmp_path / "p.meta.json").read_text())
    scores = oracle.score_files(files)
    assert isinstance(scores, Scores) and len(scores) == 12 and scores.valid.all()
    assert scores.threshold == meta["trust"]["threshold"] == oracle.threshold()
    assert scores.confidence.dtype == np.float32 and scores.pred.dtype == np.int64
    for i, path in enumerate(files):
        row = table[path]
        assert int(row["pred"]) == scores.pred[i]
        assert float(row["msp"]) == pytest.approx(float(scores.msp[i]), abs=1e-6)
        assert float(row["confidence"]) == pytest.approx(float(scores.confidence[i]), abs=1e-6)
        assert row["trust"] == ("true" if scores.trust[i] else "false")
    np.testing.assert_allclose(scores.confidence, 1 / (1 + np.exp(-scores.z.astype(float))),
                               atol=1e-6)
    out = read_outputs(run / "outputs" / "val.h5")
    written = dict(zip(output_paths(out), out.columns["confidence"]))
    np.testing.assert_allclose(scores.confidence, [written[p] for p in files], atol=1e-6)
    given = oracle.score_files(files, threshold=0.3)
    np.testing.assert_array_equal(given.confidence, scores.confidence)
    assert given.threshold == 0.3 and (given.trust == (given.confidence >= 0.3)).all()


def test_score_images_is_score_files_on_the_same_pixels(trained, oracle, tmp_path):
    """PNG copies (lossless: PIL and the file decoder read the same pixels), a 16-bit grey, an
    RGBA and a palette image among them."""
    from PIL import Image

    files = []
    for i, src in enumerate(val_files(trained[0])):
        im = Image.open(src).convert("RGB")
        im = [im, im.convert("RGBA"), im.convert("P")][i % 3]
        files.append(tmp_path / f"{i:02d}.png")
        im.save(files[-1])
    grey = np.random.default_rng(0).integers(0, 65535, (30, 40)).astype(np.uint16)
    Image.fromarray(grey).save(tmp_path / "grey16.png")
    files.append(tmp_path / "grey16.png")
    from_files = oracle.score_files(files)
    images = [Image.open(p) for p in files]
    from_images = oracle.score_images(images)
    np.testing.assert_allclose(from_images.confidence, from_files.confidence, atol=1e-6)
    np.testing.assert_array_equal(from_images.pred, from_files.pred)
    np.testing.assert_allclose(from_images.msp, from_files.msp, atol=1e-6)
    assert len(oracle.score_images([])) == 0 and len(oracle.score_files([])) == 0


def test_score_on_a_preprocessed_batch_is_score_files(trained, oracle):
    from pipeline.data.images import GpuNormalize, ResizeCrop, decode_file

    files = val_files(trained[0])
    ref = oracle.score_files(files)
    pixels = torch.stack([ResizeCrop(oracle.data_config)(decode_file(p)) for p in files])
    as_pixels = oracle.score(pixels)
    np.testing.assert_allclose(as_pixels.confidence, ref.confidence, atol=1e-6)
    assert as_pixels.pred is None and as_pixels.msp is None
    normalised = GpuNormalize(oracle.data_config, torch.device("cpu"))(pixels)
    np.testing.assert_allclose(oracle.score(normalised).confidence, ref.confidence, atol=1e-6)
    np.testing.assert_array_equal(oracle.score(normalised).trust, ref.trust)


@pytest.mark.parametrize("x, pattern", [
    (lambda: torch.zeros(2, 3, 16, 16, dtype=torch.uint8),
     r"score\(x\): got a tensor of shape \(2, 3, 16, 16\); expected \(B, 3, 32, 32\)"),
    (lambda: torch.zeros(3, 32, 32, dtype=torch.uint8),
     r"got a tensor of shape \(3, 32, 32\); expected \(B, 3, 32, 32\)"),
    (lambda: torch.zeros(2, 3, 32, 32, dtype=torch.float64),
     r"got dtype torch.float64; expected torch.uint8 pixels \(0..255\) or torch.float32"),
    (lambda: np.zeros((2, 3, 32, 32), np.uint8), r"got ndarray; expected a torch.Tensor"),
    (lambda: torch.zeros(2, 3, 32, 32, device="meta"),
     r"got a tensor on meta; expected a tensor on the CPU or on the oracle's device cpu"),
])
def test_a_batch_of_the_wrong_kind_is_refused_saying_what_is_expected(oracle, x, pattern):
    with pytest.raises(InputError, match=pattern):
        oracle.score(x())


def test_other_arguments_of_the_wrong_kind(oracle, trained, tmp_path):
    from PIL import Image

    x = torch.zeros(2, 3, 32, 32, dtype=torch.uint8)
    for kwargs, pattern in [
            ({"logits": torch.zeros(2, 5)}, r"got a torch.float32 tensor of shape \(2, 5\); "
                                            r"expected a float tensor of shape \(2, 3\)"),
            ({"threshold": 1.5}, r"threshold: got 1.5; expected a confidence in \[0, 1\]"),
            ({"threshold": "fpr=0.1"}, r"threshold: 'fpr=0.1' is not a target: expected tpr=T"),
            ({"threshold": ("tpr", 2)}, r"threshold: 'tpr=2': tpr must be in \(0, 1\]")]:
        with pytest.raises(InputError, match=pattern):
            oracle.score(x, **kwargs)
    one = val_files(trained[0])[0]
    with pytest.raises(InputError, match=r"score_files\(paths\): got str; expected a sequence "
                                         r".*wrap a single one in a list"):
        oracle.score_files(one)
    with pytest.raises(InputError, match=r"score_images: item 1: got str; expected a PIL"):
        oracle.score_images([Image.open(one), one])
    strip = Image.fromarray(np.zeros((1, 3000, 3), np.uint8))
    with pytest.raises(InputError, match=r"score_images: image 0: got 3000x1 pixels.*aspect "
                                         r"ratio 3000:1"):
        oracle.score_images([strip])
    with pytest.raises(InputError, match=r"batch_size\): got 0; expected an int >= 1"):
        load_oracle(trained[2], device="cpu", batch_size=0)
    with pytest.raises(DeviceError, match=r"'gpu' is not a device: expected cpu, cuda or cuda:N"):
        load_oracle(trained[2], device="gpu")
    assert issubclass(InputError, ValueError)


def test_missing_and_undecodable_files(oracle, trained, tmp_path):
    files = val_files(trained[0])[:3]
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(open(files[0], "rb").read()[:150])
    with pytest.raises(DataError, match=r"score_files: 1 of 4 path\(s\) are not files, e\.g\. "
                                        r".*gone\.jpg \(moved or deleted\?\)"):
        oracle.score_files([*files, tmp_path / "gone.jpg"])
    with pytest.raises(BadImageError, match=rf"cannot decode {broken} \(row 1\): .*Replace the "
                                            r"file, or pass skip_bad=True"):
        oracle.score_files([files[0], broken])
    scores = oracle.score_files([files[0], broken, tmp_path / "gone.jpg", files[1]],
                                skip_bad=True)
    np.testing.assert_array_equal(scores.valid, [True, False, False, True])
    assert np.isnan(scores.confidence[1:3]).all() and list(scores.pred[1:3]) == [-1, -1]
    assert not scores.trust[1:3].any()
    # the same files in a batch of 4 and of 2: equal on the CPU; a GPU's kernels may round
    # differently with the batch size
    np.testing.assert_allclose(scores.confidence[[0, 3]],
                               oracle.score_files([files[0], files[1]]).confidence, atol=1e-6)


# --------------------------------------------------------------------- runs and models --
def test_a_run_without_held_out_rows_needs_a_given_threshold(trained, tmp_path):
    data, cache, _ = trained
    run = tmp_path / "run0"
    run_cli(train_args(data, cache, run, "--val-fraction", 0, "--batch-size", 4))
    oracle = load_oracle(run, device="cpu")
    message = cli_error(["predict", "--run", run, "--images", data / "val", *FAST])
    with pytest.raises(RunError) as err:
        oracle.threshold()
    assert str(err.value) == message and "held out no training rows" in message
    with pytest.raises(RunError, match="held out no training rows"):
        oracle.score_files(val_files(data))
    scores = oracle.score_files(val_files(data), threshold=0.5)
    assert scores.threshold == 0.5 and "reached" not in oracle.threshold_choice(0.5)


def test_an_unfinished_run_and_a_moved_training_cache_are_refused(trained, tmp_path):
    _, _, run = trained
    for edit, pattern in [({"status": "running"}, r"is not complete \(status 'running'\)"),
                          ({"train_cache": str(tmp_path / "gone"), "train_cache_from_run": "../gone",
                            "train_cache_given": str(tmp_path / "gone")},
                           r"was trained on the classifier cache .*gone, which is not there now")]:
        copy = tmp_path / f"run-{len(edit)}-{next(iter(edit))}"
        shutil.copytree(run, copy)
        record = json.loads((copy / "run.json").read_text())
        (copy / "run.json").write_text(json.dumps({**record, **edit}))
        with pytest.raises(RunError, match=pattern):
            load_oracle(copy, device="cpu")


@pytest.fixture(scope="module")
def weights_run(trained, tmp_path_factory):
    """A run whose classifier came from a weights file (--weights), as a user's own would."""
    import timm

    data = trained[0]
    base = tmp_path_factory.mktemp("api-weights")
    torch.manual_seed(5)
    model = timm.create_model(CLASSIFIER, pretrained=False, num_classes=3, **TINY_VIT_KWARGS)
    torch.save(model.state_dict(), base / "mine.pth")
    run_cli(["extract", "--classifier", CLASSIFIER, "--weights", base / "mine.pth",
             "--model-kwargs", json.dumps(TINY_VIT_KWARGS), "--data", data, "--out",
             base / "cache", "--split", "train", "--split", "val", "--precision", "fp32", *FAST])
    run_cli(train_args(data, base / "cache", base / "run", "--val-fraction", 0.25,
                       "--batch-size", 4))
    return base


def test_a_moved_weights_file_is_named_and_found_again_by_weights(trained, weights_run,
                                                                  tmp_path):
    data, base = trained[0], weights_run
    moved = tmp_path / "moved.pth"
    shutil.move(base / "mine.pth", moved)
    try:
        message = cli_error(["predict", "--run", base / "run", "--images", data / "val",
                             "--threshold", 0.5, *FAST])
        with pytest.raises(ModelError) as err:
            load_oracle(base / "run", device="cpu")
        # the CLI's message, naming the API's argument
        assert str(err.value) == message.replace("--weights FILE", "load_oracle(weights=FILE)")
        assert "is not there now (moved or deleted): pass --weights FILE" in message
        oracle = load_oracle(base / "run", device="cpu", weights=moved)
        assert len(oracle.score_files(val_files(data), threshold=0.5)) == 12
        import timm
        torch.manual_seed(6)
        torch.save(timm.create_model(CLASSIFIER, pretrained=False, num_classes=3,
                                     **TINY_VIT_KWARGS).state_dict(), tmp_path / "other.pth")
        with pytest.raises(ModelError, match=r"load_oracle\(weights=.*other.pth\) is not the "
                                             r"weights file the classifier of cache .* its sha256"):
            load_oracle(base / "run", device="cpu", weights=tmp_path / "other.pth")
    finally:
        shutil.move(moved, base / "mine.pth")


def test_a_cache_of_another_classifier_is_refused_by_the_oracle(trained, oracle, weights_run):
    oracle.check_cache(open_cache(trained[1] / CLASSIFIER / "val"))
    other = open_cache(weights_run / "cache" / CLASSIFIER / "val")
    with pytest.raises(CacheMismatch, match=r"(?s)weights_sha256: cache has .*It was extracted "
                                            r"with another classifier than the training split's"):
        oracle.check_cache(other)


@pytest.fixture(scope="module")
def stacked_run(trained, tmp_path_factory):
    """A head-only oracle on stacked inputs (features + the classifier's logit statistics)."""
    data = trained[0]
    base = tmp_path_factory.mktemp("api-stacked")
    extract(data, base / "cache", flip_view=False, extra=("--features",))
    run_cli(["train-oracle", "--classifier", CLASSIFIER, "--oracle", CLASSIFIER,
             "--random-init", "--model-kwargs", json.dumps({**TINY_VIT_KWARGS, "num_classes": 3}),
             "--data", data, "--cache", base / "cache", "--loss", "ce", "--batch-size", 4,
             "--no-progress", "--no-flip", "--head-only", "--head-inputs", "stacked",
             "--epochs", 2, "--lr", 0.05, "--val-fraction", 0.25, "--out", base / "run"])
    return base / "run"


def test_a_stacked_oracle_reads_the_classifiers_logits(trained, stacked_run, tmp_path):
    from pipeline.data.images import GpuNormalize, ResizeCrop, decode_file
    from pipeline.oracle.deploy.rebuild import load_classifier

    data = trained[0]
    oracle = load_oracle(stacked_run, device="cpu")
    assert oracle.stacked
    files = val_files(data)
    table = cli_table(stacked_run, data / "val", tmp_path / "s.csv", "--threshold", 0.5)
    scores = oracle.score_files(files, threshold=0.5)
    np.testing.assert_allclose(scores.confidence,
                               [float(table[p]["confidence"]) for p in files], atol=1e-6)
    pixels = torch.stack([ResizeCrop(oracle.data_config)(decode_file(p)) for p in files])
    with pytest.raises(InputError, match=r"got no logits; expected the classifier's logits "
                                         r"\(12, 3\): this oracle's head reads them too"):
        oracle.score(pixels, threshold=0.5)
    clf_cfg = oracle.classifier_data_config
    x_clf = torch.stack([ResizeCrop(clf_cfg)(decode_file(p)) for p in files])
    # the classifier the stacked run's cache recorded: the same seeded model as the trained run's
    classifier = load_classifier(ClassifierCache.open(trained[1] / CLASSIFIER / "val"), None)
    with torch.inference_mode():
        logits = classifier(GpuNormalize(clf_cfg, torch.device("cpu"))(x_clf))
    with_logits = oracle.score(pixels, logits, threshold=0.5)
    np.testing.assert_allclose(with_logits.confidence, scores.confidence, atol=1e-6)
    np.testing.assert_array_equal(with_logits.pred, scores.pred)
    np.testing.assert_allclose(with_logits.msp, scores.msp, atol=1e-6)
