"""docs/RESULTS.md says one thing: every generated block is what bench/results_page.py renders
from docs/results/summary.json (the extract of ONE `cli.py demo --full` report), its figures are
that run's, the hand-written prose quotes no result numbers (they live in the generated blocks,
so the prose cannot go stale), and -- where the report is at hand -- the extract is that
report's."""
from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path

import pytest

from bench import results_page as R
from conftest import ROOT

REGENERATE = ("python bench/results_page.py (from docs/results/summary.json), or for a new run "
              "python bench/results_page.py --report <artifacts root>/report")
# sections whose numbers are constants, not results of the run: the paper's own tables, the
# determinism measurements and the hyperparameter search that chose the preset
CONSTANT_SECTIONS = ("## The paper's numbers compared against", "## Determinism",
                     "## Hyperparameters")
CONSTANTS = {"0.5", "0.1"}       # the TPR/TNR threshold and the MC-Dropout rate, named in prose
HISTORY = re.compile(r"\b(previous (version|grid|page)|until this version|now|no longer)\b",
                     re.IGNORECASE)


@pytest.fixture(scope="module")
def summary() -> dict:
    return R.load_summary()


@pytest.fixture(scope="module")
def page() -> str:
    return R.PAGE.read_text(encoding="utf-8")


def test_every_generated_block_is_what_the_extract_renders(summary, page):
    stale = R.stale(page, R.render(summary))
    assert not stale, (f"docs/RESULTS.md: generated block(s) {', '.join(stale)} differ from "
                       f"docs/results/summary.json's rendering; run {REGENERATE}")


def test_the_page_has_only_the_generators_blocks(page):
    names = re.findall(r"<!-- (?:end )?generated: ([\w-]+) -->", page)
    unknown = sorted(set(names) - set(R.all_blocks()))
    assert not unknown, f"docs/RESULTS.md: blocks {unknown} have no renderer in {R.__file__}"
    assert sorted(names) == sorted(2 * list(R.all_blocks())), \
        "each block: one begin and one end marker"


def _prose(page: str) -> list[tuple[int, str]]:
    """(line number, text) of the hand-written lines outside the constant sections: generated
    blocks, code fences and inline code left out."""
    out, in_block, in_fence, constant = [], False, False, False
    for n, line in enumerate(page.splitlines(), 1):
        if line.startswith("## "):
            constant = line.startswith(CONSTANT_SECTIONS)
        if re.match(r"<!-- generated: ", line):
            in_block = True
        if re.match(r"<!-- end generated: ", line):
            in_block = False
            continue
        if line.startswith("```"):
            in_fence = not in_fence
            continue
        if not (in_block or in_fence or constant):
            out.append((n, re.sub(r"`[^`]*`", "", line)))
    return out


def test_the_prose_quotes_no_result_numbers(page):
    """A result (a mean, a difference, an interval, a rate) appears only inside a generated
    block, so a regenerated page cannot contradict its own prose."""
    found = []
    for n, line in _prose(page):
        decimals = [d for d in re.findall(r"(?<![\w.])\d+\.\d+", line) if d not in CONSTANTS]
        percents = [p for p in re.findall(r"(?<![\w.])(\d+(?:\.\d+)?)\s?%", line) if p != "95"]
        if decimals or percents or re.search(r"\d\s?±|±\s?\d", line):
            found.append(f"line {n}: {line.strip()[:100]!r}")
    assert not found, ("docs/RESULTS.md: numbers of the run in hand-written prose (put them in "
                       "a generated block of bench/results_page.py):\n  " + "\n  ".join(found))


def test_the_page_is_a_reference_not_a_history(page):
    found = [f"line {n}: {m.group(0)!r}" for n, line in enumerate(page.splitlines(), 1)
             for m in HISTORY.finditer(line)]
    assert not found, "docs/RESULTS.md narrates history:\n  " + "\n  ".join(found)


def test_the_figures_are_the_runs(summary, page):
    """Every figure the page shows is the file the extract recorded (same bytes, same run), and
    the page shows no figure outside the extract."""
    recorded = {f["name"]: f["sha256"] for f in summary["figures"]}
    for name, digest in recorded.items():
        path = R.FIGURES / name
        assert path.exists(), f"{path.relative_to(ROOT)} missing: run {REGENERATE}"
        assert R.sha256(path) == digest, \
            f"{path.relative_to(ROOT)} is not the run's figure (sha256 differs): run {REGENERATE}"
    linked = set(re.findall(r"\]\(figures/([^)]+)\)", page))
    assert linked <= set(recorded), \
        f"figures from outside the run: {sorted(linked - set(recorded))}"


def _without_paths(obj):
    if isinstance(obj, dict):
        return {k: _without_paths(v) for k, v in obj.items() if k != "path"}
    if isinstance(obj, list):
        return [_without_paths(v) for v in obj]
    return obj


