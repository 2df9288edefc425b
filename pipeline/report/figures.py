"""Report figures (PNG, headless): TP/FP/TN/FN histograms (paper Fig. 3) and risk-coverage
curves.  Which figures a report has, and what each shows, is figplan.py's; this module draws one.

Figures are built on ``matplotlib.figure.Figure`` with the Agg canvas: no pyplot state and no
display, so they can be drawn in joblib worker processes.  Risk-coverage axes are placed in
inches (their labels are fixed; no layout pass to pay for); histogram figures, whose tick labels,
titles and panel counts vary, are sized by their panel count and laid out by the constrained
layout engine so that nothing is cut.  Legends get their own strip beside or above the panels,
never on the data.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from cache.atomic import atomic_path
from pipeline.core.catalog import higher_is_better
from pipeline.core.losses import names

COLORS = {"TP": "#2c7bb6", "FN": "#abd9e9", "TN": "#d7191c", "FP": "#fdae61"}
DPI = 110
MAX_CURVES = 8        # curves per risk-coverage panel: more cannot be told apart at a glance
MAX_COLS = 4          # histogram panels per row: the paper's Fig. 3 row (CE, Focal, TCP, SS)
# one colour per loss, the same in every panel and figure (matplotlib's tab10, in the losses'
# table order); anything else takes a spare colour
TAB10 = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")
LOSS_COLORS = dict(zip(names(), TAB10))
SPARE_COLORS = ("#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#000000", "#7f7f7f",
                "#aec7e8")
VARIANT_STYLES = ("-", "--", "-.", (0, (3, 1, 1, 1, 1, 1)))   # first variant of a panel solid
REFERENCE = {"color": "0.35", "ls": ":", "lw": 1.8}          # MCP drawn in the oracles' panels
CHAR_IN = 0.058       # width of one legend character at 7 pt, inches (DejaVu Sans, measured)
# the risk-coverage legend's title: each curve's AURC, and which way is better (the catalog's)
RC_LEGEND = f"AURC ×10³ ({'higher' if higher_is_better('aurc', 'standard') else 'lower'}: better)"


def _figure(width: float, height: float, layout: str | None = None):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout=layout)
    FigureCanvasAgg(fig)
    return fig


def _axes(fig, width: float, height: float, left: float, top: float, w: float, h: float):
    """An axes ``w`` x ``h`` inches whose top-left corner is ``left``, ``top`` inches from the
    figure's top-left corner."""
    return fig.add_axes((left / width, 1 - (top + h) / height, w / width, h / height))


def oc_label(labels: dict) -> str:
    return f"⟨{labels['oracle']}, {labels['classifier']}⟩"


# ------------------------------------------------------------------------------ histograms ---
PANEL_W, PANEL_H = 2.3, 1.7           # one histogram's axes, inches (about: see histogram_figure)
DECOR_W, DECOR_H = 0.5, 0.85          # around it: y ticks and label; two title lines and x ticks
TITLE_PT, PANEL_PT, SMALL_PT = 9, 7.5, 7     # title; panel titles; legend, ticks, axis labels
LINE_IN = 0.14                        # one more panel title line, inches
# the correct rows are filled and the wrong ones outlined (see _hist_axes)
FILLED, OUTLINED = ("TP", "FN"), ("TN", "FP")
ENTRIES = {"TP": "TP: correct, accepted", "FN": "FN: correct, rejected",
           "TN": "TN: wrong, rejected", "FP": "FP: wrong, accepted"}
OUTLINE_LW = 1.3


def _hist_axes(ax, hist: dict) -> None:
    """The counts as steps: correct rows filled (opaque), wrong rows outlined on top.  A correct
    and a wrong category share bins (TP and FP both lie above the threshold), and two
    translucent fills blend there into a colour no legend entry shows; an outline over a fill
    never blends.  TP and FN do not share bins (one threshold splits them; the fills are opaque,
    so even the bin holding the threshold does not blend), nor do TN and FP."""
    edges = np.asarray(hist["edges"])
    for name in FILLED:
        ax.stairs(np.asarray(hist["counts"][name]), edges, color=COLORS[name], fill=True, lw=0)
    for name in OUTLINED:
        counts = np.asarray(hist["counts"][name])
        nz = np.flatnonzero(counts)
        if nz.size:       # from its first to its last row's bin: no line along the x axis
            lo, hi = nz[0], nz[-1] + 1
            ax.stairs(counts[lo:hi], edges[lo:hi + 1], color=COLORS[name], lw=OUTLINE_LW)
    t = hist["thresholds"]
    ax.axvline(t["positive"], color="k", ls="--", lw=0.8)
    if t["negative"] != t["positive"]:
        ax.axvline(t["negative"], color="k", ls=":", lw=0.8)
    if t.get("tpr95") is not None:    # the working point: 95% of the correct rows accepted
        ax.axvline(t["tpr95"], color="#1a9641", ls="-.", lw=1.0)
    ax.set_xlim(0, 1)
    ax.set_yscale("symlog", linthresh=10)
    ax.tick_params(labelsize=SMALL_PT)


