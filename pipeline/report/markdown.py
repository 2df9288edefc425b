"""report.md: the tables of every split, figure links, and where every number came from (the
fitted post-hoc baselines' parameters in one column each, from baselines.py's table)."""
from __future__ import annotations

from pathlib import Path

from pipeline.core.catalog import higher_is_better
from pipeline.report import appendix, tables as T
from pipeline.report.baselines import FITTED, TABLE, and_join
from pipeline.report.verdicts import by_split


def markdown_document(doc: dict, tables: list[dict]) -> str:
    n_runs = len({e["run_dir"] for e in doc["evaluations"] if e["run_dir"]})
    n_out = sum(1 for e in doc["evaluations"] if e["kind"] == "oracle")
    caches = sorted({e["cache"] for e in doc["evaluations"] if e["kind"] == "baseline"})
    lines = ["# Trustworthiness report", "",
             f"Generated {doc['created']} by `cli.py report`; metric definitions: "
             f"**{doc['metrics']}** (see docs/METRICS.md). Values are mean ± sample std over "
             "seeds (n = number of runs; no ± with one run); percentages like the paper.", "",
             f"Sources: {n_out} oracle output file(s) from {n_runs} run(s); post-hoc baselines "
             f"(MCP, temperature-scaled MSP, negative entropy, max logit, MaxLogit-pNorm, energy, "
             f"DOCTOR, REL-U; TrustScore where the caches have features) from {len(caches)} "
             "classifier cache(s). Every number, with the runs it "
             "came from, is in report.json; bootstrap intervals of every number are in "
             "report.csv and report.json.", "",
             f"Uncertainty: {doc.get('bootstrap', '')}.", "", doc["exclusion"], ""]
    lines += _fits_section(doc.get("fits", {}))
    lines += _trust_section(doc.get("trust_score", {}))
    for skipped in doc["skipped"]:
        lines.append(f"- skipped run {skipped['run_dir']}: {skipped['reason']}")
    families = by_split(doc.get("verdicts") or {})
    for split in doc["splits"]:
        lines += _split_section(split, [t for t in tables if t["split"] == split["split"]])
        lines += _verdicts_section(doc["verdicts"], families.get(split["split"], []))
    lines += appendix.markdown(doc)       # ImageNet-C blocks, gradients, inference time
    lines += _runs_section(doc)
    return "\n".join(lines).rstrip() + "\n"


def _fits_section(fits: dict) -> list[str]:
    """How the fitted baselines' parameters were fitted, per evaluated cache."""
    if not fits:
        return []
    specs = {n: TABLE[n].fitted for n in FITTED}
    lines = ["## Fitted post-hoc baselines", "",
             and_join([s.how for s in specs.values()]) + " fitted on held-out rows of the "
             "classifier's training cache, never on the evaluated split:", "",
             "| " + " | ".join(["evaluated cache", "training cache", "held-out rows",
                                *(s.symbol for s in specs.values())]) + " |",
             "|" + "---|" * (3 + len(specs))]
    for cache, f in fits.items():
        if "reason" in f:
            empty = " |" * (len(specs) - 1)          # the other parameters' cells
            lines.append(f"| `{cache}` | — | — | not fitted: {f['reason']} |{empty}")
            continue
        why = f.get("undefined", {})
        cells = [s.display(f[n]) if f.get(n) else f"n/a: {why.get(n, '')}"
                 for n, s in specs.items()]
        lines.append(f"| `{cache}` | `{f['train_cache']}` | {f['rows']} | " + " | ".join(cells)
                     + " |")
    return lines + [""]


def _trust_section(trust: dict) -> list[str]:
    """TrustScore's fits (per training cache) and why a cache has no TrustScore row."""
    lines = []
    for f in trust.get("fits", []):
        lines.append(f"- TrustScore: k = {f['k']}, alpha = {f['alpha']}, fitted on the "
                     f"{f['train_rows']} valid rows of `{f['train_cache']}` ({f['kept_rows']} "
                     f"kept by the density filter; {f['device']}, {f['fit_s']} s + "
                     f"{f['score_s']} s), scoring {len(f['scored'])} cache(s)")
    lines += [f"- note: {note}" for note in trust.get("notes", [])]
    return lines + [""] if lines else []


def _split_section(split: dict, tables: list[dict]) -> list[str]:
    tag = split["split"]
    excluded = sum(sum(r["excluded_rows"]) for r in split["rows"] if r["kind"] == "oracle")
    lines = ["", f"## Split `{tag}`", ""]
    if excluded:
        lines += [f"{excluded} undecodable row(s) (valid == 0) excluded over this split's oracle "
                  "outputs (per run in the Runs section).", ""]
    for row in split["rows"]:
        for warning in row["warnings"]:
            lines.append(f"- warning, {row['oc']} {row['display_loss']}: {warning}")
    for table in tables:
        lines += [T.markdown_table(table), ""]
    return lines + _figures_section(split["figures"])


