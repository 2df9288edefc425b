"""Seeds into table rows: one row per <kind, oracle, classifier, loss label, group, evaluated
cache> and split, the mean +- std over its seeds (a repeated seed counted once, by ``counted``,
which every table uses), in the report's row and split order."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from pipeline.core.catalog import log_name
from pipeline.core.losses import names
from pipeline.report.baselines import DISPLAY_ORDER
from pipeline.report.compare import row_intervals
from pipeline.report.figures import oc_label
from pipeline.report.rows import Cell, Row

LOSS_ORDER = {name: i for i, name in enumerate(names())}      # CE, focal, TCP, SS


def split_order(tag: str) -> tuple:
    return (0 if tag in ("test", "val") else 1 if "-" not in tag else 2, tag)


def row_order(row: Row) -> tuple:
    baseline = row.kind == "baseline"
    order = (DISPLAY_ORDER if baseline else LOSS_ORDER).get(row.loss, 99)
    return (row.classifier, baseline, row.oracle, order, row.variant or "", row.loss_label,
            row.group)


def row_key(result: dict) -> tuple:
    """What one table row stands for: split, kind, oracle, classifier, loss label, group and the
    identity of the evaluated cache (``inputs.eval_identity``: two evaluation sets, e.g. a split
    listed with and without a class, are two rows, never one row with a "repeated seed")."""
    lab = result["labels"]
    return (result["split"], result["kind"], lab["oracle"], lab["classifier"], lab["loss_label"],
            lab["group"], json.dumps(result.get("eval") or {}, sort_keys=True))


def training_key(result: dict) -> tuple:
    """What one trained oracle stands for, wherever it was evaluated (the appendix's gradient
    magnitudes, a quantity of training)."""
    lab = result["labels"]
    return (result["kind"], lab["oracle"], lab["classifier"], lab["loss_label"], lab["group"])


def grouped(results: list[dict], key=row_key) -> dict[tuple, tuple[list[dict], list[str]]]:
    """{key: (the evaluations counted under it, the notes on its repeats)}: each group's repeated
    seeds collapsed by ``collapse_repeats`` (which marks them ``repeat_of``)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in results:
        groups[key(r)].append(r)
    out = {}
    for key, members in groups.items():
        members, notes = collapse_repeats(members)
        members.sort(key=lambda m: (m["labels"]["seed"] is None, m["labels"]["seed"] or 0))
        out[key] = (members, notes)
    return out


def counted(results: list[dict], key=row_key) -> list[dict]:
    """The evaluations every table counts (a repeated seed once): the one deduplication used by
    the main tables, the figures and the appendix (gradients, inference time)."""
    return [m for members, _ in grouped(results, key).values() for m in members]


def aggregate(results: list[dict]) -> dict[str, list[Row]]:
    """{split: rows}; a row = one ``row_key`` with its seeds."""
    splits: dict[str, list[Row]] = defaultdict(list)
    for key, (members, notes) in grouped(results).items():
        row = _row(members)
        row.warnings += notes
        splits[key[0]].append(row)
    out = {}
    for tag in sorted(splits, key=split_order):
        out[tag] = sorted(splits[tag], key=row_order)
        _display_labels(out[tag])
    return out


def _display_labels(rows: list[Row]) -> None:
    """``display_loss``: the loss label, plus what tells rows apart where several rows of one
    <O,C> would read the same (their group, and what differs in their evaluated caches)."""
    clash = defaultdict(list)
    for row in rows:
        clash[(row.oc, row.loss_label)].append(row)
    for same in clash.values():
        differ = [k for k in ("group", *same[0].eval) if len(same) > 1
                  and len({json.dumps((r.eval | {"group": r.group}).get(k), sort_keys=True)
                           for r in same}) > 1]
        for row in same:
            parts = [_short(row.group) if k == "group" else f"{k} {_short(row.eval.get(k))}"
                     for k in differ]
            row.display_loss = row.loss_label + (f" [{', '.join(parts)}]" if parts else "")


def _short(value) -> str:
    """A hash as its first 8 hex digits, anything else as text."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text[:8] if len(text) >= 32 and all(c in "0123456789abcdef" for c in text) else text


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


def _row(members: list[dict]) -> Row:
    lab = members[0]["labels"]
    row = Row(kind=members[0]["kind"], split=members[0]["split"], oc=oc_label(lab),
              eval=members[0].get("eval") or {},
              **{k: lab[k] for k in ("oracle", "classifier", "loss", "variant", "loss_label",
                                     "group", "num_classes")},
              n=len(members), seeds=[m["labels"]["seed"] for m in members],
              sources=[m["source"] for m in members],
              excluded_rows=[m["excluded_rows"] for m in members], members=members,
              fit=members[0].get("fit") or None)
    for d in ("paper", "standard"):
        row.agg[d] = {"acc": _agg([(m[log_name("acc")], None, None) for m in members], members)}
        for name in members[0]["metrics"][d]["values"]:
            entries = [(m["metrics"][d]["values"][name], m["metrics"][d]["undefined"].get(name),
                        m["metrics"][d]["notes"].get(name)) for m in members]
            row.agg[d][name] = _agg(entries, members)
    row_intervals(row, members)
    return row


def _agg(entries: list[tuple], members: list[dict]) -> Cell:
    """mean ± sample std (ddof=1) over seeds; undefined (with the reasons) if any run is.
    ``entries``: (value, why undefined, note) of each member."""
    values = [value for value, _, _ in entries]
    names = [Path(m["run_dir"]).name if m["run_dir"] else "" for m in members]
    if any(v is None for v in values):
        reasons = sorted({why for _, why, _ in entries if why})
        bad = [n for n, v in zip(names, values) if v is None]
        where = "" if len(bad) == len(values) else f" (in {len(bad)} of {len(values)} runs: {bad})"
        return Cell(None, None, len(values), values, "; ".join(reasons) + where, [])
    arr = np.asarray(values, dtype=np.float64)
    # identical seeds (e.g. every run's accuracy on one cache) give exactly 0, not rounding noise
    std = (0.0 if (arr == arr[0]).all() else float(arr.std(ddof=1))) if len(arr) > 1 else None
    return Cell(float(arr.mean()), std, len(values), [float(v) for v in values], None,
                [f"{n}: {note}" if n else note for n, (_, _, note) in zip(names, entries)
                 if note])