def _counts_line(hist: dict) -> str:
    return " · ".join(f"{n} {int(np.asarray(hist['counts'][n]).sum())}"
                      for n in ("TP", "FN", "TN", "FP"))


def _hist_legend(panels: list[dict]):
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=COLORS[n], edgecolor="none", label=ENTRIES[n]) for n in FILLED]
    handles += [Patch(fill=False, edgecolor=COLORS[n], lw=OUTLINE_LW, label=ENTRIES[n])
                for n in OUTLINED]
    handles.append(Line2D([], [], color="k", ls="--", lw=0.8, label="threshold 0.5"))
    thresholds = [p["hist"]["thresholds"] for p in panels]
    if any(t["negative"] != t["positive"] for t in thresholds):
        handles.append(Line2D([], [], color="k", ls=":", lw=0.8, label="TNR threshold 1/K (TCP)"))
    if any(t.get("tpr95") is not None for t in thresholds):
        handles.append(Line2D([], [], color="#1a9641", ls="-.", lw=1.0, label="95% TPR"))
    return handles


def draw_histograms(rows: list[list[dict]], path: str, title: str) -> None:
    _save(histogram_figure(rows, title), path)


def histogram_figure(rows: list[list[dict]], title: str):
    """One histogram panel per run, ``rows`` of panels ({"title", "hist"}) wrapped at MAX_COLS:
    the run's confidences split into TP / FN / TN / FP at its loss's thresholds (dashed: 0.5;
    dotted: the negative one where it differs, 1/K for TCP; dash-dot: the 95%-TPR working
    point); the counts under each title; the title and one legend above the panels.

    The figure is as wide as its panels (one panel: one panel wide, never an empty half), and
    at least two legend columns; titles are wrapped to that width.  The constrained layout
    engine then fits the axes around every label it measures (tick labels, axis labels, panel
    titles, the legend), so nothing is cut at the edges whatever the numbers' widths.  The
    title is the legend's title: the engine makes room for an outside legend but lays a
    suptitle over it (matplotlib 3.11)."""
    lines = [row[i:i + MAX_COLS] for row in rows for i in range(0, len(row), MAX_COLS)]
    cols = max(len(line) for line in lines)
    handles = _hist_legend([p for line in lines for p in line])
    measure = _measurer()
    gap = 1.2 * SMALL_PT / 72                              # legend column spacing, inches
    entry = max(_text_w(h.get_label(), SMALL_PT, measure) for h in handles) \
        + (1.6 + 0.8) * SMALL_PT / 72                      # handle and its pad
    width = max(cols * (PANEL_W + DECOR_W) + 0.3, 2 * entry + gap + 0.3)
    ncol = max(1, min(len(handles), int((width - 0.3 + gap) // (entry + gap))))
    legend_rows = -(-len(handles) // ncol)
    ncol = -(-len(handles) // legend_rows)                  # the rows filled evenly
    title = _wrap(title, TITLE_PT, width - 0.3, measure)
    titles = [[_wrap(f"{p['title']}\n{_counts_line(p['hist'])}", PANEL_PT,
                     PANEL_W + DECOR_W - 0.1, measure) for p in line] for line in lines]
    extra = sum(max(t.count("\n") - 1 for t in line) * LINE_IN for line in titles)
    height = (0.2 * (title.count("\n") + 1) + 0.17 * legend_rows + 0.2
              + len(lines) * (PANEL_H + DECOR_H) + extra)
    fig = _figure(width, height, layout="constrained")
    grid = fig.add_gridspec(len(lines), cols)
    for i, line in enumerate(lines):
        for j, panel in enumerate(line):
            ax = fig.add_subplot(grid[i, j])
            _hist_axes(ax, panel["hist"])
            ax.set_title(titles[i][j], fontsize=PANEL_PT)
            if i == len(lines) - 1 or j >= len(lines[i + 1]):     # nothing below it
                ax.set_xlabel("oracle confidence", fontsize=SMALL_PT)
            if j == 0:
                ax.set_ylabel("rows (symlog)", fontsize=SMALL_PT)
    legend = fig.legend(handles=handles, loc="outside upper center", ncol=ncol,
                        fontsize=SMALL_PT, frameon=False, handlelength=1.6, columnspacing=1.2,
                        title=title, title_fontsize=TITLE_PT)
    legend.get_title().set_multialignment("center")
    # laid out once, here: with the engine left on, savefig would traverse every artist once
    # more before drawing (matplotlib lays out in a draw pass of its own)
    fig.get_layout_engine().execute(fig)
    fig.set_layout_engine(None)
    return fig


def _measurer():
    from matplotlib.backends.backend_agg import RendererAgg

    return RendererAgg(1, 1, DPI)


def _text_w(text: str, size: float, renderer) -> float:
    """Width of one line of ``text`` at ``size`` pt, inches, as the Agg renderer draws it."""
    from matplotlib.font_manager import FontProperties

    w, _, _ = renderer.get_text_width_height_descent(text, FontProperties(size=size), False)
    return w / renderer.dpi


def _wrap(text: str, size: float, width: float, renderer) -> str:
    """``text`` broken at spaces into lines at most ``width`` inches wide at ``size`` pt (its
    own line breaks kept; a word wider than a line is cut): wrapped, never cut at the edges."""
    def fits(s: str) -> bool:
        return _text_w(s, size, renderer) <= width

    out = []
    for paragraph in text.split("\n"):
        line = ""
        for word in paragraph.split(" "):
            while len(word) > 1 and not fits(word):
                k = max((k for k in range(1, len(word)) if fits(word[:k])), default=1)
                out += [line, word[:k]] if line else [word[:k]]
                line, word = "", word[k:]
            if line and not fits(f"{line} {word}"):
                out.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        out.append(line)
    return "\n".join(out)


# -------------------------------------------------------------------------- risk-coverage ----
RC_W, RC_H = 4.0, 2.4                 # one risk-coverage panel's axes, inches


def rc_risk_limit(curves: list[dict], min_coverage: float = 0.05) -> float:
    """Top of the risk axis: 10% above the highest risk any curve reaches at coverage >= 5%
    (the first few rows' risk jumps between 0 and 1 and would squash every curve), at most 1."""
    peak = max((max((r for c, r in zip(cv["coverage"], cv["risk"]) if c >= min_coverage),
                    default=0.0) for cv in curves), default=1.0)
    return min(1.0, max(peak * 1.1, 0.01))


def curve_styles(curves: list[dict], forms: list[str]) -> list[dict]:
    """Line styles of one panel's curves: a loss keeps its colour in every panel, its form (the
    variant without "head-only", e.g. broadcast; its index in the figure's ``forms``) sets the
    dash; a baseline or a repeated (loss, form) takes a spare colour; the reference (MCP) is
    grey dotted."""
    used, spare, styles = set(), iter(SPARE_COLORS * 4), []
    for c in curves:
        if c.get("reference"):
            styles.append(dict(REFERENCE))
            continue
        key = (c.get("loss"), c.get("form", ""))
        color = LOSS_COLORS.get(c.get("loss")) if not c["baseline"] else None
        if color is None or key in used:
            color = next(spare)
        used.add(key)
        ls = "-" if c["baseline"] else VARIANT_STYLES[forms.index(c.get("form", ""))
                                                      % len(VARIANT_STYLES)]
        styles.append({"color": color, "ls": ls, "lw": 1.3})
    return styles


def draw_rc_panels(panels: list[dict], path: str, title: str, full_range: bool = False) -> None:
    _save(rc_figure(panels, title, full_range), path)


def rc_figure(panels: list[dict], title: str, full_range: bool = False):
    """Selective risk vs coverage, one panel per ``panels`` item ({"title", "curves"}) stacked
    on shared axes, each with at most MAX_CURVES curves and its legend to its right; ``curves``
    items: {"label", "coverage", "risk", "aurc", "baseline"} (+ "loss", "form", "reference").
    The risk axis is scaled to the data (``rc_risk_limit``); ``full_range`` draws 0..1."""
    every = [c for p in panels for c in p["curves"]]
    labels = [_rc_label(c) for c in every]
    legend_w = max(2.0, CHAR_IN * max(len(t) for t in labels + [RC_LEGEND])
                   + 0.6)
    width, top = 0.6 + RC_W + 0.2 + legend_w, 0.55
    height = top + len(panels) * RC_H + (len(panels) - 1) * 0.55 + 0.5
    fig = _figure(width, height)
    ymax = 1.0 if full_range else rc_risk_limit(every)
    forms = list(dict.fromkeys(c.get("form", "") for c in every if not c["baseline"]))
    for i, panel in enumerate(panels):
        ax = _axes(fig, width, height, 0.6, top + i * (RC_H + 0.55), RC_W, RC_H)
        for curve, style in zip(panel["curves"], curve_styles(panel["curves"], forms)):
            ax.plot(curve["coverage"], curve["risk"], label=_rc_label(curve), **style)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, ymax)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.set_ylabel("selective risk", fontsize=7.5)
        ax.set_title(panel["title"], fontsize=8, loc="left")
        if i == len(panels) - 1:
            ax.set_xlabel("coverage (share of rows kept, most trusted first)", fontsize=7.5)
        ax.legend(loc="upper left", bbox_to_anchor=(1.03, 1.0), borderaxespad=0, fontsize=7,
                  title=RC_LEGEND, title_fontsize=7, frameon=False,
                  handlelength=2.2)
    fig.suptitle(title, fontsize=9, y=1 - 0.08 / height, va="top")
    return fig


def _rc_label(curve: dict) -> str:
    return f"{curve['label']}  {1000 * curve['aurc']:.1f}"


def _save(fig, path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, suffix=".png") as tmp:    # matplotlib's format: the extension's
        fig.savefig(tmp)
