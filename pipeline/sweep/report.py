"""A sweep's table (md, csv, json) and the paper's Fig. 4b/c: mean training loss, and TPR/TNR on
the held-out validation rows, against each swept option (the others at their chosen values)."""
from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from pipeline.core.catalog import log_name
from pipeline.core.losses import all_params
from pipeline.sweep.grid import score_of

NAMES = {name: p.symbol for name, p in all_params().items()}
# the table's metric columns (header, catalog metric) of the held-out validation rows and of the
# evaluation split; a point holds them under their log.jsonl keys (catalog.log_name)
RATES = (("TPR", "tpr"), ("TNR", "tnr"))          # also Fig. 4c's curves
VAL_COLUMNS = (*RATES, ("AUPR-Err", "aupr_err"), ("AUC", "auc"))
EVAL_COLUMNS = (*RATES, ("AUC", "auc"))


def table_rows(summary: dict) -> tuple[list[str], list[list]]:
    """Header and rows: one per point, validation metrics (the choice) before the eval split's."""
    opts = list(summary["swept"])
    crit = summary["criterion"]
    tag = next((p["eval"]["split"] for p in summary["points"] if p.get("eval")), "eval")
    head = (["stage", *[NAMES[o] for o in opts], "status", f"val {crit}",
             *[f"val {h}" for h, _ in VAL_COLUMNS], "mean train loss",
             *[f"eval {tag} {h} (not used)" for h, _ in EVAL_COLUMNS], "chosen", "run"])
    rows = []
    for p in summary["points"]:
        v, e = p.get("val") or {}, p.get("eval") or {}
        score = score_of(v, crit)
        rows.append([p["stage"], *[p["values"][o] for o in opts], p["status"], score,
                     *[v.get(log_name(m)) for _, m in VAL_COLUMNS], p["mean_train_loss"],
                     *[e.get(log_name(m)) for _, m in EVAL_COLUMNS],
                     "*" if p.get("chosen_in_stage") else "",
                     Path(p["run_dir"]).name if p.get("run_dir") else ""])
    return head, rows


def _fmt(x) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def markdown(summary: dict) -> str:
    head, rows = table_rows(summary)
    chosen = ", ".join(f"{NAMES[k]} = {v:g}" for k, v in summary["chosen"].items())
    kind = "fine-tuned" if summary["fine_tune"] else "head-only"
    lines = [f"# Sweep ({summary['mode']} protocol, {kind} oracles)",
             "", f"Chosen on the held-out validation rows by {summary['criterion']}: **{chosen}**.",
             "The evaluation split's columns are shown for information; they take no part in "
             "the choice.", "", "| " + " | ".join(head[:-1]) + " |",
             "|" + "---|" * (len(head) - 1)]
    lines += ["| " + " | ".join(_fmt(x) for x in r[:-1]) + " |" for r in rows]
    lines += ["", "Train the chosen oracle:", "", "```bash", summary["command"], "```", ""]
    return "\n".join(lines)


def write_all(root: Path, summary: dict, figures: bool = True) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    head, rows = table_rows(summary)
    (root / "sweep.md").write_text(markdown(summary))
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(head)
    writer.writerows([[("" if x is None else x) for x in r] for r in rows])
    (root / "sweep.csv").write_text(buf.getvalue())
    files = [str(root / "sweep.md"), str(root / "sweep.csv"), str(root / "sweep.json")]
    if figures:
        files += [str(p) for p in write_figures(root / "figures", summary)]
    return files


def curve(summary: dict, option: str) -> list[dict]:
    """The points of the stage that swept ``option`` alone (paper protocol), or of a grid the
    points where only ``option`` differs from the chosen values; sorted by its value."""
    stage = next(st for st in summary["stages"] if option in st["options"])
    if stage["options"] == [option]:
        pts = [p for p in summary["points"] if p["stage"] == stage["stage"]]
    else:
        chosen = summary["chosen"]
        pts = [p for p in summary["points"]
               if all(p["values"][k] == chosen[k] for k in chosen if k != option)]
    uniq = {p["values"][option]: p for p in pts}     # a value trained twice: same run directory
    return [uniq[k] for k in sorted(uniq)]


def write_figures(out: Path, summary: dict) -> list[Path]:
    """sweep_<option>.png: (b) mean training loss and (c) TPR / TNR against the option."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for option in summary["swept"]:
        pts = curve(summary, option)
        if len(pts) < 2:
            continue
        x = [p["values"][option] for p in pts]
        fig = Figure(figsize=(9, 3.4))
        FigureCanvasAgg(fig)
        ax_b, ax_c = fig.subplots(1, 2)
        ax_b.plot(x, [p["mean_train_loss"] for p in pts], "o-", color="k")
        ax_b.set(xlabel=NAMES[option], ylabel="mean training loss",
                 title="(b) loss vs " + NAMES[option])
        for (label, metric), colour in zip(RATES, ("tab:blue", "tab:red")):
            key = log_name(metric)
            ax_c.plot(x, [_get(p, "val", key) for p in pts], "o-", color=colour,
                      label=f"{label} (held-out val)")
            ev = [_get(p, "eval", key) for p in pts]
            tag = next((p["eval"]["split"] for p in pts if p.get("eval")), None)
            if tag is not None:
                ax_c.plot(x, ev, "s--", color=colour, alpha=0.5, label=f"{label} ({tag})")
        ax_c.axvline(summary["chosen"][option], color="grey", lw=0.8, ls=":")
        ax_c.set(xlabel=NAMES[option], ylabel="rate", ylim=(-0.02, 1.02),
                 title=f"(c) TPR / TNR vs {NAMES[option]} (chosen {summary['chosen'][option]:g})")
        ax_c.legend(fontsize=7, loc="best")
        held = {k: v for k, v in pts[0]["values"].items() if k != option}
        fixed = ", ".join(f"{NAMES[k]} = {v:g}" for k, v in held.items())
        if fixed:
            fig.suptitle(fixed, fontsize=8)
        fig.subplots_adjust(left=0.07, right=0.98, bottom=0.15, top=0.84, wspace=0.25)
        path = out / f"sweep_{option}.png"
        fig.savefig(path, dpi=110)
        paths.append(path)
    return paths


def _get(p: dict, where: str, key: str) -> float:
    v = (p.get(where) or {}).get(key)
    return math.nan if v is None else float(v)


def read_chosen(root: Path) -> tuple[dict, dict] | None:
    """(the values a finished sweep in ``root`` chose, over the fixed ones it did not sweep;
    the fixed ones), e.g. ``({"alpha_pos": 1.0, "alpha_neg": 4.0}, {"alpha_pos": 1.0,
    "alpha_neg": 3.0})``; None while its sweep.json does not exist."""
    path = Path(root) / "sweep.json"
    if not path.exists():
        return None
    summary = json.loads(path.read_text())
    fixed = summary.get("fixed", {})
    return {**fixed, **summary["chosen"]}, fixed
