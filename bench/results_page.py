"""docs/RESULTS.md's numbers, tables and figures, all from ONE run of `cli.py demo --full`:

    python bench/results_page.py --report artifacts/fashion-mnist/report   # extract, figures, page
    python bench/results_page.py              # re-render the page from docs/results/summary.json
    python bench/results_page.py --check      # exit 1 when a generated block of the page is stale

With ``--report`` (the report folder or its report.json) it reads that report.json, the demo's
``demo.json`` and sweeps beside it (``<root>/report/``, ``<root>/demo.json``,
``<root>/sweeps/*/sweep.json``) and the machine the run recorded (the classifier caches'
manifests, the runs' run.json), writes the compact extract docs/results/summary.json (only the
numbers the page shows, with the sha256 of every file they came from), copies the figures the
page shows into docs/figures/, and rewrites every generated block of docs/RESULTS.md from the
extract alone.  A block is the text between ``<!-- generated: NAME -->`` and
``<!-- end generated: NAME -->``; everything outside the blocks is left as it is.  The report's
own table renderers (pipeline/report/tables.py, smallscale.py) draw the tables they have; the
page's summaries, verdicts and the sweep are rendered here, from the extract.

Lives beside bench/runbook_table.py, the other script that writes marked blocks of the docs from
recorded measurements (tests/test_results_page.py checks the page, as tests/test_rehearse.py
checks runbook_table's).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:          # run as a script: the project's packages on the path
    sys.path.insert(0, str(ROOT))

from cache.manifest import load_manifest  # noqa: E402
from cache.runs import RunDir  # noqa: E402
from cache.schema import CacheError  # noqa: E402
from pipeline.core.catalog import CATALOG  # noqa: E402
from pipeline.core.presets import DEMO, DEMO_ATTACK, PRETRAINED  # noqa: E402
from pipeline.report import tables as T  # noqa: E402

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


# ----------------------------------------------------------------------------------- extract --
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


def _value(cell: dict, metric: str):
    """mean, or [mean, std] where several seeds give a std (display units)."""
    mean, std = shown(cell.get("mean"), metric), shown(cell.get("std"), metric)
    return mean if std is None else [mean, std]


def _row(row: dict, columns: dict[str, list[str]]) -> dict:
    out = {k: row[k] for k in ROW_KEYS}
    undefined, notes, ci = {}, {}, {}
    for d, metrics in columns.items():
        cells = row["agg"][d]
        out[d] = [_value(cells[m], m) if m in cells else None for m in metrics]
        for m in metrics:
            c = cells.get(m) or {}
            if c.get("mean") is None and c.get("undefined"):
                undefined[f"{d}.{m}"] = c["undefined"]
            if c.get("notes"):
                notes[f"{d}.{m}"] = list(c["notes"])
    for m in CI_METRICS:
        c = (row["agg"]["standard"].get(m) or {}).get("ci") or {}
        if c.get("low") is not None:
            ci[m] = [shown(c["low"], m), shown(c["high"], m)]
    out["ci"] = ci
    if row["kind"] == "baseline" and row.get("eval"):
        out["identity"] = {k: row["eval"].get(k) for k in IDENTITY}
    if undefined:
        out["undefined"] = undefined
    if notes:
        out["notes"] = notes
    return out


# a baseline row's cache, by what it is: the classifier's weights and the rows it scored
IDENTITY = ("model", "weights_sha256", "dataset_fingerprint", "corruption")
ROW_KEYS = ("kind", "oc", "oracle", "classifier", "loss", "variant", "loss_label",
            "display_loss", "group", "n", "seeds")


SIDES = {"SS better": "better", "learned better": "better", "SS worse": "worse",
         "learned worse": "worse", "no clear difference": "none"}


def _deltas(metrics: dict) -> dict:
    """{metric: [difference, low, high, side]} in display units; side = better / worse / none
    (the interval holds 0) / null (no interval), then why, where the interval is undefined."""
    out = {}
    for m, e in metrics.items():
        ci = e.get("ci") or {}
        out[m] = [shown(e.get("delta"), m), shown(ci.get("low"), m), shown(ci.get("high"), m),
                  SIDES.get(e.get("verdict"))] + ([ci["undefined"]] if ci.get("undefined") else [])
    return out


# the paired comparisons the page shows: SS fine-tuned against the other losses of its pair, its
# head-only twin and MCP; SS on ConfidNet's head against TCP on it and MCP
PAGE_SS = ("SS", "SS (head-only, ConfidNet)")
PAGE_OTHER = PER_SAMPLE + BROADCAST + ("MCP", "SS (head-only)", "TCP (head-only, ConfidNet)")


def _comparisons(split: dict) -> list[dict]:
    return [{"oc": c["oc"], "ss": c["ss"], "other": c["other"], "other_kind": c["other_kind"],
             "n_ss": c["n_ss"], "n_other": c["n_other"], **_deltas(c["metrics"])}
            for c in split.get("comparisons", []) if c["ss"] in PAGE_SS
            and c["other"] in PAGE_OTHER]


def _versus(split: dict) -> list[dict]:
    """Every learned scorer against MCP, and against the strongest post-hoc score of its split."""
    return [{"learned": {k: c["learned_key"][k] for k in ("oracle", "classifier", "variant",
                                                          "group")},
             "other": c["other"], "other_key": c["other_key"], "strongest": c["strongest"],
             **_deltas(c["metrics"])}
            for c in split.get("versus_baselines", []) if c["other_key"] == "mcp"
            or c["strongest"]]


def _role(tag: str, shifts: dict) -> str:
    if tag == "test":
        return "test"
    if tag in shifts:
        return "shifted"
    return "adversarial" if tag == DEMO_ATTACK["tag"] else "other"


def _figures(split: dict, role: str, report_dir: Path) -> list[dict]:
    listed = {Path(f["path"]).name: f for f in split["figures"].get("list", [])}
    out = []
    for want_role, kind, oc in SHOWN:
        name = f"{kind}_{oc}_{split['split']}.png"
        if want_role != role or name not in listed:
            continue
        path = report_dir / listed[name]["path"]
        if not path.exists():
            raise Refused(f"{path}: listed in report.json but not on disk; re-run the report")
        out.append({"split": split["split"], "kind": kind, "oc": oc, "name": name,
                    "shows": listed[name]["shows"], "sha256": sha256(path), "from": str(path)})
    return out


def _machine(doc: dict) -> dict:
    """What the run recorded about where it ran: the classifier caches' manifests (host, Python,
    torch, timm; the device of their inference timing) and the runs' run.json (CPU threads).
    CPU model, core count and GPU model are recorded nowhere."""
    info, devices, threads = {}, set(), set()
    for cache in sorted({e["cache"] for e in doc["evaluations"]}):
        try:
            manifest = load_manifest(Path(cache))
        except (CacheError, OSError):
            continue
        for k in ("host", "python", "torch", "timm"):
            v = (manifest.get("info") or {}).get(k)
            if v is not None:
                info.setdefault(k, set()).add(str(v))
        device = ((manifest.get("summary") or {}).get("inference") or {}).get("device")
        if device:
            devices.add(device)
    for run_dir in sorted({e["run_dir"] for e in doc["evaluations"] if e.get("run_dir")}):
        try:
            versions = RunDir(Path(run_dir)).read().get("versions") or {}
        except (CacheError, OSError, ValueError):
            continue
        if versions.get("threads") is not None:
            threads.add(int(versions["threads"]))
    if not devices:   # the caches are not at hand: the device the report's timings name
        devices = {t["device"] for i in (doc.get("appendix") or {}).get("inference", [])
                   for t in i.get("oracle_timing") or [] if t.get("device")}
    out = {k: sorted(info.get(k, ())) for k in ("host", "python", "torch", "timm")}
    out["device"] = sorted(devices)
    out["threads"] = sorted(threads)
    return out


def _command(cfg: dict) -> tuple[str, bool]:
    """The `cli.py demo` command that demo.json's config stands for, and whether it is --full."""
    full = cfg.get("seeds") == DEMO["full_seeds"] and cfg.get("pairs") == DEMO["full_pairs"]
    parts = ["python cli.py demo"] + (["--full"] if full else [])
    if not full:
        if cfg.get("seeds") not in (None, DEMO["seeds"]):
            parts.append(f"--seeds {cfg['seeds']}")
        if cfg.get("pairs") not in (None, DEMO["pairs"]):
            parts.append(f"--pairs {cfg['pairs']}")
    for key in ("corruption", "severity"):
        if cfg.get(key) not in (None, DEMO[key]):
            parts.append(f"--{key} {cfg[key]}")
    if cfg.get("pretrained"):
        parts.append("--pretrained-oracle" if cfg.get("base_oracles", True)
                     else "--pretrained-only")
    return " ".join(parts), full


