"""Stage 3 inputs: find run directories and classifier caches, check them, evaluate one split.

The main process only reads small things (run.json, HDF5 attributes, manifests) to plan the work
and to refuse mismatched inputs early; the workers (``evaluate_output``, ``evaluate_baselines``)
read the columns and return small dicts of numbers, so joblib ships no large arrays.  Run
directories are read through ``cache.runs`` only (its RunDir names every file in them); the
run.json read here travels with each OutputTask, so later steps need not read it again.
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cache.manifest import IDENTITY_FILE, MANIFEST_FILE
from cache.outputs import classifier_ref, read_outputs
from cache.reader import ClassifierCache, UnverifiedCacheWarning, slug, split_tag
from cache.runs import OUTPUTS, RUN_FILE, RunDir, find_runs, is_run_dir
from cache.schema import KIND_ORACLE, CacheError, CacheMismatch, canonical, check_identity
from cache.shards import read_attrs
from pipeline.core.losses import tnr_threshold
from pipeline.report.baselines import BASELINES, FITTED, TABLE, baseline_scores
from pipeline.report.bootstrap import BootstrapSpec
from pipeline.report.heldout import FitTask, fit_heldout
from pipeline.report.scoring import score_summary, undefined_summary

LABEL_KEYS = ("oracle", "oracle_model", "classifier", "loss", "variant", "loss_label", "seed",
              "group", "dataset", "num_classes")


class ReportError(CacheError):
    """The report's inputs are missing, empty or inconsistent (cli.py prints it, exit code 1)."""


@dataclass(frozen=True)
class OutputTask:
    run_dir: str
    output: str
    tag: str
    cache: str
    ref: dict
    classifier: str
    run_json: dict = field(default_factory=dict)
    bootstrap: BootstrapSpec | None = None


@dataclass(frozen=True)
class CacheTask:
    cache: str
    classifier: str
    tags: tuple[str, ...]  # the split tags its baseline rows appear under
    names: tuple[str, ...] = ()  # baselines to compute (all when empty)
    fit: FitTask | str | None = None   # where T and p are fitted, or why they cannot be
    bootstrap: BootstrapSpec | None = None


@dataclass
class Sources:
    run_dirs: dict[Path, bool] = field(default_factory=dict)  # run dir -> named explicitly
    caches: list[Path] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)


def is_cache_dir(path: Path) -> bool:
    return (path / MANIFEST_FILE).exists() or (path / IDENTITY_FILE).exists()


def cache_tag(identity: dict) -> str:
    """``val`` or ``val-defocus_blur-5`` from a cache identity (corruption ``name:sev:seedN``)."""
    corruption = identity.get("corruption") or "none"
    if corruption == "none":
        return identity["split"]
    name, severity = corruption.split(":")[:2]
    return split_tag(identity["split"], name, int(severity))


def collect(paths: tuple[str, ...], runs_root: str | None, caches: tuple[str, ...],
            default_root: Path) -> Sources:
    """Classify the command line's paths into run directories and classifier caches.

    With no path, no --runs-root and no --cache, the default runs root is scanned."""
    src = Sources()
    for text in paths:
        path = Path(text)
        if not path.exists():
            raise ReportError(f"{path} does not exist (expected a run directory, a runs root or "
                              "a classifier cache)")
        if is_cache_dir(path):
            src.caches.append(path)
        elif is_run_dir(path):
            src.run_dirs[path.resolve()] = True
        else:
            found = find_runs(path)
            if not found:
                raise ReportError(f"{path} is neither a run directory ({RUN_FILE} + {OUTPUTS}/), "
                                  "a directory of runs, nor a classifier cache (manifest.json)")
            src.run_dirs.update({p: False for p in found if p not in src.run_dirs})
    roots = [Path(runs_root)] if runs_root else ([] if paths or caches else [default_root])
    for root in roots:
        if not root.is_dir():
            raise ReportError(f"runs root {root} does not exist: train oracles first "
                              "(`cli.py train-oracle`), or pass RUN_DIR, --runs-root or --cache")
        found = find_runs(root)
        if not found:
            raise ReportError(f"no run directories (with {RUN_FILE} or {OUTPUTS}/) under {root}")
        src.run_dirs.update({p: False for p in found if p not in src.run_dirs})
    for text in caches:
        src.caches.extend(_caches_under(Path(text)))
    return src


def _caches_under(path: Path) -> list[Path]:
    if not path.is_dir():
        raise ReportError(f"--cache {path} does not exist")
    if is_cache_dir(path):
        return [path]
    found = sorted(p.parent for depth in ("*/", "*/*/") for p in path.glob(f"{depth}{MANIFEST_FILE}"))
    if not found:
        raise ReportError(f"--cache {path} holds no classifier cache (no {MANIFEST_FILE} in it or "
                          "up to two levels below); run `cli.py extract` first")
    return found


