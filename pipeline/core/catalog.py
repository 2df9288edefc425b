"""Which trust metrics a report shows, each declared once: the definitions it belongs to, its
table column (header and direction per definition, unit, table), what computes it, and which rows
its bootstrap interval needs.  Pure Python; ``pipeline.core.metrics`` (``evaluate``),
``pipeline.core.selective``, the report's bootstrap and tables derive their name lists from here,
its comparisons and verdicts which side of a difference is better.

    CATALOG["aurc"]              # Metric(paper=None, standard=Header("AURC", False, "×10³"), ...)
    column("aurc", "standard")   # Column("standard", "aurc", "AURC ↓ ×10³", "e3"): a table's
                                 # column, the header's arrow from the metric's direction
    higher_is_better("aurc", "standard")   # False: what comparisons and verdicts decide by
    names("standard", "scalar")  # what core.metrics.evaluate computes for the standard set
    log_name("aupr_err")         # "aupr_error": its key in training's validation records

The names here are the report's (report.json's tables and metrics).  Training's held-out
validation (log.jsonl, run.json, the sweep's files) has always written a few under other keys
(``aupr_error``, ``aupr_success``, ``accuracy``); those files keep them, and ``log_name`` is the
one mapping between the two.

Adding a metric: its formula (``pipeline/core/counts.py`` for a rank metric computed from counts
per threshold, or a function in ``pipeline/core/metrics.py``) and its entry here (docs/ARCHITECTURE.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from pipeline.core.counts import COVERAGES, RISKS

DEFINITIONS = ("paper", "standard")


@dataclass(frozen=True)
class Header:
    """A metric's column header in one definition's tables: ``label``, the arrow of its
    direction, ``note`` ("AURC ↓ ×10³").  ``higher_is_better``: the direction, which the
    comparisons and verdicts decide by; None: none (TPR, the share of correct rows accepted at a
    fixed threshold, is no quality on its own).  The arrow is only its display."""
    label: str
    higher_is_better: bool | None = None
    note: str = ""

    @property
    def text(self) -> str:
        arrow = {True: " ↑", False: " ↓", None: ""}[self.higher_is_better]
        return self.label + arrow + (f" {self.note}" if self.note else "")


def _up(label: str, note: str = "") -> Header:
    return Header(label, True, note)


def _down(label: str, note: str = "") -> Header:
    return Header(label, False, note)


@dataclass(frozen=True)
class Metric:
    """``paper`` / ``standard``: its header in that definition's tables, with its direction
    there (None: not in that set; AUPR-Error's direction differs between the two).  ``unit``:
    "%" x100 as the paper, "e3" x1000 (fd-shifts' AURC scale), "" as is.  ``table``:
    main (paper Table 1 layout), working_points, separability.  ``source``: scalar
    (``core.metrics.evaluate``), counts (``core.counts`` through ``core.selective``), ece
    (``core.selective``), separability (``report.separability``), accuracy.  ``needs``: the class
    a bootstrap interval needs at least two rows of (pos, neg, both; None: no such check).
    ``log_name``: its key in the per-run records (held-out validation in log.jsonl and run.json,
    the sweep's files, report.json's per-score summaries); None: not recorded there."""
    paper: Header | None
    standard: Header | None
    unit: str = "%"
    table: str = "main"
    source: str = "scalar"
    needs: str | None = "both"
    log_name: str | None = None


CATALOG = {
    "acc": Metric(_up("Acc"), _up("Acc"), source="accuracy", needs=None, log_name="accuracy"),
    "fpr95": Metric(_down("FPR-95%-TPR"), _down("FPR-95%-TPR")),
    # the paper scores the errors by p itself, not -p: there a lower AUPR-Error is better
    "aupr_err": Metric(_down("AUPR-Error", "(p)"), _up("AUPR-Error", "(−p)"),
                       log_name="aupr_error"),
    "aupr_succ": Metric(_up("AUPR-Success"), _up("AUPR-Success"), log_name="aupr_success"),
    "auc": Metric(_up("AUC"), _up("AUC"), log_name="auc"),
    "tpr": Metric(Header("TPR"), Header("TPR"), needs="pos", log_name="tpr"),
    "tnr": Metric(_up("TNR"), _up("TNR"), needs="neg", log_name="tnr"),
    "aurc": Metric(None, _down("AURC", "×10³"), "e3", needs=None),
    "eaurc": Metric(None, _down("E-AURC", "×10³"), "e3", needs=None),
    "augrc": Metric(None, _down("AUGRC", "×10³"), "e3", needs=None),
    "eaugrc": Metric(None, _down("e-AUGRC", "×10³"), "e3", source="counts", needs=None),
    **{f"risk@cov{c}": Metric(None, _down(f"Risk @{c}% cov"), table="working_points",
                              source="counts", needs=None) for c in COVERAGES},
    **{f"cov@risk{r}": Metric(None, _up(f"Cov @{r}% risk"), table="working_points",
                              source="counts", needs=None) for r in RISKS},
    "ece": Metric(None, _down("ECE"), table="working_points", source="ece", needs=None),
    "kl": Metric(_up("KL̄ (paper formula)"), _up("KL̄ (correct)"), "", "separability",
                 "separability"),
    "bhattacharyya": Metric(_up("d_B"), _up("d_B"), "", "separability", "separability"),
}


def names(definition: str, *sources: str) -> tuple[str, ...]:
    """The metrics of ``definition`` computed by ``sources`` (all when none), in table order."""
    return tuple(n for n, m in CATALOG.items() if getattr(m, definition) is not None
                 and (not sources or m.source in sources))


class Column(NamedTuple):
    """One column of a report table: ``metric`` as ``definition`` computes it, under ``header``,
    shown in ``unit`` (the report's tables scale by it)."""
    definition: str
    metric: str
    header: str
    unit: str


def columns(definition: str, table: str) -> list[Column]:
    """The columns of one table of one definition, in order."""
    return [column(n, definition) for n, m in CATALOG.items()
            if m.table == table and getattr(m, definition) is not None]


def _header(metric: str, definition: str) -> Header:
    head = getattr(CATALOG[metric], definition)
    if head is None:
        raise KeyError(f"metric {metric!r} is not in the {definition} definition; its metrics: "
                       f"{list(names(definition))}")
    return head


def column(metric: str, definition: str) -> Column:
    """The column of ``metric`` in ``definition``'s tables (header "AURC ↓ ×10³")."""
    return Column(definition, metric, _header(metric, definition).text, CATALOG[metric].unit)


def higher_is_better(metric: str, definition: str) -> bool | None:
    """Whether a higher value of ``metric`` is better in ``definition`` (None: no direction)."""
    return _header(metric, definition).higher_is_better


# The metric the checkpoint choice ranks held-out validation by (its standard definition), and
# the key run.json's "best" records its value under ("val_aupr_error").
CHECKPOINT_METRIC = "aupr_err"


def log_name(metric: str) -> str:
    """The key the per-run records hold ``metric`` under (``Metric.log_name``)."""
    name = CATALOG[metric].log_name
    if name is None:
        raise KeyError(f"metric {metric!r} is not recorded by validation; those that are: "
                       f"{[n for n, m in CATALOG.items() if m.log_name]}")
    return name


BEST_KEY = f"val_{log_name(CHECKPOINT_METRIC)}"


def delta_header(metric: str, definition: str) -> str:
    """The header of a difference column: the metric's header without its arrow ("ΔAUC",
    "ΔAURC ×10³"); which side is better is the verdict's to say, cell by cell."""
    head = _header(metric, definition)
    return "Δ" + head.label + (f" {head.note}" if head.note else "")
