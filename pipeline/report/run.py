"""Stage 3 (`cli.py report`): the paper's tables, separability, figures and post-hoc baselines,
computed from cached oracle outputs and classifier caches only (no model in memory).

resolve inputs -> plan (main process: attributes and manifests only; mismatches refused before any
work) -> evaluate every (run, split) output and every classifier cache in parallel (joblib) ->
aggregate seeds per <oracle, classifier, loss, group, split> (bootstrap intervals of the seed
means, paired SS comparisons) -> figures -> md / csv / tex / json [-> fd-shifts export].
Temperature scaling, MaxLogit-pNorm and REL-U are fitted in the baseline workers, on held-out
training rows (heldout.py), alongside the other evaluations; TrustScore (trustscore.py) is one
worker task per training cache, on its features.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from cache.atomic import atomic_file
from cache.reader import ClassifierCache
from pipeline.core.artifacts import cache_root_of, only_runs_root, recorded_root
from pipeline.core.presets import ARTIFACTS
from pipeline.report import appendix, tables as T
from pipeline.report.aggregate import aggregate
from pipeline.report.rows import Row
from pipeline.report.baselines import WORKER_SPLIT
from pipeline.report.bootstrap import BootstrapSpec
from pipeline.report.compare import comparisons, versus_baselines
from pipeline.report.export import export_fd_shifts
from pipeline.report.heldout import plan_fits
from pipeline.report.evaluate import evaluate_baselines, evaluate_output, evaluate_trust_score
from pipeline.report.figplan import plan_figures, relative
from pipeline.report.inputs import ReportError, collect, plan
from pipeline.report.markdown import markdown_document
from pipeline.report.trustscore import TrustScoreError, TrustSpec, plan_trust
from pipeline.report.verdicts import verdicts

METRIC_CHOICES = ("paper", "standard", "both")
FORMATS = ("md", "csv", "latex", "json")
FILES = {"md": "report.md", "csv": "report.csv", "latex": "report.tex", "json": "report.json"}
EXPORTS = ("fd-shifts",)
NO_VERDICTS = "no verdicts without bootstrap intervals (--resamples 0 / --no-ci)"
EXCLUSION_NOTE = ("Rows with valid == 0 (images that could not be decoded, recorded by "
                  "`extract --skip-bad`) are excluded from every metric, accuracy included.")


@dataclass(frozen=True)
class ReportConfig:
    paths: tuple[str, ...] = ()
    runs_root: str | None = None
    caches: tuple[str, ...] = ()
    metrics: str = "both"
    formats: tuple[str, ...] = FORMATS
    out: str | None = None
    splits: tuple[str, ...] = ()
    jobs: int = 0
    figures: bool = True
    artifacts: str = str(ARTIFACTS)   # where a bare report looks for the one root with runs
    resamples: int = 1000        # bootstrap resamples; 0 = no intervals
    ci_seed: int = 0
    ci_in_tables: bool = False   # intervals in report.md / report.tex too (always in csv / json)
    rc_full_range: bool = False  # risk-coverage plots on selective risk 0..1
    export: tuple[str, ...] = ()
    trust_score: TrustSpec | None = TrustSpec()   # None: left out (--no-trust-score)


def report(cfg: ReportConfig) -> dict:
    """Run stage 3; returns a summary (paths written, counts)."""
    if cfg.metrics not in METRIC_CHOICES:
        raise ValueError(f"metrics must be one of {METRIC_CHOICES}, got {cfg.metrics!r}")
    clock = [time.perf_counter()]
    timings = {}

    def lap(name: str) -> None:
        clock.append(time.perf_counter())
        timings[name] = round(clock[-1] - clock[-2], 3)

    # a bare report: the runs of the one artifacts root that has any (refused when several/none)
    bare = not (cfg.paths or cfg.runs_root or cfg.caches)
    found = only_runs_root(Path(cfg.artifacts)) if bare else None
    src = collect(cfg.paths, cfg.runs_root or (found and str(found)), cfg.caches)
    tasks, cache_tasks = plan(src, cfg.splits)
    # absolute: joblib may reuse worker processes started in another working directory
    out = (Path(cfg.out) if cfg.out else default_out(tasks, cache_tasks)).resolve()
    if cfg.resamples < 0:
        raise ReportError(f"--resamples {cfg.resamples}: expected 0 (no intervals) or more")
    spec = BootstrapSpec(cfg.resamples, cfg.ci_seed) if cfg.resamples else None
    lap("plan")
    fits = plan_fits(tasks, [c.cache for c in cache_tasks], src.caches)
    try:
        trust, notes = plan_trust(cache_tasks, fits, src.caches, cfg.trust_score)
    except TrustScoreError as err:
        raise ReportError(f"TrustScore: {err}") from None
    # the longest tasks (TrustScore, a cache's baselines) first: the workers finish together
    calls = [(evaluate_trust_score, (replace(t, bootstrap=spec),)) for t in trust]
    calls += [(evaluate_baselines, (replace(c, names=names, fit=fits[c.cache], bootstrap=spec),))
             for c in cache_tasks for names in _baseline_split(c)]
    calls += [(evaluate_output, (replace(t, bootstrap=spec),)) for t in tasks]
    results = []
    for item in parallel(calls, cfg.jobs):
        results.extend(item if isinstance(item, list) else [item])
    results.sort(key=lambda r: r["kind"] != "oracle")     # report.json: runs, then baselines
    lap("evaluate")
    splits = aggregate(results)
    compared = {tag: (comparisons(rows), versus_baselines(rows)) for tag, rows in splits.items()}
    judged = verdicts(splits, cfg.ci_seed) if spec else {"families": [], "note": NO_VERDICTS}
    figures = draw_figures(splits, out, cfg.jobs, cfg.rc_full_range) if cfg.figures else {}
    lap("figures")
    doc = build_doc(cfg, splits, results, src.skipped, figures, out, compared, fit_records(results),
                    {t.run_dir: t.run_file for t in tasks})
    doc["verdicts"] = judged
    doc["trust_score"] = {"fits": trust_records(results), "notes": notes}
    written = write_outputs(doc, splits, out, cfg)
    if "fd-shifts" in cfg.export:
        written.append(export_fd_shifts(out, tasks))
    lap("write")
    return {"out": str(out), "files": written, "runs": len({t.run_dir for t in tasks}),
            "found_runs_root": found and str(found),
            "outputs": len(tasks), "caches": len(cache_tasks), "splits": list(splits),
            "groups": sum(len(s) for s in splits.values()), "skipped": src.skipped,
            "notes": notes + [f"split {tag}, {row.oc} {row.display_loss}: {w}"
                              for tag, rows in splits.items() for row in rows
                              for w in row.warnings],
            "elapsed_s": round(clock[-1] - clock[0], 3), "timings": timings}


def draw_figures(splits: dict[str, list[Row]], out: Path, jobs: int = 0,
                 full_range: bool = False) -> dict:
    """Every split's figures (figplan.py says which), drawn in worker processes."""
    calls, index = plan_figures(splits, out, full_range)
    parallel(calls, jobs)
    return index


