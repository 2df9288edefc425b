"""Verdicts: "better / no clear difference / worse" for the report's two questions, with
intervals over every source of variance the question is about and corrected for the number of
questions asked.

The questions (each a family, per evaluated split):

* ``losses``: SS against each other loss trained the same way (same oracle model, classifier
  architecture and training kind: fine-tuned, head-only, ConfidNet, stacked);
* ``reference``: every learned scorer against the classifier's own softmax (MCP,
  ``baselines.REFERENCE``).

A *recipe* is what one row of the report stands for with its classifier's fit left out: several
fits of one classifier architecture (caches that differ only in ``weights_sha256``) are the
recipe's *fits*, each with its seeds.  A difference a - b is the mean over fits of (mean over a's
seeds - mean over b's seeds), paired within each fit on the same rows.

Interval: a three-level bootstrap over fits, seeds and rows (``significance.hierarchical``); with
one fit and one seed per side it is the row bootstrap and the verdict says so (``covers``).

Decision: on the ``PRIMARY`` metric, declared here and in docs/METRICS.md (AUGRC, Traub et al.
2024), with AURC and AUC beside it.  Each difference gets a two-sided bootstrap p-value; within a
family the p-values of one metric are adjusted by Holm's step-down method (``significance.holm``),
which controls the family-wise error at ``ALPHA``.  "better" / "worse" when the adjusted p-value
is below ``ALPHA``, by the sign of the difference; "disagree" lists the metrics whose verdict
differs from the primary's.  What is chosen is chosen on held-out rows: the best learned scorer of
the ``reference`` question by its runs' held-out training rows (``select``), then judged on the
split.
Torch-free.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from cache.outputs import read_outputs
from cache.runs import RunDir
from pipeline.core import metrics
from pipeline.core.catalog import higher_is_better
from pipeline.core.presets import PAPER_LOSS
from pipeline.report.baselines import REFERENCE
from pipeline.report.bootstrap import interval
from pipeline.report.rows import Row
from pipeline.report.significance import hierarchical, holm, p_value

PRIMARY = "augrc"
METRICS = ("augrc", "aurc", "auc")     # standard definitions; which side is better: the catalog
ALPHA = 0.05
QUESTIONS = {"losses": "SS against each other loss trained the same way",
             "reference": "each learned scorer against the classifier's softmax (MCP)"}
KINDS = ("head-only", "confidnet", "stacked")      # variant tags that make a training kind
SS = PAPER_LOSS


@dataclass
class Recipe:
    """One scorer across the fits of its classifier: {fit (weights hash): its Row}."""
    kind: str
    oracle: str
    loss: str
    label: str
    training: str
    arch: str                       # the evaluated cache's identity without its weights
    fits: dict[str, Row] = field(default_factory=dict)
    clash: list[str] = field(default_factory=list)   # fits holding several rows (groups)

    @property
    def name(self) -> str:
        return self.label if self.kind == "baseline" else f"{self.label} ⟨{self.oracle}⟩"


def recipes(rows: list[Row]) -> list[Recipe]:
    """The split's rows grouped into recipes (module docstring)."""
    out: dict[tuple, Recipe] = {}
    for row in rows:
        lab = row.members[0]["labels"] if row.members else {}
        tags = set(row.variant.split("+")) if row.variant else set()
        training = "+".join(t for t in KINDS if t in tags) or "fine-tuned"
        same = ", O = C" if row.oracle == row.classifier else ""
        oracle = "post-hoc" if row.kind == "baseline" else \
            f"{lab.get('oracle_model') or row.oracle}{same}"
        arch = json.dumps({k: v for k, v in row.eval.items() if k != "weights_sha256"},
                          sort_keys=True)
        key = (row.kind, oracle, row.loss_label, training, arch)
        rec = out.setdefault(key, Recipe(row.kind, oracle, row.loss, row.loss_label, training,
                                         arch))
        fit = str(row.eval.get("weights_sha256"))
        if fit in rec.fits:
            rec.clash.append(fit)
        rec.fits[fit] = row
    return list(out.values())