def _where(path: Path, root: Path) -> str:
    """``path`` as the run names it: under ``artifacts/<dataset>/`` (the artifacts root the demo
    wrote), never a path of the machine the page was generated on.  The pretrained grid's
    ``root`` is ``<artifacts>/pretrained``: named under its artifacts root too."""
    base = root.parent if root.name == PRETRAINED["root"] else root
    return str(Path("artifacts") / base.name / path.resolve().relative_to(base.resolve()))


def _demo(root: Path) -> dict | None:
    path = root / "demo.json"
    if not path.exists():
        return None
    d = json.loads(path.read_text())
    cfg = d.get("config") or {}
    command, full = _command(cfg)
    stages = Counter(s["stage"] for s in d.get("steps", []))
    reports = [s["command"] for s in d.get("steps", []) if s["stage"] == "report"]
    return {"path": _where(path, root), "sha256": sha256(path), "command": command,
            "full": full, "config": cfg, "seeds": list(range(int(cfg.get("seeds") or 1))),
            "head_seeds": list(range(int(cfg.get("head_seeds") or 1))),
            "finished": d.get("finished"), "failed": d.get("failed"),
            "machine": d.get("machine"), "jobs": int(cfg.get("jobs") or 1),
            "minutes": round(d.get("seconds", 0) / 60, 1),
            "minutes_by_stage": {k: round(v / 60, 1) for k, v in (d.get("by_stage") or {}).items()},
            "steps": dict(sorted(stages.items())),
            "report_command": reports[-1] if reports else None}


def _sweeps(root: Path) -> list[dict]:
    out = []
    for path in sorted((root / "sweeps").glob("*/sweep.json")):
        s = json.loads(path.read_text())
        oc = path.parent.name.split("_", 1)[0]        # <O>-<C>_<loss>_<variant>_seed<S>_<hash>
        points = []
        for p in s["points"]:
            val, test = p.get("val") or {}, p.get("eval") or {}
            both = None if val.get("tpr") is None or val.get("tnr") is None else \
                round((val["tpr"] + val["tnr"]) / 2, 3)
            points.append({"stage": p["stage"], "alpha_neg": p["values"].get("alpha_neg"),
                           "alpha_pos": p["values"].get("alpha_pos"), "status": p["status"],
                           "val_tpr": _round(val.get("tpr"), 2),
                           "val_tnr": _round(val.get("tnr"), 2),
                           "val_balanced": both, "test_tpr": _round(test.get("tpr"), 2),
                           "test_tnr": _round(test.get("tnr"), 2),
                           "mean_train_loss": _round(p.get("mean_train_loss"), 2)})
        figures = [{"kind": "sweep", "option": fig.stem[len("sweep_"):],
                    "name": f"sweep_{oc}_{fig.stem[len('sweep_'):]}.png", "sha256": sha256(fig),
                    "from": str(fig)}
                   for fig in sorted((path.parent / "figures").glob("sweep_*.png"))]
        out.append({"path": _where(path, root), "sha256": sha256(path), "oc": oc,
                    "criterion": s.get("criterion"), "fine_tune": s.get("fine_tune"),
                    "fixed": s.get("fixed"), "chosen": s.get("chosen"), "points": points,
                    "figures": figures})
    return out


def _round(v, digits: int):
    return None if v is None else round(v, digits)


def _fits(doc: dict) -> dict:
    classifier_of = {e["cache"]: e["labels"]["classifier"] for e in doc["evaluations"]
                     if e["kind"] == "baseline"}
    out = {}
    for cache, f in sorted(doc.get("fits", {}).items()):
        clf = classifier_of.get(cache)
        if clf is None or clf in out or "reason" in f:
            continue
        ts, pn, relu = f.get("ts") or {}, f.get("pnorm") or {}, f.get("relu") or {}
        grid = {k: v for k, v in (pn.get("aurc_grid") or {}).items() if k != "MSP"}
        best_p = min(grid, key=grid.get) if grid else None
        out[clf] = {"rows": f.get("rows"), "temperature": _round(ts.get("temperature"), 3),
                    "nll": _round(ts.get("nll"), 4), "nll_at_1": _round(ts.get("nll_at_1"), 4),
                    "p": pn.get("p"),
                    "aurc_msp": shown((pn.get("aurc_grid") or {}).get("MSP"), "aurc"),
                    "best_p": best_p,
                    "aurc_best_p": shown(grid.get(best_p), "aurc") if best_p else None,
                    "relu_lambda": relu.get("lambda")}
    order = {c: i for i, c in enumerate(CLASSIFIERS)}
    return dict(sorted(out.items(), key=lambda kv: order.get(kv[0], 9)))


