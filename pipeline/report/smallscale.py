"""The paper's small-scale table (its MNIST / CIFAR-10 table, run with ConfidNet's setup): per
classifier C, MCP, MC-Dropout and TrustScore (post-hoc) and ConfidNet's head on C's own features
trained with TCP's loss and with SS; the columns of Table 1; the paper's numbers beside ours.

The table is built from the split's rows (``pipeline.report.run``), so it shows what the report
evaluated: a row the report has no data for (no MC-Dropout columns in the cache, no ConfidNet-head
run) is "n/a" with the reason.  The paper's figures were computed by its ConfidNet-fork code, so
compare them with the standard definitions' table (ConfidNet's FPR and AUPR); its TPR/TNR are the
paper's own additions (TNR at 0.5, at 1/K for TCP)."""
from __future__ import annotations

from typing import Callable

from pipeline.core.catalog import Column, columns
from pipeline.core.losses import get
from pipeline.core.presets import DEMO
from pipeline.report.baselines import SMALL_SCALE

# (label, which report row) -- a post-hoc baseline (baselines.SMALL_SCALE), or an oracle on the
# classifier's own features (O = C) with ConfidNet's head (not the stacked inputs) and a loss
ROWS: tuple[tuple[str, Callable[[dict, str], bool]], ...] = (
    *((label, lambda r, c, key=key: _baseline(r, c, key)) for label, key in SMALL_SCALE.items()),
    *((f"{get(loss).label} (ConfidNet head)", lambda r, c, loss=loss: _confidnet(r, c, loss))
      for loss in DEMO["scorer_losses"]),
)
PAPER_SOURCE = ("the paper's small-scale table (MNIST and CIFAR-10; ConfidNet's classifiers and "
                "setup, its ConfidNet-fork code); – = not reported; TCP† = ConfidNet's published "
                "TCP result as the paper quotes it")
# Acc, FPR-95%-TPR, AUPR-Error, AUPR-Success, AUC, TPR, TNR in %, as printed
PAPER = {
    "MNIST": [("MCP", (99.10, 5.56, 35.05, 99.99, 98.63, 99.89, 8.89)),
              ("MC-Dropout", (99.10, 5.26, 38.50, 99.99, 98.65, None, None)),
              ("TrustScore", (99.10, 10.00, 35.88, 99.98, 98.20, None, None)),
              ("TCP", (99.10, 3.33, 45.89, 99.99, 98.82, 99.71, 0.00)),
              ("TCP†", (99.10, 3.33, 45.88, 99.99, 98.82, 99.72, 0.00)),
              ("SS", (99.10, 2.22, 40.86, 99.99, 98.83, 100.00, 0.00))],
    "CIFAR-10": [("MCP", (92.19, 47.50, 45.36, 99.19, 91.53, 99.64, 6.66)),
                 ("MC-Dropout", (92.19, 49.02, 46.40, 99.27, 92.08, None, None)),
                 ("TrustScore", (92.19, 55.70, 38.10, 98.76, 88.47, None, None)),
                 ("TCP", (92.19, 44.94, 49.94, 99.24, 92.12, 99.77, 0.00)),
                 ("TCP†", (92.19, 45.07, 49.89, 99.24, 92.12, 97.88, 0.00)),
                 ("SS", (92.19, 44.69, 50.28, 99.26, 92.22, 98.46, 28.04))],
}
METRICS = tuple(c.metric for c in columns("paper", "main"))    # Table 1's columns, as PAPER's
NOT_REPORTED = "not reported in the paper"


def _baseline(row: dict, classifier: str, key: str) -> bool:
    return row["kind"] == "baseline" and row["classifier"] == classifier and row["loss"] == key


def _confidnet(row: dict, classifier: str, loss: str) -> bool:
    variant = row["variant"].split("+")
    return (row["kind"] == "oracle" and row["oracle"] == row["classifier"] == classifier
            and row["loss"] == loss and "confidnet" in variant and "stacked" not in variant)


def has_rows(split: dict) -> bool:
    """Whether the split has a ConfidNet-head run (without one the table is not the paper's)."""
    return any(_confidnet(r, r["classifier"], r["loss"]) for r in split["rows"])


def small_scale_table(split: dict, definition: str, columns: list[Column], text: str,
                      ci: bool = False) -> dict:
    """The table of one split in one definition: ``columns`` are Table 1's of ``definition``;
    per classifier the rows of ROWS, then the paper's rows."""
    missing = {"mean": None, "std": None, "undefined": "no such row in this report (see the "
               "table's note)", "notes": []}
    rows = []
    for clf in dict.fromkeys(r["classifier"] for r in split["rows"]):
        for label, match in ROWS:
            found = [r for r in split["rows"] if match(r, clf)]
            r = found[0] if found else None
            rows.append({"oc": f"classifier {clf}", "loss": label,
                         "kind": r["kind"] if r else "missing", "n": r["n"] if r else 0,
                         "keys": _keys(r, clf, label),
                         "cells": [r["agg"][definition][c.metric] if r else missing
                                   for c in columns]})
    for dataset, entries in PAPER.items():
        for label, values in entries:
            percent = dict(zip(METRICS, values))
            cells = [{"mean": None if percent.get(c.metric) is None else percent[c.metric] / 100.0,
                      "std": None, "undefined": NOT_REPORTED, "notes": []} for c in columns]
            rows.append({"oc": f"paper, {dataset}", "loss": label, "kind": "paper", "n": "–",
                         "keys": {"oracle": "paper", "classifier": dataset, "loss": label,
                                  "variant": "", "loss_label": label, "group": ""},
                         "cells": cells})
    return {"id": f"small_scale_{definition}", "split": split["split"],
            "title": f"The paper's small-scale table — {definition} definitions",
            "definition": (f"{text} Ours: 'n' seeds (mean ± std); ConfidNet's head on the "
                           f"classifier's own features (O = C). Paper: {PAPER_SOURCE}."),
            "columns": list(columns),
            "rows": rows, "ci": ci}


def _keys(row: dict | None, classifier: str, label: str) -> dict:
    if row is None:
        return {"oracle": "", "classifier": classifier, "loss": label, "variant": "",
                "loss_label": label, "group": ""}
    return {k: row[k] for k in ("oracle", "classifier", "loss", "variant", "loss_label", "group")}
