"""The results page's names, lookups and formatting: what bench/results_extract.py,
bench/results_claims.py, bench/results_blocks.py, bench/results_page.py and
bench/results_pretrained.py share (one definition each of the page's constants, of a row's
lookup in the extract, and of how a cell, a paired difference or a tally is written)."""
from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

from pipeline.core.catalog import CATALOG
from pipeline.report import tables as T

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "RESULTS.md"
SUMMARY = ROOT / "docs" / "results" / "summary.json"
FIGURES = ROOT / "docs" / "figures"
SCHEMA = "results-page/1"
COMMAND = "python bench/results_page.py --report artifacts/fashion-mnist/report"
BEGIN, END = "<!-- generated: {} -->", "<!-- end generated: {} -->"
CI_METRICS = ("acc", "auc", "aurc", "augrc")     # shown with their interval (standard defs.)
CLASSIFIERS = ("vit", "resnet")
PER_SAMPLE = ("CE", "Focal", "TCP")             # the fine-tuned losses SS is compared with
BROADCAST = ("CE (broadcast)", "Focal (broadcast)")
POSTHOC = (("mcp", "MCP"), ("ts", "TS"), ("pnorm", "pNorm"), ("relu", "REL-U"),
           ("trustscore", "TrustScore"), ("mcd_msp", "MC-Dropout"))
FAMILIES = ("fine-tuned oracle", "linear head (head-only)", "ConfidNet head",
            "stacked ConfidNet head")
# the figures the page shows: (split role, kind, <O-C>); those the report lacks are left out
SHOWN = (("test", "histograms", "vit-vit"), ("test", "histograms", "resnet-resnet"),
         ("test", "risk_coverage", "vit-vit"), ("test", "risk_coverage", "resnet-resnet"),
         ("shifted", "histograms", "vit-vit"), ("shifted", "risk_coverage", "vit-vit"),
         ("shifted", "risk_coverage", "resnet-resnet"),
         ("adversarial", "risk_coverage", "vit-vit"),
         ("adversarial", "risk_coverage", "resnet-resnet"))


class Refused(Exception):
    """An input the page cannot be made from, or a page without a block's markers: exit 1."""



def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def unit(metric: str) -> str:
    """The metric's display unit in the report's tables: '%', 'e3' (x1000) or '' (4 digits)."""
    return CATALOG[metric].unit


def shown(value, metric: str):
    """A fraction in the page's display unit and precision (x100 or x1000, rounded as the
    report's tables round it): the extract holds the numbers the page prints, rounded once."""
    if value is None:
        return None
    scale, digits = T.UNITS[unit(metric)]
    return round(value * scale, digits)



# ------------------------------------------------------------------------------ lookups --
def _split(summary: dict, role: str) -> dict | None:
    return next((s for s in summary["splits"] if s["role"] == role), None)


def _rows(split: dict | None, **match) -> list[dict]:
    if split is None:
        return []
    return [r for r in split["rows"] if all(r.get(k) == v for k, v in match.items())]


def _one(split: dict | None, **match) -> dict | None:
    found = _rows(split, **match)
    return found[0] if found else None


def _cmp(split: dict, oc: str, ss: str, other: str) -> dict | None:
    return next((c for c in split["comparisons"] if c["oc"] == oc and c["ss"] == ss
                 and c["other"] == other), None)


def _order(name: str) -> int:
    return CLASSIFIERS.index(name) if name in CLASSIFIERS else len(CLASSIFIERS)


def _pairs(split: dict | None, variant: str = "", loss: str = "ss") -> list[tuple[str, str]]:
    """The <O, C> pairs with a ``loss`` oracle of ``variant``: per classifier, O = C first."""
    seen = {(r["oracle"], r["classifier"]) for r in _rows(split, kind="oracle", loss=loss,
                                                           variant=variant)}
    return sorted(seen, key=lambda p: (_order(p[1]), p[0] != p[1], _order(p[0])))


def _oc(o: str, c: str) -> str:
    return f"⟨{o}, {c}⟩"


def _family(variant: str) -> str:
    parts = set((variant or "").split("+"))
    if "stacked" in parts:
        return FAMILIES[3]
    if "confidnet" in parts:
        return FAMILIES[2]
    if "head-only" in parts:
        return FAMILIES[1]
    return FAMILIES[0]


def _classifiers(split: dict) -> list[str]:
    present = {r["classifier"] for r in split["rows"]}
    return sorted(present, key=lambda c: (_order(c), c))


def _c(row: dict | None, metric: str, d: str = "standard") -> dict | None:
    """One cell of a row, in display units: mean, std, ci (standard definitions), why
    undefined, notes."""
    if row is None or metric not in row["_columns"][d]:
        return None
    value = row[d][row["_columns"][d].index(metric)]
    mean, std = value if isinstance(value, list) else (value, None)
    ci = row.get("ci", {}).get(metric) if d == "standard" else None
    key = f"{d}.{metric}"
    return {"mean": mean, "std": std,
            "ci": {"low": ci[0], "high": ci[1], "undefined": None} if ci else None,
            "undefined": row.get("undefined", {}).get(key),
            "notes": row.get("notes", {}).get(key, [])}


def _mean(row: dict | None, metric: str, d: str = "standard") -> float | None:
    cell = _c(row, metric, d)
    return None if cell is None else cell["mean"]


# --------------------------------------------------------------------------- formatting --
def _fraction(v, metric: str):
    return None if v is None else v / T.UNITS[unit(metric)][0]


