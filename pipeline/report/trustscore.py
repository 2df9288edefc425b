"""TrustScore (Jiang et al., NeurIPS 2018) as a post-hoc baseline row: fitted on the classifier's
cached features of its TRAINING split (every valid row, with its label), applied to the features
of every evaluated split whose classifier has that training cache (``knn.py`` does the search).

Planning (main process, small reads only): per evaluated cache, its training cache (the one
``heldout.py`` fits T and p on, else the cache of split ``train`` of the same classifier among
the inputs or beside it); what stops the row (no features, the evaluated cache is the training
cache, a class with no training row or fewer than k) is a note when TrustScore was not asked for
and an error naming the cache, the class or the option when it was (``--trust-score``, a k, an
alpha or a device given).  One worker task per training cache: its kept sets are fitted once and
score every evaluated cache of it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cache.errors import TrustOraclesError
from cache.reader import ClassifierCache
from cache.schema import FEATURE_COLUMN
from pipeline.report import knn
from pipeline.report.heldout import FitTask, training_cache
from pipeline.report.calibrate import FitError
from pipeline.report.inputs import ReportError

TRAIN_SPLIT = "train"
# Unasked, TrustScore runs on the CPU only below this many (training row, query) pairs: the
# embedded demo's 60,000 x 20,000 take ~10 s there; ImageNet's 1.28M x 50,000 per split would
# take hours (docs/PERFORMANCE.md), so there it needs --knn-device cuda or --trust-score.
AUTO_CPU_PAIRS = 2_000_000_000


@dataclass(frozen=True)
class TrustSpec:
    k: int = 10            # the reference's default
    alpha: float = 0.0     # the reference's default (no filtering)
    device: str = "cpu"
    requested: bool = False   # asked for explicitly: what stops it is an error, not a note


@dataclass(frozen=True)
class TrustTask:
    train_cache: str
    evaluated: tuple       # the CacheTasks (report/inputs.py) it scores
    spec: TrustSpec
    bootstrap: object = None


class TrustScoreError(TrustOraclesError, ValueError):
    """Why TrustScore cannot be computed for a cache; a note, or an error when requested."""


def plan_trust(cache_tasks: list, fits: dict, known: list[Path], spec: TrustSpec | None,
               ) -> tuple[list[TrustTask], list[str]]:
    """(one TrustTask per training cache, the notes of the caches left without the row).
    ``fits``: heldout.plan_fits's {evaluated cache: FitTask or reason}.  Raises
    TrustScoreError when TrustScore was requested and a cache cannot have it."""
    if spec is None:
        return [], []
    if spec.device != "cpu":
        try:
            knn.backend(spec.device)          # a device torch cannot use: said before any work
        except knn.KnnError as err:
            raise TrustScoreError(str(err)) from None
    groups: dict[str, list] = {}
    notes = []
    checked: dict[str, str | None] = {}
    for task in cache_tasks:
        try:
            train = _train_cache_of(task.cache, fits.get(task.cache), known)
            if train not in checked:
                checked[train] = _class_problem(train, spec.k)
            if checked[train]:
                raise TrustScoreError(checked[train])
            groups.setdefault(train, []).append(task)
        except TrustScoreError as err:
            if spec.requested:
                raise
            notes.append(f"TrustScore left out for {task.cache}: {err}")
    out = []
    for train, tasks in groups.items():
        pairs = ClassifierCache.open(Path(train)).num_rows * sum(
            ClassifierCache.open(Path(t.cache)).num_rows for t in tasks)
        if spec.device == "cpu" and not spec.requested and pairs > AUTO_CPU_PAIRS:
            notes += [f"TrustScore left out for {t.cache}: its exact search on the CPU "
                      f"({pairs:,} training-row x query pairs with its training cache {train}) "
                      "would take long; pass --knn-device cuda, or --trust-score to run it on "
                      "the CPU" for t in tasks]
            continue
        out.append(TrustTask(train, tuple(tasks), spec))
    return out, notes


def _train_cache_of(path: str, fit, known: list[Path]) -> str:
    cache = ClassifierCache.open(Path(path))
    if FEATURE_COLUMN not in cache.manifest["columns"]:
        raise TrustScoreError(f"the classifier cache {path} has no features; TrustScore measures "
                              "distances between them: re-extract it with `cli.py extract "
                              "--features`")
    try:
        train = (fit.train_cache if isinstance(fit, FitTask) else
                 training_cache([], TRAIN_SPLIT, cache.identity, path, known))
    except FitError as err:
        raise TrustScoreError(f"it is fitted on the {TRAIN_SPLIT!r} split: {err}") from None
    if Path(train).resolve() == Path(path).resolve():
        raise TrustScoreError(f"{path} is the training cache TrustScore is fitted on (its rows "
                              "would be their own nearest neighbours)")
    if FEATURE_COLUMN not in ClassifierCache.open(Path(train)).manifest["columns"]:
        raise TrustScoreError(f"its training cache {train} has no features: re-extract it with "
                              "`cli.py extract --features`")
    return train


def _class_problem(train: str, k: int) -> str | None:
    """Why the training cache cannot give every class's kept set (None: it can)."""
    cache = ClassifierCache.open(Path(train))
    cols = cache.load(["label", "valid"])
    counts = np.bincount(cols["label"][cols["valid"] == 1],
                         minlength=int(cache.identity["num_classes"]))
    names = cache.manifest.get("classes") or []
    # a classifier fitted without some classes never predicts them: only its known classes
    # (the cache's classes_kept, pipeline/data/newclass.py) need training rows
    known = cache.identity.get("classes_kept")
    for c, n in enumerate(counts.tolist()):
        if known is not None and c not in known:
            continue
        name = f"class {c}" + (f" ({names[c]!r})" if c < len(names) else "")
        if n == 0:
            return (f"{name} has no valid row in the training cache {train}; TrustScore needs "
                    "every class's training features (the distance to each class): extract a "
                    "training split that holds every class, or leave TrustScore out "
                    "(--no-trust-score)")
        if n < k:
            return (f"{name} has {n} valid row(s) in the training cache {train}, fewer than "
                    f"--trust-score-k {k} (a row's density is the distance to its k-th "
                    f"neighbour in its class); pass --trust-score-k {n} or less")
    return None


