"""TrustScore (pipeline/report/knn.py, trustscore.py): the chunked exact search against a direct,
loop-based implementation of Jiang et al.'s definition as their reference code computes it
(a row is its own first neighbour, np.percentile's kept radii <=, min_dist 1e-12), with ties;
the report's rows, notes and errors."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.synthetic_runs import write_cache, write_run, write_study
from cache.reader import ClassifierCache
from conftest import ROOT
from pipeline.report import knn


def direct(train, labels, queries, pred, k, alpha, classes):
    """The definition, one distance at a time (math.dist: sqrt of the sum of squares)."""
    kept = {}
    for c in range(classes):
        rows = [x for x, y in zip(train, labels) if y == c]
        radii = [sorted(math.dist(a, b) for b in rows)[k - 1] for a in rows]   # a itself first
        cut = np.percentile(radii, (1 - alpha) * 100)
        kept[c] = [a for a, r in zip(rows, radii) if r <= cut]
    out = []
    for x, y in zip(queries, pred):
        dist = {c: min(math.dist(x, b) for b in kept[c]) for c in range(classes)}
        out.append(min(dist[c] for c in dist if c != y) / (dist[y] + 1e-12))
    return np.array(out), {c: len(v) for c, v in kept.items()}


def tied_points(seed=0, n=90, d=3, classes=3):
    """Integer coordinates (every distance exact in float64, many equal), duplicated rows, and
    queries that sit on training rows (a distance of exactly 0)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, size=(n, d)).astype(np.float64)
    x[n // 2:n // 2 + 10] = x[:10]                     # duplicates, in other classes too
    y = rng.integers(0, classes, n)
    q = np.concatenate([rng.integers(-4, 5, size=(40, d)), x[:15]]).astype(np.float64)
    return x, y, q, rng.integers(0, classes, len(q))


@pytest.mark.parametrize("k,alpha", [(1, 0.0), (2, 0.0), (3, 0.25), (5, 0.5), (10, 0.1), (4, 1.0)])
def test_equals_the_direct_definition_with_ties(k, alpha):
    x, y, q, pred = tied_points()
    want, counts = direct(x, y, q, pred, k, alpha, 3)
    kept, offsets = knn.kept_sets(x, y, 3, k, alpha)
    assert np.diff(offsets).tolist() == [counts[c] for c in range(3)]
    got = knn.trust_ratio(q, pred, kept, offsets)
    assert np.array_equal(got, want)           # exact: the distances are recomputed directly
    if alpha > 0:
        assert len(kept) < len(x)              # the filter did filter


def test_small_chunks_and_torch_give_the_same_bits():
    """The query and radius chunking, and the torch path (on the CPU here; cuda in
    bench_trustscore.py), choose the same rows."""
    x, y, q, pred = tied_points(seed=4, n=150)
    want = knn.trust_ratio(q, pred, *knn.kept_sets(x, y, 3, 4, 0.3))
    tiny = knn.backend("cpu")
    tiny.block = 8 * 7                         # 7 columns' worth: chunks of 1 row
    assert np.array_equal(knn.trust_ratio(q, pred, *knn.kept_sets(x, y, 3, 4, 0.3, tiny), tiny),
                          want)
    pytest.importorskip("torch")
    dev = knn._Torch("cpu")
    assert np.array_equal(knn.trust_ratio(q, pred, *knn.kept_sets(x, y, 3, 4, 0.3, dev), dev),
                          want)


def test_float16_features_with_duplicates_match_the_definition():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(120, 6)).astype(np.float16)
    x[60:80] = x[:20]
    y = rng.integers(0, 4, 120)
    q = np.concatenate([rng.normal(size=(30, 6)).astype(np.float16), x[:10]])
    pred = rng.integers(0, 4, len(q))
    want, _ = direct(x.astype(np.float64), y, q.astype(np.float64), pred, 5, 0.2, 4)
    got = knn.trust_ratio(q, pred, *knn.kept_sets(x, y, 4, 5, 0.2))
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_far_from_the_origin_duplicates_stay_at_distance_zero():
    """Features far from the origin (|x|^2 ~ 1e5): |q|^2 - 2 q.x + |x|^2 cancels to a residue
    where q and x coincide, and its root would divide the score; the definition has 0 there."""
    rng = np.random.default_rng(8)
    x = 100.0 + rng.normal(size=(80, 10))
    x[40:50] = x[:10]
    y = rng.integers(0, 2, 80)
    q = np.concatenate([100.0 + rng.normal(size=(20, 10)), x[:10], x[40:45]])
    pred = np.concatenate([rng.integers(0, 2, 20), y[:10], y[40:45]])    # on their own class
    want, _ = direct(x, y, q, pred, 3, 0.1, 2)
    got = knn.trust_ratio(q, pred, *knn.kept_sets(x, y, 2, 3, 0.1))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert (want[20:] > 1e9).sum() >= 5       # queries on kept rows of their class: d = 0


