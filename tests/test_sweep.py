"""cli.py sweep: the paper's protocol over head-only (and fine-tuned) oracles, the choice on
held-out validation rows only, the table/figures, the printed command, and resuming."""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from oracle_fixtures import CLASSIFIER, TINY_VIT_KWARGS, extract, run_cli, write_colour_tree

ORACLE_KWARGS = {**TINY_VIT_KWARGS, "num_classes": 3}


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    data = write_colour_tree(root / "data", {"train": 40, "val": 12})
    extract(data, root / "cache", extra=("--features",))
    return root, data


def common(root: Path, data: Path, cache="cache") -> list:
    return ["--classifier", CLASSIFIER, "--oracle", CLASSIFIER, "--random-init",
            "--model-kwargs", json.dumps(ORACLE_KWARGS), "--data", data, "--cache", root / cache,
            "--batch-size", 8, "--no-progress", "--val-fraction", "0.25", "--lr", "0.05",
            "--momentum", "0.9", "--epochs", "4"]


def test_choose_uses_validation_only():
    from pipeline.sweep.grid import choose

    pts = [{"values": {"alpha_neg": a}, "val": {"tpr": tv, "tnr": nv, "auc": 0.5},
            "eval": {"tpr": te, "tnr": ne}}
           for a, tv, nv, te, ne in ((1, 0.9, 0.1, 0.9, 0.9), (3, 0.8, 0.6, 0.1, 0.1),
                                     (5, float("nan"), 0.9, 1.0, 1.0))]
    assert choose(pts, "tpr-tnr")["values"]["alpha_neg"] == 3   # eval would pick 5 (or 1)


def test_held_out_metrics_undefined_by_one_class_are_not_chosen_and_tabulated_as_missing():
    """Run files write a metric one class leaves undefined as null: no TypeError, the point is
    never chosen, its cell is '–'; no point defined -> None (the sweep's one-class message)."""
    from pipeline.sweep.grid import choose
    from pipeline.sweep.report import markdown

    undefined = {"tpr": 1.0, "tnr": None, "auc": None, "aupr_error": None, "aupr_success": 1.0}
    pts = [{"values": {"alpha_neg": a}, "val": val, "eval": None, "stage": 1, "status": "ok",
            "mean_train_loss": 0.1, "run_dir": f"r{a}"}
           for a, val in ((1, undefined), (3, {**undefined, "tnr": 0.5, "auc": 0.7}))]
    assert choose(pts, "tpr-tnr")["values"]["alpha_neg"] == 3
    assert choose(pts[:1], "tpr-tnr") is None and choose(pts[:1], "auc") is None
    text = markdown({"swept": ["alpha_neg"], "criterion": "tpr-tnr", "points": pts,
                     "chosen": {"alpha_neg": 3.0}, "fine_tune": False, "mode": "grid",
                     "command": "python cli.py train-oracle ..."})
    assert "| 1 | 1 | ok | – | 1 | – |" in text


def invert_correctness(cache_dir: Path) -> None:
    """Make the evaluation split disagree with the training split: flip o on every row.  The
    edit is re-sealed (column hashes, manifest entries) as a writer would, since every read
    checks them (an unsealed edit is refused as damage)."""
    from cache.integrity import column_hash
    from cache.manifest import MANIFEST_FILE
    from cache.shards import HASHES, shard_entry
    from cache.schema import to_attr

    for shard in cache_dir.glob("shard-*.h5"):
        with h5py.File(shard, "r+") as fh:
            hashes = json.loads(fh.attrs[HASHES])
            for col in ("correct", "correct_flip"):
                fh[col][...] = 1 - fh[col][...]
                hashes[col] = column_hash(fh[col][...])
            fh.attrs[HASHES] = to_attr(hashes)
    manifest = json.loads((cache_dir / MANIFEST_FILE).read_text())
    manifest["shards"] = [shard_entry(cache_dir / e["file"], e["start"], e["stop"])
                          for e in manifest["shards"]]
    (cache_dir / MANIFEST_FILE).write_text(json.dumps(manifest))


def test_head_only_sweep_chooses_on_validation_rows_when_the_test_split_disagrees(tree, tmp_path):
    root, data = tree
    shutil.copytree(root / "cache", tmp_path / "cache")
    invert_correctness(tmp_path / "cache" / CLASSIFIER / "val")
    out = tmp_path / "sw"
    res = run_cli(["sweep", "--alpha-neg", "0.5,2,8", "--alpha-pos", "0.25,1,6", "--out", out,
                   *common(tmp_path, data)])
    doc = json.loads((out / "sweep.json").read_text())
    score = lambda m: (m["tpr"] + m["tnr"]) / 2          # noqa: E731 - the default criterion
    for stage in (1, 2):
        pts = [p for p in doc["points"] if p["stage"] == stage]
        val = [score(p["val"]) for p in pts]
        ev = [score(p["eval"]) for p in pts]
        chosen = [p for p in pts if p.get("chosen_in_stage")]
        assert len(chosen) == 1 and score(chosen[0]["val"]) == max(val)
        if len(set(np.round(val, 12))) > 1:
            assert np.argmax(ev) != np.argmax(val)       # the test split disagrees ...
            assert score(chosen[0]["eval"]) < max(ev)     # ... and is not what chose
    assert len({score(p["val"]) for p in doc["points"]}) > 1   # the points differ at all
    # the table, the csv, the figures, and the command with the chosen values
    rows = list(csv.reader((out / "sweep.csv").open()))
    assert len(rows) == 1 + len(doc["points"]) == 7
    for name in ("sweep_alpha_neg.png", "sweep_alpha_pos.png"):
        png = out / "figures" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    md = (out / "sweep.md").read_text()
    ch = doc["chosen"]
    assert f"--alpha-neg {ch['alpha_neg']:g} --alpha-pos {ch['alpha_pos']:g}" in doc["command"]
    assert res.output.strip().splitlines()[-1] == doc["command"] and doc["command"] in md
    assert doc["command"].startswith("python cli.py train-oracle --classifier")
    # stage 2 runs at the alpha- chosen in stage 1
    assert {p["values"]["alpha_neg"] for p in doc["points"] if p["stage"] == 2} == \
        {doc["stages"][0]["chosen"]["alpha_neg"]}


