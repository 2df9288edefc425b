"""Bad input at the run end: torn log lines, option ranges and
devices, failed starts, output names, duplicated seeds in a report, the NaN hint and a damaged
manifest.  Each case is listed in docs/BAD_INPUT.md with the test that covers it."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import cli
from oracle_fixtures import CLASSIFIER, extract, run_cli, train_args, write_colour_tree
from conftest import assert_error


@pytest.fixture(scope="module")
def stage1(tmp_path_factory):
    base = tmp_path_factory.mktemp("bad_runs")
    data = write_colour_tree(base / "colours", {"train": 8, "val": 4})
    cache = base / "cache"
    extract(data, cache, flip_view=False)
    return data, cache


# ------------------------------------------------------------------------------ log.jsonl --
def test_a_torn_last_log_line_is_dropped_with_a_note_and_the_run_resumes(stage1, tmp_path):
    data, cache = stage1
    full, torn = tmp_path / "full", tmp_path / "torn"
    args = ("--batch-size", 4, "--epochs", 2, "--val-fraction", 0.25)
    run_cli(train_args(data, cache, full, *args))
    run_cli(train_args(data, cache, torn, *args, "--stop-at-step", 2))
    with open(torn / "log.jsonl", "a") as fh:
        fh.write('{"loss": 0.69, "st')                   # a write cut short (disk full, kill -9)
    result = run_cli(train_args(data, cache, torn, *args))
    assert re.search(r"note: .*log.jsonl: dropped a torn last line", result.output), result.output
    assert log_entries(torn) == log_entries(full)


def log_entries(run_dir: Path) -> list[dict]:
    """log.jsonl without the throughput, which differs between any two runs."""
    entries = [json.loads(l) for l in (run_dir / "log.jsonl").read_text().splitlines()]
    return [{k: v for k, v in e.items() if k != "img_per_s"} for e in entries]


def test_a_damaged_log_line_before_the_last_is_refused_naming_the_line(stage1, tmp_path):
    data, cache = stage1
    out = tmp_path / "r"
    run_cli(train_args(data, cache, out, "--batch-size", 4, "--stop-at-step", 3,
                       "--val-fraction", 0))
    lines = (out / "log.jsonl").read_text().splitlines()
    lines[1] = lines[1][:5]
    (out / "log.jsonl").write_text("\n".join(lines) + "\n")
    result = run_cli(train_args(data, cache, out, "--batch-size", 4, "--val-fraction", 0),
                     expect=1)
    assert_error(result, r"log.jsonl line 2 is not JSON")


# -------------------------------------------------------------- option ranges and devices --
def test_every_numeric_option_of_every_command_has_a_range():
    """A plain int/float option accepts 0, negatives, nan and inf; each must say its range."""
    import click

    unbounded = []
    for name, command in cli.commands.items():
        for param in command.params:
            if isinstance(param.type, (click.types.IntParamType, click.types.FloatParamType)) \
                    and not isinstance(param.type, click.types._NumberRangeBase):
                unbounded.append(f"{name} {param.opts[0]}")
    assert not unbounded, f"numeric options without a range: {unbounded}"


@pytest.mark.parametrize("args, option", [
    (["extract", "--batch-size", "0"], "--batch-size"),
    (["extract", "--batch-size", "-5"], "--batch-size"),
    (["extract", "--seed", "-1"], "--seed"),
    (["train-oracle", "--lr", "0"], "--lr"),
    (["train-oracle", "--lr", "-1"], "--lr"),
    (["train-oracle", "--lr", "nan"], "--lr"),
    (["train-oracle", "--momentum", "-1"], "--momentum"),
    (["train-oracle", "--momentum", "1"], "--momentum"),
    (["train-oracle", "--weight-decay", "-0.1"], "--weight-decay"),
    (["train-oracle", "--eval-batch-size", "0"], "--eval-batch-size"),
    (["train-oracle", "--val-fraction", "1"], "--val-fraction"),
    (["train-oracle", "--gamma", "inf"], "--gamma"),
    (["train-oracle", "--alpha-pos", "0"], "--alpha-pos"),
    (["train-oracle", "--cb-beta", "1"], "--cb-beta"),
    (["train-oracle", "--neg-weight", "-2"], "--neg-weight"),
    (["train-oracle", "--split-seed", "-1"], "--split-seed"),
    (["predict", "--run", "{tmp}", "--batch-size", "0"], "--batch-size"),
    (["predict", "--run", "{tmp}", "--name", "../../x"], "--name"),
    (["predict", "--run", "{tmp}", "--name", "sub/x"], "--name"),
    (["predict", "--run", "{tmp}", "--name", ".."], "--name"),
    (["fit-classifier", "--seed", "-3"], "--seed"),
    (["extract", "--device", "gpu0"], "--device"),
    (["train-oracle", "--device", "cuda:x"], "--device"),
    (["predict", "--run", "{tmp}", "--device", "gpu0"], "--device"),
    (["fit-classifier", "--device", "tpu"], "--device"),
])
def test_out_of_range_options_are_usage_errors_before_any_work(tmp_path, monkeypatch, args,
                                                               option):
    monkeypatch.chdir(tmp_path)                                  # default artifacts/ go here
    result = CliRunner().invoke(cli, [a.format(tmp=tmp_path) for a in args])
    assert_error(result, rf"Invalid value for '{option}", code=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == []      # nothing created


def test_devices_this_machine_lacks_are_refused_before_any_work(tmp_path, monkeypatch):
    import torch

    monkeypatch.chdir(tmp_path)
    missing = "cuda" if not torch.cuda.is_available() else f"cuda:{torch.cuda.device_count()}"
    for command in (["extract"], ["train-oracle"], ["fit-classifier"]):
        result = CliRunner().invoke(cli, [*command, "--device", missing])
        assert_error(result, rf"Invalid value for '--device'.*{missing}", code=2)
    if not torch.cuda.is_available():
        result = CliRunner().invoke(cli, ["extract", "--decode", "gpu", "--device", "cpu"])
        assert_error(result, r"--decode gpu.*CUDA device.*--decode cpu", code=2)
        result = CliRunner().invoke(cli, ["extract", "--decode", "mixed"])   # default device
        assert_error(result, r"--decode mixed.*CUDA device", code=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_failed_start_leaves_no_empty_run_folder(stage1, tmp_path):
    data, cache = stage1
    out = tmp_path / "runs" / "r"
    args = train_args(data, cache, out, "--batch-size", 4)
    i = args.index("--model-kwargs")
    args[i + 1] = json.dumps({"no_such_kwarg": 1})              # fails when the oracle is built
    assert_error(run_cli(args, expect=None), r"timm.create_model.*no_such_kwarg")
    assert not out.exists()


def test_a_failed_extract_start_leaves_no_claimed_cache_folder(tmp_path):
    from conftest import TINY_VIT, make_imagenet_tree
    from pipeline.data.labels import imagenet_synsets

    syn = imagenet_synsets()
    tree = make_imagenet_tree(tmp_path / "d", list(syn[:2]), per_class=3, splits=("val",))
    victim = tree / "val" / syn[0] / f"{syn[0]}_0.JPEG"          # row 0: the first shard fails
    victim.write_bytes(victim.read_bytes()[:100])
    args = ["extract", "--classifier", TINY_VIT[0], "--model-kwargs", json.dumps(TINY_VIT[1]),
            "--random-init", "--device", "cpu", "--precision", "fp32", "--workers", 0,
            "--batch-size", 4, "--shard-size", 6, "--no-progress", "--data", tree, "--split",
            "val", "--out", tmp_path / "c"]
    assert_error(run_cli(args, expect=None), r"cannot decode .*_0.JPEG \(row 0\)")
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == []


# ----------------------------------------------------------------------- report: seeds --
def test_repeated_runs_of_one_seed_are_collapsed_with_a_note_not_averaged(tmp_path):
    """The same command run twice into two --out folders: one seed, not two (n = 1, no std)."""
    import shutil

    from bench.synthetic_runs import write_cache, write_run

    cache = write_cache(tmp_path / "cache" / "vit" / "test", n=300, model="vit")
    runs = tmp_path / "runs"
    for seed, sep in ((0, 1.0), (1, 2.0)):
        write_run(runs / f"a_seed{seed}", cache, oracle="vit", classifier="vit", loss="ss",
                  seed=seed, group="g1", separation=sep)
    shutil.copytree(runs / "a_seed0", runs / "b_seed0_again")       # a repeated run of seed 0
    result = CliRunner().invoke(cli, ["report", "--runs-root", runs, "--out", tmp_path / "rep",
                                      "--no-figures", "--format", "json", "--format", "md"])
    assert result.exit_code == 0, result.output
    assert re.search(r"note: .*2 runs of seed 0.*counted once.*b_seed0_again", result.output), \
        result.output
    doc = json.loads((tmp_path / "rep" / "report.json").read_text())
    row = next(r for r in doc["splits"][0]["rows"] if r["kind"] == "oracle")
    assert row["n"] == 2 and row["seeds"] == [0, 1]
    assert row["sources"] == [str(runs / "a_seed0" / "outputs" / "test.h5"),
                              str(runs / "a_seed1" / "outputs" / "test.h5")]
    auroc = row["agg"]["standard"]["auc"]
    assert auroc["n"] == 2 and len(auroc["values"]) == 2 and auroc["std"] > 0
    assert any("counted once" in w for w in row["warnings"])
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "counted once" in md and "not counted (repeat of seed 0)" in md


# --------------------------------------------------------------------- hints that fit the run --
@pytest.mark.parametrize("precision, suggested", [("fp32", False), ("bf16", True)])
def test_the_nan_hint_suggests_fp32_only_to_a_run_not_in_fp32(stage1, tmp_path, precision,
                                                               suggested):
    data, cache = stage1
    args = train_args(data, cache, tmp_path / "nan", "--lr", 1e30, "--batch-size", 4,
                      "--val-fraction", 0)
    args[args.index("--precision") + 1] = precision
    result = run_cli(args, expect=1)
    assert "the loss became nan" in result.output and "Lower --lr" in result.output
    assert ("--precision fp32" in result.output) == suggested, result.output


def test_an_edited_num_rows_in_the_manifest_is_blamed_on_the_cache_not_on_data(stage1, tmp_path):
    import shutil

    data, cache = stage1
    copy = shutil.copytree(cache, tmp_path / "cache")
    manifest = copy / CLASSIFIER / "train" / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["identity"]["num_rows"] += 1
    manifest.write_text(json.dumps(doc))
    result = run_cli(train_args(data, copy, tmp_path / "r", "--batch-size", 4), expect=1)
    assert_error(result, r"manifest.json.*num_rows.*damaged or edited.*re-run .*extract")
    assert "pass the same --data" not in result.output


def test_no_output_name_leaves_the_outputs_folder(tmp_path):
    """The last guard, whoever built the name (--name, a split tag, a data root's name)."""
    from cache.runs import RunDir, RunError

    output_path = lambda run_dir, name: RunDir(run_dir).output(name)  # noqa: E731

    tag = "val-defocus_blur-5"
    assert output_path(tmp_path, tag) == tmp_path / "outputs" / f"{tag}.h5"
    # a split of an ImageNet-C-layout tree is flattened into one file name, not a sub-folder
    assert output_path(tmp_path, "defocus_blur/5") == tmp_path / "outputs" / "defocus_blur_5.h5"
    for name in ("../../x", "..", ".hidden", "a\\b", ""):
        with pytest.raises(RunError, match="would not be a file inside"):
            output_path(tmp_path, name)
