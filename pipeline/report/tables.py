"""Report tables: one table model (paper Table 1 / Table A4 layouts), four writers (md, csv, tex,
json).  Every table carries the sentence that says which metric definitions it uses (the
post-hoc baselines ECE applies to named from baselines.py's table)."""
from __future__ import annotations

import csv
import io
import json

from pipeline.core.catalog import CATALOG, DEFINITIONS, Column, column, columns, delta_header
from pipeline.report import smallscale
from pipeline.report.baselines import CALIBRATED_SCORES, REFERENCE, TABLE
from pipeline.report.compare import COMPARED, VERSUS_METRICS

# the columns of each table, from pipeline/core/catalog.py; unit "%" = x100 like the paper,
# "e3" = x1000 (fd-shifts' AURC scale).
COLUMNS = {d: columns(d, "main") for d in DEFINITIONS}
WORKING_POINTS = columns("standard", "working_points")
UNITS = {"%": (100.0, 2), "e3": (1000.0, 2), "": (1.0, 4)}
DEFINITION_TEXT = {
    "paper": "Paper definitions (the authors' code): FPR-95%-TPR at the first of 10,000 grid "
             "thresholds whose TPR lies in [0.9495, 0.9505] († = no grid threshold in the window, "
             "the nearest TPR was used); AUPR-Error = AP of the errors scored by p itself, NOT "
             "negated, so LOWER is better; TPR = P(p > 0.5 | correct); TNR = P(p < t | incorrect) "
             "with t = 0.5, t = 1/K for TCP.",
    "standard": "Standard definitions (ConfidNet / fd-shifts): FPR-95%-TPR = lowest FPR over the "
                "exact ROC points with TPR ≥ 0.9495; AUPR-Error = AP of the errors scored by −p "
                "(higher is better); TNR threshold 0.5 for every loss; AURC, E-AURC, AUGRC ×10³ "
                "(risk-coverage curves, ties grouped).",
    "working_points": "Working points on the selective risk-coverage curve (ties grouped): "
                      "selective risk (error rate among the kept rows) at the highest threshold "
                      "keeping ≥ 80/90/95% of the rows; the largest coverage whose selective risk "
                      "is ≤ 1/5/10% (0: even the most confident rows are riskier). ECE: 15 "
                      "equal-width bins, for scores that estimate P(correct) (oracles, "
                      + ", ".join(TABLE[n].prose or TABLE[n].label for n in CALIBRATED_SCORES)
                      + ").",
    "paired": "SS minus the other row, mean over seeds, with the 95% paired bootstrap interval "
              "over test rows (the same resamples for both rows). AUC in points (higher is "
              "better for SS when positive), AURC ×10³ (better when negative).",
    "versus": "The learned scorer (an oracle run; mean over its seeds) minus the post-hoc "
              "baseline, with the 95% paired bootstrap interval over test rows (the same "
              "resamples for both rows). AUC in points (the learned scorer is better when "
              "positive), AURC and AUGRC ×10³ (better when negative); 'learned better/worse' "
              "only where the interval excludes 0. The strongest post-hoc baseline is the one "
              "with the best AURC on this split's own rows: a choice that favours the baselines.",
    "separability": "Gaussian fits (unbiased std) to the confidences of correct vs incorrect "
                    "predictions; KL̄ = KL averaged over both directions — the paper formula "
                    "(authors' code, factor 2 missing: identical Gaussians give 0.5) and/or the "
                    "correct one; d_B = Bhattacharyya distance.",
}
LATEX_HEAD = {"⟨O,C⟩": r"\textlangle O, C\textrangle", "↑": r"$\uparrow$", "↓": r"$\downarrow$",
              "×10³": r"$\times 10^3$", "−p": "$-p$", "KL̄": r"$\bar{d}_{KL}$", "d_B": "$d_B$",
              "≥": r"$\geq$", "⟨": r"\textlangle ", "⟩": r"\textrangle", "—": "---",
              "†": r"$\dagger$", "–": "--", "Δ": r"$\Delta$", "−": "$-$"}


def build_tables(split: dict, choice: str, ci: bool = False) -> list[dict]:
    """The tables of one split: Table 1 per chosen definition, the working points (standard
    definitions), the separability table and the paired comparisons.  ``ci``: intervals in the
    md/tex cells too."""
    defs = ["paper", "standard"] if choice == "both" else [choice]
    tables = []
    for d in defs:
        tables.append(_table(split, d, f"Trust metrics — {d} definitions (paper Table 1 layout)",
                             DEFINITION_TEXT[d], COLUMNS[d], ci))
    if smallscale.has_rows(split):
        for d in defs:
            cols = [c for c in COLUMNS[d] if c.metric in smallscale.METRICS]
            tables.append(smallscale.small_scale_table(split, d, cols, DEFINITION_TEXT[d], ci))
    standard = "standard" in defs        # working points, ECE and AURC belong to that set
    if standard:
        tables.append(_table(split, "working_points", "Working points and calibration",
                             DEFINITION_TEXT["working_points"], WORKING_POINTS, ci))
    sep = [column("kl", d) for d in defs] + [column("bhattacharyya", defs[0])]
    tables.append(_table(split, "separability", "Separability (paper Table A4)",
                         DEFINITION_TEXT["separability"], sep, ci))
    if standard and split.get("comparisons"):
        tables.append(paired_table(split))
    if standard:
        tables += versus_tables(split)
    return tables


