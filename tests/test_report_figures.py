"""The report's figures a reader can read (issue 21, item 8): which files a study with training
variants gets, that report.md lists each with one line, a sane width, at most 8 curves per
axes, legends beside the data and never on it, and the same bytes when drawn twice."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

from bench.synthetic_runs import write_run, write_study
from cli import cli
from pipeline.report import figures as F
from pipeline.report.aggregate import aggregate
from pipeline.report.figplan import plan_figures

# (variant, its label's tags, losses): fine-tuned 12 curves (two panels), head-only 6 (one)
VARIANTS = (("broadcast", "broadcast", ("ce", "focal", "tcp", "ss")),
            ("cb", "CB", ("ce", "focal", "tcp", "ss")),
            ("head-only", "head-only", ("ce", "focal", "tcp", "ss")),
            ("broadcast+head-only", "broadcast, head-only", ("ce", "focal")))
LABELS = {"ce": "CE", "focal": "Focal", "tcp": "TCP", "ss": "SS"}
MAX_WIDTH_PX = 1300


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """<vit, vit> and <resnet, vit>, four losses x two seeds, plus <vit, vit>'s other training
    variants (seed 0); a report over them with figures (no intervals: not what is tested)."""
    root = tmp_path_factory.mktemp("figures")
    write_study(root, n=400, pairs=(("vit", "vit"), ("resnet", "vit")), seeds=(0, 1),
                n_train=1200)
    for variant, tags, losses in VARIANTS:
        for loss in losses:
            write_run(root / "runs" / f"vit-vit_{loss}_{variant}", root / "cache" / "vit" / "test",
                      oracle="vit", classifier="vit", loss=loss, seed=0, group=f"{loss}-{variant}",
                      variant=variant, loss_label=f"{LABELS[loss]} ({tags})")
    result = CliRunner().invoke(cli, ["report", str(root / "runs"), "--out", str(root / "report"),
                                      "--no-ci", "--jobs", "1"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return root / "report"


def _png_width(path: Path) -> int:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">I", data[16:20])[0]


def _splits(report: Path) -> dict:
    """The report's rows rebuilt from report.json's evaluations (as the report aggregates them)."""
    return aggregate(json.loads((report / "report.json").read_text())["evaluations"])


def test_one_question_per_figure_listed_in_report_md(study):
    names = sorted(p.name for p in (study / "figures").iterdir())
    assert names == sorted([
        "histograms_vit-vit_test.png", "histograms_vit-vit_test_run2.png",         # Fig. 3
        "histograms_vit-vit_variants_test.png",     # broadcast, CB, head-only: a row each
        "histograms_vit-vit_variants2_test.png",    # broadcast + head-only
        "histograms_resnet-vit_test.png", "histograms_resnet-vit_test_run2.png",
        "risk_coverage_vit-vit_test.png", "risk_coverage_resnet-vit_test.png"])
    for name in names:
        assert _png_width(study / "figures" / name) <= MAX_WIDTH_PX, name
    listed = json.loads((study / "report.json").read_text())["splits"][0]["figures"]["list"]
    assert sorted(Path(f["path"]).name for f in listed) == names
    md = (study / "report.md").read_text().splitlines()
    for f in listed:
        lines = [line for line in md if f"]({f['path']})" in line]
        assert len(lines) == 1 and f["shows"] in lines[0], f["path"]
    shows = {Path(f["path"]).name: f["shows"] for f in listed}
    assert "paper Fig. 3 layout" in shows["histograms_vit-vit_test.png"]
    assert "broadcast; cb; head-only" in shows["histograms_vit-vit_variants_test.png"]
    assert "fine-tuned oracles, head-only oracles, post-hoc baselines" in \
        shows["risk_coverage_vit-vit_test.png"]


def _rendered(call):
    """The Figure a planned call draws (the same builder, without saving)."""
    draw, args = call
    if draw is F.draw_histograms:
        rows, _, title = args
        return F.histogram_figure(rows, title)
    assert draw is F.draw_rc_panels
    panels, _, title, full_range = args
    return F.rc_figure(panels, title, full_range)


def _overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_curves_per_axes_and_legends_outside_the_data(study, tmp_path):
    calls, index = plan_figures(_splits(study), tmp_path)
    panels_of = {}
    for call in calls:
        fig = _rendered(call)
        renderer = fig.canvas.get_renderer()
        fig.draw(renderer)
        axes = fig.get_axes()
        legends = list(fig.legends) + [ax.get_legend() for ax in axes if ax.get_legend()]
        assert legends, call[1][1]
        whole = fig.bbox
        for legend in legends:
            box = legend.get_window_extent(renderer)
            assert not any(_overlaps(box, ax.get_window_extent(renderer)) for ax in axes)
            assert whole.x0 <= box.x0 and box.x1 <= whole.x1 and box.y1 <= whole.y1
        if call[0] is F.draw_rc_panels:
            for ax in axes:
                assert 1 <= len(ax.get_lines()) <= F.MAX_CURVES
                assert len(ax.get_legend().get_texts()) == len(ax.get_lines())
            panels_of[Path(call[1][1]).name] = [ax.get_title(loc="left") for ax in axes]
    # 12 fine-tuned curves + MCP: a panel per form (4 + 4 + MCP > 8); head-only 6 + MCP: one
    titles = panels_of["risk_coverage_vit-vit_test.png"]
    assert [t.split(";")[0] for t in titles] == [
        "fine-tuned oracles (plain)", "fine-tuned oracles (broadcast)", "fine-tuned oracles (cb)",
        "head-only oracles (frozen backbone, head on its features)",
        "post-hoc baselines (the classifier's logits only)"]
    assert len(panels_of["risk_coverage_resnet-vit_test.png"]) == 2   # fine-tuned, baselines


def test_figures_are_drawn_identically_twice(study, tmp_path):
    splits = _splits(study)
    for out in (tmp_path / "a", tmp_path / "b"):
        for draw, args in plan_figures(splits, out)[0]:
            draw(*args)
    files = sorted(p.name for p in (tmp_path / "a" / "figures").iterdir())
    assert files == sorted(p.name for p in (study / "figures").iterdir())
    for name in files:
        assert (tmp_path / "a" / "figures" / name).read_bytes() == \
            (tmp_path / "b" / "figures" / name).read_bytes(), name
