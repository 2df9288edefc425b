"""One artifacts root per dataset (pipeline/core/artifacts.py): extract, train-oracle and a bare
report of a wnid-layout folder and of a classes.txt folder all write under artifacts/<folder
name>; a bare report with two roots holding runs, or none, refuses and says what to pass."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import assert_error
from oracle_fixtures import CLASSIFIER, TINY_VIT_KWARGS, run_cli, write_colour_tree

COLOURS = {"red": (200, 40, 40), "green": (40, 200, 40), "blue": (40, 40, 200)}


def write_named_tree(root: Path, per_class: dict[str, int], seed: int = 0) -> Path:
    """ROOT/<split>/<colour name>/*.png with ROOT/classes.txt (the user's own class names)."""
    rng = np.random.default_rng(seed)
    for split, n in per_class.items():
        for name, rgb in COLOURS.items():
            for i in range(n):
                img = np.clip(np.array(rgb) + rng.integers(-50, 50, (36, 36, 3)), 0, 255)
                path = root / split / name / f"{name}_{i}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(img.astype(np.uint8)).save(path)
    (root / "classes.txt").write_text("\n".join(COLOURS) + "\n")
    return root


def extract_and_train(data: Path) -> None:
    """The user's commands without --out / --cache: every default output goes where it goes."""
    kwargs = json.dumps({**TINY_VIT_KWARGS, "num_classes": 3})
    run_cli(["extract", "--classifier", CLASSIFIER, "--random-init", "--model-kwargs", kwargs,
             "--data", data, "--split", "train", "--split", "val", "--workers", 0,
             "--precision", "fp32", "--no-progress"])
    run_cli(["train-oracle", "--classifier", CLASSIFIER, "--oracle", CLASSIFIER, "--random-init",
             "--model-kwargs", json.dumps(TINY_VIT_KWARGS), "--data", data, "--loss", "ce",
             "--batch-size", 8, "--epochs", 1, "--val-fraction", 0.25, "--workers", 0,
             "--precision", "fp32", "--no-progress"])


@pytest.fixture(scope="module")
def worked(tmp_path_factory):
    """Two working directories, each where a user worked on one dataset: a wnid-layout folder
    (whose caches say dataset "imagenet") and a classes.txt folder."""
    base = tmp_path_factory.mktemp("roots")
    here = Path.cwd()
    dirs = {}
    try:
        for name, write in (("colours", lambda p: write_colour_tree(p, {"train": 12, "val": 6})),
                            ("palette", lambda p: write_named_tree(p, {"train": 12, "val": 6}))):
            cwd = base / f"work-{name}"
            cwd.mkdir()
            data = write(base / "data" / name)
            os.chdir(cwd)
            extract_and_train(data)
            dirs[name] = cwd
    finally:
        os.chdir(here)
    return dirs


def bare_report(cwd: Path, *extra, expect: int | None = 0):
    here = Path.cwd()
    os.chdir(cwd)
    try:
        return run_cli(["report", "--no-figures", "--no-ci", "--jobs", 1, *extra], expect=expect)
    finally:
        os.chdir(here)


@pytest.mark.parametrize("name", ["colours", "palette"])
def test_extract_train_and_a_bare_report_write_under_one_root(worked, name):
    cwd = worked[name]
    root = cwd / "artifacts" / name
    assert (root / "cache" / CLASSIFIER / "val" / "manifest.json").is_file()
    assert len(list((root / "runs").iterdir())) == 1
    result = bare_report(cwd)
    assert f"report: read artifacts/{name}/runs, the only artifacts root's runs/" in result.output
    assert (root / "report" / "report.md").is_file()
    assert sorted(p.name for p in (cwd / "artifacts").iterdir()) == [name]   # not "imagenet"


def test_a_run_named_from_elsewhere_reports_beside_it(worked, tmp_path):
    """The recorded root, found among the run directory's ancestors: not ./artifacts/<dataset>
    of the directory the report runs in."""
    run = next((worked["colours"] / "artifacts" / "colours" / "runs").iterdir())
    result = bare_report(tmp_path, run)
    assert (worked["colours"] / "artifacts" / "colours" / "report" / "report.md").is_file()
    assert not (tmp_path / "artifacts").exists(), result.output


def test_two_roots_with_runs_are_listed_and_refused(worked, tmp_path):
    for name, cwd in worked.items():
        (tmp_path / "artifacts").mkdir(exist_ok=True)
        (tmp_path / "artifacts" / name).symlink_to(cwd / "artifacts" / name)
    before = {p: p.stat().st_mtime_ns for cwd in worked.values() for p in cwd.rglob("*")}
    result = bare_report(tmp_path, expect=1)
    assert_error(result, r"several artifacts roots hold runs: artifacts/colours/runs \(1 run\), "
                         r"artifacts/palette/runs \(1 run\); pick one with --runs-root")
    assert {p: p.stat().st_mtime_ns for cwd in worked.values() for p in cwd.rglob("*")} == before
    result = bare_report(tmp_path, "--runs-root", "artifacts/palette/runs")
    assert (worked["palette"] / "artifacts" / "palette" / "report" / "report.md").is_file()


def test_no_runs_anywhere_says_what_to_run_first(tmp_path):
    result = bare_report(tmp_path, expect=1)
    assert_error(result, r"no runs in any artifacts root .*train oracles first "
                         r"\(`cli.py extract`, then `cli.py train-oracle`\)")
    (tmp_path / "artifacts" / "fashion-mnist" / "cache").mkdir(parents=True)   # caches only
    assert_error(bare_report(tmp_path, expect=1), r"no runs in any artifacts root")
    assert not re.search(r"report\.md", str(list(tmp_path.rglob("*"))))


def test_runs_of_two_roots_or_a_cache_outside_one_ask_for_out(worked, tmp_path):
    import shutil

    runs = [next((cwd / "artifacts" / n / "runs").iterdir()) for n, cwd in worked.items()]
    assert_error(bare_report(tmp_path, *runs, expect=1),
                 r"the inputs come from several artifacts roots .*colours.*palette.*: pass --out")
    cache = worked["palette"] / "artifacts" / "palette" / "cache" / CLASSIFIER / "val"
    shutil.copytree(cache, tmp_path / "copied" / "val")
    assert_error(bare_report(tmp_path, "--cache", tmp_path / "copied" / "val", expect=1),
                 r"copied/val: not in an artifacts root .*: pass --out")
    bare_report(tmp_path, "--cache", cache)                 # caches only: the root they lie in
    assert (worked["palette"] / "artifacts" / "palette" / "report" / "report.md").is_file()


def test_fit_classifier_of_a_wnid_folder_saves_under_its_root(tmp_path, monkeypatch):
    """Not artifacts/imagenet/classifiers (the caches' dataset name) but the folder's root."""
    data = write_colour_tree(tmp_path / "colours", {"train": 4})
    monkeypatch.chdir(tmp_path)
    result = run_cli(["fit-classifier", "--classifier", CLASSIFIER, "--model-kwargs",
                      json.dumps(TINY_VIT_KWARGS), "--data", data, "--epochs", 1,
                      "--batch-size", 4, "--workers", 0, "--precision", "fp32", "--device", "cpu",
                      "--no-progress"])
    path = Path("artifacts") / "colours" / "classifiers" / f"{CLASSIFIER}.pt"
    assert (tmp_path / path).is_file() and str(path) in result.output


def sweep_here(cwd: Path, expect: int | None = 0):
    here = Path.cwd()
    os.chdir(cwd)
    try:
        return run_cli(["sweep", "--fine-tune", "--loss", "focal", "--gamma", "1,2", "--no-figures",
                        "--classifier", CLASSIFIER, "--oracle", CLASSIFIER, "--random-init",
                        "--model-kwargs", json.dumps(TINY_VIT_KWARGS), "--batch-size", 8,
                        "--epochs", 1, "--val-fraction", 0.25, "--workers", 0,
                        "--precision", "fp32", "--no-progress"], expect=expect)
    finally:
        os.chdir(here)


def test_a_sweep_without_data_takes_the_data_of_the_one_root_with_caches(worked, tmp_path):
    cwd = worked["colours"]
    data = json.loads(next((cwd / "artifacts" / "colours" / "cache").rglob("manifest.json"))
                      .read_text())["config"]["data"]
    result = sweep_here(cwd)
    assert (f"sweep: no --data given: {data}, whose caches are in artifacts/colours, the only "
            "artifacts root holding caches") in result.output
    assert len(list((cwd / "artifacts" / "colours" / "sweeps").glob("*/sweep.json"))) == 1
    assert f"--data {data}" in result.output.splitlines()[-1]       # the printed command
    for name, work in worked.items():
        (tmp_path / "artifacts").mkdir(exist_ok=True)
        (tmp_path / "artifacts" / name).symlink_to(work / "artifacts" / name)
    assert_error(sweep_here(tmp_path, expect=1),
                 r"no --data given, and several artifacts roots hold caches: "
                 r"artifacts/colours/cache \(2 caches\), artifacts/palette/cache \(2 caches\); "
                 r"pick the data with --data DIR")


