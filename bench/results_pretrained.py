"""docs/RESULTS.md, "With a pretrained oracle": the blocks drawn from the pretrained study
(`cli.py demo --full --pretrained-only`, its report in ``<root>/pretrained/report``).

bench/results_page.py extracts that report into summary.json's ``pretrained``: the report's
rows (as the page's own extract), each classifier fit's accuracy, and the report's verdicts --
every learned scorer against MCP and SS against each other loss, on the primary metric with
intervals over fits, seeds and rows, Holm-corrected per question and split -- and renders these
blocks from it.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from bench import results_format as R
from bench.results_blocks import full_tables
from bench.results_extract import extract as extract_report
from pipeline.core.presets import CHECKPOINT_NAMES, IN1K

QUESTIONS = ("reference", "losses")
VERDICTS = ("better", "no clear difference", "worse")
SIZES = {model: name for name, model in CHECKPOINT_NAMES.items() if not name.endswith(IN1K)}


def extract(root: Path, note: str | None = None) -> dict | None:
    """The extract of ``<root>/pretrained/report`` (None where the run has no study); ``note``:
    what the study's files do not record (how it was invoked)."""
    path = root / "pretrained" / "report" / "report.json"
    if not path.exists():
        return None
    s = extract_report(path, note)
    doc = json.loads(path.read_text())
    out = {k: s[k] for k in ("sources", "report", "machine", "splits")}
    out["fits"] = _fits(s["splits"])
    out["verdicts"] = _verdicts(doc.get("verdicts") or {})
    return out


def _fits(splits: list[dict]) -> list[dict]:
    """Each classifier fit (its weights hash) and its accuracy on every evaluated split."""
    fits: dict[tuple, dict] = {}
    for split in splits:
        for row in R._rows(split, kind="baseline", loss="mcp"):
            sha = (row.get("identity") or {}).get("weights_sha256") or ""
            fit = fits.setdefault((row["classifier"], sha), {
                "classifier": row["classifier"], "weights_sha256": sha, "acc": {}})
            fit["acc"][_column(split)] = _accuracy(row, split)
    return sorted(fits.values(), key=lambda f: (f["classifier"], f["weights_sha256"]))


def _accuracy(row: dict, split: dict) -> float | None:
    """A row's accuracy as the extract holds it (display units; the mean where a list)."""
    columns = split["columns"]["standard"]
    value = row["standard"][columns.index("acc")] if "acc" in columns else None
    return value[0] if isinstance(value, list) else value


def _column(split: dict) -> str:
    """A split's column in the classifiers' table: its tag; every attacked split one column."""
    return "adversarial" if split["role"] == "adversarial" else split["split"]


def _verdicts(doc: dict) -> dict:
    """The report's verdict families in display units: per comparison [difference, low, high,
    Holm-adjusted p, verdict] per metric."""
    families = []
    for fam in doc.get("families", []):
        comparisons = [{
            "a": e["a"], "b": e["b"], "training": e["training"],
            "classifier": SIZES.get(e["arch"].get("model"), e["arch"].get("model")),
            "fits": e["fits"], "seeds": e["seeds"], "covers": e["covers"],
            "verdict": e["verdict"], "disagree": e["disagree"],
            "metrics": {m: [R.shown(c["delta"], m), *(R.shown(v, m) for v in (c["ci"] or
                                                                                 (None, None))),
                            c.get("p_holm"), c.get("verdict")]
                        for m, c in e["metrics"].items()}} for e in fam["comparisons"]]
        selected = fam.get("selected")
        families.append({"split": fam["split"], "question": fam["question"],
                         "counts": fam["counts"], "refused": fam["refused"],
                         "selected": selected and {k: selected[k] for k in ("scorer", "verdict")},
                         "comparisons": comparisons})
    return {"primary": doc.get("primary"), "alpha": doc.get("alpha"),
            "method": doc.get("method"), "families": families}


