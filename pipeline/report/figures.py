"""Report figures (PNG, headless): TP/FP/TN/FN histograms (paper Fig. 3) and risk-coverage curves.

Figures are built on ``matplotlib.figure.Figure`` with the Agg canvas: no pyplot state and no
display, so they can be drawn in joblib worker processes.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

COLORS = {"TP": "#2c7bb6", "FN": "#abd9e9", "TN": "#d7191c", "FP": "#fdae61"}
DPI = 110


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def oc_label(labels: dict) -> str:
    return f"⟨{labels['oracle']}, {labels['classifier']}⟩"


def _hist_axes(ax, hist: dict, legend: bool = True) -> None:
    edges = np.asarray(hist["edges"])
    for name in ("TP", "FN", "TN", "FP"):
        counts = np.asarray(hist["counts"][name])
        ax.stairs(counts, edges, color=COLORS[name], fill=True, alpha=0.55,
                  label=f"{name} ({int(counts.sum())})")
    t = hist["thresholds"]
    ax.axvline(t["positive"], color="k", ls="--", lw=0.8)
    if t["negative"] != t["positive"]:
        ax.axvline(t["negative"], color="k", ls=":", lw=0.8)
    if t.get("tpr95") is not None:    # the working point: 95% of the correct rows accepted
        ax.axvline(t["tpr95"], color="#1a9641", ls="-.", lw=1.0, label="95% TPR")
    ax.set_xlim(0, 1)
    ax.set_yscale("symlog", linthresh=10)
    ax.tick_params(labelsize=7)
    if legend:
        ax.legend(fontsize=6, loc="upper left", framealpha=0.7, handlelength=1.0)


def draw_histogram_grid(cells: dict[tuple[str, str], dict], rows: list[str], cols: list[str],
                        path: str, title: str) -> None:
    """The paper's Fig. 3 layout: one panel per (⟨O,C⟩ row, loss column); empty where absent.
    Each panel: the run's confidences split into TP / FN / TN / FP at its loss's thresholds
    (dashed: positive threshold 0.5; dotted: the negative one where it differs, 1/K for TCP)."""
    width, height = 2.9 * len(cols) + 0.4, 2.3 * len(rows) + 0.6
    fig = _figure(width, height)
    # fixed margins in inches: tight_layout would cost a full extra draw of every panel
    axes = fig.subplots(len(rows), len(cols), squeeze=False, gridspec_kw=dict(
        left=0.45 / width, right=1 - 0.1 / width, bottom=0.35 / height, top=1 - 0.65 / height,
        wspace=0.3, hspace=0.45))
    for i, row in enumerate(rows):
        for j, col in enumerate(cols):
            ax = axes[i, j]
            result = cells.get((row, col))
            if result is None:
                ax.set_axis_off()
                continue
            _hist_axes(ax, result["hist"])
            seed = result["labels"].get("seed")
            ax.set_title(f"{row} + {col}" + (f", seed {seed}" if seed is not None else ""),
                         fontsize=8)
    fig.suptitle(title, fontsize=9)
    _save(fig, path)


def rc_risk_limit(curves: list[dict], min_coverage: float = 0.05) -> float:
    """Top of the risk axis: 10% above the highest risk any curve reaches at coverage >= 5%
    (the first few rows' risk jumps between 0 and 1 and would squash every curve), at most 1."""
    peak = max((max((r for c, r in zip(cv["coverage"], cv["risk"]) if c >= min_coverage),
                    default=0.0) for cv in curves), default=1.0)
    return min(1.0, max(peak * 1.1, 0.01))


def draw_rc_curves(curves: list[dict], path: str, title: str, full_range: bool = False) -> None:
    """Selective risk vs coverage, one line per loss (solid) and post-hoc baseline (dashed);
    ``curves`` items: {"label", "coverage", "risk", "aurc", "baseline"}; AURC x1000 in the legend.
    The risk axis is scaled to the data (``rc_risk_limit``); ``full_range`` draws 0..1."""
    fig = _figure(5.2, 3.8)
    ax = fig.add_subplot()
    for curve in curves:
        ax.plot(curve["coverage"], curve["risk"], lw=1.3 if not curve["baseline"] else 1.0,
                ls="--" if curve["baseline"] else "-",
                label=f"{curve['label']} (AURC {1000 * curve['aurc']:.2f}×10⁻³)")
    ax.set_xlabel("coverage", fontsize=8)
    ax.set_ylabel("selective risk (error rate among kept)", fontsize=8)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.0 if full_range else rc_risk_limit(curves))
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6.5, loc="upper left", frameon=False)
    ax.set_title(title, fontsize=9)
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.12, top=0.92)  # no tight_layout pass
    _save(fig, path)


def _save(fig, path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(path).with_name(f".{Path(path).name}.tmp.png")
    fig.savefig(tmp)
    tmp.replace(path)
