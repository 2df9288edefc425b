"""Which trust metrics a report shows, each declared once: the definitions it belongs to, its
table column (header per definition, unit, table), what computes it, and which rows its bootstrap
interval needs.  Pure Python; ``pipeline.core.metrics`` (``evaluate``), ``pipeline.core.selective``,
the report's bootstrap and tables derive their name lists from here.

    CATALOG["aurc"]              # Metric(paper=None, standard="AURC ↓ ×10³", unit="e3", ...)
    names("standard", "scalar")  # what core.metrics.evaluate computes for the standard set

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
    a bootstrap interval needs at least two rows of (pos, neg, both; None: no such check)."""
    paper: str | None
    standard: str | None
    unit: str = "%"
    table: str = "main"
    source: str = "scalar"
    needs: str | None = "both"


CATALOG = {
    "acc": Metric("Acc ↑", "Acc ↑", source="accuracy", needs=None),
    "fpr95": Metric("FPR-95%-TPR ↓", "FPR-95%-TPR ↓"),
    "aupr_err": Metric("AUPR-Error ↓ (p)", "AUPR-Error ↑ (−p)"),
    "aupr_succ": Metric("AUPR-Success ↑", "AUPR-Success ↑"),
    "auc": Metric("AUC ↑", "AUC ↑"),
    "tpr": Metric("TPR", "TPR", needs="pos"),
    "tnr": Metric("TNR ↑", "TNR ↑", needs="neg"),
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