def _values(rec: Recipe, metric: str) -> tuple[dict, dict] | None:
    """({fit: per-seed values (S,)}, {fit: per-seed resampled values (S, R)}), or None without
    bootstrap values."""
    point, boot = {}, {}
    for fit, row in rec.fits.items():
        vals = [m["metrics"]["standard"]["values"].get(metric) for m in row.members]
        boots = [m.resampled("standard", metric) for m in row.members]
        if any(b is None for b in boots) or any(v is None for v in vals):
            return None
        point[fit], boot[fit] = np.asarray(vals, float), np.asarray(boots, float)
    return point, boot


def covers(a: Recipe, b: Recipe) -> str:
    """Which sources of variance the interval of a - b covers."""
    levels = (["fits"] if len(a.fits) > 1 else []) + \
        (["seeds"] if any(len(r.members) > 1 for r in [*a.fits.values(), *b.fits.values()])
         else []) + ["rows"]
    return ", ".join(levels)


def difference(a: Recipe, b: Recipe, metric: str, seed: int) -> dict:
    """a - b of ``metric``: the point estimate, the 95% hierarchical interval, the p-value."""
    va, vb = _values(a, metric), _values(b, metric)
    if va is None or vb is None:
        return {"delta": None, "ci": None, "p": None,
                "undefined": "no bootstrap values (--no-ci, or the metric undefined)"}
    delta = float(np.mean([va[0][f].mean() - vb[0][f].mean() for f in sorted(a.fits)]))
    rng = np.random.default_rng([seed, *map(ord, f"{a.name}|{b.name}|{metric}")])
    reps = hierarchical(va[1], vb[1], rng)
    # the report's one interval rule (percentiles; undefined with too few rows of a class or
    # too many replicates left out), with the fewest correct/incorrect rows of any fit
    counts = tuple(min(int(r.members[0].get("class_counts", (0, 0))[k])
                       for r in [*a.fits.values(), *b.fits.values()]) for k in (0, 1))
    ci = interval(reps, delta, metric, counts)
    if ci["undefined"] is not None:
        return {"delta": delta, "ci": None, "p": None, "undefined": ci["undefined"]}
    return {"delta": delta, "ci": [ci["low"], ci["high"]],
            "p": p_value(reps[np.isfinite(reps)]), "undefined": None}


def pairs(recs: list[Recipe]) -> dict[str, list[tuple[Recipe, Recipe]]]:
    """The comparisons of each question on one split."""
    learned = [r for r in recs if r.kind == "oracle"]
    out = {"losses": [], "reference": []}
    for ss in (r for r in learned if r.loss == SS):
        out["losses"] += [(ss, o) for o in learned if o.loss != SS and o.oracle == ss.oracle
                          and o.training == ss.training and o.arch == ss.arch]
    for r in learned:
        out["reference"] += [(r, m) for m in recs if m.kind == "baseline" and m.loss == REFERENCE
                       and m.arch == r.arch]
    return out


def refusal(a: Recipe, b: Recipe) -> str | None:
    """Why a and b cannot be compared fit by fit (the identities named), or None."""
    if a.clash or b.clash:
        return (f"several runs of one classifier fit under one label ({a.name}: "
                f"{sorted(set(a.clash))}, {b.name}: {sorted(set(b.clash))}): give them distinct "
                "labels or report them apart")
    if set(a.fits) != set(b.fits):
        return (f"other classifier fits (weights_sha256): {a.name} has "
                f"{sorted(f[:12] for f in a.fits)}, {b.name} has {sorted(f[:12] for f in b.fits)}")
    return None