# ---------------------------------------------------------------------------- the report --
def cli(*args, cwd=None):
    return subprocess.run([sys.executable, str(ROOT / "cli.py"), *map(str, args)],
                          capture_output=True, text=True, cwd=cwd)


@pytest.fixture(scope="module")
def featured(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("featured")
    write_study(root, n=600, losses=("ss",), seeds=(0,), n_train=1500, features=8)
    return root


def baseline_labels(doc: dict) -> set[str]:
    return {r["loss_label"] for s in doc["splits"] for r in s["rows"] if r["kind"] == "baseline"}


def test_report_on_caches_with_features_has_both_rows(featured, tmp_path):
    out = tmp_path / "r"
    proc = cli("report", "--runs-root", featured / "runs", "--out", out, "--no-figures",
               "--resamples", "50", "--jobs", "1")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "report.json").read_text())
    assert {"TrustScore", "REL-U"} <= baseline_labels(doc)
    fit = doc["trust_score"]["fits"][0]
    assert fit["train_cache"] == str((featured / "cache" / "vit" / "train").resolve())
    assert (fit["k"], fit["alpha"], fit["kept_rows"]) == (10, 0.0, fit["train_rows"])
    row = next(r for s in doc["splits"] for r in s["rows"] if r["loss_label"] == "TrustScore")
    assert row["agg"]["standard"]["auc"]["mean"] > 0.5      # features centred on the prediction
    md = (out / "report.md").read_text()
    assert "| TrustScore |" in md and "| REL-U |" in md and "TrustScore: k = 10" in md


def test_trust_scores_in_the_report_are_the_definitions(featured, tmp_path):
    """The worker's scores (k = 3, alpha = 0.2) equal knn's on the same valid rows."""
    from pipeline.report.inputs import CacheTask
    from pipeline.report.trustscore import TrustSpec, TrustTask, fit_and_score
    test, train = (featured / "cache" / "vit" / t for t in ("test", "train"))
    task = TrustTask(str(train), (CacheTask(str(test), "vit", ("test",)),), TrustSpec(3, 0.2))
    record, scored = fit_and_score(task)
    tr = ClassifierCache.open(train).load(["label", "features"])
    ev = ClassifierCache.open(test).load(["pred", "features"])
    want = knn.trust_ratio(ev["features"], ev["pred"],
                           *knn.kept_sets(tr["features"], tr["label"], 10, 3, 0.2))
    assert np.array_equal(scored[str(test)]["score"], want)
    assert record["kept_rows"] < record["train_rows"] == 1500


def test_caches_without_features_get_a_note_or_on_request_an_error(tmp_path):
    root = tmp_path / "plain"
    write_study(root, n=400, losses=("ss",), seeds=(0,), n_train=1000)
    out = tmp_path / "r"
    proc = cli("report", "--runs-root", root / "runs", "--out", out, "--no-figures", "--no-ci")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "report.json").read_text())
    assert "TrustScore" not in baseline_labels(doc) and "REL-U" in baseline_labels(doc)
    note = doc["trust_score"]["notes"][0]
    assert "has no features" in note and "extract --features" in note
    assert "note: TrustScore left out" in (out / "report.md").read_text()
    for ask in (["--trust-score"], ["--trust-score-k", "5"]):
        proc = cli("report", "--runs-root", root / "runs", "--out", tmp_path / "x", *ask)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        assert "error: TrustScore: the classifier cache" in proc.stderr
        assert "has no features" in proc.stderr and "cli.py extract --features" in proc.stderr
    assert not (tmp_path / "x").exists()


def small_study(root: Path, n_train: int, bad_rows=()) -> Path:
    test = write_cache(root / "cache" / "vit" / "test", n=300, k=3, model="vit", features=4)
    train = write_cache(root / "cache" / "vit" / "train", n=n_train, k=3, seed=9,
                        weights_seed=0, model="vit", split="train", features=4,
                        bad_rows=tuple(bad_rows))
    write_run(root / "runs" / "a", test, oracle="vit", classifier="vit", loss="ss", seed=0,
              group="g", train_cache=train, val_rows=list(range(0, n_train, 2)))
    return train


def test_k_above_a_class_is_named_with_the_k_that_fits(tmp_path):
    train = small_study(tmp_path / "s", 40)
    counts = np.bincount(ClassifierCache.open(train).load(["label"])["label"], minlength=3)
    c, n = int(counts.argmin()), int(counts.min())
    proc = cli("report", "--runs-root", tmp_path / "s" / "runs", "--out", tmp_path / "r",
               "--trust-score-k", n + 1)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert (f"error: TrustScore: class {c} ('{c}') has {n} valid row(s) in the training cache "
            f"{train.resolve()}, fewer than --trust-score-k {n + 1}") in proc.stderr
    assert f"pass --trust-score-k {n} or less" in proc.stderr
    assert not (tmp_path / "r").exists()
    # unasked (the default k = 10 here), the same problem is a note and the report is written
    if n < 10:
        proc = cli("report", "--runs-root", tmp_path / "s" / "runs", "--out", tmp_path / "r2",
                   "--no-figures", "--no-ci")
        assert proc.returncode == 0 and "note: TrustScore left out" in proc.stderr
        assert "fewer than --trust-score-k 10" in proc.stderr


