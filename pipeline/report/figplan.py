"""Which figures a report draws, their files and the one line saying what each shows.

Each figure answers one question at a glance: per split and <O,C>,
- ``histograms_<O-C>_<split>.png``: the paper's Fig. 3 layout, the fine-tuned oracles' TP / FN /
  TN / FP histograms, one panel per loss (CE, Focal, TCP, SS);
- ``histograms_<O-C>_variants_<split>.png``: the same for every other training variant
  (broadcast, head-only, ...), one row per variant; where no plain fine-tuned oracle was drawn
  and one variant was, its figure is named after it (``histograms_<O-C>_head-only_<split>.png``);
- ``risk_coverage_<O-C>_<split>.png``: fine-tuned oracles, head-only oracles and the post-hoc
  baselines in separate panels on shared axes, at most ``figures.MAX_CURVES`` curves each.
The lowest seed of each group is drawn; the i-th seed of every group in ``..._run<i>`` files.
"""
from __future__ import annotations

from pathlib import Path

from cache.reader import slug
from pipeline.report import figures as F
from pipeline.report.baselines import REFERENCE, TABLE
from pipeline.report.rows import Row

HEAD_ONLY = "head-only"
VARIANT_ROWS = 3          # variant rows per histogram figure: a page's height


def plan_figures(splits: dict[str, list[Row]], out: Path, full_range: bool = False
                 ) -> tuple[list, dict]:
    """(drawing calls for ``run.parallel``, {split: index}); an index holds "histograms" (paths),
    "risk_coverage" ({<O,C>: path}) and "list" ([{"path", "shows"}], report.md's order)."""
    calls, index = [], {}
    for tag, rows in splits.items():
        entry = index[tag] = {"histograms": [], "risk_coverage": {}, "list": []}
        oracle_rows = [r for r in rows if r.kind == "oracle"]
        with_oracle = {r.classifier for r in oracle_rows}
        for oc in dict.fromkeys(r.oc for r in rows):
            block = [r for r in rows if r.oc == oc]
            if block[0].kind == "baseline" and block[0].classifier in with_oracle:
                continue      # drawn in the baselines' panel of every <O, C> of this classifier
            baselines = [r for r in rows if r.kind == "baseline"
                         and r.classifier == block[0].classifier]
            figs = _histogram_figures(tag, oc, [r for r in block if r.kind == "oracle"], out)
            figs += _rc_figure(tag, oc, [r for r in block if r.kind == "oracle"], baselines,
                               out, full_range)
            for kind, path, shows, call in figs:
                calls.append(call)
                if kind == "histograms":
                    entry["histograms"].append(str(path))
                else:
                    entry["risk_coverage"][oc] = str(path)
                entry["list"].append({"path": str(path), "shows": shows})
    return calls, index


def relative(entry: dict, rel) -> dict:
    """An index entry with every path passed through ``rel`` (report.json's relative paths)."""
    return {"histograms": [rel(p) for p in entry["histograms"]],
            "risk_coverage": {k: rel(v) for k, v in entry["risk_coverage"].items()},
            "list": [{**f, "path": rel(f["path"])} for f in entry["list"]]}


def _variant_key(variant: str) -> tuple:
    """Fine-tuned before head-only, the plain loss first within each."""
    return HEAD_ONLY in variant.split("+"), variant != "" and variant != HEAD_ONLY, variant


def _form(variant: str) -> str:
    """The variant without "head-only": the loss's form (broadcast, linear z, ...)."""
    return "+".join(t for t in variant.split("+") if t and t != HEAD_ONLY)


def _variant_name(variant: str) -> str:
    return ", ".join(variant.split("+")) if variant else "fine-tuned"


def _histogram_figures(tag: str, oc: str, rows: list[Row], out: Path) -> list[tuple]:
    """Per seed rank: the plain fine-tuned losses' figure (Fig. 3) and the other variants'."""
    by_variant: dict[str, list[Row]] = {}
    for r in sorted(rows, key=lambda r: _variant_key(r.variant)):
        by_variant.setdefault(r.variant, []).append(r)
    name = slug(oc.strip("⟨⟩"))
    figs = []
    for i in range(max((r.n for r in rows), default=0)):
        which = "lowest seed of each group" if i == 0 else f"run {i + 1} of each group"
        suffix = "" if i == 0 else f"_run{i + 1}"
        panels = {v: [{"title": f"{r.display_loss}, seed {r.members[i]['labels']['seed']}",
                       "hist": r.members[i]["hist"]} for r in group if r.n > i]
                  for v, group in by_variant.items()}
        panels = {v: p for v, p in panels.items() if p}
        other = "" in panels     # the plain losses' figure: the rest are the "other" variants
        if other:
            path = out / "figures" / f"histograms_{name}_{slug(tag)}{suffix}.png"
            title = f"{oc}, split {tag}: fine-tuned oracles, one panel per loss ({which})"
            figs.append(("histograms", path,
                         f"{oc}: TP / FN / TN / FP histograms of the fine-tuned oracles' "
                         f"confidence, one panel per loss (paper Fig. 3 layout), {which}",
                         (F.draw_histograms, ([panels.pop("")], str(path), title))))
        figs += _variant_figures(panels, tag=tag, oc=oc, name=name, suffix=suffix, which=which,
                                 out=out, other=other)
    return figs


