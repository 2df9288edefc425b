"""Intervals of seed means and paired comparisons (SS against the other losses and the reference
post-hoc baseline; every learned scorer against the post-hoc baselines), from the per-resample
values of the workers.

Every score evaluated on the same rows (one classifier cache and split) saw the same resamples
(pipeline/report/bootstrap.py), so per resample b:

* a row's seed mean is mean_s value[s, b]: its interval is that of the test rows for the average
  of the seeds (the ± std beside it is the spread between seeds);
* a difference between two rows is mean_s SS[s, b] - mean_s X[s, b]: paired, so what the rows
  have in common (easy or hard images) cancels.
"""
from __future__ import annotations

import numpy as np

from pipeline.core.catalog import higher_is_better
from pipeline.core.presets import PAPER_LOSS
from pipeline.report.baselines import REFERENCE, VERSUS
from pipeline.report.bootstrap import CI_LEVEL, interval
from pipeline.report.rows import Row
from pipeline.report.scoring import ScoreSummary

# (metric, definition); which side is better, from the catalog
COMPARED = (("auc", "standard"), ("aurc", "standard"))
SS = PAPER_LOSS
# "Does anything learned beat the softmax?": every oracle row against the post-hoc baselines
# baselines.VERSUS of its classifier (those the report has), on AUC, AURC and AUGRC
VERSUS_METRICS = COMPARED + (("augrc", "standard"),)


def _same_rows(members: list[ScoreSummary]) -> str | None:
    caches = {(m["cache"], m["valid_rows"]) for m in members}
    return None if len(caches) == 1 else "the runs were evaluated on different rows"


def _samples(members: list[ScoreSummary], d: str, name: str) -> np.ndarray | None:
    boots = [m.resampled(d, name) for m in members]
    if any(b is None for b in boots):
        return None
    return np.mean(boots, axis=0)


def row_intervals(row: Row, members: list[ScoreSummary]) -> None:
    """Add "ci" to every aggregated cell of ``row`` (in place): the member's own interval for one
    run, the interval of the seed mean for several."""
    if not all("ci" in m for m in members):
        return
    counts = members[0]["class_counts"]
    why = _same_rows(members)
    for d, cells in row.agg.items():
        for name, cell in cells.items():
            if len(members) == 1:
                cell.ci = members[0]["ci"][d].get(name)
                continue
            reasons = [m["ci"][d].get(name, {}).get("undefined") for m in members]
            reason = why or next((r for r in reasons if r), None)
            cell.ci = interval(_samples(members, d, name), cell.mean, name, counts, reason=reason)


def comparisons(rows: list[Row]) -> list[dict]:
    """SS rows against every other oracle row of their <O,C> and against the classifier's
    reference baseline (``baselines.REFERENCE``, MCP), for each metric of ``COMPARED``: the
    difference of the seed means, its paired interval and which side the interval favours."""
    out = []
    for ss in (r for r in rows if r.kind == "oracle" and r.loss == SS):
        same = [r for r in rows if r.eval == ss.eval]     # rows of one evaluated cache
        others = [r for r in same if r.kind == "oracle" and r.oc == ss.oc and r is not ss]
        others += [r for r in same if r.kind == "baseline" and r.loss == REFERENCE
                   and r.classifier == ss.classifier]
        for other in others:
            out.append(_compare(ss, other))
    return out


def versus_baselines(rows: list[Row]) -> list[dict]:
    """Every oracle row (a learned scorer) against each post-hoc baseline of ``VERSUS`` of its
    classifier on the same evaluated cache: the difference learned - baseline of each metric of
    ``VERSUS_METRICS``, its paired interval and verdict; plus, per learned row, which of those
    baselines has the best AURC here (``strongest``)."""
    out = []
    for learned in (r for r in rows if r.kind == "oracle"):
        bases = [r for r in rows if r.eval == learned.eval and r.kind == "baseline"
                 and r.loss in VERSUS and r.classifier == learned.classifier]
        aurc = {r.loss: r.agg["standard"]["aurc"].mean for r in bases}
        defined = [(value, loss) for loss, value in aurc.items() if value is not None]
        best = min(defined)[1] if defined else None      # a tie: the first name
        for base in bases:
            entry = _compare(learned, base, VERSUS_METRICS, "learned")
            entry.update(learned=entry.pop("ss"), n_learned=entry.pop("n_ss"),
                         learned_key=learned.key(), other_key=base.loss,
                         strongest=base.loss == best)
            out.append(entry)
    return out


def _compare(a: Row, b: Row, metrics: tuple = COMPARED, subject: str = "SS") -> dict:
    members = a.members + b.members
    why = _same_rows(members)
    entry = {"oc": a.oc, "ss": a.display_loss, "other": b.display_loss, "other_kind": b.kind,
             "other_oc": b.oc, "n_ss": a.n, "n_other": b.n, "metrics": {}}
    for name, d in metrics:
        higher = higher_is_better(name, d)
        ma, mb = a.agg[d][name].mean, b.agg[d][name].mean
        delta = None if ma is None or mb is None else ma - mb
        sa, sb = _samples(a.members, d, name), _samples(b.members, d, name)
        counts = members[0].get("class_counts", (0, 0))
        ci, side = paired_interval(delta, sa, sb, name, counts, higher, reason=why)
        verdict = None if side is None else {1: f"{subject} better", -1: f"{subject} worse",
                                             0: "no clear difference"}[side]
        entry["metrics"][name] = {"definition": d, "delta": delta, "ci": ci, "verdict": verdict,
                                  "higher_is_better": higher}
    return entry


def paired_interval(delta: float | None, sa: np.ndarray | None, sb: np.ndarray | None,
                    name: str, counts: tuple[int, int], higher: bool,
                    reason: str | None = None, level: float = CI_LEVEL) -> tuple[dict, int | None]:
    """The paired interval of ``delta`` = a - b of metric ``name`` from the per-resample values
    ``sa``, ``sb`` (R,) of the two scores on the SAME resamples, and which side it favours: 1 (a
    better), -1 (a worse), 0 (the interval holds 0), None (no interval).  ``counts`` = (correct,
    incorrect) rows; ``higher``: higher is better.  Shared with trust_oracles.evaluation."""
    reason = reason or (None if sa is not None and sb is not None else
                        "no bootstrap values (--no-ci, or a metric undefined on these rows)")
    ci = interval(None if reason else sa - sb, delta, name, counts, reason=reason, level=level)
    if ci["undefined"] is not None:
        return ci, None
    better = ci["low"] > 0 if higher else ci["high"] < 0
    worse = ci["high"] < 0 if higher else ci["low"] > 0
    return ci, 1 if better else -1 if worse else 0
