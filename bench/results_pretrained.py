"""docs/RESULTS.md, "With a pretrained oracle": the blocks drawn from the pretrained-oracle grid
of the same `cli.py demo --full` run (``<root>/pretrained/report``, beside the demo's report).

bench/results_page.py extracts that report into summary.json's ``pretrained`` (the same shape
as the page's own extract: rows, paired comparisons, versus the post-hoc scores, sweeps) and
renders these blocks with the rest; the from-scratch rows they are set against are the page's.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from bench import results_format as R
from bench.results_blocks import full_tables
from bench.results_extract import extract as extract_report

ORACLE = "lite0-in1k"
LOSSES = ("ce", "focal", "tcp", "ss")


def extract(root: Path, note: str | None = None) -> dict | None:
    """The extract of ``<root>/pretrained/report`` (None where the run has no such grid);
    ``note``: what that grid's files do not record (how it was invoked)."""
    path = root / "pretrained" / "report" / "report.json"
    if not path.exists():
        return None
    s = extract_report(path, note)
    return {k: s[k] for k in ("sources", "report", "machine", "fits", "splits", "sweeps")}


def check_same_classifiers(summary: dict, p: dict) -> None:
    """Refuse (results_page.Refused) a grid whose shared classifiers are not the page's: the
    section sets its rows against the page's, so vit and resnet must be the same fits scoring
    the same rows (a ``demo --pretrained-only`` after ``demo --full``, or one run of both).
    Compared, per shared classifier and split: the MCP row's cache identity (weights and data
    by content), its accuracy exactly, and its other metrics within ``_ROUNDING`` -- a cache
    extracted again on another GPU model holds the same predictions with logits rounded
    otherwise, which moves a ranking metric in its last shown digit.  (Not the held-out fits:
    their rows are the runs' common held-out rows, which another grid may carve otherwise.)"""
    bad = []
    for split in _evaluated(p):
        mine = R._split(summary, split["role"])
        for c in R._classifiers(split) if mine is not None else ():
            ours, theirs = _mcp(mine, c), _mcp(split, c)
            if ours is not None and theirs is not None and not _same_mcp(
                    _by_metric(ours, mine), _by_metric(theirs, split),
                    ours.get("identity"), theirs.get("identity")):
                bad.append(f"{c} MCP on {split['split']}")
    if bad:
        raise R.Refused("the pretrained grid's classifiers differ from this report's run ("
                        + "; ".join(bad) + "): run `cli.py demo --full --pretrained-only` in "
                        "the artifacts folder of the report's run (it reuses its fits and "
                        "caches), or `demo --full --pretrained-oracle` for both grids at once")


_ROUNDING = (0.02, 0.002)    # |a - b| <= max(absolute, relative * |a|), in display units


def _by_metric(row: dict, split: dict) -> dict:
    return {m: v[0] if isinstance(v, list) else v
            for m, v in zip(split["columns"]["standard"], row["standard"], strict=True)}


def _same_mcp(ours: dict, theirs: dict, our_id: dict | None, their_id: dict | None) -> bool:
    if our_id != their_id or ours.keys() != theirs.keys() or ours.get("acc") != theirs.get("acc"):
        return False
    return all((a is None) == (b is None) and (
        a is None or abs(a - b) <= max(_ROUNDING[0], _ROUNDING[1] * abs(a)))
        for a, b in ((ours[m], theirs[m]) for m in ours))


def _learned(split: dict, classifier: str) -> list[dict]:
    rows = [r for r in R._rows(split, kind="oracle", classifier=classifier)
            if r["oracle"] == ORACLE]
    return sorted(rows, key=lambda r: ("head-only" in r["variant"], LOSSES.index(r["loss"]),
                                       r["loss_label"]))


def _family(row: dict) -> str:
    return "head-only" if "head-only" in row["variant"] else "fine-tuned"


def _mcp_side(split: dict, row: dict, mcp: bool = True):
    return R._side(R._versus_of(split, row, mcp=mcp), "aurc")


def _evaluated(p: dict) -> list[dict]:
    """The grid's report splits that the page evaluates (test, shifted, adversarial)."""
    return [sp for sp in p["splits"] if sp["role"] != "other"]


def _mcp(split: dict, classifier: str) -> dict | None:
    return R._one(split, kind="baseline", classifier=classifier, loss="mcp")


def _ranked(split: dict, classifier: str) -> bool:
    """Whether the split has correct and incorrect predictions of ``classifier`` to rank (an
    attack that leaves no correct prediction leaves AUC undefined and every AURC at 1)."""
    return R._mean(_mcp(split, classifier), "auc") is not None


def _unranked(split: dict) -> str:
    gone = [f"{c}, {R.fmt(R._c(_mcp(split, c), 'acc'), 'acc')}% accurate"
            for c in R._classifiers(split) if not _ranked(split, c)]
    return (f"; not ranked, no correct and incorrect predictions to separate: {'; '.join(gone)}"
            if gone else "")


