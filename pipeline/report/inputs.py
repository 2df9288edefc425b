"""Stage 3 inputs: find run directories and classifier caches, check them, plan the work.

The main process only reads small things (run.json, HDF5 attributes, manifests) to plan the work
and to refuse mismatched inputs early; the workers (``report/evaluate.py``) read the columns and
return small dicts of numbers, so joblib ships no large arrays.  Run
directories are read through ``cache.runs`` only (its RunDir names every file in them); the
run.json read here travels with each OutputTask, so later steps need not read it again.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from cache.manifest import IDENTITY_FILE, MANIFEST_FILE
from cache.outputs import classifier_ref
from cache.reader import ClassifierCache, slug, split_tag
from cache.runfile import RunFile
from cache.runs import OUTPUTS, RUN_FILE, RunDir, find_runs, is_run_dir
from cache.schema import KIND_ORACLE, CacheError, CacheMismatch, canonical, check_identity
from cache.shards import read_attrs
from pipeline.core.presets import CHECKPOINT_NAMES, EMBEDDED_ARCH, IMAGENET_PRESETS
from pipeline.report.bootstrap import BootstrapSpec
from pipeline.report.heldout import FitTask

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
    run_file: RunFile = field(default_factory=RunFile.empty)
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


def collect(paths: tuple[str, ...], runs_root: str | None, caches: tuple[str, ...]) -> Sources:
    """Classify the command line's paths into run directories and classifier caches, and scan
    the runs root (``report`` finds one for a bare report: ``core.artifacts.only_runs_root``)."""
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
    if runs_root:
        root = Path(runs_root)
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


def eval_identity(ref: dict) -> dict:
    """What makes an evaluated classifier cache what it is (``classifier_ref`` without its path):
    model, weights hash, dataset fingerprint, split, corruption, rows, ...  The report keys its
    rows by it, so two evaluation sets are never merged because their paths or tags look alike."""
    return canonical({k: v for k, v in ref.items() if k != "path"})


def _ref_key(ref: dict) -> str:
    return json.dumps(eval_identity(ref), sort_keys=True)


def classifier_label(name: str, identity: dict) -> str:
    """The classifier a row is labelled with: the name given (--classifier, or the cache's
    folder) when it names the model the cache recorded, else that recorded model -- a copied
    cache of model A under the name B is A's, whatever the folder or the command line said.
    A name names a model when it is the model (timm's pretrained tag aside), a preset of it or
    a name the demo gives its checkpoint (presets.CHECKPOINT_NAMES)."""
    model = str(identity.get("model") or "")
    named = {name, IMAGENET_PRESETS.get(name), (EMBEDDED_ARCH.get(name) or (None,))[0],
             CHECKPOINT_NAMES.get(name)}
    if not name or not model or model in named or name.split(".")[0] == model.split(".")[0]:
        return name or model
    return model


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
        label = classifier_label(cache.path.resolve().parent.name, cache.identity)
        labels.setdefault(cache.path.resolve(), (label, []))
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
        run_file = run.record_if_any()
        for output in outputs:
            task = _output_task(run_dir, output, run_file, known)
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


def _output_task(run_dir: Path, output: Path, run_file: RunFile, known: dict) -> OutputTask:
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
    _check_labels(run_dir, run_file, run)
    return OutputTask(str(run_dir), str(output), output.stem, str(cache.path.resolve()), ref,
                      classifier_label(str(run.get("classifier") or ""), cache.identity), run_file)


def _locate_cache(run_dir: Path, output: Path, recorded: dict, run: dict) -> Path:
    """The recorded path, else ``<ancestor>/cache/<classifier>/<tag>`` (a moved artifacts tree)."""
    tried = [Path(recorded.get("path", ""))]
    classifier = run.get("classifier") or recorded.get("model", "")
    tag = cache_tag(recorded)
    tried += [a / "cache" / slug(classifier) / tag for a in list(run_dir.parents)[:4]]
    for path in tried:
        if (path / MANIFEST_FILE).exists():
            return path
    places = list(dict.fromkeys(str(p.resolve()) for p in tried))   # each place named once
    nor = f" (nor at {', '.join(places[1:])})" if len(places) > 1 else ""
    raise ReportError(f"run {run_dir}: the classifier cache of {output.name} is not at "
                      f"{places[0]}{nor}; pass --cache DIR "
                      "pointing at it (it must have the same model, weights and dataset)")


def _check_labels(run_dir: Path, run_file: RunFile, run: dict) -> None:
    """run.json and the outputs' ``run`` attribute must describe the same run."""
    labels = run_file.labels
    for key in ("oracle", "classifier", "loss", "variant", "seed", "group"):
        if labels is None or key not in run:
            continue
        if canonical(getattr(labels, key)) != canonical(run[key]):
            raise CacheMismatch(f"run {run_dir}: {RUN_FILE} says {key}={getattr(labels, key)!r} "
                                f"but its outputs say {key}={run[key]!r}; the outputs belong to "
                                "another run")
    missing = [k for k in ("oracle", "classifier", "loss", "seed", "group") if k not in run]
    if missing:
        raise ReportError(f"run {run_dir}: the outputs' run record lacks {missing}")
