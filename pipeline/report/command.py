"""``cli.py report``: options -> ``ReportConfig`` -> one ``report`` call.  Imports no torch."""
from __future__ import annotations

import click


@click.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=str))
@click.option("--runs-root", default=None, help="Directory searched (recursively) for run "
              "directories. Default, when no RUN_DIR/--cache is given: the runs/ of the one "
              "artifacts root under ./artifacts that holds runs (several: refused, listed).")
@click.option("--metrics", type=click.Choice(["paper", "standard", "both"]), default="both",
              show_default=True, help="paper: the authors' definitions; standard: exact FPR95, "
              "negated AUPR-Error, AURC/E-AURC/AUGRC; both: every table twice (docs/METRICS.md).")
@click.option("--format", "formats", multiple=True, type=click.Choice(["md", "csv", "latex", "json"]),
              help="Output format(s) (repeatable). Default: all four.")
@click.option("--out", default=None, help="Report directory. Default: <artifacts root>/report, the "
              "root the runs recorded (for caches only: the root they lie in).")
@click.option("--cache", "caches", multiple=True, help="Classifier cache directory or cache root "
              "(repeatable): post-hoc baseline rows (MCP, temperature-scaled MSP, entropy, max logit, "
              "MaxLogit-pNorm, energy, DOCTOR, REL-U, TrustScore; T, p and REL-U's matrix are "
              "fitted on the training cache's held-out rows, TrustScore on its features, so "
              "pass its cache too if it moved) and "
              "where to find caches that moved since the runs were trained.")
@click.option("--split", "splits", multiple=True, help="Only these split tags (repeatable).")
@click.option("--jobs", default=0, show_default=True, type=click.IntRange(0),
              help="Parallel worker processes (0: one per CPU core, at most one per file).")
@click.option("--no-figures", is_flag=True, help="Skip the PNG figures.")
@click.option("--resamples", default=1000, show_default=True, type=click.IntRange(0),
              help="Bootstrap resamples for the 95% intervals (0: none, as --no-ci).")
@click.option("--no-ci", is_flag=True, help="No bootstrap intervals (and no paired intervals).")
@click.option("--ci-seed", default=0, show_default=True, type=click.IntRange(0),
              help="Seed of the bootstrap resamples.")
@click.option("--ci-in-tables", is_flag=True, help="Also print the intervals in report.md and "
              "report.tex (they are always in report.csv and report.json).")
@click.option("--rc-full-range", is_flag=True, help="Risk-coverage plots on selective risk 0-1 "
              "instead of an axis scaled to the curves.")
@click.option("--export", "export", multiple=True, type=click.Choice(["fd-shifts"]),
              help="Also write the inputs of another tool's analysis: fd-shifts = one experiment "
              "per run (its held-out rows + evaluated splits, <out>/fd-shifts; docs/METRICS.md).")
@click.option("--trust-score/--no-trust-score", "trust_score", default=None,
              help="TrustScore (Jiang et al. 2018) rows from the classifier's features of its "
              "training split. Default: computed where the caches have features (extract "
              "--features), else left out with a note; --trust-score: required (an error "
              "where it cannot be computed).")
@click.option("--trust-score-k", type=click.IntRange(1), default=None, help="TrustScore's k: a "
              "training row's density is the distance to its k-th neighbour in its class "
              "[default: 10]. Giving it requires TrustScore.")
@click.option("--trust-score-alpha", type=click.FloatRange(0.0, 1.0), default=None,
              help="TrustScore's alpha: the fraction of each class's training rows of lowest "
              "density left out [default: 0, none]. Giving it requires TrustScore.")
@click.option("--knn-device", default=None, help="Where TrustScore's exact nearest-neighbour "
              "search runs: cpu (numpy) or a torch device such as cuda (loads torch; for "
              "ImageNet-sized training splits) [default: cpu]. Giving it requires TrustScore.")
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
