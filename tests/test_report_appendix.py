"""The report's appendix sections: the ImageNet-C layout over every shifted split (on-the-fly
corruptions and ImageNet-C folder trees), gradient magnitudes from run.json and classifier vs
oracle inference time."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from bench.synthetic_runs import write_cache, write_run, write_study
from cli import cli
from cache.runfile import RunFile
from cache.runs import RunDir
from pipeline.report.appendix import collect, corruption_of

SHIFTS = {"glass_blur/5": "none", "defocus_blur/5": "none",
          "test-gaussian_noise-3": "gaussian_noise:3:seed0"}


def study(root: Path) -> Path:
    write_study(root, n=300, pairs=(("vit", "vit"),), losses=("ce", "ss"), seeds=(0, 1))
    runs = sorted((root / "runs").glob("vit-vit_*"))
    for i, (tag, corruption) in enumerate(SHIFTS.items()):
        split = tag.split("-")[0] if corruption != "none" else tag
        cache = write_cache(root / "cache" / "vit" / tag, n=200, model="vit", seed=5 + i,
                            split=split, corruption=corruption, accuracy=0.4)
        manifest = json.loads((cache / "manifest.json").read_text())
        manifest["summary"]["inference"] = {"model_ms_per_img": 1.64, "device": "cuda:0 (H)",
                                            "batch_size": 256, "precision": "bf16"}
        (cache / "manifest.json").write_text(json.dumps(manifest))
        for run in runs:
            record = RunDir(run).read()["run"]
            write_run(run, cache, oracle="vit", classifier="vit", loss=record["loss"],
                      seed=record["seed"], group=record["group"], separation=0.5,
                      tag=tag.replace("/", "_"))
    for k, run in enumerate(runs):
        run_json = RunDir(run).read()
        run_json["grad_norm"] = {"mean": 0.001 * (k + 1), "samples": 100, "global_batch": 40}
        RunDir(run).run_file.write_text(json.dumps(run_json))
        for out in (run / "outputs").glob("*.h5"):
            RunDir.timing_path(out).write_text(json.dumps(
                {"model_ms_per_img": 1.5 + 0.01 * k, "device": "cuda:0 (H)", "batch_size": 256,
                 "precision": "bf16"}))
    return root / "runs"


def test_corruption_of_a_cache():
    assert corruption_of({"split": "val", "corruption": "defocus_blur:5:seed0"}) == ("defocus_blur", 5)
    assert corruption_of({"split": "defocus_blur/5", "corruption": "none"}) == ("defocus_blur", 5)
    assert corruption_of({"split": "3", "corruption": "none"}, "/d/imagenet-c/zoom_blur") == \
        ("zoom_blur", 3)
    assert corruption_of({"split": "val", "corruption": "none"}, "/d/imagenet") is None
    assert corruption_of({"split": "3", "corruption": "none"}, "/d/Data-2") is None


def test_appendix_sections(tmp_path):
    runs = study(tmp_path)
    out = tmp_path / "report"
    result = CliRunner().invoke(cli, ["report", "--runs-root", str(runs), "--out", str(out)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    md = (out / "report.md").read_text()
    doc = json.loads((out / "report.json").read_text())
    section = md.split("## Shifted splits (paper appendix ImageNet-C layout)")[1].split("\n## ")[0]
    rows = [l for l in section.splitlines() if l.startswith("| ") and "Corruption" not in l]
    # blocks in corruption order, each with its two oracle rows; the numbers are the split's own
    assert [r.split(" | ")[0].strip("| ") for r in rows] == \
        ["defocus_blur", "", "gaussian_noise", "", "glass_blur", ""]
    split = next(s for s in doc["splits"] if s["split"] == "defocus_blur_5")
    ce = next(r for r in split["rows"] if r["kind"] == "oracle" and r["loss_label"] == "CE")
    auc = ce["agg"]["paper"]["auc"]
    assert f"{100 * auc['mean']:.2f} ± {100 * auc['std']:.2f}" in rows[0]

    grads = md.split("## Gradient magnitudes")[1].split("\n## ")[0]
    by_loss = {}
    for g in doc["appendix"]["gradients"]:
        by_loss.setdefault(g["labels"]["loss_label"], []).append(g["mean"])
    for loss, values in by_loss.items():
        line = next(l for l in grads.splitlines() if f"| {loss} |" in l)
        assert f"{np.mean(values):.4f} ± {np.std(values, ddof=1):.4f}" in line
        assert f"{40 * np.mean(values):.3f}" in line and "| 40 | 2 |" in line

    timing = md.split("## Inference time")[1].split("\n## ")[0]
    line = next(l for l in timing.splitlines() if "`defocus_blur_5`" in l)
    oracle = [json.loads(RunDir.timing_path(p).read_text())["model_ms_per_img"]
              for p in runs.glob("*/outputs/defocus_blur_5.h5")]
    assert "| 1.6400 |" in line and f"{np.mean(oracle):.4f} ± {np.std(oracle, ddof=1):.4f}" in line


def _one_run(root: Path) -> tuple[Path, Path]:
    """A one-run study (no held-out rows): its run directory and its output file."""
    runs, _ = write_study(root, n=200, losses=("ss",), seeds=(0,), held_out=None)
    run = RunDir(next(runs.iterdir()))
    return runs, run.outputs()[0]


def test_a_missing_timing_file_is_no_entry(tmp_path):
    """Head-only outputs have no timing file: the run is reported, without an oracle time."""
    runs, output = _one_run(tmp_path)
    assert not RunDir.timing_path(output).exists()
    out = tmp_path / "report"
    result = CliRunner().invoke(cli, ["report", "--runs-root", str(runs), "--out", str(out),
                                      "--no-figures", "--jobs", "1"])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "report.json").read_text())
    assert all(not e["oracle_timing"] for e in doc["appendix"]["inference"])


def test_a_damaged_timing_file_is_refused_by_name(tmp_path):
    runs, output = _one_run(tmp_path)
    timing = RunDir.timing_path(output)
    for damage in ('{"model_ms_per_img": 1.', "[1.5]"):      # cut short; not an object
        timing.write_text(damage)
        result = CliRunner().invoke(cli, ["report", "--runs-root", str(runs), "--out",
                                          str(tmp_path / "report"), "--no-figures", "--jobs", "1"])
        assert result.exit_code == 1, result.output
        assert str(timing) in result.output and "inference timing" in result.output


def test_gradients_come_from_the_planner_s_run_records(tmp_path):
    """appendix.collect takes run.json as the planner read it instead of reading it again."""
    _, output = _one_run(tmp_path)
    run_dir = str(output.parent.parent)
    cache = str(tmp_path / "cache" / "vit" / "test")
    result = {"kind": "oracle", "split": "test", "cache": cache, "run_dir": run_dir,
              "source": str(output), "labels": {"oracle": "vit", "classifier": "vit", "loss_label": "SS",
                                               "group": "g", "seed": 0}}
    record = RunFile.from_json({"grad_norm": {"mean": 0.25, "samples": 8}})
    found = collect([result], {run_dir: record})
    assert [g["mean"] for g in found["gradients"]] == [0.25]
    assert collect([result], {run_dir: RunFile.empty()})["gradients"] == []
