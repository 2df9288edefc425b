"""The results page's extract: one report.json (with the demo.json, sweeps and machine records
beside it) to the compact summary docs/results/summary.json holds -- only the numbers the page
shows, in display units, with the sha256 of every file they came from."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from bench.results_format import (
    BROADCAST, CI_METRICS, CLASSIFIERS, PER_SAMPLE, Refused, SCHEMA, SHOWN, sha256, shown, unit)
from cache.manifest import load_manifest
from cache.runs import RunDir
from cache.schema import CacheError
from pipeline.core.presets import DEMO, DEMO_ATTACK, PRETRAINED


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
    # an attacked split scored by runs carries the demo's tag; a classifier's own cache of it
    # (a report of caches alone) the tag and the classifier's name
    attacked = tag == DEMO_ATTACK["tag"] or tag.startswith(f"{DEMO_ATTACK['tag']}-")
    return "adversarial" if attacked else "other"


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
    full = cfg.get("full", cfg.get("seeds") == DEMO["full_seeds"]
                   and cfg.get("pairs") == DEMO["full_pairs"])
    parts = ["python cli.py demo"] + (["--full"] if full else [])
    if not full:
        if cfg.get("seeds") not in (None, DEMO["seeds"]):
            parts.append(f"--num-seeds {cfg['seeds']}")
        if cfg.get("pairs") not in (None, DEMO["pairs"]):
            parts.append(f"--pairs {cfg['pairs']}")
    for key in ("corruption", "severity"):
        if cfg.get(key) not in (None, DEMO[key]):
            parts.append(f"--{key} {cfg[key]}")
    if cfg.get("pretrained"):
        parts.append("--pretrained-oracle" if cfg.get("base_oracles", True)
                     else "--pretrained-only")
        if cfg.get("fits"):
            parts.append(f"--fits {cfg['fits']}")
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