# --------------------------------------------------------------------------------- blocks --
def _study(s: dict) -> dict | None:
    """The extract's study, its rows knowing their split's columns (results_format's lookups
    read them there)."""
    p = s.get("pretrained")
    if p is None or "verdicts" not in p:
        return None
    for split in p["splits"]:
        for row in split["rows"]:
            row["_columns"] = split["columns"]
    return p


def _evaluated(p: dict) -> list[dict]:
    return [sp for sp in p["splits"] if sp["role"] != "other"]


def _families(p: dict, question: str) -> list[tuple[dict, dict]]:
    """(split, family) of ``question``, in the report's split order."""
    by = {(f["split"], f["question"]): f for f in p["verdicts"]["families"]}
    return [(sp, by[(sp["split"], question)]) for sp in _evaluated(p)
            if (sp["split"], question) in by]


def _kind(c: dict) -> str:
    """Which oracle a learned scorer is: O = C fine-tuned, cross (the other size's ImageNet
    weights) or a head on the classifier's features."""
    if c["training"] != "fine-tuned":
        return "heads"
    return "O = C" if "O = C" in c["a"] else "cross"


def _counts(comparisons: list[dict]) -> str:
    t = Counter(c["verdict"] for c in comparisons)
    return (f"better {t['better']}, no clear difference {t['no clear difference']}, worse "
            f"{t['worse']} (of {len(comparisons)})")


def block_source(s: dict) -> str:
    p = _study(s)
    if p is None:
        return "No pretrained study in this run."
    rep, demo = p["sources"]["report"], p["sources"]["demo"]
    runs = p["report"]["runs"]
    text = (f"The section's numbers come from `{rep['path']}` (sha256 `{rep['sha256'][:16]}…`, "
            f"created {rep['created']}), " + (f"{runs} runs" if runs else
                                              "a report of the classifier fits' caches alone, "
                                              "with no oracle run"))
    note = (f"\n\nNote (given when this page was generated): {p['sources']['note']}"
            if p["sources"].get("note") else "")
    if demo is None:
        return text + "; no demo.json beside it records the command." + note
    return text + (f", made by `{demo['command']}`, finished {demo['finished']} in "
                   f"{demo['minutes']} min on "
                   + R._machine_text(p.get("machine") or {}, demo["machine"]) + "." + note)


def block_classifiers(s: dict) -> str:
    p = _study(s)
    if p is None:
        return "No pretrained study in this run."
    columns = list(dict.fromkeys(_column(sp) for sp in _evaluated(p)))
    head = ["classifier", "fit (weights sha256)", *columns]
    rows = [[f"`{f['classifier']}`", f"`{f['weights_sha256'][:12]}`",
             *(f"{f['acc'][c]:.2f}" if f["acc"].get(c) is not None else "not run"
               for c in columns)] for f in p["fits"]]
    return "\n".join(["Accuracy (%) of each classifier fit on the rows the oracles are "
                      "scored on:", "", *R._table(head, rows), "", _ranges(p["fits"], columns)])


def _ranges(fits: list[dict], columns: list[str]) -> str:
    """Per size, the range over its fits of each column's accuracy and of the points each
    shifted column loses against test."""
    parts = []
    for c in dict.fromkeys(f["classifier"] for f in fits):
        mine = [f["acc"] for f in fits if f["classifier"] == c]
        cells = []
        for col in columns:
            values = [a[col] for a in mine if a.get(col) is not None]
            # the attacked split is a part of test: its loss is the manifest's, not this
            lost = [a["test"] - a[col] for a in mine if col not in ("test", "adversarial")
                    and a.get(col) is not None and a.get("test") is not None]
            if values:
                cells.append(f"{col} {R._range(values)}"
                             + (f" ({R._range(lost)} points below test)" if lost else ""))
        parts.append(f"`{c}` over {len(mine)} fits: " + "; ".join(cells) + ".")
    return "\n".join(f"- {p}" for p in parts)


