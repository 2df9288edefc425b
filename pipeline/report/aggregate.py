"""Seeds into table rows: one row per <kind, oracle, classifier, loss label, group> and split, the
mean +- std over its seeds (a repeated seed counted once), in the report's row and split order."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from pipeline.core.losses import LOSSES
from pipeline.report.baselines import DISPLAY_ORDER
from pipeline.report.compare import row_intervals
from pipeline.report.figures import oc_label

LOSS_ORDER = {name: i for i, name in enumerate(LOSSES)}      # CE, focal, TCP, SS


def split_order(tag: str) -> tuple:
    return (0 if tag in ("test", "val") else 1 if "-" not in tag else 2, tag)


def row_order(row: dict) -> tuple:
    baseline = row["kind"] == "baseline"
    order = (DISPLAY_ORDER if baseline else LOSS_ORDER).get(row["loss"], 99)
    return (row["classifier"], baseline, row["oracle"], order, row["variant"] or "",
            row["loss_label"], row["group"])


def aggregate(results: list[dict]) -> dict[str, list[dict]]:
    """{split: rows}; a row = one <kind, oracle, classifier, loss label, group> with its seeds."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in results:
        lab = r["labels"]
        groups[(r["split"], r["kind"], lab["oracle"], lab["classifier"], lab["loss_label"],
                lab["group"])].append(r)
    splits: dict[str, list[dict]] = defaultdict(list)
    for key, members in groups.items():
        members, notes = collapse_repeats(members)
        members.sort(key=lambda m: (m["labels"]["seed"] is None, m["labels"]["seed"] or 0))
        row = _row(members)
        row["warnings"] += notes
        splits[key[0]].append(row)
    out = {}
    for tag in sorted(splits, key=split_order):
        rows = sorted(splits[tag], key=row_order)
        clash = defaultdict(int)
        for row in rows:
            clash[(row["oc"], row["loss_label"])] += 1
        for row in rows:
            ambiguous = clash[(row["oc"], row["loss_label"])] > 1
            row["display_loss"] = row["loss_label"] + (f" [{row['group']}]" if ambiguous else "")
        out[tag] = rows
    return out


def collapse_repeats(members: list[dict]) -> tuple[list[dict], list[str]]:
    """One member per seed of a group: repeated runs of one (group, seed) -- the same command
    with two --out folders, a copied run directory, a cache given twice -- are one sample, not
    independent seeds, so averaging them would shrink the std and inflate n.  The member kept is
    a complete run first, then the first source path; the others are marked ``repeat_of`` (the
    Runs section shows them as not counted) and a note says so."""
    by_seed: dict = defaultdict(list)
    for m in members:
        by_seed[m["labels"]["seed"]].append(m)
    kept, notes = [], []
    for seed, same in by_seed.items():
        same.sort(key=lambda m: (m.get("status") not in (None, "complete"), m["source"]))
        kept.append(same[0])
        if len(same) == 1:
            continue
        for m in same[1:]:
            m["repeat_of"] = same[0]["source"]
        values = [m["metrics"]["standard"]["values"] for m in same]
        alike = "identical numbers" if all(v == values[0] for v in values) else \
            "their numbers differ (a non-deterministic run?)"
        what = f"seed {seed}" if seed is not None else "this classifier cache"
        others = ", ".join(m["source"] for m in same[1:])
        notes.append(f"{len(same)} runs of {what} in this group ({alike}): counted once, from "
                     f"{same[0]['source']}; not counted: {others}")
    return kept, notes


def _row(members: list[dict]) -> dict:
    lab = members[0]["labels"]
    seeds = [m["labels"]["seed"] for m in members]
    row = {"kind": members[0]["kind"], "split": members[0]["split"], "oc": oc_label(lab),
           **{k: lab[k] for k in ("oracle", "classifier", "loss", "variant", "loss_label",
                                  "group", "num_classes")},
           "n": len(members), "seeds": seeds, "sources": [m["source"] for m in members],
           "excluded_rows": [m["excluded_rows"] for m in members], "agg": {}, "warnings": [],
           "_members": members}
    for d in ("paper", "standard"):
        row["agg"][d] = {"acc": _agg([(m["accuracy"], None, None) for m in members], members)}
        for name in members[0]["metrics"][d]["values"]:
            entries = [(m["metrics"][d]["values"][name], m["metrics"][d]["undefined"].get(name),
                        m["metrics"][d]["notes"].get(name)) for m in members]
            row["agg"][d][name] = _agg(entries, members)
    row_intervals(row, members)
    if members[0].get("fit"):
        row["fit"] = members[0]["fit"]
    return row


def _agg(entries: list[tuple], members: list[dict]) -> dict:
    """mean ± sample std (ddof=1) over seeds; undefined (with the reasons) if any run is."""
    values = [e[0] for e in entries]
    names = [Path(m["run_dir"]).name if m["run_dir"] else "" for m in members]
    if any(v is None for v in values):
        reasons = sorted({e[1] for e in entries if e[1]})
        bad = [n for n, v in zip(names, values) if v is None]
        where = "" if len(bad) == len(values) else f" (in {len(bad)} of {len(values)} runs: {bad})"
        return {"mean": None, "std": None, "n": len(values), "values": values,
                "undefined": "; ".join(reasons) + where, "notes": []}
    arr = np.asarray(values, dtype=np.float64)
    # identical seeds (e.g. every run's accuracy on one cache) give exactly 0, not rounding noise
    std = (0.0 if (arr == arr[0]).all() else float(arr.std(ddof=1))) if len(arr) > 1 else None
    return {"mean": float(arr.mean()), "std": std,
            "n": len(values), "values": [float(v) for v in values], "undefined": None,
            "notes": [f"{n}: {e[2]}" if n else e[2] for n, e in zip(names, entries) if e[2]]}