def test_sweep_refusals(tree, tmp_path):
    root, data = tree
    base = ["--out", tmp_path / "x", *common(root, data)]
    assert "--alpha-neg does not apply to --loss ce" in run_cli(
        ["sweep", "--alpha-neg", "1,2", *base, "--loss", "ce"], expect=2).output
    assert "nothing to sweep" in run_cli(["sweep", *base, "--loss", "focal"], expect=2).output
    assert "positive" in run_cli(["sweep", "--alpha-neg", "1,-2", *base], expect=2).output
    assert "--head-only is not a sweep option" in run_cli(["sweep", *base, "--head-only"],
                                                         expect=2).output
    assert "--workers" in run_cli(["sweep", *base, "--workers", "2"], expect=2).output
    assert "held-out" in run_cli(["sweep", *base[:-8], "--val-fraction", "0"], expect=2).output


@pytest.mark.slow
def test_resumed_fine_tune_sweep_skips_complete_points(tree, tmp_path):
    root, data = tree
    out = tmp_path / "ft"
    args = ["sweep", "--fine-tune", "--mode", "grid", "--out", out, "--no-figures",
            *common(root, data)[:-2], "--epochs", "1", "--workers", "0", "--precision", "fp32"]
    run_cli(args[:1] + ["--alpha-neg", "1,3"] + args[1:])
    first = json.loads((out / "sweep.json").read_text())
    dirs = {p["values"]["alpha_neg"]: Path(p["run_dir"]) for p in first["points"]}
    stamps = {a: ((d / "log.jsonl").read_text(), (d / "checkpoints" / "best.pt").stat().st_mtime_ns)
              for a, d in dirs.items()}
    # interrupted sweep: a point that had not finished (its run directory incomplete)
    (dirs[3.0] / "run.json").write_text((dirs[3.0] / "run.json").read_text().replace(
        '"status": "complete"', '"status": "running"'))
    res = run_cli(args[:1] + ["--alpha-neg", "1,3,5"] + args[1:])
    again = json.loads((out / "sweep.json").read_text())
    assert len(again["points"]) == 3 and all(p["status"] == "complete" for p in again["points"])
    done = {p["values"]["alpha_neg"]: p for p in again["points"]}
    assert done[1.0]["already_complete"] and not done[5.0]["already_complete"]
    d = dirs[1.0]       # the complete point was not trained again
    assert ((d / "log.jsonl").read_text(), (d / "checkpoints" / "best.pt").stat().st_mtime_ns) \
        == stamps[1.0]
    assert "--alpha-neg 1: already complete" in res.output
    assert "--alpha-neg 5: complete" in res.output


def test_a_sweep_lists_the_image_folder_once_and_the_next_sweep_sees_changed_images(
        tree, tmp_path, monkeypatch):
    """Every point of every stage needs the same splits: one listing and one image check per
    split for the whole sweep, and none kept past it."""
    import pipeline.oracle.settings.targets as targets

    root, data = tree
    data = Path(shutil.copytree(data, tmp_path / "data"))     # its images are edited below
    listed, checked = [], []
    list_split, check_sources = targets.list_split, targets.check_sources
    monkeypatch.setattr(targets, "list_split",
                        lambda *a, **k: listed.append(a[1]) or list_split(*a, **k))
    monkeypatch.setattr(targets, "check_sources",
                        lambda path, *a, **k: checked.append(path) or check_sources(path, *a, **k))
    args = ["sweep", "--alpha-neg", "0.5,2,8", "--alpha-pos", "1,4", "--no-figures",
            *common(root, data)]
    run_cli([*args, "--out", tmp_path / "one"])
    doc = json.loads((tmp_path / "one" / "sweep.json").read_text())
    assert len(doc["points"]) == 5
    assert sorted(listed) == ["train", "val"]          # each split of the folder listed once
    assert len(checked) == len(set(checked)) == 2      # each cache's images checked once

    image = sorted((data / "train").rglob("*.JPEG"))[3]
    raw = bytearray(image.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    image.write_bytes(bytes(raw))
    res = run_cli([*args, "--out", tmp_path / "two"], expect=1)
    assert "of --data changed since it was extracted" in res.output
    assert not list((tmp_path / "two").rglob("run.json"))      # no run of the changed images