def _table(split: dict, tid: str, title: str, text: str, columns: list[Column],
           ci: bool = False) -> dict:
    rows = [{"oc": r["oc"], "loss": r["display_loss"], "kind": r["kind"], "n": r["n"],
             "keys": {k: r[k] for k in ("oracle", "classifier", "loss", "variant", "loss_label",
                                        "group")},
             "cells": [r["agg"][c.definition][c.metric] for c in columns]} for r in split["rows"]]
    return {"id": tid, "split": split["split"], "title": title, "definition": text,
            "columns": columns, "rows": rows, "ci": ci}


def _delta_columns(compared: tuple) -> list[Column]:
    """The columns of the differences compare.py computes."""
    return [Column(d, m, delta_header(m, d), CATALOG[m].unit) for m, d in compared]


PAIRED_COLUMNS = _delta_columns(COMPARED)
VERSUS_COLUMNS = _delta_columns(VERSUS_METRICS)


def _delta_cells(c: dict, columns: list[Column]) -> list[dict]:
    cells = []
    for col in columns:
        e = c["metrics"][col.metric]
        cells.append({"mean": e["delta"], "std": None, "ci": e["ci"], "verdict": e["verdict"],
                      "undefined": e["ci"]["undefined"] if e["delta"] is not None else
                      "undefined for one of the rows", "notes": []})
    return cells


def paired_table(split: dict) -> dict:
    """SS against each other row: one row per pair, cells = differences with their interval."""
    rows = []
    for c in split["comparisons"]:
        rows.append({"oc": c["oc"], "loss": f"{c['ss']} − {c['other']}"
                     + (" (post-hoc)" if c["other_kind"] == "baseline" else ""),
                     "kind": "paired", "n": f"{c['n_ss']}/{c['n_other']}",
                     "keys": {"oracle": c["oc"], "classifier": "", "loss": c["ss"], "variant": "",
                              "loss_label": c["other"], "group": ""},
                     "cells": _delta_cells(c, PAIRED_COLUMNS)})
    return {"id": "paired", "split": split["split"], "title": "Paired comparisons: SS − other",
            "definition": DEFINITION_TEXT["paired"], "columns": PAIRED_COLUMNS, "rows": rows,
            "ci": True}


def versus_tables(split: dict) -> list[dict]:
    """Every learned scorer against MCP, and against the post-hoc baseline with the best AURC on
    this split (of those compare.VERSUS lists that the report has)."""
    picks = {"versus_mcp": ("Learned scorers − MCP", lambda c: c["other_key"] == REFERENCE),
             "versus_strongest": ("Learned scorers − the strongest post-hoc baseline (best AURC)",
                                  lambda c: c["strongest"])}
    tables = []
    for tid, (title, pick) in picks.items():
        rows = [{"oc": c["oc"], "loss": f"{c['learned']} − {c['other']}", "kind": "versus",
                 "n": f"{c['n_learned']}/{c['n_other']}",
                 "keys": {**c["learned_key"], "loss_label": c["other"]},
                 "cells": _delta_cells(c, VERSUS_COLUMNS)}
                for c in split.get("versus_baselines", []) if pick(c)]
        if rows:
            tables.append({"id": tid, "split": split["split"], "title": title,
                           "definition": DEFINITION_TEXT["versus"], "columns": VERSUS_COLUMNS,
                           "rows": rows, "ci": True})
    return tables


def cell_text(cell: dict, unit: str, pm: str = " ± ", metric: str = "", ci: bool = False) -> str:
    """mean ± std in display units; accuracy without ± when every seed has the same (the paper's
    layout: one classifier, one accuracy); `` [low, high]`` with ``ci`` and an interval; the
    verdict of a paired comparison."""
    if cell["mean"] is None:
        return "n/a"
    scale, digits = UNITS[unit]
    text = f"{cell['mean'] * scale:+.{digits}f}" if "verdict" in cell else \
        f"{cell['mean'] * scale:.{digits}f}"
    if cell.get("std") is not None and not (metric == "acc" and cell["std"] == 0):
        text += f"{pm}{cell['std'] * scale:.{digits}f}"
    interval = cell.get("ci") or {}
    if ci and interval.get("low") is not None:
        text += f" [{interval['low'] * scale:.{digits}f}, {interval['high'] * scale:.{digits}f}]"
    if cell.get("verdict"):
        text += f" ({cell['verdict']})"
    return text


def _marks(cell: dict, footnotes: list[str]) -> str:
    marks = ""
    for text in ([cell["undefined"]] if cell["mean"] is None else []) + list(cell.get("notes", [])):
        if text not in footnotes:
            footnotes.append(text)
        marks += f"[{footnotes.index(text) + 1}]"
    return marks