def _ref_key(ref: dict) -> str:
    return json.dumps(canonical({k: v for k, v in ref.items() if k != "path"}), sort_keys=True)


def open_cache(path: Path) -> tuple[ClassifierCache, dict]:
    cache = ClassifierCache.open(path)
    return cache, classifier_ref(cache.path, cache.identity)


def plan(src: Sources, splits: tuple[str, ...] = ()) -> tuple[list[OutputTask], list[CacheTask]]:
    """One task per (run, split) output file and per classifier cache (baselines)."""
    known: dict[str, Path] = {}
    labels: dict[Path, tuple[str, list[str]]] = {}  # cache -> (classifier label, split tags)
    for path in src.caches:
        cache, ref = open_cache(path)
        known.setdefault(_ref_key(ref), cache.path.resolve())
        labels.setdefault(cache.path.resolve(), (cache.path.resolve().parent.name, []))
    tasks = []
    for run_dir, explicit in src.run_dirs.items():
        run = RunDir(run_dir)
        outputs = [p for p in run.outputs() if not splits or p.stem in splits]
        if not outputs:
            why = (f"no {OUTPUTS}/*.h5" + (f" for split(s) {list(splits)}" if splits else ""))
            if explicit:
                raise ReportError(f"run {run_dir} has {why}: finish training or run "
                                  "`cli.py predict` on it")
            src.skipped.append({"run_dir": str(run_dir), "reason": why})
            continue
        run_json = run.read_if_any()
        for output in outputs:
            task = _output_task(run_dir, output, run_json, known)
            tasks.append(task)
            label, tags = labels.setdefault(Path(task.cache), (task.classifier, []))
            tags.append(task.tag)
    cache_tasks = []
    for path, (label, tags) in labels.items():
        # a cache's baselines go beside the outputs computed from it, else under its own tag
        tags = list(dict.fromkeys(tags)) or [cache_tag(ClassifierCache.open(path).identity)]
        tags = [t for t in tags if not splits or t in splits]
        if tags:
            cache_tasks.append(CacheTask(str(path), label or path.parent.name, tuple(tags)))
    if not tasks and not cache_tasks:
        raise ReportError("nothing to report: no oracle outputs and no classifier cache" + (
            f" for split(s) {list(splits)}" if splits else ""))
    return tasks, cache_tasks


def _output_task(run_dir: Path, output: Path, run_json: dict, known: dict) -> OutputTask:
    attrs = read_attrs(output)
    if attrs.get("kind") != KIND_ORACLE or "classifier_cache" not in attrs:
        raise ReportError(f"run {run_dir}: {output} is not an oracle output file "
                          f"(kind={attrs.get('kind')!r})")
    recorded, run = attrs["classifier_cache"], attrs.get("run", {})
    cache_path = known.get(_ref_key(recorded)) or _locate_cache(run_dir, output, recorded, run)
    cache, ref = open_cache(cache_path)
    keys = tuple(k for k in ref if k != "path")
    try:
        check_identity(recorded, ref, f"run {run_dir} outputs {output.name}", keys=keys,
                       check_version=False)
    except CacheMismatch as err:
        raise CacheMismatch(f"{err}\nrefused: these outputs were not computed from the classifier "
                            f"cache {cache.path}") from None
    _check_labels(run_dir, run_json, run)
    return OutputTask(str(run_dir), str(output), output.stem, str(cache.path.resolve()), ref,
                      str(run.get("classifier") or ""), run_json)


def _locate_cache(run_dir: Path, output: Path, recorded: dict, run: dict) -> Path:
    """The recorded path, else ``<ancestor>/cache/<classifier>/<tag>`` (a moved artifacts tree)."""
    tried = [Path(recorded.get("path", ""))]
    classifier = run.get("classifier") or recorded.get("model", "")
    tag = cache_tag(recorded)
    tried += [a / "cache" / slug(classifier) / tag for a in list(run_dir.parents)[:4]]
    for path in tried:
        if (path / MANIFEST_FILE).exists():
            return path
    raise ReportError(f"run {run_dir}: the classifier cache of {output.name} is not at "
                      f"{tried[0]} (nor at {', '.join(map(str, tried[1:]))}); pass --cache DIR "
                      "pointing at it (it must have the same model, weights and dataset)")


