"""``cli.py report``: options -> ``ReportConfig`` -> one ``report`` call.  Imports no torch."""
from __future__ import annotations

import click

from pipeline.core.commandline import Command, options
from pipeline.core.options import Opt
@click.command(cls=Command)
@click.argument("paths", nargs=-1, type=click.Path(path_type=str))
@options(
    Opt(("--runs-root",), type=click.Path(path_type=str), group="data", help="Directory "
        "searched (recursively) for run directories.", default_text="with no RUN_DIR or --cache: the runs/ of the one "
        "artifacts root under ./artifacts that holds runs (several: refused, listed)"),
    Opt(("--cache", "caches"), type=click.Path(path_type=str), multiple=True, group="data",
        help="Classifier cache directory or "
        "cache root (repeatable): post-hoc baseline rows (MCP, temperature-scaled MSP, entropy, "
        "max logit, MaxLogit-pNorm, energy, DOCTOR, REL-U, TrustScore; T, p and REL-U's matrix "
        "are fitted on the training cache's held-out rows, TrustScore on its features, so pass "
        "its cache too if it moved) and where to find caches that moved since the runs were "
        "trained.", default_text="none beyond the caches the runs recorded"),
    Opt(("--split", "splits"), multiple=True, group="data", help="Only these split tags "
        "(repeatable).", default_text="every split"),
    Opt(("--metrics",), type=click.Choice(["paper", "standard", "both"]), default="both",
        group="protocol", help="paper: the authors' definitions; standard: exact FPR95, negated "
        "AUPR-Error, AURC/E-AURC/AUGRC; both: every table twice (docs/METRICS.md)."),
    Opt(("--no-ci",), is_flag=True, group="protocol", help="No bootstrap intervals (and no "
        "paired intervals)."),
    Opt(("--resamples",), default=1000, type=click.IntRange(0), group="protocol", hidden=True,
        help="Bootstrap resamples for the 95% intervals (0: none, as --no-ci)."),
    Opt(("--ci-seed",), default=0, type=click.IntRange(0), group="protocol", hidden=True,
        help="Seed of the bootstrap resamples."),
    Opt(("--trust-score/--no-trust-score", "trust_score"), group="protocol", help="TrustScore "
        "(Jiang et al. 2018) rows from the classifier's features of its training split; "
        "--trust-score: required (an error where it cannot be computed).",
        default_text="computed where the caches have features (extract --features), else left "
        "out with a note"),
    Opt(("--trust-score-k",), type=click.IntRange(1), group="protocol", default_text="10",
        help="TrustScore's k: a training row's density is the distance to its k-th neighbour in "
        "its class. Giving it requires TrustScore."),
    Opt(("--trust-score-alpha",), type=click.FloatRange(0.0, 1.0), group="protocol",
        default_text="0, none", help="TrustScore's alpha: the fraction of each class's "
        "training rows of lowest density left out. Giving it requires TrustScore."),
    Opt(("--out",), group="output", metavar="DIR", help="Report directory.",
        default_text="<artifacts root>/report, the root the runs recorded (for caches only: the "
        "root they lie in)"),
    Opt(("--report-format", "formats"), aliases=("--format",), multiple=True, group="output",
        type=click.Choice(["md", "csv", "latex", "json"]), help="Output format(s) (repeatable).",
        default_text="all four"),
    Opt(("--no-figures",), is_flag=True, group="output", help="Skip the PNG figures."),
    Opt(("--ci-in-tables",), is_flag=True, group="output", help="Also print the intervals in "
        "report.md and report.tex (they are always in report.csv and report.json)."),
    Opt(("--rc-full-range",), is_flag=True, group="output", help="Risk-coverage plots on "
        "selective risk 0-1 instead of an axis scaled to the curves."),
    Opt(("--export", "export"), multiple=True, type=click.Choice(["fd-shifts"]), group="output",
        default_text="none", help="Also write the inputs of another tool's analysis: fd-shifts "
        "= one experiment per run (its held-out rows + evaluated splits, <out>/fd-shifts; "
        "docs/METRICS.md)."),
    Opt(("--jobs",), default=0, type=click.IntRange(0), group="runtime", hidden=True,
        help="Parallel worker processes (0: one per CPU core, at most one per file)."),
    Opt(("--knn-device",), group="runtime", default_text="cpu", help="Where TrustScore's exact "
        "nearest-neighbour search runs: cpu (numpy) or a torch device such as cuda (loads torch; "
        "for ImageNet-sized training splits). Giving it requires TrustScore."),
)
def report(paths, runs_root, metrics, formats, out, caches, splits, jobs, no_figures, resamples,
           no_ci, ci_seed, ci_in_tables, rc_full_range, export, trust_score, trust_score_k,
           trust_score_alpha, knn_device):
    """Stage 3: tables (paper Table 1 / A4), figures and post-hoc baselines from run directories
    (RUN_DIR ... or a directory of runs) and classifier caches; no model is loaded.

    \b
    A bare `report` (no RUN_DIR, --runs-root or --cache) reads the runs of the
    data you worked on. Each dataset has one artifacts root, ./artifacts/<name of
    the --data folder> (artifacts/fashion-mnist for the embedded dataset). If one
    root holds runs, its runs/ is read (and named); if several do, the report
    stops and lists them: pick one with --runs-root artifacts/<name>/runs; if
    none does, it says so. The report goes to the runs' root: <root>/report."""
    # Imported on call: a command loads only its own stage.
    from pipeline.report.run import FORMATS, ReportConfig, report as run_report
    from pipeline.report.trustscore import TrustSpec

    given = [f"--{n}" for n, v in (("trust-score-k", trust_score_k), ("knn-device", knn_device),
                                   ("trust-score-alpha", trust_score_alpha)) if v is not None]
    if trust_score is False and given:
        raise click.UsageError(f"{', '.join(given)} given with --no-trust-score: drop one")
    chosen = {k: v for k, v in (("k", trust_score_k), ("alpha", trust_score_alpha),
                                ("device", knn_device)) if v is not None}
    spec = None if trust_score is False else TrustSpec(**chosen,
                                                       requested=bool(trust_score or given))

    cfg = ReportConfig(paths=tuple(paths), runs_root=runs_root, caches=tuple(caches),
                       metrics=metrics, formats=tuple(formats) or FORMATS, out=out,
                       splits=tuple(splits), jobs=jobs, figures=not no_figures,
                       resamples=0 if no_ci else resamples, ci_seed=ci_seed,
                       ci_in_tables=ci_in_tables, rc_full_range=rc_full_range,
                       export=tuple(export), trust_score=spec)
    s = run_report(cfg)
    if s["found_runs_root"]:
        click.echo(f"report: read {s['found_runs_root']}, the only artifacts root's runs/ under "
                   "./artifacts (pick another with --runs-root)")
    for skipped in s["skipped"]:
        click.echo(f"skipped {skipped['run_dir']}: {skipped['reason']}", err=True)
    for note in s["notes"]:
        click.echo(f"note: {note}", err=True)
    click.echo(f"report: {s['outputs']} output file(s) from {s['runs']} run(s), {s['caches']} "
               f"classifier cache(s), {s['groups']} table row(s) over split(s) "
               f"{', '.join(s['splits'])} in {s['elapsed_s']:.1f}s")
    for path in s["files"]:
        click.echo(f"  wrote {path}")
