"""What a report row stands for: rows keyed by the identity of the
evaluated cache, one deduplication of repeated seeds for every table, and classifier labels from
what the cache recorded.  Each case is listed in docs/BAD_INPUT.md (Report)."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from click.testing import CliRunner

from bench.synthetic_runs import write_cache, write_run
from cache.runs import RunDir
from cli import cli


def report(paths: list, out: Path, *extra) -> dict:
    args = ["report", *map(str, paths), "--out", str(out), "--no-figures", "--jobs", "1",
            "--format", "json", "--format", "md", *extra]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "report.json").read_text())
    return {"output": result.output, "doc": doc, "md": (out / "report.md").read_text()}


def rows_of(doc: dict, kind: str) -> list[dict]:
    return [r for s in doc["splits"] for r in s["rows"] if r["kind"] == kind]


def test_two_evaluation_sets_of_one_configuration_are_two_rows(tmp_path):
    """One run configuration (group, seed) evaluated on two caches of split 'test' whose data
    differ (a class missing from one: another dataset fingerprint) were one row, the second
    'a repeated seed (a non-deterministic run?)'; their post-hoc baselines likewise."""
    full = write_cache(tmp_path / "a" / "cache" / "vit" / "test", n=300, model="vit")
    part = write_cache(tmp_path / "b" / "cache" / "vit" / "test", n=270, model="vit")
    for root, cache in (("a", full), ("b", part)):
        write_run(tmp_path / root / "runs" / "r", cache, oracle="vit", classifier="vit",
                  loss="ss", seed=0, group="g1")
    got = report([tmp_path / "a" / "runs", tmp_path / "b" / "runs"], tmp_path / "rep")
    assert "counted once" not in got["output"] and "repeat" not in got["md"]
    oracle = rows_of(got["doc"], "oracle")
    assert [r["n"] for r in oracle] == [1, 1]
    assert {r["eval"]["num_rows"] for r in oracle} == {300, 270}
    labels = [r["display_loss"] for r in oracle]
    assert len(set(labels)) == 2 and all("dataset_fingerprint" in l for l in labels), labels
    mcp = [r for r in rows_of(got["doc"], "baseline") if r["loss"] == "mcp"]
    assert [r["n"] for r in mcp] == [1, 1] and len({r["display_loss"] for r in mcp}) == 2
    # the paired SS-vs-MCP comparison stays within one evaluated cache
    comparisons = got["doc"]["splits"][0]["comparisons"]
    assert len(comparisons) == 2
    assert all(c["metrics"]["auc"]["ci"]["undefined"] is None for c in comparisons)


def test_a_repeated_seed_counts_once_in_the_appendix_tables(tmp_path):
    """Gradient magnitudes showed n = 3 and inference time averaged the repeat too."""
    cache = write_cache(tmp_path / "cache" / "vit" / "test", n=300, model="vit")
    runs = tmp_path / "runs"
    for seed in (0, 1):
        write_run(runs / f"a_seed{seed}", cache, oracle="vit", classifier="vit", loss="ss",
                  seed=seed, group="g1")
    shutil.copytree(runs / "a_seed0", runs / "b_seed0_again")
    for k, name in enumerate(("a_seed0", "a_seed1", "b_seed0_again")):
        run = RunDir(runs / name)
        record = run.read()
        record["grad_norm"] = {"mean": 0.001 * (k + 1), "samples": 10, "global_batch": 40}
        run.run_file.write_text(json.dumps(record))
        RunDir.timing_path(run.outputs()[0]).write_text(json.dumps(
            {"model_ms_per_img": 1.0 + k, "device": "cpu", "batch_size": 8, "precision": "fp32"}))
    got = report([runs], tmp_path / "rep")
    grads = got["md"].split("## Gradient magnitudes")[1].split("\n## ")[0]
    line = next(l for l in grads.splitlines() if "| SS |" in l)
    assert line.endswith("| 40 | 2 |") and "0.0015 ± 0.0007" in line, line
    timing = got["md"].split("## Inference time")[1].split("\n## ")[0]
    assert "1.5000 ± 0.7071" in timing, timing       # runs a_seed0 and a_seed1: 1.0 and 2.0
    assert len(got["doc"]["appendix"]["gradients"]) == 2


def test_rows_are_labelled_with_the_classifier_the_cache_recorded(tmp_path):
    """A cache of model 'resnet' copied under cache/vit and trained on with --classifier vit:
    run.json records resnet, the report labelled the rows ⟨vit, vit⟩."""
    cache = write_cache(tmp_path / "cache" / "vit" / "test", n=300, model="resnet")
    write_run(tmp_path / "runs" / "r", cache, oracle="vit", classifier="vit", loss="ss", seed=0,
              group="g1")
    got = report([tmp_path / "runs"], tmp_path / "rep")
    assert {r["oc"] for r in rows_of(got["doc"], "oracle")} == {"⟨vit, resnet⟩"}
    assert {r["classifier"] for r in rows_of(got["doc"], "baseline")} == {"resnet"}
    assert not re.search(r"⟨vit, vit⟩", got["md"])