def parallel(calls: list, jobs: int = 0) -> list:
    """joblib processes over the calls (loky); in-process when one worker is enough."""
    n = jobs if jobs > 0 else min(os.cpu_count() or 1, len(calls))
    if n <= 1 or len(calls) <= 1:
        return [f(*args) for f, args in calls]
    from joblib import Parallel, delayed
    return Parallel(n_jobs=n, backend="loky")(delayed(f)(*args) for f, args in calls)


def fit_records(results: list[dict]) -> dict[str, dict]:
    """{evaluated cache: how T and p were fitted (or why not)}, from the baseline rows."""
    out: dict[str, dict] = {}
    for r in results:
        fit = r.get("fit")
        if r["kind"] != "baseline" or not fit:
            continue
        entry = out.setdefault(r["cache"], {k: v for k, v in fit.items()
                                            if k not in ("value", "parameter", "undefined")})
        name = r["labels"]["loss"]
        entry[name] = fit["value"]
        if fit.get("undefined", {}).get(name):
            entry.setdefault("undefined", {})[name] = fit["undefined"][name]
    return out


def trust_records(results: list[dict]) -> list[dict]:
    """TrustScore's fit per training cache (k, alpha, rows kept, times) and what it scored."""
    out: dict[str, dict] = {}
    for r in results:
        if "trust_fit" in r:
            entry = out.setdefault(r["trust_fit"]["train_cache"], {**r["trust_fit"], "scored": []})
            if r["cache"] not in entry["scored"]:
                entry["scored"].append(r["cache"])
    return list(out.values())


