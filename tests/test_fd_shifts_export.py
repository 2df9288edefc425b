"""`report --export fd-shifts` against fd-shifts' documented input semantics (its README "Analysis"
and ``fd_shifts.analysis``; fd-shifts installs only from its git source, so CI cannot run it):
one experiment per run, one raw_logits.npz holding every dataset told apart by the last column,
index 0 = the validation set its analysis requires (present, = the run's held-out rows), test
sets 1, 2, ... in query_studies order, correctness = argmax(logits) == label, and the external
confidences row-aligned.  docs/METRICS.md records the run of fd-shifts itself."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.synthetic_runs import write_cache, write_run, write_study
from cache.integrity import file_digest
from cache.outputs import MadeOn, classifier_ref, read_outputs, write_outputs
from cache.reader import ClassifierCache
from cache.runs import FRAME_KEYS, RunDir
from cache.schema import CacheMismatch
from pipeline.core import metrics as M
from pipeline.report.export import fd_shifts_logits, raw_logits_array
from pipeline.report.run import ReportConfig, report


def add_heldout(run_dir: Path, train_cache: Path, seed: int = 0) -> np.ndarray:
    """What train-oracle now writes at the end of a run: its oracle's scores of the rows it held
    out (RUN/heldout/train.h5, valid = 1 on those rows), recorded in run.json."""
    run = RunDir(run_dir)
    rows = np.asarray(run.val_split()["val_rows"])
    cache = ClassifierCache.open(train_cache)
    cols = cache.load(["label", "valid", "pred", "correct"])
    n = cache.num_rows
    z, valid = np.zeros(n, np.float32), np.zeros(n, np.uint8)
    z[rows] = np.random.default_rng(seed).normal(size=len(rows)) + 2 * cols["correct"][rows] - 1
    valid[rows] = 1
    record = run.read()
    path = run.heldout_output("train")
    write_outputs(path, {"index": np.arange(n, dtype=np.int64), "valid": valid, "z": z,
                         "confidence": 1 / (1 + np.exp(-z)), "correct": cols["correct"],
                         "label": cols["label"], "pred": cols["pred"]},
                  classifier_ref(cache.path, cache.identity), record["run"],
                  MadeOn("", "", "", "", "synthetic scores"))
    extra = {k: v for k, v in record.items() if k not in FRAME_KEYS}
    run.write(record["run"], record["status"], record["versions"],
              **{**extra, "heldout_output": {"split": "train", **file_digest(path)}})
    return rows


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """Two runs (CE, SS) of one classifier on test (row 7 undecodable) and on a corrupted copy
    of test, each with its 300 held-out training rows scored."""
    root = tmp_path_factory.mktemp("fds")
    write_study(root, n=900, losses=("ce", "ss"), seeds=(0,), n_train=3000, bad_rows=(7,))
    shifted = write_cache(root / "cache" / "vit" / "test-gaussian_noise-5", n=500, model="vit",
                          seed=3, weights_seed=0, corruption="gaussian_noise:5:seed0")
    for run in sorted((root / "runs").iterdir()):
        record = RunDir(run).read()["run"]
        write_run(run, shifted, oracle="vit", classifier="vit", loss=record["loss"], seed=0,
                  group=record["group"], tag="test-gaussian_noise-5",
                  train_cache=root / "cache" / "vit" / "train",
                  val_rows=RunDir(run).val_split()["val_rows"])
        add_heldout(run, root / "cache" / "vit" / "train")
    return root


def export(root: Path, out: Path) -> dict:
    report(ReportConfig(runs_root=str(root / "runs"), out=str(out), figures=False, jobs=1,
                        resamples=0, export=("fd-shifts",)))
    return json.loads((out / "fd-shifts" / "index.json").read_text())


def load(exp_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """As fd-shifts' ExperimentData.from_experiment reads them (positional arr_0, float64)."""
    with np.load(exp_dir / "test_results" / "raw_logits.npz") as npz:
        raw = npz.f.arr_0.astype(np.float64)
    with np.load(exp_dir / "test_results" / "external_confids.npz") as npz:
        ext = npz.f.arr_0.astype(np.float64)
    return raw, ext