def extract(report: Path, note: str | None = None, pretrained_note: str | None = None) -> dict:
    """The page's extract of one report (``report``: its folder or report.json); ``note`` and
    ``pretrained_note``: what the run's files do not record, of the page's run and of its
    pretrained-oracle grid."""
    path = report / "report.json" if report.is_dir() else report
    if not path.exists():
        raise Refused(f"{path}: no report.json (pass the report folder of a finished `cli.py "
                      "demo --full`, e.g. artifacts/fashion-mnist/report)")
    doc = json.loads(path.read_text())
    if doc.get("schema") != "trust-oracles-report/1":
        raise Refused(f"{path}: schema {doc.get('schema')!r}, expected trust-oracles-report/1")
    report_dir, root = path.parent, path.parent.parent
    shifts = (doc.get("appendix") or {}).get("shifts") or {}
    splits, figures = [], []
    for s in doc["splits"]:
        role = _role(s["split"], shifts)
        columns = {d: list(dict.fromkeys(m for r in s["rows"] for m in r["agg"][d]))
                   for d in ("paper", "standard")}
        splits.append({
            "split": s["split"], "role": role, "shift": shifts.get(s["split"]),
            "rows_evaluated": max((e["valid_rows"] for e in doc["evaluations"]
                                   if e["split"] == s["split"]), default=None),
            "columns": columns, "rows": [_row(r, columns) for r in s["rows"]],
            "comparisons": _comparisons(s), "versus": _versus(s)})
        figures += _figures(s, role, report_dir)
    oracle_evals = [e for e in doc["evaluations"] if e["kind"] == "oracle"]
    cfg = doc.get("config") or {}
    sweeps = _sweeps(root)
    for sw in sweeps:
        figures += sw.pop("figures")
    units = sorted({m for s in doc["splits"] for r in s["rows"] for d in r["agg"].values()
                    for m in d})
    pretrained = _pretrained(root, pretrained_note)
    summary = {
        "schema": SCHEMA, "generator": "bench/results_page.py",
        "values": "in the page's display units and precision, as the report's tables print "
                  "them (units: % = x100, e3 = x1000, '' = as is). A row's 'paper' and "
                  "'standard' follow its split's 'columns': the mean, or [mean, std] over several "
                  "seeds; its 'ci': [low, high], the 95% bootstrap interval of the seed mean. A "
                  "difference: [difference, low, high, side (better / worse / none: the paired "
                  "interval holds 0)]",
        "units": {m: unit(m) for m in units},
        "sources": {"report": {"path": _where(path, root), "sha256": sha256(path),
                               "created": doc.get("created")},
                    "demo": _demo(root),
                    "sweeps": [{"path": sw.pop("path"), "sha256": sw.pop("sha256")}
                               for sw in sweeps],
                    "note": note},
        "report": {"resamples": cfg.get("resamples"), "ci_seed": cfg.get("ci_seed"),
                   "runs": len({e["run_dir"] for e in oracle_evals}),
                   "outputs": len(oracle_evals),
                   "caches": len({e["cache"] for e in doc["evaluations"]
                                  if e["kind"] == "baseline"})},
        "machine": _machine(doc),
        "fits": _fits(doc),
        "splits": splits,
        "sweeps": sweeps,
        **({"pretrained": pretrained} if pretrained else {}),
        "figures": [{k: v for k, v in f.items() if k != "from"} for f in figures],
        "_copy": [(f["from"], f["name"]) for f in figures],
    }
    if pretrained:
        from bench import results_pretrained
        results_pretrained.check_same_classifiers(summary, pretrained)
    return summary


def _pretrained(root: Path, note: str | None) -> dict | None:
    from bench import results_pretrained
    return results_pretrained.extract(root, note)