def fit_and_score(task: TrustTask) -> tuple[dict, dict[str, dict]]:
    """Worker: the kept sets of the training cache, then every evaluated cache's scores ->
    (the fit's record, {evaluated cache: its columns, the features replaced by ``score``})."""
    spec, start = task.spec, time.perf_counter()
    xp = knn.backend(spec.device)
    train = ClassifierCache.open(Path(task.train_cache))
    cols = train.load(["label", "valid", FEATURE_COLUMN])
    ok = cols["valid"] == 1
    # ImageNet: 5.2 GB of float16 features; no third copy when every row is valid
    feats, labels = ((cols[FEATURE_COLUMN], cols["label"]) if ok.all() else
                     (cols[FEATURE_COLUMN][ok], cols["label"][ok]))
    del cols
    kept, offsets = knn.kept_sets(feats, labels, int(train.identity["num_classes"]), spec.k,
                                  spec.alpha, xp)
    del feats
    record = {"train_cache": task.train_cache, "k": spec.k, "alpha": spec.alpha,
              "device": spec.device, "train_rows": int(ok.sum()), "kept_rows": int(len(kept)),
              "kept_per_class": np.diff(offsets).tolist()}
    fit_s, out = time.perf_counter() - start, {}
    for cache_task in task.evaluated:
        cache = ClassifierCache.open(Path(cache_task.cache))
        ev = cache.load(["index", "valid", "correct", "pred", FEATURE_COLUMN])
        if ev[FEATURE_COLUMN].shape[1] != kept.shape[1]:
            raise ReportError(f"TrustScore: the features of {cache_task.cache} have "
                              f"{ev[FEATURE_COLUMN].shape[1]} dimensions, those of its training "
                              f"cache {task.train_cache} {kept.shape[1]}; re-extract one of them")
        valid = ev["valid"] == 1
        score = np.zeros(len(valid), np.float64)   # undecodable rows: excluded from metrics
        score[valid] = knn.trust_ratio(ev[FEATURE_COLUMN][valid], ev["pred"][valid], kept,
                                       offsets, xp)
        del ev[FEATURE_COLUMN]            # ImageNet-C: 75 caches of 50,000 x 2,048
        out[cache_task.cache] = {**ev, "score": score}
    record.update(fit_s=round(fit_s, 3), score_s=round(time.perf_counter() - start - fit_s, 3))
    return record, out