def test_one_experiment_per_run_validation_rows_at_index_0(study, tmp_path):
    index = export(study, tmp_path / "r")
    root = tmp_path / "r" / "fd-shifts"
    runs = sorted(p for p in (study / "runs").iterdir())
    assert sorted(e["run"] for e in index["experiments"]) == [str(r) for r in runs]
    assert sorted(p.name for p in (root / "vit").iterdir()) == [r.name for r in runs]
    train = ClassifierCache.open(study / "cache" / "vit" / "train").load(["label", "logits"])
    for e in index["experiments"]:
        raw, ext = load(root / e["dir"])
        k = 10
        assert raw.shape == (300 + 899 + 500, k + 2) and ext.shape == (len(raw),)
        idx = raw[:, -1]
        # fd-shifts: val_tuning = index 0, then iid_study, then each in_class_study
        assert [d["study"] for d in e["datasets"]] == ["val_tuning", "iid_study", "in_class_study"]
        assert [d["split"] for d in e["datasets"]] == ["train", "test", "test-gaussian_noise-5"]
        assert np.bincount(idx.astype(int)).tolist() == [300, 899, 500]
        assert e["datasets"][1]["excluded_indices"] == [7]
        run = RunDir(Path(e["run"]))
        held = run.val_split()["val_rows"]
        heldout = read_outputs(run.heldout_output("train"))
        assert np.array_equal(raw[idx == 0, :k], train["logits"][held].astype(np.float64))
        assert np.array_equal(raw[idx == 0, k], train["label"][held])
        assert np.array_equal(ext[idx == 0], heldout.columns["confidence"][held].astype(np.float32))
        for i, tag in ((1, "test"), (2, "test-gaussian_noise-5")):
            o = read_outputs(run.output(tag))
            ok = o.columns["valid"] == 1
            assert np.array_equal(ext[idx == i], o.columns["confidence"][ok].astype(np.float32))
            # fd-shifts' correctness (argmax == label) is our correct column, row by row
            fd_correct = raw[idx == i, :k].argmax(1) == raw[idx == i, k]
            assert np.array_equal(fd_correct, o.columns["correct"][ok] == 1)
        args = e["fd_shifts_args"]
        assert f"--config.exp.name={Path(e['run']).name}" in args
        assert "--config.eval.query_studies.iid_study=test" in args
        assert ("--config.eval.query_studies.in_class_study=[{dataset: test-gaussian_noise-5, "
                "img_size: [28, 28, 3]}]") in args
        assert "--config.eval.ext_confid_name=ext" in args


def test_a_float16_tie_is_resolved_toward_the_stored_prediction():
    """fd-shifts' argmax takes the lower class on a tie; our pred came from unrounded logits."""
    logits = np.array([[2.0, 0.5, 2.0], [1.0, 3.0, 0.0]], np.float16)
    pred = np.array([2, 1])
    out, adjusted = fd_shifts_logits(logits, pred)
    assert adjusted == 1 and out.argmax(1).tolist() == [2, 1]
    assert out[0, 2] == np.nextafter(np.float32(2.0), np.float32(3.0))
    others = np.arange(6) != 2
    assert np.array_equal(out.ravel()[others], logits.astype(np.float32).ravel()[others])
    cols = {"logits": logits, "pred": pred, "label": np.array([2, 0]), "correct": np.array([1, 0])}
    raw, n = raw_logits_array(cols, 1)
    assert n == 1 and (raw[:, -1] == 1).all()
    assert (raw[:, :3].argmax(1) == raw[:, 3]).tolist() == [True, False]
    with pytest.raises(CacheMismatch, match="cache C: row 41: the stored prediction 0 is not a "
                                            "largest logit of that row"):
        fd_shifts_logits(logits, np.array([2, 0]), "cache C", np.array([40, 41]))
    with pytest.raises(CacheMismatch, match="rows: row 1: correct=0 but pred 1 and label 1"):
        raw_logits_array({**cols, "label": np.array([2, 1])}, 1)


def cli_report(*args):
    from click.testing import CliRunner

    from cli import cli
    return CliRunner().invoke(cli, ["report", "--no-figures", "--jobs", "1", "--no-ci",
                                    "--export", "fd-shifts", *map(str, args)],
                              catch_exceptions=False)


def test_runs_without_held_out_scores_are_refused_naming_the_command(tmp_path):
    """A run trained before train-oracle scored its held-out rows, and one that held out none:
    no experiment without a validation set (fd-shifts' analysis would stop on an empty or
    missing index 0); the report itself is kept."""
    write_study(tmp_path / "a", n=300, losses=("ss",), seeds=(0, 1), n_train=1000)
    add_heldout(next((tmp_path / "a" / "runs").glob("*seed1*")),
                tmp_path / "a" / "cache" / "vit" / "train")
    res = cli_report("--runs-root", tmp_path / "a" / "runs", "--out", tmp_path / "ra")
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert res.output.count("\n  run ") == 1 and "seed0" in res.output
    assert ("has no oracle scores of its held-out rows, which fd-shifts' analysis needs as its "
            "validation set (dataset index 0): re-run the same `cli.py train-oracle` command"
            ) in res.output
    assert (tmp_path / "ra" / "report.md").exists() and not (tmp_path / "ra" / "fd-shifts").exists()
    write_study(tmp_path / "b", n=300, losses=("ss",), seeds=(0,), held_out=None)
    res = cli_report("--runs-root", tmp_path / "b" / "runs", "--out", tmp_path / "rb")
    assert res.exit_code == 1 and "held out no training rows (--val-fraction 0)" in res.output
    assert "train it with --val-fraction > 0" in res.output
    res = cli_report("--cache", tmp_path / "b" / "cache" / "vit" / "test", "--out", tmp_path / "rc")
    assert res.exit_code == 1 and "no oracle run among the inputs" in res.output
    assert (tmp_path / "rc" / "report.md").exists()