def test_the_extract_is_its_reports(summary):
    """Where the report.json the extract names is at hand (its recorded path, or RESULTS_REPORT),
    a fresh extract of it equals the committed one: same sha256, same numbers, same figures."""
    recorded = Path(summary["sources"]["report"]["path"])
    given = os.environ.get("RESULTS_REPORT")
    report = Path(given) if given else recorded
    if not report.exists():
        pytest.skip(f"the run's report is not on this machine ({report}); set RESULTS_REPORT to "
                    "its report.json to check the extract against it")
    if not given and R.sha256(report) != summary["sources"]["report"]["sha256"]:
        pytest.skip(f"{report} is another run's report (its sha256 differs from the one "
                    "docs/results/summary.json names)")
    grid_note = (summary.get("pretrained") or {}).get("sources", {}).get("note")
    fresh = json.loads(R.summary_text(R.extract(report, summary["sources"].get("note"), grid_note)))
    assert fresh["sources"]["report"]["sha256"] == summary["sources"]["report"]["sha256"], \
        (f"{report} is not the report docs/results/summary.json was extracted from (sha256 "
         f"differs); if it is the new run, run python bench/results_page.py --report "
         f"{report.parent}")
    assert _without_paths(fresh) == _without_paths(summary), \
        f"docs/results/summary.json differs from a fresh extract of {report}: run {REGENERATE}"


def test_the_blocks_render_a_run_with_missing_pairs_and_single_seeds(summary):
    """A smaller run (the default demo: one seed, O = C pairs only) or one missing a pair, the
    ConfidNet runs, the sweep or demo.json renders every block: absent rows read "not run", a
    single run has no ±, and no verdict is invented for a comparison that is not there."""
    s = copy.deepcopy(summary)
    for split in s["splits"]:
        split["rows"] = [r for r in split["rows"] if not (
            r["kind"] == "oracle" and r["oracle"] == r["classifier"] == "resnet"
            and r["variant"] in ("", "broadcast"))
            and "confidnet" not in r["variant"]]
        split["comparisons"] = [c for c in split["comparisons"]
                                if c["oc"] != "⟨resnet, resnet⟩" and "ConfidNet" not in c["ss"]]
        split["versus"] = [v for v in split["versus"] if "confidnet" not in v["learned"]["variant"]]
    s["sweeps"], s["sources"]["demo"] = [], None
    s["figures"] = [f for f in s["figures"] if f["kind"] != "sweep"]
    blocks = R.render(s)
    assert "not run" in blocks["summary"]
    assert "No ConfidNet-head runs" in blocks["small-scale"]
    assert "No α sweep" in blocks["sweep"]
    assert "not recorded" in blocks["what-was-run"]
    for line in blocks["summary"].splitlines():
        if line.startswith("| test | resnet"):
            assert line.count("not run") >= 3, line       # SS row, SS − CE, SS − MCP
    single = [r for sp in s["splits"] for r in sp["rows"] if r["n"] == 1]
    assert single and all(not isinstance(v, list) for r in single for v in r["standard"])


def test_a_page_without_a_blocks_markers_is_refused(summary, page):
    broken = page.replace(R.BEGIN.format("summary"), "")
    with pytest.raises(R.Refused, match="summary"):
        R.rewrite(broken, R.render(summary))


def test_the_pretrained_sections_blocks_render_a_studys_verdicts(tmp_path):
    """bench/results_pretrained.py over a study's report (here a synthetic one: SS, CE and CE
    of another oracle for one classifier, two seeds): each fit's accuracy, and every verdict of
    the report's two questions with its interval and Holm-adjusted p-value, rendered as the
    report decided it -- nothing recounted."""
    from bench import results_pretrained as P
    from bench.synthetic_runs import write_study
    from pipeline.report.run import ReportConfig, report
    root = tmp_path / "artifacts" / "fm"
    write_study(root / "pretrained" / "fits", n=600, pairs=(("vit", "vit"),),
                losses=("ce", "ss"), seeds=(0, 1), n_train=1200)
    report(ReportConfig(runs_root=str(root / "pretrained" / "fits" / "runs"),
                        out=str(root / "pretrained" / "report"), figures=False, jobs=1,
                        resamples=200))
    doc = json.loads((root / "pretrained" / "report" / "report.json").read_text())
    study = P.extract(root, "how it was run")
    assert [f["classifier"] for f in study["fits"]] == ["vit"]
    assert study["fits"][0]["acc"]["test"] is not None
    s = json.loads(R.summary_text({"pretrained": study}))
    blocks = {name: fn(s) for name, fn in P.BLOCKS.items()}
    assert "2 runs" in blocks["pretrained-source"] or "4 runs" in blocks["pretrained-source"]
    assert "how it was run" in blocks["pretrained-source"]
    fams = {(f["split"], f["question"]): f for f in doc["verdicts"]["families"]}
    ref = fams[("test", "reference")]
    for e in ref["comparisons"]:
        row = next(line for line in blocks["pretrained-verdicts"].splitlines()
                   if f"| {e['a']} |" in line)
        assert f"**{e['verdict']}**" in row, row
    counts = ref["counts"]
    assert (f"better {counts['better']}, no clear difference {counts['no clear difference']}, "
            f"worse {counts['worse']}") in blocks["pretrained-answer"]
    assert "| `vit` | SS ⟨vit-model, O = C⟩ − CE ⟨vit-model, O = C⟩ | fine-tuned | 1 × 2 |" in \
        blocks["pretrained-losses"]