def test_a_class_without_valid_training_rows_is_named(tmp_path):
    labels = np.random.default_rng(9).integers(0, 3, 200)    # write_cache's first draw
    train = small_study(tmp_path / "s", 200, bad_rows=np.flatnonzero(labels == 2).tolist())
    cols = ClassifierCache.open(train).load(["label", "valid"])
    assert set(cols["label"][cols["valid"] == 0].tolist()) == {2}      # the premise
    proc = cli("report", "--runs-root", tmp_path / "s" / "runs", "--out", tmp_path / "r",
               "--trust-score")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert (f"error: TrustScore: class 2 ('2') has no valid row in the training cache "
            f"{train.resolve()}") in proc.stderr


def test_no_trust_score_with_its_options_is_a_usage_error(featured, tmp_path):
    proc = cli("report", "--runs-root", featured / "runs", "--out", tmp_path / "r",
               "--no-trust-score", "--trust-score-alpha", "0.1")
    assert proc.returncode == 2 and "--trust-score-alpha given with --no-trust-score" in proc.stderr


def test_an_unusable_device_is_refused_before_any_work(featured, tmp_path):
    proc = cli("report", "--runs-root", featured / "runs", "--out", tmp_path / "r",
               "--knn-device", "nosuchdevice")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "error: TrustScore: --knn-device nosuchdevice:" in proc.stderr
    assert "use --knn-device cpu" in proc.stderr and not (tmp_path / "r").exists()


def test_an_unasked_search_too_large_for_the_cpu_is_a_note(featured, tmp_path, monkeypatch):
    """Caches with features of ImageNet's size would make a default report run for hours on the
    CPU: unasked, it is left out with a note (here the limit is lowered to the study's size)."""
    from pipeline.report import trustscore
    from pipeline.report.run import ReportConfig, report
    monkeypatch.setattr(trustscore, "AUTO_CPU_PAIRS", 1500 * 600 - 1)
    report(ReportConfig(runs_root=str(featured / "runs"), out=str(tmp_path / "r"), figures=False,
                        jobs=1, resamples=0))
    doc = json.loads((tmp_path / "r" / "report.json").read_text())
    assert "TrustScore" not in baseline_labels(doc) and not doc["trust_score"]["fits"]
    assert "(900,000 training-row x query pairs" in doc["trust_score"]["notes"][0]
    assert "pass --knn-device cuda, or --trust-score" in doc["trust_score"]["notes"][0]
    monkeypatch.setattr(trustscore, "AUTO_CPU_PAIRS", 1500 * 600)
    report(ReportConfig(runs_root=str(featured / "runs"), out=str(tmp_path / "r"), figures=False,
                        jobs=1, resamples=0))
    doc = json.loads((tmp_path / "r" / "report.json").read_text())
    assert "TrustScore" in baseline_labels(doc)


def test_the_training_cache_itself_gets_no_trust_score_row(tmp_path):
    """Its rows would be their own nearest neighbours (distance 0): a note, never a number."""
    train = write_cache(tmp_path / "cache" / "vit" / "train", n=300, k=3, model="vit",
                        split="train", features=4)
    proc = cli("report", "--cache", train, "--out", tmp_path / "r", "--no-figures", "--no-ci")
    assert proc.returncode == 0, proc.stderr
    assert (f"note: TrustScore left out for {train.resolve()}: {train.resolve()} is the "
            "training cache TrustScore is fitted on") in proc.stderr
    doc = json.loads((tmp_path / "r" / "report.json").read_text())
    assert "TrustScore" not in baseline_labels(doc)


def test_features_of_another_width_than_the_training_caches_are_refused(tmp_path):
    test = write_cache(tmp_path / "s" / "cache" / "vit" / "test", n=300, k=3, model="vit",
                       features=6)
    train = write_cache(tmp_path / "s" / "cache" / "vit" / "train", n=200, k=3, seed=9,
                        weights_seed=0, model="vit", split="train", features=4)
    write_run(tmp_path / "s" / "runs" / "a", test, oracle="vit", classifier="vit", loss="ss",
              seed=0, group="g", train_cache=train, val_rows=list(range(0, 200, 2)))
    proc = cli("report", "--runs-root", tmp_path / "s" / "runs", "--out", tmp_path / "r",
               "--no-figures", "--no-ci")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert (f"error: TrustScore: the features of {test.resolve()} have 6 dimensions, those of "
            f"its training cache {train.resolve()} 4; re-extract one of them") in proc.stderr
