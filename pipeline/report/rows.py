"""A table row of the report, typed: one <kind, oracle, classifier, loss label, group, evaluated
cache> on one split, with each metric aggregated over its seeds.

``aggregate.aggregate`` builds the rows; ``compare`` (intervals, paired differences) and
``figplan`` (the figures) read them; ``to_json`` is the row as report.json holds it, which the
tables (``tables.build_tables``) and every reader of report.json take.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.report.scoring import ScoreSummary

_NOT_SET = object()      # a cell without intervals (--no-ci): report.json has no "ci" key


@dataclass
class Cell:
    """One metric of one row: mean ± sample std over the seeds; undefined (with the reasons)
    where any run's value is.  ``ci``: the interval of the seed mean (``compare.row_intervals``),
    left unset without bootstrap values."""
    mean: float | None
    std: float | None
    n: int
    values: list
    undefined: str | None
    notes: list[str]
    ci: Any = _NOT_SET

    def to_json(self) -> dict:
        out = {"mean": self.mean, "std": self.std, "n": self.n, "values": self.values,
               "undefined": self.undefined, "notes": self.notes}
        if self.ci is not _NOT_SET:
            out["ci"] = self.ci
        return out


@dataclass
class Row:
    """One table row.  ``agg``: {definition: {metric: Cell}} (accuracy as "acc");
    ``members``: the evaluations it counts (one per seed, the workers' results, each with its
    per-resample values beside it); ``display_loss``: the label shown, set once every row of the
    split is known (``aggregate``: what tells look-alike rows apart)."""
    kind: str                      # "oracle" or "baseline"
    split: str
    oc: str                        # ⟨oracle, classifier⟩ as the tables print it
    eval: dict                     # the evaluated cache's identity (inputs.eval_identity)
    oracle: str
    classifier: str
    loss: str
    variant: str
    loss_label: str
    group: str
    num_classes: int
    n: int
    seeds: list
    sources: list[str]
    excluded_rows: list[int]
    agg: dict[str, dict[str, Cell]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    members: list[ScoreSummary] = field(default_factory=list, repr=False)
    fit: dict | None = None        # a fitted baseline's parameters (T, p)
    display_loss: str = ""

    def to_json(self) -> dict:
        out = {"kind": self.kind, "split": self.split, "oc": self.oc, "eval": self.eval,
               "oracle": self.oracle, "classifier": self.classifier, "loss": self.loss,
               "variant": self.variant, "loss_label": self.loss_label, "group": self.group,
               "num_classes": self.num_classes, "n": self.n, "seeds": self.seeds,
               "sources": self.sources, "excluded_rows": self.excluded_rows,
               "agg": {d: {name: c.to_json() for name, c in cells.items()}
                       for d, cells in self.agg.items()},
               "warnings": self.warnings}
        if self.fit:
            out["fit"] = self.fit
        out["display_loss"] = self.display_loss
        return out

    def key(self) -> dict:
        """What names the row's scorer (report.json's comparisons name it so)."""
        return {"oracle": self.oracle, "classifier": self.classifier, "loss": self.loss,
                "variant": self.variant, "group": self.group}