def _baseline_split(task) -> tuple[tuple[str, ...], ...]:
    """With few classes the metric summaries (a sort of N rows and the bootstrap per baseline)
    outweigh the scores (a few passes over N x K logits): split them over two workers, each
    recomputing its cheap scores.  With many classes one task computes the scores once."""
    k = int(ClassifierCache.open(Path(task.cache)).identity["num_classes"])
    return WORKER_SPLIT if k <= 32 else ((),)


def default_out(tasks, cache_tasks) -> Path:
    """<artifacts root>/report: the root the runs recorded (run.json config ``artifacts``), for
    a run without that record, or a report of caches only, the root its cache lies in
    (``<root>/cache/<classifier>/<tag>``).  One root per report, else --out is asked for."""
    roots: dict[str, Path | None] = {}
    for t in tasks:
        recorded = t.run_file.config.get("artifacts")
        roots[t.run_dir] = recorded_root(Path(t.run_dir), recorded) if recorded else \
            cache_root_of(Path(t.cache))
    if not tasks:
        roots = {c.cache: cache_root_of(Path(c.cache)) for c in cache_tasks}
    unknown = [where for where, root in roots.items() if root is None]
    if unknown:
        raise ReportError(f"{unknown[0]}: not in an artifacts root (neither a run that recorded "
                          "its root nor a cache under <root>/cache/<classifier>/<split>), so the "
                          "report has no default place: pass --out")
    found = sorted({str(Path(root).resolve()) for root in roots.values()})
    if len(found) != 1:
        raise ReportError(f"the inputs come from several artifacts roots {found}: pass --out")
    return Path(found[0]) / "report"


# ------------------------------------------------------------------------------- documents --
def build_doc(cfg, splits, results, skipped, figures, out: Path, compared: dict,
              fits: dict, run_records: dict) -> dict:
    """report.json; ``run_records``: {run directory: its run.json (``RunFile``) as the planner
    read it}."""
    def rel(p):
        return os.path.relpath(p, out) if p else None
    doc_splits = []
    for tag, rows in splits.items():
        fig = figures.get(tag, {"histograms": [], "risk_coverage": {}, "list": []})
        doc_splits.append({
            "split": tag, "rows": [r.to_json() for r in rows],
            "comparisons": compared.get(tag, ([], []))[0],
            "versus_baselines": compared.get(tag, ([], []))[1],
            "figures": relative(fig, rel)})
    return {"schema": "trust-oracles-report/1", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "metrics": cfg.metrics, "definitions": T.DEFINITION_TEXT, "exclusion": EXCLUSION_NOTE,
            "config": asdict(cfg), "bootstrap": _bootstrap_text(cfg), "fits": fits,
            "splits": doc_splits, "skipped": skipped, "appendix": appendix.collect(results, run_records),
            "evaluations": results}


def _bootstrap_text(cfg: ReportConfig) -> str:
    if not cfg.resamples:
        return "no bootstrap intervals (--resamples 0 / --no-ci)"
    return (f"95% percentile bootstrap intervals over test rows, {cfg.resamples} resamples, seed "
            f"{cfg.ci_seed}; rows resampled in at most 512 random groups, the same resamples "
            "for every score of a split (paired); for several seeds, the interval of the seed "
            "mean (docs/METRICS.md, 'Bootstrap intervals')")


def write_outputs(doc: dict, splits: dict, out: Path, cfg: ReportConfig) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    tables = [t for s in doc["splits"] for t in T.build_tables(s, cfg.metrics, cfg.ci_in_tables)]
    texts = {"md": lambda: markdown_document(doc, tables), "csv": lambda: T.csv_text(tables),
             "latex": lambda: T.latex_document(tables), "json": lambda: T.json_text(doc)}
    written = []
    for fmt in dict.fromkeys(cfg.formats):
        path = out / FILES[fmt]
        with atomic_file(path, "w", encoding="utf-8") as fh:
            fh.write(texts[fmt]())
        written.append(str(path))
    return written