def _dump(obj, level: int = 0, depth: int = 4) -> str:
    """JSON, nested objects and lists indented down to ``depth``, compact below it (one line
    per table row, comparison or figure: small diffs when the page is regenerated)."""
    flat = isinstance(obj, list) and not any(isinstance(v, (dict, list)) for v in obj)
    if level >= depth or not isinstance(obj, (dict, list)) or not obj or flat:
        return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(", ", ": "))
    pad, inner = " " * level, " " * (level + 1)
    if isinstance(obj, dict):
        items = [f"{inner}{json.dumps(k, ensure_ascii=False)}: {_dump(v, level + 1, depth)}"
                 for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    items = [f"{inner}{_dump(v, level + 1, depth)}" for v in obj]
    return "[\n" + ",\n".join(items) + f"\n{pad}]"


def summary_text(summary: dict) -> str:
    return _dump({k: v for k, v in summary.items() if not k.startswith("_")}) + "\n"


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


# ------------------------------------------------------------------------------- blocks --
def block_source(s: dict) -> str:
    rep, demo = s["sources"]["report"], s["sources"]["demo"]
    if demo is None:
        first = ("Every number and figure below comes from one report, with no demo.json beside "
                 "it: the command that made it is not recorded.")
    elif demo["full"]:
        first = (f"Every number and figure below comes from one run of `{demo['command']}`, "
                 f"finished {demo['finished']}.")
    else:
        first = (f"**Stand-in:** every number and figure below comes from one run of "
                 f"`{demo['command']}` (finished {demo['finished']}), the default demo, not "
                 "`python cli.py demo --full`: fewer seeds and pairs than the text describes, so "
                 "rows of the full grid are missing and single runs carry no ±. Regenerate the "
                 "page from a `--full` run's report (command below).")
    return "\n".join([
        first, "",
        f"Source: `{rep['path']}` (sha256 `{rep['sha256'][:16]}…`, created {rep['created']}), "
        f"extracted to `docs/results/summary.json` and rendered by `{COMMAND}` (the report folder "
        "of the run as its argument); `python -m pytest tests/test_results_page.py` fails when a "
        "block of this page differs from that extract."])


def block_summary(s: dict) -> str:
    head = ["split", "C (accuracy %)", "MCP: AUC / AURC", "SS ⟨C, C⟩: AUC / AURC",
            "SS − CE ⟨C, C⟩: ΔAUC", "SS − MCP ⟨C, C⟩: ΔAURC",
            "best learned scorer (lowest AURC) − MCP: ΔAURC",
            "learned scorers vs MCP on AURC: better / no clear / worse"]
    rows = []
    for split in s["splits"]:
        if split["role"] == "other":
            continue
        for c in _classifiers(split):
            mcp = _one(split, kind="baseline", classifier=c, loss="mcp")
            ss = _one(split, kind="oracle", oracle=c, classifier=c, loss="ss", variant="")
            oc = _oc(c, c)
            best, vs = _best_learned(split, c)
            t = _tally([_side(v, "aurc") for v in split["versus"]
                        if v["other_key"] == "mcp" and v["learned"]["classifier"] == c])
            rows.append([
                _short_split(split), f"{c} ({fmt(_c(mcp, 'acc'), 'acc')})",
                f"{fmt(_c(mcp, 'auc'), 'auc')} / {fmt(_c(mcp, 'aurc'), 'aurc')}",
                f"{fmt(_c(ss, 'auc'), 'auc')} / {fmt(_c(ss, 'aurc'), 'aurc')}" if ss else "not run",
                fmt_delta(_cmp(split, oc, "SS", "CE"), "auc"),
                fmt_delta(_cmp(split, oc, "SS", "MCP"), "aurc"),
                f"{fmt_delta(vs, 'aurc')}: {best['display_loss']}, {best['oc']}" if best
                else "none",
                f"{t['better']} / {t['none']} / {t['worse']} (of {sum(t.values())})"])
    return "\n".join(_table(head, rows) + [
        "", "AUC in %, AURC ×10³ (standard definitions). Values: mean ± std over seeds (no ± for "
        "one run or a post-hoc score). Differences: of the seed means, [95% paired bootstrap "
        "interval over the split's rows], called better or worse only where the interval "
        "excludes 0."])


def block_run(s: dict) -> str:
    demo, rep, m = s["sources"]["demo"], s["report"], s["machine"]
    lines = []
    if demo:
        cfg = demo["config"]
        lines += [
            f"- **Command**: `{demo['command']}`, as its `demo.json` records it: "
            f"{sum(demo['steps'].values())} commands ("
            + ", ".join(f"{n} {k}" for k, n in demo["steps"].items()) + ").",
            f"- **Seeds**: {_list(demo['seeds'])} for every fine-tuned and head-only oracle; "
            f"{_list(demo['head_seeds'])} (at least) for ConfidNet's head on the classifier's "
            f"features. Fine-tuned pairs ⟨O, C⟩: "
            f"{'all four' if cfg.get('pairs') == 'all' else 'O = C only'}; losses "
            f"{', '.join(cfg.get('losses', []))}, and the authors' broadcasting "
            f"{' and '.join(cfg.get('broadcast_losses', []))}.",
            f"- **Date**: finished {demo['finished']}; {demo['minutes']} min of wall time ("
            + ", ".join(f"{k} {v}" for k, v in demo["minutes_by_stage"].items())
            + (f"; the steps' own minutes by stage, which overlap: `--jobs {demo['jobs']}`"
               if demo.get("jobs", 1) > 1 else "") + ")."]
    else:
        lines.append("- **Command**: not recorded (no demo.json beside the report).")
    lines.append("- **Machine**: " + _machine_text(m, (demo or {}).get("machine")) + ".")
    if s["sources"].get("note"):
        lines.append(f"- **Note** (given when this page was generated): {s['sources']['note']}")
    report_cmd = (demo or {}).get("report_command") or "python cli.py report"
    lines.append(f"- **Report**: `{report_cmd}`, the demo's last step: {rep['runs']} oracle "
                 f"runs, {rep['outputs']} output files, {rep['caches']} classifier caches; "
                 f"{rep['resamples']} bootstrap resamples, seed {rep['ci_seed']}.")
    lines.append("- **Splits**: " + "; ".join(f"{_split_name(sp)}, {sp['rows_evaluated']:,} rows"
                                             for sp in s["splits"]) + ".")
    return "\n".join(lines)


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


def block_classifiers(s: dict) -> str:
    head = ["classifier"] + [f"{_short_split(sp)} accuracy %" for sp in s["splits"]]
    rows = []
    classifiers = sorted({r["classifier"] for sp in s["splits"] for r in sp["rows"]},
                         key=lambda c: (_order(c), c))
    for c in classifiers:
        rows.append([c] + [fmt(_c(_one(sp, kind="baseline", classifier=c, loss="mcp"), "acc"),
                               "acc", ci=True) for sp in s["splits"]])
    lines = _table(head, rows) + [
        "", "[95% bootstrap interval over the split's rows.] The post-hoc baselines' parameters, "
        "fitted on the oracles' held-out training rows, never on a test split:", ""]
    head = ["classifier", "held-out rows", "T (NLL at T / at T = 1)",
            "pNorm's p (AURC ×10³ on the held-out rows: MSP / best p)", "REL-U λ"]
    rows = []
    for c, f in s["fits"].items():
        p = "MSP (fallback)" if f["p"] == "MSP" else f"p = {f['p']}"
        best = f"p = {f['best_p']}: {f['aurc_best_p']:.2f}" if f["best_p"] is not None else "no p"
        rows.append([c, str(f["rows"]),
                     "not fitted" if f["temperature"] is None else
                     f"{f['temperature']:.3f} ({f['nll']:.4f} / {f['nll_at_1']:.4f})",
                     "not fitted" if f["aurc_msp"] is None else
                     f"{p} (MSP {f['aurc_msp']:.2f}; {best})",
                     "n/a" if f["relu_lambda"] is None else f"{f['relu_lambda']:g}"])
    lines += _table(head, rows)
    fallback = [c for c, f in s["fits"].items() if f["p"] == "MSP"]
    if fallback:
        lines += ["", f"MaxLogit-pNorm falls back to MSP for {' and '.join(fallback)}: no p beats "
                  "the softmax on the held-out rows (Cattelan & Silva's rule), so its rows equal "
                  "MCP's there."]
    return "\n".join(lines)


# ------------------------------------------------------------------------------ claims --
def claims(s: dict) -> list[dict]:
    """The paper's claims with what this run says: evidence (markdown) and a verdict (holds /
    partly / fails / not tested) by the rule each states."""
    test, shifted = _split(s, "test"), _split(s, "shifted")
    out = [_claim_saturation(test),
           _claim_higher(test, "tnr", "paper", "SS rejects more incorrect predictions at the "
                         "0.5 threshold: a higher TNR than CE, focal and TCP",
                         "paper, Table 1 and Fig. 3", "TNR", "%"),
           _claim_higher(test, "bhattacharyya", "standard", "SS separates the confidences of "
                         "correct and incorrect predictions more: a higher Bhattacharyya "
                         "distance than CE, focal and TCP", "paper, Table A4", "d_B", ""),
           _claim_auc(test, "SS gives the best AUC of the losses, in distribution",
                      "paper, Table 1")]
    if shifted is not None:
        out.append(_claim_auc(shifted, "SS gives the best AUC of the losses under a shift",
                              "paper, Table 3, ImageNet-C"))
    out += [_claim_small_scale(test), _claim_softmax(test)]
    return out


def _claim_saturation(split: dict) -> dict:
    rows = [r for r in _rows(split, kind="oracle", variant="") +
            _rows(split, kind="oracle", variant="broadcast") if r["loss"] in ("ce", "focal", "tcp")]
    tpr = [_mean(r, "tpr", "paper") for r in rows]
    tnr = [_mean(r, "tnr", "paper") for r in rows]
    ok = sum(1 for a, b in zip(tpr, tnr) if a is not None and b is not None and a > 99 and b < 1)
    evidence = (f"{split['split']}, paper definitions, the {len(rows)} fine-tuned CE, focal and "
                f"TCP rows (per-sample and broadcasting): TPR {_range(tpr)}%, TNR {_range(tnr)}% "
                f"(TCP's at 1/K); {ok} of {len(rows)} within both of the paper's bounds")
    if rows and ok < len(rows):
        worst = max(rows, key=lambda r: _mean(r, "tnr", "paper") or 0)
        evidence += (f"; the highest TNR: {worst['oc']} {worst['display_loss']}, "
                     f"{fmt(_c(worst, 'tnr', 'paper'), 'tnr')}%")
    return {"claim": "CE, focal and TCP oracles say \"trust\" for almost everything: TPR above "
                     "99%, TNR below 1%", "source": "paper, Table 1 and its text",
            "evidence": evidence, "verdict": _verdict(ok, len(rows)),
            "rule": "holds when every row is within both bounds"}


def _claim_higher(split: dict, metric: str, d: str, claim: str, source: str, label: str,
                  sign: str) -> dict:
    wins, total, ss_vals, other_vals = 0, 0, [], []
    for o, c in _pairs(split):
        ss = _one(split, kind="oracle", oracle=o, classifier=c, loss="ss", variant="")
        ss_vals.append(_mean(ss, metric, d))
        for r in _rows(split, kind="oracle", oracle=o, classifier=c, variant=""):
            a, b = _mean(ss, metric, d), _mean(r, metric, d)
            if r["loss"] not in ("ce", "focal", "tcp") or a is None or b is None:
                continue
            total += 1
            wins += a > b
            other_vals.append(b)
    digits = T.UNITS[unit(metric)][1]
    evidence = (f"{split['split']}, fine-tuned oracles, {d} definitions: SS {label} "
                f"{_range(ss_vals, digits)}{sign} against {_range(other_vals, digits)}{sign} for "
                f"CE, focal and TCP; SS higher in {wins} of {total} comparisons within a pair "
                "(seed means; the report has no paired interval for this metric)")
    return {"claim": claim, "source": source, "evidence": evidence,
            "verdict": _verdict(wins, total), "rule": "holds when SS is higher in every one"}


def _claim_auc(split: dict, claim: str, source: str) -> dict:
    per_sample, broadcast = [], []
    for o, c in _pairs(split):
        per_sample += [_side(_cmp(split, _oc(o, c), "SS", x), "auc") for x in PER_SAMPLE]
        broadcast += [_side(_cmp(split, _oc(o, c), "SS", x), "auc") for x in BROADCAST]
    tp, tb = _tally(per_sample), _tally(broadcast)
    evidence = (f"{split['split']}, fine-tuned oracles, paired ΔAUC of SS against the other "
                f"losses of its pair: against per-sample CE, focal and TCP {_count_text(tp)}; "
                f"against the authors' broadcasting CE and focal {_count_text(tb)}")
    return {"claim": claim, "source": source, "evidence": evidence,
            "verdict": _verdict(tp["better"] + tb["better"], sum(tp.values()) + sum(tb.values())),
            "rule": "holds when SS is better in every paired comparison"}


def _claim_small_scale(split: dict) -> dict:
    sides, parts = [], []
    for c in CLASSIFIERS:
        tcp = _cmp(split, _oc(c, c), "SS (head-only, ConfidNet)", "TCP (head-only, ConfidNet)")
        mcp = _cmp(split, _oc(c, c), "SS (head-only, ConfidNet)", "MCP")
        if tcp is None and mcp is None:
            continue
        sides += [_side(tcp, "auc"), _side(mcp, "auc")]
        parts.append(f"{c}: SS − TCP {fmt_delta(tcp, 'auc')}, SS − MCP {fmt_delta(mcp, 'auc')}")
    t = _tally(sides)
    return {"claim": "On ConfidNet's head, SS beats TCP and the softmax (MCP)",
            "source": "the paper's small-scale table, MNIST and CIFAR-10",
            "evidence": (f"{split['split']}, paired ΔAUC: " + "; ".join(parts)) if parts else
            "no ConfidNet-head runs in this report",
            "verdict": _verdict(t["better"], sum(t.values())),
            "rule": "holds when SS is better in every paired comparison"}


def _claim_softmax(split: dict) -> dict:
    t = _tally([_side(v, "aurc") for v in split["versus"] if v["other_key"] == "mcp"])
    return {"claim": "A trained oracle estimates trust better than the classifier's own softmax",
            "source": "the paper's premise; it compares no post-hoc score on ImageNet",
            "evidence": f"{split['split']}, every learned scorer against MCP, paired ΔAURC: "
                        f"{_count_text(t)}",
            "verdict": _verdict(t["better"], sum(t.values())),
            "rule": "holds when every learned scorer is better, fails when none is"}


def _verdict(good: int, total: int) -> str:
    if total == 0:
        return "not tested"
    return "holds" if good == total else "fails" if good == 0 else "partly"


def block_answers(s: dict) -> str:
    test, shifted, adv = _split(s, "test"), _split(s, "shifted"), _split(s, "adversarial")
    parts = []
    for split in (test, shifted):
        if split is None:
            continue
        per_sample, broadcast = [], []
        for o, c in _pairs(split):
            per_sample += [_side(_cmp(split, _oc(o, c), "SS", x), "auc") for x in PER_SAMPLE]
            broadcast += [_side(_cmp(split, _oc(o, c), "SS", x), "auc") for x in BROADCAST]
        parts.append(f"{_on(split)}, against per-sample CE, focal and TCP "
                     f"{_count_text(_tally(per_sample))}; against the authors' broadcasting CE "
                     f"and focal {_count_text(_tally(broadcast))}")
    tnr = [_mean(_one(test, kind="oracle", oracle=o, classifier=c, loss="ss", variant=""), "tnr",
                 "paper") for o, c in _pairs(test)]
    others = [_mean(r, "tnr", "paper") for r in _rows(test, kind="oracle", variant="")
              if r["loss"] in ("ce", "focal", "tcp")]
    lines = [f"- **Does SS help?** SS against the other losses trained the same way (fine-tuned, "
             f"same pair, paired ΔAUC): {'; '.join(parts)}. At the 0.5 threshold SS rejects "
             f"incorrect predictions (test TNR {_range(tnr)}%) where CE, focal and TCP reject "
             f"few ({_range(others)}%)."]
    parts = []
    for split in (test, shifted, adv):
        if split is None:
            continue
        t = _tally([_side(v, "aurc") for v in split["versus"] if v["other_key"] == "mcp"])
        bests = []
        for c in _classifiers(split):
            best, vs = _best_learned(split, c)
            if best is not None:
                bests.append(f"{c}: {best['display_loss']} {best['oc']}, "
                             f"{fmt_delta(vs, 'aurc')}")
        parts.append(f"{_on(split)}, of {sum(t.values())} learned scorers "
                     f"{t['better']} beat MCP on AURC, {t['none']} show no clear difference and "
                     f"{t['worse']} are worse (the lowest AURC per classifier, ΔAURC ×10³ against "
                     f"MCP: {'; '.join(bests)})")
    lines.append("- **Does anything learned beat the softmax?** " + "; ".join(parts) + ".")
    groups: dict[str, list[str]] = {}
    for i, cl in enumerate(claims(s), 1):
        groups.setdefault(cl["verdict"], []).append(str(i))
    lines.append("- **Which of the paper's claims fail?** Of the claims checked below, "
                 + "; ".join(f"{v}: {', '.join(n)}" for v, n in sorted(
                     groups.items(), key=lambda kv: ("fails", "partly", "holds",
                                                     "not tested").index(kv[0]))) + ".")
    return "\n".join(lines)


def block_verdicts(s: dict) -> str:
    lines = [f"{i}. **{cl['claim']}** ({cl['source']}). Here: {cl['evidence']}. "
             f"**Verdict: {cl['verdict']}** ({cl['rule']})." for i, cl in enumerate(claims(s), 1)]
    test = _split(s, "test")
    per_sample = [_mean(r, "auc") for r in _rows(test, kind="oracle", variant="")
                  if r["loss"] in ("ce", "focal", "tcp")]
    broadcast = [_mean(r, "auc") for r in _rows(test, kind="oracle", variant="broadcast")]
    lines += ["", f"For the paper's near-chance CE and focal oracles (AUC 51–53 in its Table 1; "
              f"chance is 50): on `test` the fine-tuned per-sample CE, focal and TCP oracles reach "
              f"AUC {_range(per_sample)}, the authors' broadcasting CE and focal "
              f"{_range(broadcast)}."]
    return "\n".join(lines)


# ------------------------------------------------------------------ report's renderers --
def report_split(split: dict) -> dict:
    """The extract's split in the shape pipeline/report/tables.py renders (report.json's)."""
    rows = []
    for r in split["rows"]:
        agg = {d: {m: _report_cell(_c(r, m, d), m) for m in split["columns"][d]}
               for d in ("paper", "standard")}
        rows.append({**r, "agg": agg})
    comparisons = [{**c, "metrics": {m: _report_delta(c[m], m) for m in ("auc", "aurc")
                                     if m in c}} for c in split["comparisons"]]
    return {"split": split["split"], "rows": rows, "comparisons": comparisons,
            "versus_baselines": []}


def _markdown(table: dict, level: str = "####") -> str:
    text = T.markdown_table(table).rstrip()
    return level + text[len("###"):] if text.startswith("### ") else text


def _tables(split: dict) -> dict[str, dict]:
    return {t["id"]: t for t in T.build_tables(report_split(split), "both", ci=False)}


def block_paired(s: dict) -> str:
    lines = []
    for split in s["splits"]:
        if split["role"] not in ("test", "shifted"):
            continue
        rs = report_split(split)
        rs["comparisons"] = [c for c in rs["comparisons"] if c["ss"] == "SS"
                             and c["other"] in PER_SAMPLE + BROADCAST + ("MCP",)]
        if rs["comparisons"]:
            table = T.paired_table(rs)
            table["title"] = f"SS (fine-tuned) − the other losses and MCP, {_split_name(split)}"
            lines += [_markdown(table), ""]
    return "\n".join(lines).rstrip() or "No fine-tuned SS oracle in this report."


def block_small_scale(s: dict) -> str:
    test = _split(s, "test")
    table = _tables(test).get("small_scale_standard")
    if table is None:
        return "No ConfidNet-head runs in this report: the small-scale table is not drawn."
    table["title"] = f"The paper's small-scale table on the embedded data, {_split_name(test)}"
    lines = [_markdown(table), "", "Paired ΔAUC of SS on ConfidNet's head (points):", ""]
    for c in CLASSIFIERS:
        tcp = _cmp(test, _oc(c, c), "SS (head-only, ConfidNet)", "TCP (head-only, ConfidNet)")
        mcp = _cmp(test, _oc(c, c), "SS (head-only, ConfidNet)", "MCP")
        if tcp or mcp:
            lines.append(f"- {c}: SS − TCP on the same head {fmt_delta(tcp, 'auc')}; SS − MCP "
                         f"{fmt_delta(mcp, 'auc')}.")
    return "\n".join(lines)


def block_versus(s: dict) -> str:
    lines = []
    for split in s["splits"]:
        if split["role"] == "other":
            continue
        lines += [f"**{_split_name(split)}**", ""]
        head = ["C", "post-hoc: " + " · ".join(label for _, label in POSTHOC)
                + " (AUC / AURC ×10³)"]
        rows = []
        for c in _classifiers(split):
            cells = []
            for key, _ in POSTHOC:
                r = _one(split, kind="baseline", classifier=c, loss=key)
                cells.append("–" if r is None else
                             f"{fmt(_c(r, 'auc'), 'auc')} / {fmt(_c(r, 'aurc'), 'aurc')}")
            rows.append([c, " · ".join(cells)])
        lines += _table(head, rows) + [""]
        head = ["C", "learned family", "best of it (lowest AURC)", "ΔAUC vs MCP",
                "ΔAURC ×10³ vs MCP", "ΔAUGRC ×10³ vs MCP",
                "ΔAURC ×10³ vs the strongest post-hoc score",
                "better / no clear / worse than MCP on AURC (of the family)"]
        rows = []
        for c in _classifiers(split):
            for fam in FAMILIES:
                best, vs = _best_learned(split, c, fam)
                if best is None:
                    continue
                strongest = _versus_of(split, best, mcp=False)
                fam_v = [v for v in split["versus"] if v["other_key"] == "mcp"
                         and v["learned"]["classifier"] == c
                         and _family(v["learned"]["variant"]) == fam]
                t = _tally([_side(v, "aurc") for v in fam_v])
                rows.append([c, fam, f"{best['display_loss']}, {best['oc']} (n={best['n']})",
                             fmt_delta(vs, "auc"), fmt_delta(vs, "aurc"), fmt_delta(vs, "augrc"),
                             f"{fmt_delta(strongest, 'aurc')} ({strongest['other']})"
                             if strongest else "—",
                             f"{t['better']} / {t['none']} / {t['worse']} (of {len(fam_v)})"])
        lines += _table(head, rows) + [""]
    return "\n".join(lines).rstrip()


HEAD_ONLY_LOSSES = (("ce", ""), ("focal", ""), ("tcp", ""), ("ss", ""), ("ce", "broadcast"),
                    ("focal", "broadcast"))


def block_head_only(s: dict) -> str:
    lines = []
    for split in s["splits"]:
        if split["role"] not in ("test", "shifted"):
            continue
        head = ["⟨O,C⟩", "loss", "fine-tuned AUC", "head-only AUC", "fine-tuned AURC ×10³",
                "head-only AURC ×10³", "SS: fine-tuned − head-only ΔAUC"]
        rows = []
        pairs = sorted({(r["oracle"], r["classifier"]) for r in _rows(split, kind="oracle")},
                       key=lambda p: (_order(p[1]), p[0] != p[1], _order(p[0])))
        for o, c in pairs:
            for loss, variant in HEAD_ONLY_LOSSES:
                tuned = _one(split, kind="oracle", oracle=o, classifier=c, loss=loss,
                             variant=variant)
                frozen = _one(split, kind="oracle", oracle=o, classifier=c, loss=loss,
                              variant="+".join(p for p in (variant, "head-only") if p))
                if tuned is None and frozen is None:
                    continue
                label = tuned["loss_label"] if tuned else \
                    frozen["loss_label"].replace(", head-only", "").replace(" (head-only)", "")
                paired = _cmp(split, _oc(o, c), "SS", "SS (head-only)") \
                    if (loss, variant) == ("ss", "") else None
                rows.append([_oc(o, c), label, fmt(_c(tuned, "auc"), "auc", ci=True),
                             fmt(_c(frozen, "auc"), "auc", ci=True),
                             fmt(_c(tuned, "aurc"), "aurc"), fmt(_c(frozen, "aurc"), "aurc"),
                             fmt_delta(paired, "auc") if paired else "—"])
        for c in _classifiers(split):
            mcp = _one(split, kind="baseline", classifier=c, loss="mcp")
            if mcp:
                rows.append([_oc("post-hoc", c), "MCP", fmt(_c(mcp, "auc"), "auc", ci=True), "",
                             fmt(_c(mcp, "aurc"), "aurc"), "", ""])
        lines += [f"**{_split_name(split)}**", ""] + _table(head, rows) + [""]
    lines.append("AUC in %: mean ± std over seeds [95% bootstrap interval of the seed mean]; "
                 "AURC ×10³; \"not run\": the run trained no such oracle.")
    return "\n".join(lines)


def block_sweep(s: dict) -> str:
    if not s["sweeps"]:
        return "No α sweep beside this report."
    sym = {"alpha_neg": "α⁻", "alpha_pos": "α⁺"}
    lines = []
    for sw in s["sweeps"]:
        fixed, chosen = sw["fixed"] or {}, sw["chosen"] or {}
        oc = "⟨" + ", ".join(sw["oc"].split("-")) + "⟩"
        lines.append(f"{oc}, {'fine-tuned' if sw['fine_tune'] else 'head-only'} SS oracles, seed "
                     f"0, chosen by {sw['criterion']} ((TPR + TNR) / 2) on the held-out training "
                     f"rows. Preset: α⁻ = {fixed.get('alpha_neg'):g}, α⁺ = "
                     f"{fixed.get('alpha_pos'):g}; **chosen: α⁻ = {chosen.get('alpha_neg'):g}, "
                     f"α⁺ = {chosen.get('alpha_pos'):g}**.")
        for stage in sorted({p["stage"] for p in sw["points"]}):
            pts = [p for p in sw["points"] if p["stage"] == stage]
            swept = "alpha_neg" if len({p["alpha_neg"] for p in pts}) > 1 else "alpha_pos"
            held = "alpha_pos" if swept == "alpha_neg" else "alpha_neg"
            head = [f"{sym[swept]} ({sym[held]} = {pts[0][held]:g})"] + [
                f"**{p[swept]:g}**" if p[swept] == chosen.get(swept) else f"{p[swept]:g}"
                for p in pts]
            pair = (lambda a, b: "–" if a is None else f"{a:.2f} / {b:.2f}")
            rows = [["held-out TPR / TNR"] + [pair(p["val_tpr"], p["val_tnr"]) for p in pts],
                    ["held-out (TPR + TNR) / 2"] + [f"{p['val_balanced']:.3f}" for p in pts],
                    ["test TPR / TNR (not used)"] + [pair(p["test_tpr"], p["test_tnr"])
                                                     for p in pts],
                    ["mean training loss"] + [f"{p['mean_train_loss']:.2f}" for p in pts]]
            lines += [""] + _table(head, rows)
        neg = sorted((p for p in sw["points"] if p["alpha_pos"] == fixed.get("alpha_pos")
                      and p["stage"] == min(q["stage"] for q in sw["points"])),
                     key=lambda p: p["alpha_neg"])
        lines += ["", f"Along α⁻: held-out TPR {_monotone([p['val_tpr'] for p in neg], -1)}, "
                  f"TNR {_monotone([p['val_tnr'] for p in neg], 1)}, mean training loss "
                  f"{_monotone([p['mean_train_loss'] for p in neg], 1)}."]
    figs = [f for f in s["figures"] if f["kind"] == "sweep"]
    if figs:
        lines += [""] + [f"![the sweep over {f['option'].replace('_', ' ')}](figures/{f['name']})"
                         for f in figs]
    return "\n".join(lines)


def _monotone(values: list, sign: int) -> str:
    """'falls monotonically' / 'rises monotonically' / 'is not monotone' (as printed)."""
    values = [v for v in values if v is not None]
    steps = [sign * (b - a) for a, b in zip(values, values[1:])]
    word = "rises" if sign > 0 else "falls"
    return f"{word} monotonically" if steps and all(d >= 0 for d in steps) else "is not monotone"


def block_figures(s: dict) -> str:
    lines = []
    for f in s["figures"]:
        if f["kind"] != "sweep":
            lines += [f"{f['shows']}; split `{f['split']}`:", "",
                      f"![{f['kind'].replace('_', ' ')}, {f['oc']}, {f['split']}]"
                      f"(figures/{f['name']})", ""]
    return "\n".join(lines).rstrip() or "No figures in this report."


def block_full_tables(s: dict) -> str:
    return full_tables(s["splits"])


def full_tables(splits: list[dict], heading: str = "### Split") -> str:
    """The report's paper, standard, working-point and separability tables of ``splits``."""
    lines = []
    for split in splits:
        tables = _tables(split)
        lines += [f"{heading} {_split_name(split)}", ""]
        lines += [part for tid in ("paper", "standard", "working_points", "separability")
                  if tid in tables for part in (_markdown(tables[tid]), "")]
    return "\n".join(lines).rstrip()


BLOCKS = {"source": block_source, "answers": block_answers, "summary": block_summary,
          "what-was-run": block_run, "classifiers": block_classifiers,
          "verdicts": block_verdicts, "paired": block_paired, "small-scale": block_small_scale,
          "versus": block_versus, "head-only": block_head_only, "sweep": block_sweep,
          "figures": block_figures, "full-tables": block_full_tables}


def render(summary: dict) -> dict[str, str]:
    """Every block's text, from the extract alone."""
    s = json.loads(summary_text(summary))          # what the committed file holds, and a copy
    for split in s["splits"]:
        for row in split["rows"]:
            row["_columns"] = split["columns"]
    for split in (s.get("pretrained") or {}).get("splits", []):
        for row in split["rows"]:
            row["_columns"] = split["columns"]
    return {name: fn(s).rstrip() for name, fn in all_blocks(s).items()}


def all_blocks(summary: dict | None = None) -> dict:
    """The page's blocks, and the pretrained-oracle section's (bench/results_pretrained.py)
    where the run has that grid (``summary``; None: the committed extract's)."""
    from bench import results_pretrained
    summary = load_summary() if summary is None else summary
    return {**BLOCKS, **(results_pretrained.BLOCKS if summary.get("pretrained") else {})}


# --------------------------------------------------------------------------------- page --
def blocks_of(text: str, names) -> dict[str, str]:
    """{name: the text between its markers} of a page, for each of ``names``."""
    out = {}
    for name in names:
        b, e = BEGIN.format(name), END.format(name)
        if text.count(b) != 1 or text.count(e) != 1 or text.index(b) > text.index(e):
            raise Refused(f"{PAGE.relative_to(ROOT)}: block {name!r} needs exactly one '{b}' "
                          f"followed by one '{e}'")
        out[name] = text[text.index(b) + len(b):text.index(e)].strip("\n")
    return out


def rewrite(text: str, rendered: dict[str, str]) -> str:
    blocks_of(text, rendered)            # every marker present, once
    for name, body in rendered.items():
        b, e = BEGIN.format(name), END.format(name)
        head, rest = text.split(b, 1)
        _, tail = rest.split(e, 1)
        text = f"{head}{b}\n{body}\n{e}{tail}"
    return text


def stale(text: str, rendered: dict[str, str]) -> list[str]:
    have = blocks_of(text, rendered)
    return [name for name, body in rendered.items() if have[name] != body]


def load_summary(path: Path = SUMMARY) -> dict:
    summary = json.loads(path.read_text())
    if summary.get("schema") != SCHEMA:
        raise Refused(f"{path}: schema {summary.get('schema')!r}, expected {SCHEMA}")
    return summary


def copy_figures(summary: dict, previous: dict | None) -> None:
    FIGURES.mkdir(parents=True, exist_ok=True)
    for src, name in summary["_copy"]:
        shutil.copyfile(src, FIGURES / name)
    shown = {f["name"] for f in summary["figures"]}
    for f in (previous or {}).get("figures", []):      # ours, no longer shown
        if f["name"] not in shown and (FIGURES / f["name"]).exists():
            (FIGURES / f["name"]).unlink()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--report", type=Path, help="a report folder (or its report.json) of one "
                    "`cli.py demo --full` run: extract it, copy its figures, rewrite the page")
    ap.add_argument("--note", help="what the run's files do not record (e.g. how it was "
                    "invoked), printed under 'What was run'")
    ap.add_argument("--pretrained-note", help="the same, of the pretrained-oracle grid's run "
                    "(printed in that section's source)")
    ap.add_argument("--check", action="store_true", help="exit 1 when the page's generated "
                    "blocks differ from docs/results/summary.json's rendering")
    args = ap.parse_args(argv)
    try:
        if args.report and args.check:
            raise Refused("--check compares the page with the committed extract: no --report")
        if (args.note or args.pretrained_note) and not args.report:
            raise Refused("--note and --pretrained-note describe the run of --report: pass both")
        if args.report:
            previous = load_summary() if SUMMARY.exists() else None
            summary = extract(args.report, args.note, args.pretrained_note)
            SUMMARY.parent.mkdir(parents=True, exist_ok=True)
            page = rewrite(PAGE.read_text(), render(summary))   # markers checked before writing
            SUMMARY.write_text(summary_text(summary))
            copy_figures(summary, previous)
            PAGE.write_text(page)
            print(f"wrote {SUMMARY.relative_to(ROOT)}, {len(summary['figures'])} figure(s) in "
                  f"{FIGURES.relative_to(ROOT)}/, {len(all_blocks(summary))} block(s) of "
                  f"{PAGE.relative_to(ROOT)}")
            return 0
        summary = load_summary()
        rendered = render(summary)
        text = PAGE.read_text()
        if args.check:
            bad = stale(text, rendered)
            if bad:
                raise Refused(f"{PAGE.relative_to(ROOT)}: block(s) {', '.join(bad)} differ from "
                              f"{SUMMARY.relative_to(ROOT)}: run python bench/results_page.py")
            return 0
        PAGE.write_text(rewrite(text, rendered))
        return 0
    except Refused as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    # run the imported module's main: bench/results_pretrained.py raises ITS Refused, which a
    # second copy of this module (__main__) would not catch
    from bench.results_page import main as _main
    sys.exit(_main())
