"""README.md's figures (the headline result's counts, the demo's time) are what
bench/readme_blocks.py writes from docs/results/summary.json and bench/results/demo-2cpu.json:
a figure edited by hand, or a result regenerated without rewriting README.md, fails here."""
from __future__ import annotations

import json

from bench import readme_blocks
from bench.results_claims import learned_vs_mcp
from bench.results_format import _split
from bench.results_page import load_summary, prepared
from conftest import ROOT


def test_readme_blocks_are_what_the_script_writes():
    text = (ROOT / "README.md").read_text()
    stale = readme_blocks.stale(text, readme_blocks.render())
    assert not stale, f"README.md: block(s) {stale} are stale; run python bench/readme_blocks.py"


def test_the_headline_counts_are_the_results_pages():
    s = prepared(load_summary())
    text = " ".join((ROOT / "README.md").read_text().split())
    for role in ("test", "shifted", "adversarial"):
        t = learned_vs_mcp(_split(s, role))
        assert f"{t['better']} of {sum(t.values())} ({t['none']} no clear difference, " \
               f"{t['worse']} worse)" in text, role
    answers = " ".join((ROOT / "docs" / "RESULTS.md").read_text().split())
    t = learned_vs_mcp(_split(s, "shifted"))
    assert f"of {sum(t.values())} learned scorers {t['better']} beat MCP" in answers


def test_the_demo_time_is_the_measured_one():
    d = json.loads((ROOT / "bench" / "results" / "demo-2cpu.json").read_text())
    text = " ".join((ROOT / "README.md").read_text().split())
    assert f"`make demo` took {d['total_min']:.1f} min" in text
    edited = (ROOT / "README.md").read_text().replace(f"{d['total_min']:.1f} min",
                                                      f"{d['total_min'] + 1:.1f} min", 1)
    assert readme_blocks.stale(edited, readme_blocks.render()) == ["demo-time"]