def block_answer(s: dict) -> str:
    """Per split: the learned scorers against MCP (O = C, cross, heads; per size), the scorer
    chosen on held-out rows and its verdict, and SS against the other losses."""
    p = _study(s)
    if p is None:
        return "This run has no pretrained study (`demo --pretrained-oracle`)."
    losses = dict((sp["split"], f) for sp, f in _families(p, "losses"))
    lines = []
    for sp, fam in _families(p, "reference"):
        comps = fam["comparisons"]
        parts = [f"{k}: {_counts([c for c in comps if _kind(c) == k])}"
                 for k in ("O = C", "cross", "heads") if any(_kind(c) == k for c in comps)]
        sizes = "; ".join(f"`{c}`: {_counts([x for x in comps if x['classifier'] == c])}"
                          for c in dict.fromkeys(x["classifier"] for x in comps))
        sel = fam.get("selected")
        chosen = (f" Chosen on held-out rows: {sel['scorer']} ({sel['verdict']} than MCP)."
                  if sel else "")
        ss = losses.get(sp["split"])
        vs = f" SS against the other losses: {_counts(ss['comparisons'])}." if ss else ""
        lines.append(f"- **{R._split_name(sp)}**, learned scorers against MCP: "
                     f"{_counts(comps)}; by oracle: {'; '.join(parts)}; by classifier: {sizes}."
                     + chosen + vs)
    if not lines and not p["report"]["runs"]:
        return ("No oracle of the study is in this report: the blocks of verdicts below are "
                "empty until a report of its runs replaces it.")
    return "\n".join(lines) or "The report holds no verdicts (it ran without intervals)."


def _delta(c: dict, metric: str) -> str:
    d, low, high, p, verdict = c["metrics"][metric]
    if d is None:
        return "undefined"
    ci = f" [{low:+g}, {high:+g}]" if low is not None else ""
    return f"{d:+g}{ci}"


def _p(c: dict, metric: str) -> str:
    p = c["metrics"][metric][3]
    return "" if p is None else ("<0.001" if p < 0.001 else f"{p:.3f}")


def _comparison_rows(comps: list[dict], primary: str) -> list[list[str]]:
    return [[f"`{c['classifier']}`", c["a"] if c["b"] == "MCP" else f"{c['a']} − {c['b']}",
             c["training"], f"{c['fits']} × {'/'.join(str(n) for n in c['seeds'][0])}",
             _delta(c, primary), _p(c, primary), f"**{c['verdict']}**" if c["verdict"] else "",
             _delta(c, "aurc"), _delta(c, "auc"), ", ".join(c["disagree"])] for c in comps]


def _verdict_tables(s: dict, question: str, what: str) -> str:
    p = _study(s)
    if p is None:
        return "No pretrained study in this run."
    primary = p["verdicts"]["primary"]
    head = ["C", what, "training", "fits × seeds", f"Δ{primary.upper()} ×10³ [95%]",
            "p (Holm)", "verdict", "ΔAURC ×10³ [95%]", "ΔAUC % [95%]", "metrics that disagree"]
    lines = []
    for sp, fam in _families(p, question):
        lines += [f"**{R._split_name(sp)}**", "",
                  *R._table(head, _comparison_rows(fam["comparisons"], primary)), ""]
        lines += [f"Not compared: {r['a']} − {r['b']}: {r['why']}" for r in fam["refused"]]
    return "\n".join(lines).rstrip() or "No comparison of this kind in the study's report."


def block_verdicts(s: dict) -> str:
    """Every learned scorer of the study against its classifier's MCP, per split."""
    return _verdict_tables(s, "reference", "scorer (− MCP)")


def block_losses(s: dict) -> str:
    """SS against each other loss of the same oracle, classifier and training, per split."""
    return _verdict_tables(s, "losses", "SS − other loss")


def block_full_tables(s: dict) -> str:
    p = _study(s)
    if p is None:
        return "No pretrained study in this run."
    return full_tables(_evaluated(p), heading="### Pretrained study, split")


BLOCKS = {"pretrained-source": block_source, "pretrained-answer": block_answer,
          "pretrained-classifiers": block_classifiers, "pretrained-verdicts": block_verdicts,
          "pretrained-losses": block_losses, "pretrained-full-tables": block_full_tables}