def _report_cell(cell: dict | None, metric: str) -> dict:
    """A display-unit cell as the report's renderers take it (fractions)."""
    cell = cell or {"mean": None, "std": None, "undefined": "not in this report"}
    ci = cell.get("ci")
    return {"mean": _fraction(cell.get("mean"), metric), "std": _fraction(cell.get("std"), metric),
            "ci": None if not ci else {"low": _fraction(ci["low"], metric),
                                       "high": _fraction(ci["high"], metric),
                                       "undefined": ci.get("undefined")},
            "undefined": cell.get("undefined") or ("undefined" if cell.get("mean") is None
                                                   else None),
            "notes": cell.get("notes") or []}


def fmt(cell: dict | None, metric: str, ci: bool = False) -> str:
    """A row's value as the report prints it (tables.cell_text): mean ± std (no ± for one
    run), `` [low, high]`` with ``ci``."""
    if cell is None:
        return "not run"
    return T.cell_text(_report_cell(cell, metric), unit(metric), metric=metric, ci=ci)


def _report_delta(e: list, metric: str, subject: str = "SS") -> dict:
    delta, low, high, side = e[:4]
    verdict = None if side is None else {"better": f"{subject} better",
                                         "worse": f"{subject} worse",
                                         "none": "no clear difference"}[side]
    return {"delta": _fraction(delta, metric), "verdict": verdict,
            "ci": {"low": _fraction(low, metric), "high": _fraction(high, metric),
                   "undefined": e[4] if len(e) > 4 else None}}


def fmt_delta(entry: dict | None, metric: str) -> str:
    """A paired difference: +d [low, high] and its verdict (better / worse / no clear
    difference: whether the interval excludes 0)."""
    if entry is None or metric not in entry:
        return "not run"
    e = _report_delta(entry[metric], metric)
    cell = {"mean": e["delta"], "std": None, "ci": e["ci"], "verdict": None,
            "undefined": e["ci"]["undefined"] or "undefined"}
    text = T.cell_text(cell, unit(metric), ci=True)
    side = _side(entry, metric)
    return text + (f" {_WORDS[side]}" if side else "")


_WORDS = {"better": "better", "worse": "worse", "none": "no clear difference"}


def _side(entry: dict | None, metric: str) -> str | None:
    """'better', 'worse', 'none' (interval holds 0), None (no comparison / no interval)."""
    if entry is None or metric not in entry:
        return None
    return entry[metric][3]


def _tally(sides: list[str | None]) -> Counter:
    return Counter(s for s in sides if s is not None)


def _count_text(t: Counter) -> str:
    return (f"better in {t['better']}, no clear difference in {t['none']}, worse in "
            f"{t['worse']} of {sum(t.values())}")


def _range(values: list[float | None], digits: int = 2) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    lo, hi = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return lo if lo == hi else f"{lo}–{hi}"


def _split_name(split: dict) -> str:
    if split["role"] == "shifted" and split.get("shift"):
        name, severity = split["shift"]
        return f"shifted (`{split['split']}`: {name.replace('_', ' ')}, severity {severity})"
    if split["role"] == "adversarial":
        return f"adversarial (`{split['split']}`: PGD L∞ against the classifier)"
    return f"`{split['split']}`"


def _short_split(split: dict) -> str:
    return split["role"] if split["role"] != "other" else split["split"]


def _on(split: dict) -> str:
    return {"test": "on `test`", "shifted": "under the shift",
            "adversarial": "on the adversarial split"}.get(split["role"], f"on `{split['split']}`")


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + \
        ["| " + " | ".join(r) + " |" for r in rows]


def _list(values: list) -> str:
    return ", ".join(str(v) for v in values)


def _machine_text(m: dict, recorded: dict | None) -> str:
    """demo.json's record of the machine where there is one, else what the caches' manifests and
    the runs' run.json record (each item only where recorded)."""
    if recorded:
        gpu = (f"{recorded['gpus']}x {recorded['gpu']}" if recorded.get("gpu")
               else "no GPU (every step on the CPU)")
        return (f"{gpu}; CPU {recorded['cpu']}, {recorded['cores']} cores; Python "
                f"{recorded['python']}, torch {recorded['torch']}, timm {recorded['timm']} "
                "(demo.json)")
    items = [f"{what} {_list(m[key])}" for what, key in (
        ("host", "host"), ("device", "device"), ("torch", "torch"), ("timm", "timm"),
        ("Python", "python")) if m.get(key)]
    if m.get("threads"):
        items.append(f"{_list(m['threads'])} CPU thread(s) per training run")
    return (", ".join(items) or "not recorded") + " (the caches' manifests and the runs' run.json)"


def _best_learned(split: dict, classifier: str, family: str | None = None):
    """The learned scorer of ``classifier`` (of one family) with the lowest AURC, and its
    comparison with MCP."""
    learned = [r for r in _rows(split, kind="oracle", classifier=classifier)
               if (family is None or _family(r["variant"]) == family)
               and _mean(r, "aurc") is not None]
    if not learned:
        return None, None
    best = min(learned, key=lambda r: _mean(r, "aurc"))
    return best, _versus_of(split, best, mcp=True)


def _versus_of(split: dict, row: dict, mcp: bool) -> dict | None:
    return next((v for v in split["versus"] if (v["other_key"] == "mcp" if mcp else v["strongest"])
                 and v["learned"]["group"] == row["group"]
                 and v["learned"]["oracle"] == row["oracle"]
                 and v["learned"]["classifier"] == row["classifier"]), None)