def block_source(s: dict) -> str:
    """Which invocation made the grid: the page's own (one demo.json), or a `--pretrained-only`
    run of its own (its demo.json beside its report), with its report's hash and machine."""
    p = s.get("pretrained")
    if p is None:
        return "No pretrained-oracle grid in this run."
    rep, demo = p["sources"]["report"], p["sources"]["demo"]
    text = (f"The section's runs come from `{rep['path']}` (sha256 `{rep['sha256'][:16]}…`, "
            f"created {rep['created']}); ")
    note = (f"\n\nNote (given when this page was generated): {p['sources']['note']}"
            if p["sources"].get("note") else "")
    if demo is None:
        return text + "the same invocation made them as the page's other sections." + note
    cfg = demo["config"]
    return text + (
        f"they were made by `{demo['command']}`, finished {demo['finished']} in "
        f"{demo['minutes']} min on " + R._machine_text(p.get("machine") or {}, demo["machine"])
        + f", seeds {R._list(demo['seeds'])}, losses {', '.join(cfg.get('losses', []))}, from "
        "the page's classifier fits scoring the page's rows: the same weights and data by "
        "their caches' identities, and their MCP rows agree on every split (accuracy exactly, "
        "the other metrics within a GPU's rounding), or this page would not have been "
        "generated. The section's MCP rows are its own report's." + note)


def block_answer(s: dict) -> str:
    """How the pretrained oracles fare against MCP, split by split, beside the from-scratch
    oracles of the same classifiers."""
    p = s.get("pretrained")
    if p is None:
        return "This run has no pretrained-oracle grid (`demo --pretrained-oracle`)."
    lines = []
    for split in _evaluated(p):
        scratch = R._split(s, split["role"])
        sides = {c: R._tally([_mcp_side(split, r) for r in _learned(split, c)])
                 for c in R._classifiers(split) if _ranked(split, c)}
        total = sum(sides.values(), Counter())
        text = (f"- **{R._split_name(split)}**: pretrained-oracle scorers against MCP on AURC: "
                f"{R._count_text(total)} (" + "; ".join(
                    f"{c}: {R._count_text(t)}" for c, t in sides.items() if t)
                + _unranked(split) + ")")
        if scratch is not None:
            old = R._tally([R._side(R._versus_of(scratch, r, mcp=True), "aurc")
                            for r in R._rows(scratch, kind="oracle")])
            text += f". The from-scratch scorers of vit and resnet: {R._count_text(old)}."
        lines.append(text)
    return "\n".join(lines)


def block_classifiers(s: dict) -> str:
    p = s.get("pretrained")
    if p is None:
        return "No pretrained-oracle grid in this run."
    head, rows = ["classifier"], []
    splits = _evaluated(p)
    head += [R._short_split(sp) for sp in splits]
    for c in R._classifiers(splits[0]):
        cells = [R.fmt(R._c(_mcp(sp, c), "acc"), "acc", ci=True) for sp in splits]
        rows.append([f"`{c}`", *cells])
    fit = (s["pretrained"].get("fits") or {}).get("lite0") or {}
    lines = ["Accuracy (%) of each classifier on the rows the oracles are scored on, "
             "[95% bootstrap interval]:", "", *R._table(head, rows)]
    if fit.get("temperature") is not None:
        lines += ["", f"lite0's fitted temperature: {fit['temperature']}."]
    return "\n".join(lines)


def block_table(s: dict) -> str:
    """Per split and classifier: every pretrained scorer's AUC and AURC with their intervals and
    its paired AURC difference from MCP and from the strongest post-hoc score."""
    p = s.get("pretrained")
    if p is None:
        return "No pretrained-oracle grid in this run."
    lines = []
    for split in _evaluated(p):
        lines += [f"**{R._split_name(split)}**", ""]
        head = ["C", "scorer", "AUC %", "AURC ×10³", "ΔAUC vs MCP", "ΔAURC ×10³ vs MCP",
                "ΔAUGRC ×10³ vs MCP", "ΔAURC ×10³ vs the strongest post-hoc score"]
        rows = []
        for c in R._classifiers(split):
            strongest = next((v["other"] for v in split["versus"] if v["strongest"]
                              and v["learned"]["classifier"] == c), None)
            mcp = _mcp(split, c)
            rows.append([f"`{c}`", "MCP", R.fmt(R._c(mcp, "auc"), "auc", ci=True),
                         R.fmt(R._c(mcp, "aurc"), "aurc", ci=True), "", "", "", ""])
            for r in _learned(split, c):
                vs = R._versus_of(split, r, mcp=True)
                rows.append([f"`{c}`", f"{r['display_loss']}",
                             R.fmt(R._c(r, "auc"), "auc", ci=True),
                             R.fmt(R._c(r, "aurc"), "aurc", ci=True),
                             *(R.fmt_delta(vs, m) for m in ("auc", "aurc", "augrc")),
                             R.fmt_delta(R._versus_of(split, r, mcp=False), "aurc")
                             + (f" ({strongest})" if strongest else "")])
        lines += [*R._table(head, rows), ""]
    return "\n".join(lines).rstrip()