def _verdicts_section(doc: dict, families: list[dict]) -> list[str]:
    """Each question's verdicts on one split: the primary metric's difference, its interval and
    Holm-adjusted p-value, the verdict, the other metrics' verdicts where they disagree."""
    if not families:
        return []
    primary = doc["primary"].upper()
    better = "higher" if higher_is_better(doc["primary"], "standard") else "lower"
    lines = ["### Verdicts", "",
             f"Decided on {primary} ({better} is better), {doc['method']}; α = {doc['alpha']}. "
             f"Differences a − b ×10³; interval: 95%, over what `covers` names.", ""]
    for fam in families:
        c = fam["counts"]
        lines += [f"**{fam['text']}**: better {c['better']}, no clear difference "
                  f"{c['no clear difference']}, worse {c['worse']} (of "
                  f"{len(fam['comparisons'])}).", "",
                  f"| a | b | training | fits | seeds (a / b) | Δ{primary} [95%] | p (Holm) | "
                  "verdict | other metrics | covers |", "|" + "---|" * 10]
        for e in fam["comparisons"]:
            m = e["metrics"][doc["primary"]]
            ci = f"[{1e3 * m['ci'][0]:+.2f}, {1e3 * m['ci'][1]:+.2f}]" if m["ci"] else "—"
            delta = f"{1e3 * m['delta']:+.2f} {ci}" if m["delta"] is not None else "—"
            p = f"{m['p_holm']:.3g}" if m.get("p_holm") is not None else "—"
            others = "; ".join(f"{k.upper()}: {e['metrics'][k]['verdict']}" for k in e["disagree"])
            seeds = " / ".join(",".join(map(str, s)) for s in e["seeds"])
            lines.append(f"| {e['a']} | {e['b']} | {e['training']} | {e['fits']} | {seeds} | "
                         f"{delta} | {p} | {e['verdict'] or '—'} | {others or 'agree'} | "
                         f"{e['covers']} |")
        lines += [""] + [f"- not compared: {r['a']} against {r['b']}: {r['why']}"
                         for r in fam["refused"]]
        chosen = fam.get("selected")
        if chosen:
            value = chosen[f"heldout_{doc['primary']}"]
            lines.append(f"- chosen on held-out rows (the runs' held-out training rows, never this "
                         f"split): **{chosen['scorer']}**, held-out {primary} "
                         f"{1e3 * value:.2f} ×10⁻³; here: {chosen['verdict'] or '—'}")
        if any(e["covers"] == "rows" for e in fam["comparisons"]):
            lines.append("- where `covers` is rows only, each side has one seed of one classifier "
                         "fit: the interval leaves the spread between seeds and fits out.")
        lines.append("")
    return lines


def _figures_section(figs: dict) -> list[str]:
    """Every figure of the split, one line each saying what it shows (figplan.py's order)."""
    if not figs.get("list"):
        return []
    notes = ["Risk–coverage: the risk axis is scaled to the curves (--rc-full-range for 0-1)."]
    if figs["histograms"]:
        notes.insert(0, "Histograms: the oracle's confidence on the correct predictions, "
                        "filled (TP accepted / FN rejected), and on the wrong ones, outlined (TN "
                        "rejected / FP accepted); dashed: threshold 0.5, dotted: TCP's 1/K, green "
                        "dash-dot: the 95%-TPR working point.")
    lines = ["### Figures", "", " ".join(notes), ""]
    lines += [f"- [{Path(f['path']).name}]({f['path']}): {f['shows']}" for f in figs["list"]]
    return lines + [""]


def _runs_section(doc: dict) -> list[str]:
    lines = ["", "## Runs", "", "| split | ⟨O,C⟩ | loss | group | seed | rows | excluded | "
             "status | source |", "|---|---|---|---|---|---|---|---|---|"]
    for e in doc["evaluations"]:
        if e["kind"] != "oracle":
            continue
        lab = e["labels"]
        lines.append(f"| {e['split']} | ⟨{lab['oracle']}, {lab['classifier']}⟩ | "
                     f"{lab['loss_label']} | {lab['group']} | {lab['seed']} | {e['valid_rows']} | "
                     f"{e['excluded_rows']} | {_status(e)} | `{e['source']}` |")
    caches = sorted({(e["cache"], e["split"]) for e in doc["evaluations"] if e["kind"] == "baseline"})
    if caches:
        lines += ["", "Classifier caches (post-hoc baselines):", ""]
        lines += [f"- `{path}` (split {tag})" for path, tag in caches]
    return lines


def _status(evaluation: dict) -> str:
    if evaluation.get("repeat_of"):
        return f"not counted (repeat of seed {evaluation['labels']['seed']})"
    return evaluation.get("status") or ""