def _variant_figures(panels: dict, *, tag: str, oc: str, name: str, suffix: str, which: str,
                     out: Path, other: bool) -> list[tuple]:
    """The variants' histograms, one row per variant, VARIANT_ROWS rows a figure.  ``other``:
    beside the plain losses' figure.  Without it they are this seed rank's only histograms,
    neither "the other" variants nor, when there is one variant, "variants": that figure is
    named and described after its variant (``histograms_<O-C>_head-only_<split>.png``)."""
    variants = list(panels)
    if not other and len(variants) == 1:
        v = _variant_name(variants[0])
        path = out / "figures" / f"histograms_{name}_{slug(variants[0])}_{slug(tag)}{suffix}.png"
        title = f"{oc}, split {tag}: training variant {v}, one panel per loss ({which})"
        return [("histograms", path,
                 f"{oc}: TP / FN / TN / FP histograms of the oracles' confidence, training "
                 f"variant {v}, one panel per loss, {which}",
                 (F.draw_histograms, ([panels[variants[0]]], str(path), title)))]
    figs = []
    for k in range(0, len(variants), VARIANT_ROWS):
        part = variants[k:k + VARIANT_ROWS]
        more = "" if k == 0 else str(k // VARIANT_ROWS + 1)
        path = out / "figures" / f"histograms_{name}_variants{more}_{slug(tag)}{suffix}.png"
        names = "; ".join(_variant_name(v) for v in part)
        title = f"{oc}, split {tag}: one row per training variant ({which})"
        shows = (f"the same histograms for the other training variants ({names})" if other else
                 f"TP / FN / TN / FP histograms of the oracles' confidence per training variant "
                 f"({names})")
        figs.append(("histograms", path, f"{oc}: {shows}, one row per variant, {which}",
                     (F.draw_histograms, ([panels[v] for v in part], str(path), title))))
    return figs


def _rc_figure(tag: str, oc: str, rows: list[Row], baselines: list[Row], out: Path,
               full_range: bool) -> list[tuple]:
    """One figure of panels: fine-tuned oracles, head-only oracles (each with MCP as the
    reference), post-hoc baselines; a panel over MAX_CURVES curves is split (``_by_form``)."""
    def curve(r, **extra):
        return {"label": r.display_loss, "baseline": r.kind == "baseline",
                "loss": r.loss, "form": _form(r.variant), **r.members[0]["rc"], **extra}

    drawn = [r for r in baselines if r.members[0]["rc"] is not None]  # None: unfitted
    ref = TABLE[REFERENCE].label       # MCP: what the paired comparisons compare SS with
    mcp = [curve(r, label=f"{ref} (reference)", reference=True) for r in drawn
           if r.loss == REFERENCE]
    panels = []
    for head_only, what in ((False, "fine-tuned oracles"),
                            (True, "head-only oracles (frozen backbone, head on its features)")):
        group = [curve(r) for r in rows if (HEAD_ONLY in r.variant.split("+")) == head_only]
        chunks = _by_form(group, F.MAX_CURVES - len(mcp))
        for chunk in chunks:
            forms = dict.fromkeys(c["form"].replace("+", ", ") or "plain" for c in chunk)
            part = f" ({', '.join(forms)})" if len(chunks) > 1 else ""
            panels.append({"name": what.split(" (")[0], "curves": chunk + mcp,
                           "title": what + part + (f"; dotted: {ref}, the classifier's own "
                                                   "confidence" if mcp else "")})
    chunks = _chunks([curve(r, reference=r.loss == REFERENCE) for r in drawn], F.MAX_CURVES)
    for k, chunk in enumerate(chunks):
        part = f" ({k + 1}/{len(chunks)})" if len(chunks) > 1 else ""
        panels.append({"name": "post-hoc baselines", "curves": chunk,
                       "title": "post-hoc baselines (the classifier's logits only)" + part})
    if not panels:
        return []
    path = out / "figures" / f"risk_coverage_{slug(oc.strip('⟨⟩'))}_{slug(tag)}.png"
    shows = ", ".join(dict.fromkeys(p["name"] for p in panels))
    return [("risk_coverage", path,
             f"{oc}: risk–coverage, one panel each: {shows}; AURC in the legends, lowest seed",
             (F.draw_rc_panels, (panels, str(path),
                                 f"Risk–coverage {oc}, split {tag} (lowest seed)", full_range)))]


def _by_form(curves: list[dict], size: int) -> list[list[dict]]:
    """Panels of at most ``size`` curves, a form's curves (all broadcast ones, ...) kept in one
    panel where they fit, the plain losses first; a form with more curves than fit is split."""
    forms: dict[str, list[dict]] = {}
    for c in sorted(curves, key=lambda c: c["form"] != ""):
        forms.setdefault(c["form"], []).append(c)
    panels: list[list[dict]] = []
    for same in forms.values():
        for part in _chunks(same, size):
            if panels and len(panels[-1]) + len(part) <= size:
                panels[-1] += part
            else:
                panels.append(part)
    return panels


def _chunks(curves: list[dict], size: int) -> list[list[dict]]:
    """Consecutive panels of at most ``size`` curves, as even as possible."""
    if not curves:
        return []
    n = -(-len(curves) // size)
    per = -(-len(curves) // n)
    return [curves[i:i + per] for i in range(0, len(curves), per)]
