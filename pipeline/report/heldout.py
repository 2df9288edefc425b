"""Where the fitted post-hoc baselines (baselines.py's ``Fit`` entries: temperature scaling,
MaxLogit-pNorm) are fitted: the held-out validation rows of the classifier's TRAINING cache, i.e.
the rows ``train-oracle`` carved out of its training split (``val_split.json``) and never trained
an oracle on.  Never the evaluated split.

For each evaluated classifier cache: the runs evaluated on it name their training cache
(run.json ``train_cache``) and their held-out rows (val_split.json).  The training cache is taken
from that path, else from the --cache inputs (same model and weights, that split), else
``<cache root>/<classifier>/<split>``.  Runs that held out different rows are fitted on the rows
every one of them held out.  ``fit_heldout`` (a worker) reads only those rows, shard by shard.
Run directories are read through ``cache.runs.RunDir``; run.json comes with the planner's tasks.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cache.manifest import MANIFEST_FILE
from cache.reader import ClassifierCache
from cache.runcache import candidates, identity_problems
from cache.runfile import RunFile
from cache.runs import VAL_FILE, RunDir
from cache.shards import read_columns
from pipeline.report.baselines import FITTED, TABLE, fit_methods
from pipeline.report.calibrate import FitError

SAME_CLASSIFIER = ("model", "weights_sha256", "preprocess", "dataset", "num_classes")


@dataclass(frozen=True)
class FitTask:
    train_cache: str
    rows: tuple[int, ...]
    runs: tuple[str, ...]


def plan_fits(tasks: list, cache_paths: list[str], known_caches: list[Path]) -> dict[str, object]:
    """{evaluated cache path: FitTask, or the reason (str) why nothing can be fitted for it}.
    ``tasks``: the planner's OutputTasks, whose run.json (``run_file``) names the training cache."""
    out: dict[str, object] = {}
    records = {t.run_dir: t.run_file for t in tasks}
    for path in cache_paths:
        runs = sorted({t.run_dir for t in tasks if t.cache == path})
        if not runs:
            out[path] = (f"no run evaluated on this cache names held-out rows ({VAL_FILE} of "
                         f"train-oracle); {fit_methods()} are fitted on them")
            continue
        try:
            out[path] = _fit_task(path, {r: records[r] for r in runs}, known_caches)
        except FitError as err:
            out[path] = str(err)
    return out


def _fit_task(path: str, runs: dict[str, RunFile], known: list[Path]) -> FitTask:
    """``runs``: {run directory: its run.json (empty for a copied run without one)}."""
    identity = ClassifierCache.open(Path(path)).identity
    rows, train = None, None
    for run, run_file in runs.items():
        val = RunDir(Path(run)).val_split()
        if val is None:
            raise FitError(f"run {run} has no {VAL_FILE} (it held out no rows); the held-out "
                           "rows of the training cache are needed")
        held = set(int(i) for i in val.get("val_rows", []))
        rows = held if rows is None else rows & held
        found = training_cache(candidates(Path(run), run_file), val.get("split", "train"),
                               identity, path, known, run_file)
        if train is not None and found != train:
            raise FitError(f"the runs evaluated on {path} were trained on different caches "
                           f"({train} and {found})")
        train = found
    if not rows:
        raise FitError(f"the runs evaluated on {path} share no held-out row (their "
                       f"{VAL_FILE} files list disjoint rows)")
    return FitTask(train, tuple(sorted(rows)), tuple(runs))


def training_cache(recorded: list[Path], split: str, identity: dict, path: str,
                   known: list[Path], run: RunFile | None = None) -> str:
    """The cache of ``split`` (uncorrupted) of the classifier of ``path``: where the run recorded
    it (``cache.runcache.candidates``), else among the --cache inputs, else beside ``path``; with
    ``run`` (its run.json), only the run's own training cache (``cache.runcache``: its classifier
    and the rows it trained on, whose held-out row indices are the run's).  FitError when none is
    found.  Also where TrustScore (trustscore.py) finds its training features."""
    for cand in list(recorded) + list(known) + [Path(path).parent / split]:
        if not (cand / MANIFEST_FILE).exists():
            continue
        ident = ClassifierCache.open(cand).identity
        if (ident.get("split") == split and ident.get("corruption", "none") == "none"
                and all(ident.get(k) == identity.get(k) for k in SAME_CLASSIFIER)
                and (run is None or not identity_problems(run, ident))):
            return str(cand.resolve())
    where = recorded[0] if recorded else "the place its runs recorded"
    rows = " with the rows its runs trained on" if run is not None and run.train_fingerprint \
        else ""
    raise FitError(f"the training cache (split {split!r}) of the classifier of {path}{rows} was "
                   f"not found at {where} nor among the --cache inputs; pass --cache for it")


def read_rows(cache_dir: Path, rows: np.ndarray, columns: tuple[str, ...]) -> dict[str, np.ndarray]:
    """``columns`` of the sorted global ``rows`` only, one shard in memory at a time."""
    cache = ClassifierCache.open(cache_dir)
    parts: dict[str, list] = {c: [] for c in ("index", *columns)}
    for shard in cache.manifest["shards"]:
        a, b = int(shard["start"]), int(shard["stop"])
        local = rows[(rows >= a) & (rows < b)] - a
        if len(local):
            data = read_columns(Path(cache_dir) / shard["file"], ("index", *columns))
            for c in parts:
                parts[c].append(data[c][local])
    out = {c: np.concatenate(v) for c, v in parts.items()}
    if not np.array_equal(out["index"], rows):
        raise FitError(f"cache {cache_dir}: rows {rows[:5].tolist()}... are not all in it")
    return out


def fit_heldout(task: FitTask, names: tuple[str, ...] = FITTED) -> dict:
    """The parameters of the fitted baselines ``names`` (e.g. T of "ts", p of "pnorm") on the
    task's rows (valid ones); a reason instead of a value on failure.  Called in the baseline
    workers, so fitting overlaps the other evaluations."""
    rows = np.asarray(task.rows, dtype=np.int64)
    cols = read_rows(Path(task.train_cache), rows, ("label", "valid", "logits"))
    ok = cols["valid"] == 1
    logits, labels = cols["logits"][ok], cols["label"][ok]
    record = {"train_cache": task.train_cache, "runs": list(task.runs),
              "rows": int(ok.sum()), "invalid_rows_skipped": int((~ok).sum()),
              "rows_sha256": hashlib.sha256(rows.tobytes()).hexdigest()[:16],
              **dict.fromkeys(FITTED), "undefined": {}}
    what = f"held-out rows of {task.train_cache}"
    for name in FITTED:
        if name not in names:
            continue
        try:
            record[name] = TABLE[name].fitted.fit(logits, labels, what)
        except FitError as err:
            record["undefined"][name] = str(err)
    return record