def _check_labels(run_dir: Path, run_json: dict, run: dict) -> None:
    """run.json and the outputs' ``run`` attribute must describe the same run."""
    record = run_json.get("run", run_json) if isinstance(run_json, dict) else {}
    for key in ("oracle", "classifier", "loss", "variant", "seed", "group"):
        if key in record and key in run and canonical(record[key]) != canonical(run[key]):
            raise CacheMismatch(f"run {run_dir}: {RUN_FILE} says {key}={record[key]!r} but its "
                                f"outputs say {key}={run[key]!r}; the outputs belong to another run")
    missing = [k for k in ("oracle", "classifier", "loss", "seed", "group") if k not in run]
    if missing:
        raise ReportError(f"run {run_dir}: the outputs' run record lacks {missing}")


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


def evaluate_output(task: OutputTask) -> dict:
    """Worker: read one oracle output file, check it, and compute every number of the report."""
    warnings.simplefilter("ignore", UnverifiedCacheWarning)  # noted once by the main process
    digest = RunDir(Path(task.run_dir)).output_digest(task.run_json, Path(task.output))
    try:
        out = read_outputs(Path(task.output), expect_classifier=task.ref, digest=digest)
    except CacheMismatch as err:
        raise CacheMismatch(f"run {task.run_dir}: {err}") from None
    _check_against_cache(task, out.columns)
    conf, correct, excluded = valid_rows(task.output, out.columns, "confidence")
    run, k = out.run, int(out.classifier["num_classes"])
    thresholds = {"paper": tnr_threshold(run.get("loss"), k), "standard": 0.5}
    result = score_summary(conf, correct, thresholds, histogram=True, bootstrap=task.bootstrap)
    result.update(kind="oracle", split=task.tag, source=task.output, run_dir=task.run_dir,
                  cache=task.cache, rows=int(len(out.columns["index"])),
                  excluded_rows=int(len(excluded)), excluded_indices=excluded[:20].tolist(),
                  labels={**{key: run.get(key) for key in LABEL_KEYS}, "num_classes": k,
                          "variant": run.get("variant") or "",
                          "loss_label": run.get("loss_label") or str(run["loss"]).upper()},
                  status=task.run_json.get("status"))
    return result


def evaluate_baselines(task: CacheTask) -> list[dict]:
    """Worker: post-hoc baseline rows (``task.names``, default all, in the table's order) of
    one classifier cache; a fitted baseline whose parameter could not be fitted is a row of n/a
    with the reason."""
    names = task.names or BASELINES
    warnings.simplefilter("ignore", UnverifiedCacheWarning)  # noted once by the main process
    cache = ClassifierCache.open(Path(task.cache))
    cols = cache.load(["valid", "correct", "logits"])
    wanted = tuple(n for n in FITTED if n in names)
    fit = (fit_heldout(task.fit, wanted) if isinstance(task.fit, FitTask) and wanted
           else {"reason": task.fit or "not fitted"})
    params = {n: TABLE[n].fitted.parameter(fit.get(n)) for n in FITTED}
    unfit = {n: fit.get("reason") or fit.get("undefined", {}).get(n) for n in FITTED
             if n in names and params[n] is None}
    try:
        scores = baseline_scores(cols["logits"], names=tuple(n for n in names if n not in unfit),
                                 params=params)
    except ValueError as err:
        raise ReportError(f"classifier cache {task.cache}: {err}") from None
    results = []
    for name in names:
        if name in unfit:
            result = undefined_summary(cols["correct"][cols["valid"] == 1].astype(bool),
                                       f"not fitted: {unfit[name]}")
            excluded = cols["index"][cols["valid"] != 1]
        else:
            conf, correct, excluded = valid_rows(task.cache, {**cols, name: scores[name]}, name)
            result = score_summary(conf, correct, {"paper": 0.5, "standard": 0.5},
                                   histogram=False, rates=TABLE[name].probability,
                                   probability=TABLE[name].calibrated, bootstrap=task.bootstrap)
        if name in FITTED:     # how it was fitted: the parameter, rows, training cache, runs
            result["fit"] = {**{k: v for k, v in fit.items() if k not in FITTED},
                             "value": fit.get(name), "parameter": params[name]}
        labels = {**dict.fromkeys(LABEL_KEYS), "oracle": "post-hoc", "classifier": task.classifier,
                  "loss": name, "variant": "", "loss_label": TABLE[name].label,
                  "group": "posthoc", "dataset": cache.identity["dataset"],
                  "num_classes": cache.identity["num_classes"]}
        result.update(kind="baseline", source=task.cache, run_dir=None, cache=task.cache,
                      rows=int(len(cols["index"])), labels=labels,
                      excluded_rows=int(len(excluded)), excluded_indices=excluded[:20].tolist())
        results += [{**result, "split": tag} for tag in task.tags]
    return results
