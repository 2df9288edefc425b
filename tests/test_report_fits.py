"""What the report adds beyond the paper, end to end on a small synthetic study: where T and p are
fitted (and why not), the paired comparisons and the seed-mean intervals (the fd-shifts export:
tests/test_fd_shifts_export.py)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.synthetic_runs import write_cache, write_run, write_study
from cache.reader import ClassifierCache
from cache.runs import VAL_FILE
from pipeline.report.calibrate import fit_pnorm, fit_temperature
from pipeline.report.heldout import read_rows
from pipeline.report.run import ReportConfig, report


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("small")
    write_study(root, n=900, pairs=(("vit", "vit"),), losses=("ce", "ss"), seeds=(0, 1),
                n_train=3000, bad_rows=(7,))
    return root


def run_report(root: Path, out: Path, **kw) -> dict:
    report(ReportConfig(runs_root=str(root / "runs"), out=str(out), figures=False, jobs=1, **kw))
    return json.loads((out / "report.json").read_text())


def test_fits_use_the_held_out_training_rows(small, tmp_path):
    doc = run_report(small, tmp_path / "r", resamples=100)
    fit = doc["fits"][str((small / "cache" / "vit" / "test").resolve())]
    rows = json.loads(next((small / "runs").glob("*/val_split.json")).read_text())["val_rows"]
    assert fit["train_cache"] == str((small / "cache" / "vit" / "train").resolve())
    assert fit["rows"] == len(rows) == 300 and len(fit["runs"]) == 4
    cols = ClassifierCache.open(small / "cache" / "vit" / "train").load(["label", "logits"])
    logits, labels = cols["logits"][rows], cols["label"][rows]
    assert fit["ts"]["temperature"] == pytest.approx(fit_temperature(logits, labels)["temperature"])
    assert fit["pnorm"]["p"] == fit_pnorm(logits, labels)["p"]
    ts = next(r for r in doc["splits"][0]["rows"] if r["loss"] == "ts")
    assert ts["fit"]["value"]["temperature"] == fit["ts"]["temperature"]
    part = read_rows(small / "cache" / "vit" / "train", np.array(rows[:5]), ("label",))
    assert np.array_equal(part["label"], cols["label"][rows[:5]])


def test_disjoint_or_missing_held_out_rows_are_reasons(small, tmp_path):
    root = tmp_path / "copy"
    cache = write_cache(root / "cache" / "vit" / "test", n=400, model="vit")
    train = write_cache(root / "cache" / "vit" / "train", n=2000, model="vit", seed=5,
                        weights_seed=0, split="train")
    write_run(root / "runs" / "a", cache, oracle="vit", classifier="vit", loss="ss", seed=0,
              group="g", train_cache=train, val_rows=list(range(0, 200)))
    write_run(root / "runs" / "b", cache, oracle="vit", classifier="vit", loss="ss", seed=1,
              group="g", train_cache=train, val_rows=list(range(200, 400)))
    doc = run_report(root, tmp_path / "r1", resamples=0)
    reason = doc["fits"][str(cache.resolve())]["reason"]
    assert "share no held-out row" in reason
    ts = next(r for r in doc["splits"][0]["rows"] if r["loss"] == "ts")
    assert ts["agg"]["standard"]["auc"]["mean"] is None
    assert "share no held-out row" in ts["agg"]["standard"]["auc"]["undefined"]
    (root / "runs" / "b" / VAL_FILE).unlink()
    doc = run_report(root, tmp_path / "r2", resamples=0)
    assert "has no val_split.json" in doc["fits"][str(cache.resolve())]["reason"]


def test_paired_comparisons_and_seed_mean_intervals(small, tmp_path):
    doc = run_report(small, tmp_path / "r", resamples=300, ci_seed=3)
    split = doc["splits"][0]
    rows = {r["loss"]: r for r in split["rows"]}
    comps = {c["other"]: c for c in split["comparisons"]}
    assert set(comps) == {"CE", "MCP"}
    for other, key in (("CE", "ce"), ("MCP", "mcp")):
        for name in ("auc", "aurc"):
            entry = comps[other]["metrics"][name]
            delta = rows["ss"]["agg"]["standard"][name]["mean"] - rows[key]["agg"]["standard"][name]["mean"]
            assert entry["delta"] == pytest.approx(delta)
            assert entry["ci"]["low"] <= entry["delta"] <= entry["ci"]["high"]
    # the seed-mean interval covers the mean; same seed -> same numbers, other seed -> others
    cell = rows["ss"]["agg"]["standard"]["auc"]
    assert cell["n"] == 2 and cell["ci"]["low"] <= cell["mean"] <= cell["ci"]["high"]
    again = run_report(small, tmp_path / "r2", resamples=300, ci_seed=3)
    other = run_report(small, tmp_path / "r3", resamples=300, ci_seed=4)
    same = {c["other"]: c for c in again["splits"][0]["comparisons"]}
    assert same["CE"]["metrics"]["auc"]["ci"] == comps["CE"]["metrics"]["auc"]["ci"]
    diff = {c["other"]: c for c in other["splits"][0]["comparisons"]}
    assert diff["CE"]["metrics"]["auc"]["ci"] != comps["CE"]["metrics"]["auc"]["ci"]
    # --no-ci: no intervals anywhere, and the comparisons say why
    none = run_report(small, tmp_path / "r4", resamples=0)
    c = none["splits"][0]["comparisons"][0]["metrics"]["auc"]
    assert c["ci"]["undefined"] and c["delta"] is not None
    assert "ci" not in none["splits"][0]["rows"][0]["agg"]["standard"]["auc"]
