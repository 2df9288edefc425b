"""The measured tables of docs/PERFORMANCE.md, docs/IMAGENET.md, docs/METRICS.md and bench/NOTES.md are what
bench/doc_tables.py writes from bench/results/*.json: each block is regenerated in memory and
compared, so a table edited by hand, or a JSON changed without rerunning the script, fails here."""
from __future__ import annotations

import json
import re

import pytest

from bench import doc_tables, runbook_table
from conftest import ROOT

RESULTS = ROOT / "bench" / "results"


@pytest.mark.parametrize("doc", doc_tables.DOCS, ids=lambda p: p.name)
def test_every_generated_block_is_what_the_script_writes(doc):
    text = doc.read_text()
    fresh = doc_tables.regenerate(text, doc)
    if fresh != text:
        stale = [name for name, block in blocks(fresh).items() if blocks(text).get(name) != block]
        pytest.fail(f"{doc.relative_to(ROOT)}: generated block(s) {stale} are stale; run "
                    f"python bench/doc_tables.py")


def blocks(text: str) -> dict[str, str]:
    found = {}
    for m in doc_tables.MARKER.finditer(text):
        found[m.group(2)] = text[m.end():text.index(doc_tables.END, m.end())]
    return found


# docs/PERFORMANCE.md: what to expect per device and stage, one page; the rest of the
# measurements (profiles, memory, decoders, comparisons between trees) in bench/NOTES.md.
EXPECT = {"demo-cpu", "report-cpu", "extract-gpu", "train-step", "head-only-gpu", "inference",
          "ddp-summary", "grid-h200"}


def test_performance_holds_what_to_expect_and_the_notes_every_measurement():
    perf = (ROOT / "docs" / "PERFORMANCE.md").read_text()
    notes = blocks((ROOT / "bench" / "NOTES.md").read_text())
    assert set(blocks(perf)) == EXPECT, set(blocks(perf)) ^ EXPECT
    elsewhere = {"device-drift": "METRICS.md",       # a metric's caveat, beside the metrics
                 "cluster-hours": "IMAGENET.md",     # the grid on a cluster, in its runbook
                 "ddp-summary": "PERFORMANCE.md",    # the notes hold every run of it (ddp)
                 "grid-h200": "PERFORMANCE.md"}      # the notes hold its call (train-grid)
    missing = set(doc_tables.BLOCKS) - set(elsewhere) - set(notes)
    assert not missing, missing
    for name, doc in elsewhere.items():
        assert name in blocks((ROOT / "docs" / doc).read_text()), (name, doc)
    assert "runbook-time" in notes
    assert "runbook-time" in blocks((ROOT / "docs" / "IMAGENET.md").read_text())


def test_performance_is_one_page():
    lines = (ROOT / "docs" / "PERFORMANCE.md").read_text().splitlines()
    assert len(lines) <= 200, len(lines)
    long = [n for n, line in enumerate(lines, 1) if len(line) > 120 and not line.startswith("|")]
    assert not long, f"docs/PERFORMANCE.md: lines over 120 characters: {long}"


def test_a_number_changed_by_hand_is_found():
    doc = ROOT / "bench" / "NOTES.md"
    text = doc.read_text()
    assert "| 3,138 |" in text
    edited = text.replace("| 3,138 |", "| 3,139 |", 1)
    assert doc_tables.regenerate(edited, doc) == text


def test_every_result_states_its_device_date_and_command():
    for path in sorted(RESULTS.glob("*.json")):
        d = json.loads(path.read_text())
        env = d.get("environment", {})
        assert d.get("device") or env.get("device_name"), path.name
        assert re.match(r"\d{4}-\d{2}-\d{2}", d.get("date") or env.get("date", "")), path.name
        assert d.get("command"), path.name


def test_the_imagenet_cost_stated_up_front_is_the_measured_one():
    """README's and IMAGENET.md's first lines give the grid's cost on one H100 from the same
    measurements as the generated tables."""
    r = json.loads((RESULTS / "rehearsal.json").read_text())
    t = json.loads((RESULTS / "bench_train.json").read_text())
    upper = f"{r['grid']['total_h']:.0f}"
    lower = f"{t['projection']['graph_paper_h'] * r['grid']['runs'] / t['projection']['runs']:.0f}"
    for doc in (ROOT / "README.md", ROOT / "docs" / "IMAGENET.md"):
        assert f"{lower}–{upper} GPU hours" in doc.read_text(), (doc.name, lower, upper)


def test_the_runbook_script_and_this_one_write_the_same_runbook_block():
    assert runbook_table.main(["--check"]) == 0
    assert doc_tables.main(["--check"]) == 0