def family(tag: str, question: str, compared: list[tuple[Recipe, Recipe]], seed: int) -> dict:
    """One question's comparisons on one split, each metric Holm-adjusted within the family."""
    entries, refused = [], []
    for a, b in compared:
        why = refusal(a, b)
        if why:
            refused.append({"a": a.name, "b": b.name, "why": why})
            continue
        seeds = [sorted(len(r.members) for r in x.fits.values()) for x in (a, b)]
        entries.append({"a": a.name, "b": b.name, "training": a.training,
                        "arch": json.loads(a.arch), "fits": len(a.fits), "seeds": seeds,
                        "covers": covers(a, b),
                        "metrics": {m: difference(a, b, m, seed) for m in METRICS}})
    for metric in METRICS:
        cells = [e["metrics"][metric] for e in entries]
        for cell, adjusted in zip(cells, holm([c["p"] for c in cells])):
            cell["p_holm"] = adjusted
            cell["verdict"] = _verdict(cell["delta"], adjusted,
                                       higher_is_better(metric, "standard"))
    for e in entries:
        primary = e["metrics"][PRIMARY]["verdict"]
        e["verdict"] = primary
        e["disagree"] = [m for m in METRICS if m != PRIMARY
                         and e["metrics"][m]["verdict"] not in (None, primary)]
        if e["covers"] == "rows":
            e["note"] = ("one seed and one classifier fit a side: the interval covers the test "
                         "rows only, not the spread between seeds or fits")
    return {"split": tag, "question": question, "text": QUESTIONS[question],
            "comparisons": entries, "refused": refused,
            "counts": {v: sum(e["verdict"] == v for e in entries)
                       for v in ("better", "no clear difference", "worse")}}


def _verdict(delta: float | None, p: float | None, higher: bool) -> str | None:
    if delta is None or p is None:
        return None
    if p >= ALPHA:
        return "no clear difference"
    return "better" if (delta > 0) == higher else "worse"


def heldout_primary(rec: Recipe) -> float | None:
    """The recipe's ``PRIMARY`` metric on its runs' held-out training rows (heldout/<tag>.h5,
    rows they never trained on), averaged over seeds, then fits; None where a run has none."""
    per_fit = []
    for row in rec.fits.values():
        values = []
        for m in row.members:
            run = RunDir(Path(m["run_dir"])) if m.get("run_dir") else None
            held = run.record_if_any().heldout_output if run else None
            if not held:
                return None
            values.append(_primary_of(str(run.heldout_output(held["split"])),
                                      json.dumps(dict(held), sort_keys=True)))
        per_fit.append(float(np.mean(values)))
    return float(np.mean(per_fit))


@lru_cache(maxsize=4096)
def _primary_of(path: str, digest: str) -> float:
    """``PRIMARY`` of a held-out output file's valid rows (once per file and digest: every split's
    family asks for the same runs)."""
    out = read_outputs(Path(path), digest=json.loads(digest)).columns
    ok = out["valid"] == 1
    return getattr(metrics, PRIMARY)(out["confidence"][ok], out["correct"][ok])


def select(fam: dict, learned: list[Recipe]) -> None:
    """``fam["selected"]``: the learned scorer with the best held-out ``PRIMARY`` -- chosen on
    rows the verdict never sees -- and its verdict against MCP on this split."""
    scored = {r.name: heldout_primary(r) for r in learned}
    eligible = {k: v for k, v in scored.items() if v is not None}
    fam["selected"] = None
    if eligible:
        name = min(eligible, key=eligible.get)
        entry = next((e for e in fam["comparisons"] if e["a"] == name), None)
        fam["selected"] = {"scorer": name, f"heldout_{PRIMARY}": eligible[name],
                           "verdict": entry and entry["verdict"],
                           "without_heldout_rows": sorted(set(scored) - set(eligible))}


def verdicts(splits: dict[str, list[Row]], seed: int = 0) -> dict:
    """report.json's ``verdicts``: every question's family on every split (module docstring);
    the ``reference`` family also names the scorer chosen on held-out rows (``select``)."""
    families = []
    for tag, rows in splits.items():
        recs = recipes(rows)
        for question, compared in pairs(recs).items():
            if compared:
                families.append(family(tag, question, compared, seed))
                if question == "reference":
                    select(families[-1], list({id(a): a for a, _ in compared}.values()))
    return {"primary": PRIMARY, "metrics": list(METRICS), "alpha": ALPHA,
            "method": ("three-level bootstrap (fits, seeds, rows; paired on the rows), two-sided "
                       "p-values, Holm-adjusted within each family (question x split); the "
                       "verdict on the primary metric"),
            "families": families}


def by_split(doc: dict) -> dict[str, list[dict]]:
    """The families of ``verdicts``' document by split, for the tables."""
    out: dict[str, list[dict]] = defaultdict(list)
    for fam in doc.get("families", []):
        out[fam["split"]].append(fam)
    return out
