"""The report's figures a reader can read: which files a study with training variants gets, that
report.md lists each with one line, a sane width, at most 8 curves per axes, legends beside the
data and never on it, the same bytes when drawn twice; histogram figures of any panel count with
every label on the canvas, as wide as their panels, without blended colours the legend lacks;
a lone variant's histograms named and listed for what they hold."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from matplotlib.colors import to_rgba
from matplotlib.patches import StepPatch
from matplotlib.text import Text

from bench.synthetic_runs import write_run, write_study
from cli import cli
from pipeline.report import figures as F
from pipeline.report.aggregate import aggregate
from pipeline.report.figplan import plan_figures
from pipeline.report.scoring import histograms

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


# a long title, as long model names and a corrupted split's tag make it
LONG_TITLE = ("⟨vit_base_patch16_224, resnet50⟩, split val-gaussian_noise-5: fine-tuned oracles, "
              "one panel per loss (lowest seed of each group)")


def _hist_rows(panels: int, rows: int = 1) -> list[list[dict]]:
    """``rows`` rows of ``panels`` histogram panels; the first of each row holds 50,000 rows
    (ticks up to 10^4, the widest tick labels), TCP's at its own negative threshold 0.1."""
    rng = np.random.default_rng(panels)
    out = []
    for _ in range(rows):
        row = []
        for j in range(panels):
            n, tcp = (50_000 if j == 0 else 400), j % 4 == 2
            correct = rng.random(n) < 0.8
            z = 1.5 * (2.0 * correct - 1) + rng.normal(size=n) - (3.0 if tcp else 0.0)
            conf = (1 / (1 + np.exp(-z))).astype(np.float32)
            row.append({"title": f"SS (broadcast, linear z, head-only), seed {j}",
                        "hist": histograms(conf, correct, 0.1 if tcp else 0.5, 0.5, 0.4)})
        out.append(row)
    return out


def _drawn(fig):
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)          # as savefig draws it
    return renderer


@pytest.mark.parametrize("panels,rows", [(1, 1), (2, 1), (3, 1), (4, 1), (6, 1), (4, 3)])
def test_every_label_of_a_histogram_figure_lies_on_the_canvas(panels, rows):
    """Title, legend, panel titles, axis labels and tick labels all inside the figure, and no
    panel's labels on another panel's axes (a one-panel figure cut its title at both sides and
    its y label at the left)."""
    fig = F.histogram_figure(_hist_rows(panels, rows), LONG_TITLE)
    renderer = _drawn(fig)
    whole = fig.bbox
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    assert any(LONG_TITLE.split()[0] in t.get_text() for t in texts)       # the title is drawn
    for text in texts:
        box = text.get_window_extent(renderer)
        assert (whole.x0 - 0.5 <= box.x0 and box.x1 <= whole.x1 + 0.5
                and whole.y0 - 0.5 <= box.y0 and box.y1 <= whole.y1 + 0.5), repr(text.get_text())
    axes = fig.get_axes()
    assert len(axes) == panels * rows
    for ax in axes:
        own = ax.get_tightbbox(renderer)
        assert not any(_overlaps(own, other.get_window_extent(renderer))
                       for other in axes if other is not ax)


def test_a_histogram_figure_is_as_wide_as_its_panels():
    """One panel: one axes in a figure narrower than two panels' (it was as wide, its right
    half empty); wider with each panel up to MAX_COLS a row, then rows wrap."""
    widths = {}
    for panels in (1, 2, 3, 4, 6):
        fig = F.histogram_figure(_hist_rows(panels), "⟨vit, vit⟩, split test: one panel")
        assert len(fig.get_axes()) == panels
        widths[panels] = fig.get_figwidth()
    assert widths[1] < widths[2] < widths[3] < widths[4] == widths[6]
    assert widths[2] - widths[1] > 0.8 * F.PANEL_W
    assert widths[4] * F.DPI <= MAX_WIDTH_PX


def _look(patch) -> tuple:
    """How a patch reads: filled with a colour, or an outline of one."""
    return ("fill", to_rgba(patch.get_facecolor())) if patch.get_fill() else \
        ("outline", to_rgba(patch.get_edgecolor()))


def test_histogram_colours_never_blend_and_the_legend_shows_each():
    """Filled bars never share a bin (translucent TP over FP bars blended into a colour no
    legend entry showed); every bar drawn looks like one legend entry."""
    fig = F.histogram_figure(_hist_rows(4), "⟨vit, vit⟩, split test")
    _drawn(fig)
    legend = {_look(h) for h in fig.legends[0].legend_handles if hasattr(h, "get_fill")}
    for ax in fig.get_axes():
        bars = [p for p in ax.patches if isinstance(p, StepPatch)]
        assert {_look(p) for p in bars} <= legend
        filled = [p.get_data().values for p in bars if p.get_fill()]
        assert len(filled) == 2                                     # TP and FN
        assert int(np.sum(np.stack(filled) > 0, axis=0).max()) <= 1


def test_a_lone_variants_histograms_are_named_and_listed_for_what_they_hold(tmp_path):
    """⟨vit, vit⟩ with head-only runs only: its one histogram figure is named after its variant,
    not `_variants_`, and report.md does not call it "the other training variants";
    ⟨resnet, vit⟩ with two variants and no plain runs keeps `_variants_`, without "other"."""
    write_study(tmp_path, n=300, losses=(), held_out=None)
    cache = tmp_path / "cache" / "vit" / "test"
    for oracle, variant in (("vit", "head-only"), ("resnet", "broadcast"), ("resnet", "head-only")):
        for loss in ("ce", "ss"):
            write_run(tmp_path / "runs" / f"{oracle}_{loss}_{variant}", cache, oracle=oracle,
                      classifier="vit", loss=loss, seed=0, group=f"{oracle}-{loss}-{variant}",
                      variant=variant, loss_label=f"{LABELS[loss]} ({variant})")
    out = tmp_path / "report"
    result = CliRunner().invoke(cli, ["report", str(tmp_path / "runs"), "--out", str(out),
                                      "--no-ci", "--jobs", "1"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    hists = sorted(p.name for p in (out / "figures").glob("histograms_*.png"))
    assert hists == ["histograms_resnet-vit_variants_test.png",
                     "histograms_vit-vit_head-only_test.png"]
    md = {line.split("]")[0].lstrip("- ["): line for line in
          (out / "report.md").read_text().splitlines() if line.startswith("- [histograms_")}
    lone = md["histograms_vit-vit_head-only_test.png"]
    assert "variants" not in lone and "other" not in lone and "head-only" in lone
    several = md["histograms_resnet-vit_variants_test.png"]
    assert "other" not in several and "the same" not in several
    assert "broadcast; head-only" in several