def markdown_table(table: dict) -> str:
    heads = ["⟨O,C⟩", "Loss"] + [c.header for c in table["columns"]] + ["n"]
    lines = [f"### {table['title']}", "", table["definition"], "",
             "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    footnotes: list[str] = []
    previous = None
    for row in table["rows"]:
        cells = [cell_text(c, col.unit, metric=col.metric, ci=table.get("ci", False))
                 + _marks(c, footnotes) for c, col in zip(row["cells"], table["columns"])]
        oc = row["oc"] if row["oc"] != previous else ""
        previous = row["oc"]
        lines.append("| " + " | ".join([oc, row["loss"], *cells, str(row["n"])]) + " |")
    lines += [""] + [f"[{i + 1}] {text}  " for i, text in enumerate(footnotes)]
    return "\n".join(lines).rstrip() + "\n"


def csv_text(tables: list[dict]) -> str:
    """Tidy CSV: one line per (split, table, row, metric), values in the table's display units."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["split", "table", "definition", "kind", "oracle", "classifier", "loss",
                     "variant", "loss_label", "group", "n_runs", "metric", "unit", "mean", "std",
                     "ci_low", "ci_high", "ci_undefined_reason", "undefined_reason", "notes"])
    for t in tables:
        for row in t["rows"]:
            for cell, (d, metric, _, unit) in zip(row["cells"], t["columns"]):
                scale = UNITS[unit][0]
                mean = "" if cell["mean"] is None else repr(cell["mean"] * scale)
                std = "" if cell.get("std") is None else repr(cell["std"] * scale)
                k = row["keys"]
                ci = cell.get("ci") or {}
                low = "" if ci.get("low") is None else repr(ci["low"] * scale)
                high = "" if ci.get("high") is None else repr(ci["high"] * scale)
                writer.writerow([t["split"], t["id"], d, row["kind"], k["oracle"], k["classifier"],
                                 k["loss"], k["variant"], k["loss_label"], k["group"], row["n"],
                                 metric, {"%": "percent", "e3": "x1e3", "": "nats"}[unit],
                                 mean, std, low, high, ci.get("undefined") or "",
                                 cell.get("undefined") or "", " | ".join(cell.get("notes", []))])
    return buf.getvalue()


def _tex(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"),
                 ("#", r"\#"), ("$", r"\$")):
        text = text.replace(a, b)
    for a, b in LATEX_HEAD.items():
        text = text.replace(a, b)
    return text


def latex_table(table: dict) -> str:
    """booktabs rows like the paper: multirow ⟨O,C⟩ blocks, mean$\\pm$std, n/a and $^\\dagger$."""
    ncol = len(table["columns"]) + 2
    heads = [r"\textbf{" + _tex(h) + "}"
             for h in ["⟨O,C⟩", "Loss"] + [c.header for c in table["columns"]]]
    lines = [f"% split {table['split']}: {table['title']}. {table['definition']}",
             r"\begin{table}[!t]", r"\centering",
             r"\caption{" + _tex(f"{table['title']} — split {table['split']}. "
                                 f"{table['definition']}") + "}",
             r"\begin{tabular}{ll" + "c" * (ncol - 2) + "}", r"\toprule",
             " & ".join(heads) + r" \\",
             " ".join(f"\\cmidrule(lr){{{i}-{i}}}" for i in range(1, ncol + 1))]
    blocks: list[list[dict]] = []
    for row in table["rows"]:
        if not blocks or blocks[-1][0]["oc"] != row["oc"]:
            blocks.append([])
        blocks[-1].append(row)
    for b, block in enumerate(blocks):
        if b:
            lines.append(r"\midrule")
        for i, row in enumerate(block):
            oc = (f"\\multirow{{{len(block)}}}{{*}}{{{_tex(row['oc'])}}}" if i == 0 else "")
            cells = [_tex_cell(c, col.unit, col.metric, table.get("ci", False))
                     for c, col in zip(row["cells"], table["columns"])]
            lines.append(" & ".join([oc, _tex(row["loss"]), *cells]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}", ""]
    return "\n".join(lines)


def _tex_cell(cell: dict, unit: str, metric: str, ci: bool = False) -> str:
    text = cell_text(cell, unit, pm=r"$\pm$", metric=metric, ci=ci)
    return text + (r"$^\dagger$" if cell.get("notes") else "")


def latex_document(tables: list[dict]) -> str:
    head = ("% Generated by `cli.py report`. Needs \\usepackage{booktabs,multirow} "
            "(and textcomp for \\textlangle).\n")
    return head + "\n".join(latex_table(t) for t in tables)


def json_text(doc: dict) -> str:
    """Every number, with definitions and sources; NaN can never slip in (allow_nan=False)."""
    return json.dumps(doc, indent=1, sort_keys=False, allow_nan=False, ensure_ascii=False) + "\n"