def test_a_damaged_held_out_file_is_refused(study, tmp_path):
    run = sorted((study / "runs").iterdir())[0]
    path = RunDir(run).heldout_output("train")
    before = path.read_bytes()
    data = bytearray(before)
    data[-100] ^= 0x01
    try:
        path.write_bytes(bytes(data))
        res = cli_report("--runs-root", study / "runs", "--out", tmp_path / "r")
    finally:
        path.write_bytes(before)
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert f"{path} is damaged" in res.output and "re-run the command that wrote it" in res.output



def test_a_moved_training_cache_is_named(tmp_path):
    write_study(tmp_path, n=300, losses=("ss",), seeds=(0,), n_train=1000)
    add_heldout(next((tmp_path / "runs").iterdir()), tmp_path / "cache" / "vit" / "train")
    (tmp_path / "cache" / "vit" / "train").rename(tmp_path / "elsewhere")
    res = cli_report("--runs-root", tmp_path / "runs", "--out", tmp_path / "r")
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert ("the training cache of train.h5 is not at "
            f"{(tmp_path / 'cache' / 'vit' / 'train').resolve()}; fd-shifts' validation rows are "
            "read from it") in res.output

# ------------------------------------------------ train-oracle writes the held-out scores --
@pytest.fixture(scope="module")
def colours(tmp_path_factory):
    from oracle_fixtures import extract, write_colour_tree

    base = tmp_path_factory.mktemp("heldout")
    data = write_colour_tree(base / "colours", {"train": 16, "val": 8})
    extract(data, base / "cache", extra=("--features",))
    return data, base / "cache"


def _run_args(data, cache, run, mode: str) -> list:
    from oracle_fixtures import CLASSIFIER, TINY_VIT_KWARGS, train_args
    split = ("--val-fraction", 0.25, "--eval-split", "val")
    if mode == "fine-tuned":
        return train_args(data, cache, run, "--epochs", 1, *split)
    return ["train-oracle", "--classifier", CLASSIFIER, "--oracle", CLASSIFIER, "--random-init",
            "--model-kwargs", json.dumps({**TINY_VIT_KWARGS, "num_classes": 3}), "--data", data,
            "--cache", cache, "--loss", "ss", "--batch-size", 8, "--no-progress", "--head-only",
            "--epochs", 1, "--out", run, *split]


@pytest.mark.parametrize("mode", ["head-only", "fine-tuned"])
def test_train_oracle_scores_its_held_out_rows_outside_the_evaluated_splits(colours, tmp_path,
                                                                          mode):
    from oracle_fixtures import CLASSIFIER, run_cli

    data, cache = colours
    run_dir = tmp_path / "run"
    args = _run_args(data, cache, run_dir, mode)
    run_cli(args)
    run = RunDir(run_dir)
    held = run.heldout_output("train")
    val_rows = run.val_split()["val_rows"]
    record = run.read()
    assert record["heldout_output"] == {"split": "train", **file_digest(held)}
    scored = read_outputs(held, digest=record["heldout_output"])
    assert np.flatnonzero(scored.columns["valid"]).tolist() == sorted(val_rows)
    assert len(val_rows) == 12
    # the checkpoint the run chose, scored on those rows: the held-out AUPR-Error it was chosen
    # by (the training split itself may not be evaluated, so the log's figure is the reference)
    correct = ClassifierCache.open(cache / CLASSIFIER / "train").load(["correct"])["correct"]
    z = scored.columns["z"][val_rows]
    assert M.aupr_error(z, correct[val_rows], definition="standard") == \
        pytest.approx(record["best"]["val_aupr_error"], abs=1e-6)
    assert [p.stem for p in run.outputs()] == ["val"]                # not an evaluated split
    report(ReportConfig(paths=(str(run_dir),), out=str(tmp_path / "r"), figures=False, jobs=1,
                        resamples=0, formats=("json",)))
    doc = json.loads((tmp_path / "r" / "report.json").read_text())
    assert sorted(s["split"] for s in doc["splits"]) == ["val"]
    # a run written before held-out scores: the same command adds them, nothing retrained
    best, log = run.checkpoint("best.pt").read_bytes(), run.log_file.read_text()
    held_bytes = held.read_bytes()
    held.unlink()
    extra = {k: v for k, v in record.items() if k not in (*FRAME_KEYS, "heldout_output")}
    run.write(record["run"], record["status"], record["versions"], **extra)
    again = run_cli(args)
    assert "already complete" in again.output
    assert held.read_bytes() == held_bytes
    assert run.read()["heldout_output"] == record["heldout_output"]
    assert run.checkpoint("best.pt").read_bytes() == best and run.log_file.read_text() == log
