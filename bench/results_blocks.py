"""The results page's blocks drawn with the report's own table renderers
(pipeline/report/tables.py): the paired tables, the small-scale table, learned against post-hoc,
head-only against fine-tuned, the sweep, the figures and the full tables."""
from __future__ import annotations

from bench.results_format import (
    BROADCAST, CLASSIFIERS, FAMILIES, PER_SAMPLE, POSTHOC, _best_learned, _c, _classifiers, _cmp,
    _family, _oc, _one, _order, _report_cell, _report_delta, _rows, _side, _split, _split_name,
    _table, _tally, _versus_of, fmt, fmt_delta)
from pipeline.report import tables as T


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