def block_losses(s: dict) -> str:
    """Which loss gives the lowest AURC per classifier and split, and SS's paired differences
    from CE, focal and TCP (fine-tuned, the paper's slopes)."""
    p = s.get("pretrained")
    if p is None:
        return "No pretrained-oracle grid in this run."
    lines, tally = [], Counter()
    for split in _evaluated(p):
        best = []
        for c in [c for c in R._classifiers(split) if _ranked(split, c)]:
            learned = [r for r in _learned(split, c) if R._mean(r, "aurc") is not None]
            if learned:
                b = min(learned, key=lambda r: R._mean(r, "aurc"))
                best.append(f"{c}: {b['display_loss']}" + ("" if _family(b) == "head-only"
                                                              else " (fine-tuned)"))
            for other in R.PER_SAMPLE:
                cmp = R._cmp(split, R._oc(ORACLE, c), "SS", other)
                for m in ("auc", "aurc"):
                    side = R._side(cmp, m)
                    if side:
                        tally[(split["role"], m, side)] += 1
        lines.append(f"- {R._split_name(split)}: lowest AURC — " + "; ".join(best)
                     + _unranked(split) + ".")
    lines += ["", "SS (fine-tuned, the paper's slopes) against CE, focal and TCP of the same "
              "pretrained oracle, paired differences:", ""]
    for role in ("test", "shifted", "adversarial"):
        for m in ("auc", "aurc"):
            t = Counter({k[2]: v for k, v in tally.items() if k[:2] == (role, m)})
            if t:
                lines.append(f"- {role}, {m.upper()}: SS {R._count_text(t)}.")
    return "\n".join(lines)


def block_versus_scratch(s: dict) -> str:
    """Per split, classifier and loss (fine-tuned, the paper's slopes): the from-scratch oracle
    of the classifier's own backbone (the page's ⟨C, C⟩) and the pretrained oracle, each as its
    paired AURC difference from the same classifier's MCP."""
    p = s.get("pretrained")
    if p is None:
        return "No pretrained-oracle grid in this run."
    head = ["split", "C", "loss", "from scratch ⟨C, C⟩: ΔAURC ×10³ vs MCP",
            f"pretrained ⟨{ORACLE}, C⟩: ΔAURC ×10³ vs MCP"]
    rows = []
    for split in _evaluated(p):
        scratch = R._split(s, split["role"])
        for c in R._classifiers(scratch) if scratch is not None else ():
            for loss in LOSSES:
                old = R._one(scratch, kind="oracle", oracle=c, classifier=c, loss=loss, variant="")
                new = R._one(split, kind="oracle", oracle=ORACLE, classifier=c, loss=loss,
                             variant="")
                if old is None or new is None or not _ranked(split, c):
                    continue
                rows.append([R._short_split(split), f"`{c}`", new["display_loss"],
                             R.fmt_delta(R._versus_of(scratch, old, mcp=True), "aurc"),
                             R.fmt_delta(R._versus_of(split, new, mcp=True), "aurc")])
    return "\n".join(R._table(head, rows)) if rows else "No classifier in both grids."


def block_sweeps(s: dict) -> str:
    p = s.get("pretrained")
    if p is None or not p["sweeps"]:
        return "No pretrained-oracle sweep in this run."
    slopes = ("alpha_pos", "alpha_neg")
    rows = [[f"`{sw['oc']}`", " / ".join(f"{sw['fixed'].get(k):g}" for k in slopes),
             " / ".join(f"{sw['chosen'].get(k, sw['fixed'].get(k)):g}" for k in slopes),
             sw["criterion"]] for sw in p["sweeps"]]
    head = ["sweep (oracle-classifier)", "paper's α+ / α−", "chosen α+ / α−",
            "criterion (held-out rows)"]
    return "\n".join(R._table(head, rows))


def block_full_tables(s: dict) -> str:
    p = s.get("pretrained")
    if p is None:
        return "No pretrained-oracle grid in this run."
    return full_tables(p["splits"], heading="### Pretrained oracles, split")


BLOCKS = {"pretrained-source": block_source, "pretrained-answer": block_answer,
          "pretrained-classifiers": block_classifiers, "pretrained-table": block_table,
          "pretrained-losses": block_losses, "pretrained-sweeps": block_sweeps,
          "pretrained-versus-scratch": block_versus_scratch,
          "pretrained-full-tables": block_full_tables}
