"""The report's workers: one oracle output file, or one classifier cache's post-hoc baselines, read,
checked against their cache and turned into every number of the report (``report/scoring.py``);
small dicts back to the main process (``scoring.ScoreSummary``: each with its per-resample values
beside it)."""
from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np

from cache.outputs import classifier_ref, read_outputs
from cache.reader import ClassifierCache, UnverifiedCacheWarning
from cache.runs import RunDir
from cache.schema import CacheMismatch
from pipeline.core.losses import tnr_rule, tnr_threshold
from pipeline.report.baselines import (FITTED, LOGIT_BASELINES, TABLE, TRUST_SCORE, available,
                                       baseline_label, baseline_scores, public)
from pipeline.report.heldout import FitTask, fit_heldout
from pipeline.report.inputs import CacheTask, OutputTask, ReportError, eval_identity
from pipeline.report.scoring import ScoreSummary, score_summary, undefined_summary
from pipeline.report.trustscore import TrustTask, fit_and_score

LABEL_KEYS = ("oracle", "oracle_model", "classifier", "loss", "variant", "loss_label", "seed",
              "group", "dataset", "num_classes")


def valid_rows(source: str, cols: dict, score: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Confidences and trust labels of the decodable rows (valid == 1); NaN is an error."""
    valid = cols["valid"] == 1
    conf = cols[score][valid]
    bad = ~np.isfinite(conf)
    if bad.any():
        first = int(cols["index"][valid][bad][0])
        raise ReportError(f"{source}: {int(bad.sum())} non-finite {score} value(s), first at "
                          f"global index {first}; the outputs are corrupt — re-run `cli.py predict`")
    if not valid.any():
        raise ReportError(f"{source}: no valid rows (every image was undecodable)")
    return conf, cols["correct"][valid].astype(bool), cols["index"][~valid]


def _check_against_cache(task: OutputTask, cols: dict) -> None:
    cache = ClassifierCache.open(task.cache).load(["valid", "correct"])
    for name in ("valid", "correct"):
        diff = np.flatnonzero(cache[name] != cols[name])
        if len(diff):
            raise CacheMismatch(f"run {task.run_dir}: column {name!r} of {task.output} differs "
                                f"from the classifier cache {task.cache} at {len(diff)} row(s), "
                                f"first global index {int(diff[0])}; refused")


def evaluate_output(task: OutputTask) -> ScoreSummary:
    """Worker: read one oracle output file, check it, and compute every number of the report."""
    warnings.simplefilter("ignore", UnverifiedCacheWarning)  # noted once by the main process
    digest = RunDir(Path(task.run_dir)).output_digest(task.run_file, Path(task.output))
    try:
        out = read_outputs(Path(task.output), expect_classifier=task.ref, digest=digest)
    except CacheMismatch as err:
        raise CacheMismatch(f"run {task.run_dir}: {err}") from None
    _check_against_cache(task, out.columns)
    conf, correct, excluded = valid_rows(task.output, out.columns, "confidence")
    run, k = out.run, int(out.classifier["num_classes"])
    thresholds = {"paper": tnr_threshold(tnr_rule(run["loss"], run.get("tnr")), k), "standard": 0.5}
    result = score_summary(conf, correct, thresholds, histogram=True, bootstrap=task.bootstrap)
    result.update(kind="oracle", split=task.tag, source=task.output, run_dir=task.run_dir,
                  cache=task.cache, rows=int(len(out.columns["index"])),
                  excluded_rows=int(len(excluded)), excluded_indices=excluded[:20].tolist(),
                  eval=eval_identity(task.ref),
                  labels={**{key: run.get(key) for key in LABEL_KEYS}, "num_classes": k,
                          "classifier": task.classifier, "variant": run.get("variant") or "",
                          "loss_label": run.get("loss_label") or str(run["loss"]).upper()},
                  status=task.run_file.status)
    return result


def evaluate_baselines(task: CacheTask) -> list[ScoreSummary]:
    """Worker: post-hoc baseline rows (``task.names``, default all, in the table's order) of
    one classifier cache; a fitted baseline whose parameter could not be fitted is a row of n/a
    with the reason; one reading cache columns the cache lacks (MC-Dropout's) has no row."""
    warnings.simplefilter("ignore", UnverifiedCacheWarning)  # noted once by the main process
    cache = ClassifierCache.open(Path(task.cache))
    names = available(task.names or LOGIT_BASELINES, cache.manifest["columns"])
    extra = sorted({c for n in names for c in TABLE[n].columns})
    cols = cache.load(["valid", "correct", "logits", *extra])
    wanted = tuple(n for n in FITTED if n in names)
    fit = (fit_heldout(task.fit, wanted) if isinstance(task.fit, FitTask) and wanted
           else {"reason": task.fit or "not fitted"})
    params = {n: TABLE[n].fitted.parameter(fit.get(n)) for n in FITTED}
    unfit = {n: fit.get("reason") or fit.get("undefined", {}).get(n) for n in FITTED
             if n in names and params[n] is None}
    try:
        scores = baseline_scores(cols["logits"], names=tuple(n for n in names if n not in unfit),
                                 params=params, columns={c: cols[c] for c in extra})
    except ValueError as err:
        raise ReportError(f"classifier cache {task.cache}: {err}") from None
    results = []
    for name in names:
        if name in unfit:
            result = undefined_summary(cols["correct"][cols["valid"] == 1].astype(bool),
                                       f"not fitted: {unfit[name]}")
            excluded = cols["index"][cols["valid"] != 1]
        else:
            result, excluded = _summary(task, cols, name, scores[name])
        if name in FITTED:     # how it was fitted: the parameter, rows, training cache, runs
            value = public(fit.get(name))
            result["fit"] = {**{k: v for k, v in fit.items() if k not in FITTED},
                             "value": value, "parameter": params[name]
                             if value and TABLE[name].fitted.key in value else None}
        results += _rows(task, cache, cols, name, result, excluded)
    return results


def _summary(task: CacheTask, cols: dict, name: str, scores) -> tuple[ScoreSummary, np.ndarray]:
    conf, correct, excluded = valid_rows(task.cache, {**cols, name: scores}, name)
    return score_summary(conf, correct, {"paper": 0.5, "standard": 0.5}, histogram=False,
                         rates=TABLE[name].probability, probability=TABLE[name].calibrated,
                         bootstrap=task.bootstrap), excluded


def _rows(task: CacheTask, cache: ClassifierCache, cols: dict, name: str,
          result: ScoreSummary, excluded: np.ndarray) -> list[ScoreSummary]:
    """A baseline's result as one row per split tag of its cache."""
    labels = {**dict.fromkeys(LABEL_KEYS), "oracle": "post-hoc", "classifier": task.classifier,
              "loss": name, "variant": "", "loss_label": baseline_label(name, cache.identity),
              "group": "posthoc", "dataset": cache.identity["dataset"],
              "num_classes": cache.identity["num_classes"]}
    result.update(kind="baseline", source=task.cache, run_dir=None, cache=task.cache,
                  rows=int(len(cols["index"])), labels=labels,
                  eval=eval_identity(classifier_ref(cache.path, cache.identity)),
                  excluded_rows=int(len(excluded)), excluded_indices=excluded[:20].tolist())
    return [result.with_items(split=tag) for tag in task.tags]


def evaluate_trust_score(task: TrustTask) -> list[ScoreSummary]:
    """Worker: TrustScore fitted on one training cache's features, a row per evaluated cache
    (and split tag) it scores; its fit record (k, alpha, rows kept, times) in ``trust_fit``."""
    warnings.simplefilter("ignore", UnverifiedCacheWarning)  # noted once by the main process
    record, scored = fit_and_score(task)
    results = []
    for cache_task in task.evaluated:
        cols = scored[cache_task.cache]
        cache_task = replace(cache_task, bootstrap=task.bootstrap)
        result, excluded = _summary(cache_task, cols, TRUST_SCORE, cols["score"])
        result["trust_fit"] = record
        results += _rows(cache_task, ClassifierCache.open(Path(cache_task.cache)), cols,
                         TRUST_SCORE, result, excluded)
    return results
