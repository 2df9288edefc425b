"""`cli.py report` end to end over synthetic run directories (written with cache.outputs) and
classifier caches (written with the project's shard/manifest writers, and one real extract)."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bench.synthetic_runs import write_cache, write_run, write_study
from cache.outputs import read_outputs
from cache.runs import RunDir
from cli import cli
from pipeline.core import metrics as M

SEEDS = (0, 1)
PAIRS = (("vit", "vit"), ("resnet", "vit"), ("vit", "resnet"))
LOSSES = ("ce", "focal", "tcp", "ss")
SHIFT = "test-gaussian_noise-3"


def invoke(*args):
    return CliRunner().invoke(cli, list(map(str, args)), catch_exceptions=False)


def strict_json(path: Path) -> dict:
    def no_constants(name):
        raise AssertionError(f"{path} holds {name}")
    return json.loads(Path(path).read_text(), parse_constant=no_constants)


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """16 + 8 runs: three <O,C> pairs x four losses x two seeds on `test` (2 undecodable rows),
    and the <vit, vit> runs again on a corrupted copy of the split."""
    root = tmp_path_factory.mktemp("study")
    write_study(root, n=700, pairs=PAIRS, losses=LOSSES, seeds=SEEDS, bad_rows=(3, 10),
                n_train=2000)    # 200 held-out training rows per classifier (val_split.json)
    shifted = write_cache(root / "cache" / "vit" / SHIFT, n=500, model="vit", seed=1, split="test",
                          corruption="gaussian_noise:3:seed0", accuracy=0.5)
    for run in sorted((root / "runs").glob("vit-vit_*")):
        record = RunDir(run).read()["run"]
        write_run(run, shifted, oracle="vit", classifier="vit", loss=record["loss"],
                  seed=record["seed"], group=record["group"], separation=0.6)
    return root


def test_end_to_end_all_formats_and_figures(study, tmp_path):
    out = tmp_path / "report"
    result = invoke("report", "--runs-root", study / "runs", "--out", out)
    assert result.exit_code == 0, result.output
    assert "32 output file(s) from 24 run(s), 3 classifier cache(s)" in result.output  # 24 + 8
    for name in ("report.md", "report.csv", "report.tex", "report.json"):
        assert (out / name).stat().st_size > 0
    figures = out / "figures"
    # one Fig. 3 figure per <O,C>, split and seed rank (every run appears once), one RC plot
    # per <O,C> and split (tests/test_report_figures.py: their layout)
    hists = sorted(p.name for p in figures.glob("histograms_*.png"))
    assert hists == sorted([f"histograms_{o}-{c}_test{run}.png" for o, c in PAIRS
                            for run in ("", "_run2")]
                           + [f"histograms_vit-vit_{SHIFT}{run}.png" for run in ("", "_run2")])
    for oracle, clf in PAIRS:
        assert (figures / f"risk_coverage_{oracle}-{clf}_test.png").exists()
    assert (figures / f"risk_coverage_vit-vit_{SHIFT}.png").exists()
    assert len(list(figures.glob("risk_coverage_*.png"))) == 4  # baselines drawn dashed inside
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in figures.rglob("*.png"))

    doc = strict_json(out / "report.json")
    splits = {s["split"]: s for s in doc["splits"]}
    assert list(splits) == ["test", SHIFT]
    expected = {(o, c, loss.upper() if loss != "focal" else "Focal") for o, c in PAIRS for loss in LOSSES}
    rows = splits["test"]["rows"]
    assert {(r["oracle"], r["classifier"], r["loss_label"]) for r in rows if r["kind"] == "oracle"} == expected
    assert all(r["n"] == 2 and r["seeds"] == [0, 1] for r in rows if r["kind"] == "oracle")
    baselines = [r for r in rows if r["kind"] == "baseline"]
    # no features in these caches: no TrustScore row (tests/test_trustscore.py)
    assert sorted(r["loss"] for r in baselines) == sorted(["mcp", "entropy", "maxlogit", "energy",
                                                           "doctor", "ts", "pnorm", "relu"] * 2)
    assert {r["loss"] for r in splits[SHIFT]["rows"]} == set(LOSSES) | {
        "mcp", "entropy", "maxlogit", "energy", "doctor", "ts", "pnorm", "relu"}
    for row in rows:
        assert row["excluded_rows"] == [2] * row["n"]
        for definition in ("paper", "standard"):
            for name, cell in row["agg"][definition].items():
                if cell["mean"] is None:
                    assert cell["undefined"] and row["kind"] == "baseline"
                    assert name in ("tpr", "tnr", "ece")
                elif name in ("kl", "bhattacharyya"):
                    assert cell["mean"] >= 0
                else:
                    assert -0.01 <= cell["mean"] <= 1.0, (name, cell)
    _check_tables(out, rows)


def _check_tables(out: Path, rows: list[dict]) -> None:
    md = (out / "report.md").read_text()
    for title in ("Trust metrics — paper definitions", "Trust metrics — standard definitions",
                  "Separability (paper Table A4)", "NOT negated", "valid == 0", "AURC ↓ ×10³"):
        assert title in md
    tables, runs = md.split("## Runs")
    tables = tables.split("\n## Shifted splits (paper appendix")[0]   # its own test file
    # first row of the block: paper, standard, working points, separability, paired, learned
    # scorers - MCP, - the strongest post-hoc baseline; 2 splits
    assert tables.count("| ⟨vit, vit⟩ |") == 2 * 7
    assert runs.count("| ⟨vit, vit⟩ |") == 4 * 2 * 2  # 4 losses x 2 seeds x 2 splits
    tex = (out / "report.tex").read_text()
    assert tex.count(r"\toprule") == tex.count(r"\bottomrule") == 14
    assert r"\multirow{4}{*}{\textlangle vit, vit\textrangle}" in tex and r"$\pm$" in tex
    lines = list(csv.DictReader(io.StringIO((out / "report.csv").read_text())))
    per_row = 7 + 11 + 7 + 3  # paper + standard + working points + separability columns
    paired = (3 * 4 + 4) * 2  # SS vs 3 losses + MCP per <O,C> (3 on test, 1 shifted), AUC + AURC
    # every learned scorer (oracle row) against MCP and against the strongest post-hoc baseline
    learned = 3 * 4 + 4                       # oracle rows of test (3 pairs) and of the shifted split
    versus = 2 * learned * 3                  # 2 tables, AUC + AURC + AUGRC
    assert len(lines) == per_row * (len(rows) + 4 + 8) + paired + versus
    mcp = [l for l in lines if l["table"] == "versus_mcp" and l["metric"] == "auc"]
    assert len(mcp) == learned and all(l["loss_label"] == "MCP" for l in mcp)
    strongest = [l for l in lines if l["table"] == "versus_strongest" and l["metric"] == "auc"]
    assert {l["loss_label"] for l in strongest} <= {"MCP", "MSP (temp. scaled)", "MaxLogit-pNorm", "REL-U"}
    ss = [l for l in lines if l["split"] == "test" and l["oracle"] == "vit" and
          l["classifier"] == "vit" and l["loss"] == "ss" and l["table"] == "standard"]
    assert {l["metric"] for l in ss} >= {"fpr95", "aurc", "eaurc", "augrc", "eaugrc"}
    auc = next(l for l in ss if l["metric"] == "auc")
    assert float(auc["ci_low"]) <= float(auc["mean"]) <= float(auc["ci_high"])
    pairs = [l for l in lines if l["table"] == "paired" and l["split"] == "test"]
    assert len(pairs) == 3 * 4 * 2 and all(l["ci_low"] and l["ci_high"] for l in pairs)
    assert "| ⟨vit, vit⟩ | SS − CE |" in md and "Fitted post-hoc baselines" in md


def test_numbers_equal_a_direct_computation(study, tmp_path):
    out = tmp_path / "r"
    assert invoke("report", "--runs-root", study / "runs", "--out", out, "--split", "test",
                  "--no-figures", "--jobs", "1").exit_code == 0
    doc = strict_json(out / "report.json")
    row = next(r for r in doc["splits"][0]["rows"]
               if (r["oracle"], r["classifier"], r["loss"]) == ("vit", "resnet", "tcp"))
    aucs, fprs, tnrs = [], [], []
    for source in row["sources"]:
        o = read_outputs(Path(source))
        valid = o.columns["valid"] == 1
        conf, correct = o.columns["confidence"][valid], o.columns["correct"][valid]
        aucs.append(M.auc(conf, correct))
        fprs.append(M.fpr_at_95tpr(conf, correct, "paper"))
        tnrs.append(M.tnr(conf, correct, threshold=1 / 10))  # TCP: 1/K, K = 10
    assert row["agg"]["paper"]["auc"]["mean"] == pytest.approx(np.mean(aucs))
    assert row["agg"]["paper"]["auc"]["std"] == pytest.approx(np.std(aucs, ddof=1))
    assert row["agg"]["paper"]["fpr95"]["values"] == pytest.approx(fprs)
    assert row["agg"]["paper"]["tnr"]["mean"] == pytest.approx(np.mean(tnrs))
    assert row["agg"]["standard"]["tnr"]["mean"] != row["agg"]["paper"]["tnr"]["mean"]


def test_metric_and_format_choices(study, tmp_path):
    out = tmp_path / "paper"
    assert invoke("report", "--runs-root", study / "runs", "--out", out, "--metrics", "paper",
                  "--format", "md", "--format", "latex", "--no-figures").exit_code == 0
    assert sorted(p.name for p in out.iterdir()) == ["report.md", "report.tex"]
    md = out.joinpath("report.md").read_text()
    assert "paper definitions" in md and "standard definitions" not in md and "AURC ↓" not in md
    assert "Working points" not in md and "Paired comparisons" not in md
    assert "KL̄ (paper formula)" in md and "KL̄ (correct)" not in md
    out = tmp_path / "standard"
    assert invoke("report", "--runs-root", study / "runs", "--out", out, "--metrics", "standard",
                  "--format", "json", "--no-figures").exit_code == 0
    assert strict_json(out / "report.json")["metrics"] == "standard"
    assert not (out / "report.md").exists()


def test_single_run_and_bare_cache(study, tmp_path):
    run = sorted((study / "runs").glob("vit-vit_ss_seed0_*"))[0]
    result = invoke("report", run, "--out", tmp_path / "one", "--split", "test", "--no-figures")
    assert result.exit_code == 0, result.output
    md = (tmp_path / "one" / "report.md").read_text()
    assert "| ⟨vit, vit⟩ | SS |" in md and " ± " not in md.split("## Runs")[0].split("SS |")[1].split("\n")[0]
    result = invoke("report", "--cache", study / "cache" / "resnet" / "test", "--out", tmp_path / "bare")
    assert result.exit_code == 0, result.output
    doc = strict_json(tmp_path / "bare" / "report.json")
    rows = doc["splits"][0]["rows"]
    assert [r["kind"] for r in rows] == ["baseline"] * 8
    # no run names held-out rows: the fitted baselines say so instead of showing numbers
    unfit = [r for r in rows if r["loss"] in ("ts", "pnorm", "relu")]
    assert len(unfit) == 3
    assert all(r["agg"]["standard"]["auc"]["mean"] is None and "held-out rows" in
               r["agg"]["standard"]["auc"]["undefined"] for r in unfit)
    assert (tmp_path / "bare" / "figures" / "risk_coverage_post-hoc-resnet_test.png").exists()


def test_default_runs_root_and_output(tmp_path, monkeypatch):
    art = tmp_path / "artifacts" / "fashion-mnist"
    cache = write_cache(art / "cache" / "vit" / "test", n=300, model="vit", dataset="fashion-mnist")
    write_run(art / "runs" / "r0", cache, oracle="vit", classifier="vit", loss="ss", seed=0,
              group="abc", dataset="fashion-mnist")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    result = CliRunner().invoke(cli, ["report"])
    assert result.exit_code == 1 and "no runs in any artifacts root" in result.output
    (cwd / "artifacts").symlink_to(tmp_path / "artifacts")
    result = invoke("report", "--no-figures")
    assert result.exit_code == 0, result.output
    assert "report: read artifacts/fashion-mnist/runs, the only" in result.output
    assert (cwd / "artifacts/fashion-mnist/report/report.md").exists()


def test_ambiguous_labels_are_disambiguated_by_group(tmp_path):
    cache = write_cache(tmp_path / "cache" / "vit" / "test", n=300)
    for group in ("aaaaaaaaaaaa", "bbbbbbbbbbbb"):
        write_run(tmp_path / "runs" / group, cache, oracle="vit", classifier="vit", loss="ce",
                  seed=0, group=group)
    assert invoke("report", "--runs-root", tmp_path / "runs", "--out", tmp_path / "o",
                  "--no-figures").exit_code == 0
    md = (tmp_path / "o" / "report.md").read_text()
    assert "CE [aaaaaaaaaaaa]" in md and "CE [bbbbbbbbbbbb]" in md


def test_all_correct_split_reports_undefined_with_reasons(tmp_path):
    cache = write_cache(tmp_path / "cache" / "vit" / "test", n=300, accuracy=1.0)
    write_run(tmp_path / "runs" / "r", cache, oracle="vit", classifier="vit", loss="ss", seed=0,
              group="g")
    result = invoke("report", "--runs-root", tmp_path / "runs", "--out", tmp_path / "o")
    assert result.exit_code == 0, result.output
    doc = strict_json(tmp_path / "o" / "report.json")
    row = next(r for r in doc["splits"][0]["rows"] if r["kind"] == "oracle")
    for name in ("fpr95", "aupr_err", "aupr_succ", "auc", "tnr", "kl", "bhattacharyya"):
        cell = row["agg"]["paper"][name]
        assert cell["mean"] is None and "no incorrect predictions" in cell["undefined"]
    assert row["agg"]["standard"]["aurc"]["mean"] == 0.0
    md = (tmp_path / "o" / "report.md").read_text()
    assert "n/a[" in md and "no incorrect predictions in the split" in md


def test_real_extracted_cache(tmp_path):
    """The report reads a cache written by the real stage 1 (tiny random resnet10t)."""
    from conftest import make_imagenet_tree
    from pipeline.extract.run import ExtractConfig, extract
    from pipeline.data.labels import imagenet_synsets

    data = make_imagenet_tree(tmp_path / "data", list(imagenet_synsets()[:3]), per_class=8,
                              splits=("val",))
    cache = tmp_path / "cache" / "resnet10t" / "val"
    extract(ExtractConfig(classifier="resnet10t", out=cache, data=str(data), split="val",
                          random_init=True, model_kwargs={"num_classes": 3}, workers=0,
                          precision="fp32", device="cpu", progress=False, batch_size=24))
    for seed in SEEDS:
        write_run(tmp_path / "runs" / f"s{seed}", cache, oracle="resnet10t", classifier="resnet10t",
                  loss="tcp", seed=seed, group="g", dataset="imagenet")
    result = invoke("report", "--runs-root", tmp_path / "runs", "--out", tmp_path / "o")
    assert result.exit_code == 0, result.output
    doc = strict_json(tmp_path / "o" / "report.json")
    rows = doc["splits"][0]["rows"]
    assert doc["splits"][0]["split"] == "val" and len(rows) == 9 and rows[0]["n"] == 2
    assert rows[0]["agg"]["paper"]["acc"]["mean"] == pytest.approx(
        json.loads((cache / "manifest.json").read_text())["summary"]["accuracy"])
    assert doc["evaluations"][0]["tnr_threshold"]["paper"] == pytest.approx(1 / 3)


# ------------------------------------------------------------------------------ bad input --
def test_outputs_of_another_cache_are_refused(tmp_path):
    cache = write_cache(tmp_path / "cache" / "vit" / "test", n=200, seed=0)
    write_run(tmp_path / "runs" / "r", cache, oracle="vit", classifier="vit", loss="ss", seed=0,
              group="g")
    import shutil
    shutil.rmtree(cache)  # re-extracted with other weights at the same place
    write_cache(cache, n=200, seed=5)
    result = CliRunner().invoke(cli, ["report", str(tmp_path / "runs" / "r"), "--out",
                                      str(tmp_path / "o")])
    assert result.exit_code == 1
    assert "weights_sha256" in result.output and str(tmp_path / "runs" / "r") in result.output
    assert not (tmp_path / "o").exists()


def test_outputs_whose_columns_disagree_with_the_cache_are_refused(tmp_path):
    from cache.outputs import write_outputs
    cache = write_cache(tmp_path / "cache" / "vit" / "test", n=200)
    run = write_run(tmp_path / "runs" / "r", cache, oracle="vit", classifier="vit", loss="ss",
                    seed=0, group="g")
    o = read_outputs(run / "outputs" / "test.h5")
    cols = dict(o.columns)
    cols["correct"] = cols["correct"].copy()
    cols["correct"][7] ^= 1
    write_outputs(run / "outputs" / "test.h5", cols, o.classifier, o.run, o.made_on)
    result = CliRunner().invoke(cli, ["report", str(run), "--out", str(tmp_path / "o")])
    assert result.exit_code == 1 and "column 'correct'" in result.output
    assert "first global index 7" in result.output


def test_run_json_disagreeing_with_outputs_is_refused(tmp_path):
    cache = write_cache(tmp_path / "cache" / "vit" / "test", n=200)
    run = write_run(tmp_path / "runs" / "r", cache, oracle="vit", classifier="vit", loss="ss",
                    seed=0, group="g")
    record = RunDir(run).read()
    record["run"]["seed"] = 3
    RunDir(run).run_file.write_text(json.dumps(record))
    result = CliRunner().invoke(cli, ["report", str(run), "--out", str(tmp_path / "o")])
    assert result.exit_code == 1 and "seed=3" in result.output


def test_nan_confidence_is_a_clear_error(tmp_path):
    cache = write_cache(tmp_path / "cache" / "vit" / "test", n=200)
    write_run(tmp_path / "runs" / "r", cache, oracle="vit", classifier="vit", loss="ss", seed=0,
              group="g", nan_rows=(42,))
    result = CliRunner().invoke(cli, ["report", "--runs-root", str(tmp_path / "runs"), "--out",
                                      str(tmp_path / "o"), "--jobs", "2"])
    assert result.exit_code == 1
    assert "non-finite confidence" in result.output and "global index 42" in result.output


def test_missing_empty_and_unreadable_inputs(tmp_path):
    def run(*args):
        return CliRunner().invoke(cli, ["report", *map(str, args), "--out", str(tmp_path / "o")])

    result = run(tmp_path / "nope")
    assert result.exit_code == 1 and "does not exist" in result.output
    (tmp_path / "empty").mkdir()
    result = run("--runs-root", tmp_path / "empty")
    assert result.exit_code == 1 and "no run directories" in result.output
    result = run(tmp_path / "empty")
    assert result.exit_code == 1 and "neither a run directory" in result.output
    (tmp_path / "bare" / "outputs").mkdir(parents=True)
    result = run(tmp_path / "bare")
    assert result.exit_code == 1 and "has no outputs/*.h5" in result.output
    (tmp_path / "bare" / "outputs" / "test.h5").write_bytes(b"not hdf5")
    result = run(tmp_path / "bare")
    assert result.exit_code == 1 and "test.h5 is not a readable HDF5 file" in result.output
    result = run("--cache", tmp_path / "empty")
    assert result.exit_code == 1 and "holds no classifier cache" in result.output
    cache = write_cache(tmp_path / "cache" / "vit" / "test", n=100)
    result = run("--cache", cache, "--split", "val")
    assert result.exit_code == 1 and "nothing to report" in result.output


def test_moved_cache_is_found_beside_the_runs_or_through_cache_option(tmp_path):
    import shutil
    cache = write_cache(tmp_path / "a" / "cache" / "vit" / "test", n=200)
    write_run(tmp_path / "a" / "runs" / "r", cache, oracle="vit", classifier="vit", loss="ce",
              seed=0, group="g")
    shutil.move(tmp_path / "a", tmp_path / "b")  # the whole artifacts tree moved
    result = invoke("report", "--runs-root", tmp_path / "b" / "runs", "--out", tmp_path / "o",
                    "--no-figures")
    assert result.exit_code == 0, result.output
    shutil.move(tmp_path / "b" / "cache", tmp_path / "elsewhere")
    result = CliRunner().invoke(cli, ["report", "--runs-root", str(tmp_path / "b" / "runs"),
                                      "--out", str(tmp_path / "o")])
    assert result.exit_code == 1 and "pass --cache DIR" in result.output
    result = invoke("report", "--runs-root", tmp_path / "b" / "runs", "--cache",
                    tmp_path / "elsewhere", "--out", tmp_path / "o", "--no-figures")
    assert result.exit_code == 0, result.output


def test_a_missing_cache_names_each_place_looked_at_once(tmp_path):
    """The recorded path is also one of the places beside the runs: named once, not twice."""
    import re
    import shutil
    cache = write_cache(tmp_path / "a" / "cache" / "vit" / "test", n=200)
    write_run(tmp_path / "a" / "runs" / "r", cache, oracle="vit", classifier="vit", loss="ce",
              seed=0, group="g")
    shutil.move(cache, tmp_path / "elsewhere")
    result = CliRunner().invoke(cli, ["report", "--runs-root", str(tmp_path / "a" / "runs"),
                                      "--out", str(tmp_path / "o"), "--no-figures"])
    assert result.exit_code == 1 and "pass --cache DIR" in result.output
    named = re.findall(r"(/\S+?/cache/vit/test)\b", " ".join(result.output.split()))
    assert str(cache) in named and len(named) == len(set(named)) >= 2, result.output
