"""Which trust metrics a report shows, each declared once: the definitions it belongs to, its
table column (header per definition, unit, table), what computes it, and which rows its bootstrap
interval needs.  Pure Python; ``pipeline.core.metrics`` (``evaluate``), ``pipeline.core.selective``,
the report's bootstrap and tables derive their name lists from here.

    CATALOG["aurc"]              # Metric(paper=None, standard="AURC ↓ ×10³", unit="e3", ...)
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

from pipeline.core.counts import COVERAGES, RISKS

DEFINITIONS = ("paper", "standard")


@dataclass(frozen=True)
class Metric:
    """``paper`` / ``standard``: its header in that definition's tables (None: not in that set).
    ``unit``: "%" x100 as the paper, "e3" x1000 (fd-shifts' AURC scale), "" as is.  ``table``:
    main (paper Table 1 layout), working_points, separability.  ``source``: scalar
    (``core.metrics.evaluate``), counts (``core.counts`` through ``core.selective``), ece
    (``core.selective``), separability (``report.separability``), accuracy.  ``needs``: the class
    a bootstrap interval needs at least two rows of (pos, neg, both; None: no such check).
    ``log_name``: its key in the per-run records (held-out validation in log.jsonl and run.json,
    the sweep's files, report.json's per-score summaries); None: not recorded there."""
    paper: str | None
    standard: str | None
    unit: str = "%"
    table: str = "main"
    source: str = "scalar"
    needs: str | None = "both"
    log_name: str | None = None


CATALOG = {
    "acc": Metric("Acc ↑", "Acc ↑", source="accuracy", needs=None, log_name="accuracy"),
    "fpr95": Metric("FPR-95%-TPR ↓", "FPR-95%-TPR ↓"),
    "aupr_err": Metric("AUPR-Error ↓ (p)", "AUPR-Error ↑ (−p)", log_name="aupr_error"),
    "aupr_succ": Metric("AUPR-Success ↑", "AUPR-Success ↑", log_name="aupr_success"),
    "auc": Metric("AUC ↑", "AUC ↑", log_name="auc"),
    "tpr": Metric("TPR", "TPR", needs="pos", log_name="tpr"),
    "tnr": Metric("TNR ↑", "TNR ↑", needs="neg", log_name="tnr"),
    "aurc": Metric(None, "AURC ↓ ×10³", "e3", needs=None),
    "eaurc": Metric(None, "E-AURC ↓ ×10³", "e3", needs=None),
    "augrc": Metric(None, "AUGRC ↓ ×10³", "e3", needs=None),
    "eaugrc": Metric(None, "e-AUGRC ↓ ×10³", "e3", source="counts", needs=None),
    **{f"risk@cov{c}": Metric(None, f"Risk @{c}% cov ↓", table="working_points",
                              source="counts", needs=None) for c in COVERAGES},
    **{f"cov@risk{r}": Metric(None, f"Cov @{r}% risk ↑", table="working_points",
                              source="counts", needs=None) for r in RISKS},
    "ece": Metric(None, "ECE ↓", table="working_points", source="ece", needs=None),
    "kl": Metric("KL̄ (paper formula) ↑", "KL̄ (correct) ↑", "", "separability",
                 "separability"),
    "bhattacharyya": Metric("d_B ↑", "d_B ↑", "", "separability", "separability"),
}


def names(definition: str, *sources: str) -> tuple[str, ...]:
    """The metrics of ``definition`` computed by ``sources`` (all when none), in table order."""
    return tuple(n for n, m in CATALOG.items() if getattr(m, definition) is not None
                 and (not sources or m.source in sources))


def columns(definition: str, table: str) -> list[tuple[str, str, str]]:
    """(metric, header, unit) of one table of one definition, in order."""
    return [(n, getattr(m, definition), m.unit) for n, m in CATALOG.items()
            if m.table == table and getattr(m, definition) is not None]

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
    return "Δ" + getattr(CATALOG[metric], definition).replace(" ↑", "").replace(" ↓", "")