def test_a_sweep_refuses_a_root_whose_caches_name_other_data(worked, tmp_path):
    """Caches of colours/ copied into artifacts/other: no data folder of that root's name."""
    import shutil

    cache = worked["colours"] / "artifacts" / "colours" / "cache" / CLASSIFIER / "val"
    shutil.copytree(cache, tmp_path / "artifacts" / "other" / "cache" / CLASSIFIER / "val")
    assert_error(sweep_here(tmp_path, expect=1), r"no --data given, and the caches of "
                 r"artifacts/other/cache do not name one data folder: pass --data DIR")


def test_a_run_trained_outside_its_root_reports_into_that_root(worked, tmp_path):
    """train-oracle --out elsewhere records the root it was given (relative to where it ran):
    with a run inside the root, one root, not two spellings of it."""
    cwd = worked["palette"]
    data = json.loads(next((cwd / "artifacts" / "palette" / "cache").rglob("manifest.json"))
                      .read_text())["config"]["data"]
    here = Path.cwd()
    os.chdir(cwd)
    try:
        run_cli(["train-oracle", "--classifier", CLASSIFIER, "--oracle", CLASSIFIER,
                 "--random-init", "--model-kwargs", json.dumps(TINY_VIT_KWARGS), "--data", data,
                 "--loss", "ce", "--batch-size", 8, "--epochs", 1, "--val-fraction", 0.25,
                 "--workers", 0, "--precision", "fp32", "--no-progress", "--seed", 1,
                 "--out", tmp_path / "elsewhere"])
    finally:
        os.chdir(here)
    inside = next((cwd / "artifacts" / "palette" / "runs").iterdir())
    result = bare_report(cwd, inside, tmp_path / "elsewhere")
    assert "from 2 run(s)" in result.output
    assert (cwd / "artifacts" / "palette" / "report" / "report.md").is_file()
