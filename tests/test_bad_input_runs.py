"""Bad input at the run end (issue: nothing silently wrong): torn log lines, option ranges and
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


@pytest.fixture(scope="module")
def stage1(tmp_path_factory):
    base = tmp_path_factory.mktemp("bad_runs")
    data = write_colour_tree(base / "colours", {"train": 8, "val": 4})
    cache = base / "cache"
    extract(data, cache, flip_view=False)
    return data, cache


def assert_error(result, pattern, code=1):
    assert result.exit_code == code, result.output
    assert re.search(pattern, result.output, re.S), result.output
    assert "Traceback" not in result.output


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
