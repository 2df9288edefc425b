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
page's summaries, verdicts and the sweep are rendered from the extract.

Where each part lives: the extract in bench/results_extract.py; the claims, answers and
verdicts in bench/results_claims.py; the blocks drawn with the report's renderers, the sweep
and the figures in bench/results_blocks.py; the pretrained-oracle section in
bench/results_pretrained.py; the names, lookups and formatting they share in
bench/results_format.py.  This module: the page's source, summary, run and classifier blocks,
the markers, and the command.

Lives beside bench/runbook_table.py, the other script that writes marked blocks of the docs from
recorded measurements (tests/test_results_page.py checks the page, as tests/test_rehearse.py
checks runbook_table's).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

if str(Path(__file__).resolve().parents[1]) not in sys.path:   # run as a script: the
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # project's packages on the path

from bench.results_blocks import (  # noqa: E402
    block_figures, block_full_tables, block_head_only, block_paired, block_small_scale,
    block_sweep, block_versus)
from bench.results_claims import block_answers, block_verdicts  # noqa: E402
from bench.results_extract import extract, summary_text  # noqa: E402
from bench.results_format import (  # noqa: E402,F401 (sha256: the page's, for its tests)
    BEGIN, COMMAND, END, FIGURES, PAGE, ROOT, SCHEMA, SUMMARY, Refused, _best_learned, _c,
    _classifiers, _cmp, _list, _machine_text, _oc, _one, _order, _short_split, _side,
    _split_name, _table, _tally, fmt, fmt_delta, sha256)


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



BLOCKS = {"source": block_source, "answers": block_answers, "summary": block_summary,
          "what-was-run": block_run, "classifiers": block_classifiers,
          "verdicts": block_verdicts, "paired": block_paired, "small-scale": block_small_scale,
          "versus": block_versus, "head-only": block_head_only, "sweep": block_sweep,
          "figures": block_figures, "full-tables": block_full_tables}


def prepared(summary: dict) -> dict:
    """The extract as the block renderers read it: what the committed file holds (a copy), each
    row knowing its split's columns."""
    s = json.loads(summary_text(summary))
    for split in s["splits"]:
        for row in split["rows"]:
            row["_columns"] = split["columns"]
    return s


def render(summary: dict) -> dict[str, str]:
    """Every block's text, from the extract alone."""
    s = prepared(summary)
    return {name: fn(s).rstrip() for name, fn in all_blocks(s).items()}


def all_blocks(summary: dict | None = None) -> dict:
    """The page's blocks, and the pretrained-oracle section's (bench/results_pretrained.py)
    where the run has that grid (``summary``; None: the committed extract's)."""
    from bench import results_pretrained
    summary = load_summary() if summary is None else summary
    return {**BLOCKS, **(results_pretrained.BLOCKS if summary.get("pretrained") else {})}


# --------------------------------------------------------------------------------- page --
def blocks_of(text: str, names, where: Path = PAGE) -> dict[str, str]:
    """{name: the text between its markers} of a page (``where``), for each of ``names``."""
    out = {}
    for name in names:
        b, e = BEGIN.format(name), END.format(name)
        if text.count(b) != 1 or text.count(e) != 1 or text.index(b) > text.index(e):
            raise Refused(f"{where.relative_to(ROOT)}: block {name!r} needs exactly one '{b}' "
                          f"followed by one '{e}'")
        out[name] = text[text.index(b) + len(b):text.index(e)].strip("\n")
    return out


def rewrite(text: str, rendered: dict[str, str], where: Path = PAGE) -> str:
    blocks_of(text, rendered, where)     # every marker present, once
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


def _pretrained_only(root: Path, note: str | None) -> int:
    """--pretrained ROOT: the committed extract with its pretrained part extracted anew."""
    from bench import results_pretrained
    summary = load_summary()
    study = results_pretrained.extract(root, note)
    if study is None:
        raise Refused(f"{root}: no pretrained/report/report.json (run `cli.py demo --full "
                      "--pretrained-only` first)")
    summary["pretrained"] = study
    page = rewrite(PAGE.read_text(), render(summary))      # markers checked before writing
    SUMMARY.write_text(summary_text(summary))
    PAGE.write_text(page)
    print(f"wrote the pretrained part of {SUMMARY.relative_to(ROOT)} and "
          f"{len(results_pretrained.BLOCKS)} block(s) of {PAGE.relative_to(ROOT)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--report", type=Path, help="a report folder (or its report.json) of one "
                    "`cli.py demo --full` run: extract it, copy its figures, rewrite the page")
    ap.add_argument("--note", help="what the run's files do not record (e.g. how it was "
                    "invoked), printed under 'What was run'")
    ap.add_argument("--pretrained", type=Path, metavar="ROOT", help="an artifacts root "
                    "(artifacts/fashion-mnist) whose pretrained/report holds a pretrained study "
                    "(`cli.py demo --full --pretrained-only`): extract it in place of the "
                    "extract's pretrained part and rewrite the page; the rest of the extract "
                    "is kept")
    ap.add_argument("--pretrained-note", help="what the pretrained study's files do not "
                    "record (printed in that section's source)")
    ap.add_argument("--check", action="store_true", help="exit 1 when the page's generated "
                    "blocks differ from docs/results/summary.json's rendering")
    args = ap.parse_args(argv)
    try:
        if args.report and args.check:
            raise Refused("--check compares the page with the committed extract: no --report")
        if args.note and not args.report:
            raise Refused("--note describes the run of --report: pass both")
        if args.pretrained_note and not (args.report or args.pretrained):
            raise Refused("--pretrained-note describes the study of --report or --pretrained: "
                          "pass one")
        if args.pretrained:
            return _pretrained_only(args.pretrained, args.pretrained_note)
        if args.report:
            previous = load_summary() if SUMMARY.exists() else None
            summary = extract(args.report, args.note, args.pretrained_note)
            SUMMARY.parent.mkdir(parents=True, exist_ok=True)
            page = rewrite(PAGE.read_text(), render(summary))   # markers checked before writing
            SUMMARY.write_text(summary_text(summary))
            copy_figures(summary, previous)
            PAGE.write_text(page)
            from bench import readme_blocks         # README.md's headline counts, from the same
            if readme_blocks.main([], summary) != 0:   # extract
                raise Refused("README.md's generated blocks could not be written")
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
