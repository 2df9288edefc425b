"""The classifier cache a run was trained on: found from any working folder, and taken only if it
still is that cache.

    record = cache_record(cache_path, run_dir)  # run.json's train_cache* keys (train-oracle)
    cache = training_cache(run_dir, run)        # ClassifierCache, checked against run.json

A run records its training cache three ways: the absolute path, the path relative to the run
directory (so runs and caches moved together still resolve) and the path as typed on the command
line (``train_cache_given``, for people).  A run written before the first two recorded only the
typed path, relative to the folder ``train-oracle`` ran in; it is looked for relative to that
folder's likely places too (the current folder, then each folder above the run).

Whatever path finds a cache, the cache is taken by what it is, never by where it is: its
classifier (``CLASSIFIER_KEYS``: model, weights hash, classes, preprocessing) must be the one run.json
recorded, and its rows the ones the run trained on (the dataset fingerprint).  A cache re-extracted
in place with other weights or another model would otherwise have the oracle judge a classifier it
never saw (``predict --images``, ``load_oracle``) or fit the report's baselines on other rows.
Torch-free (``cli.py report`` uses it).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from cache.manifest import MANIFEST_FILE
from cache.reader import ClassifierCache
from cache.runfile import RunError, RunFile
from cache.schema import CLASSIFIER_KEYS, CacheMismatch, identity_diff

FIX = ("Restore the cache the run was trained on (its `cli.py extract` command, with the weights "
       "it recorded, into another --out if this one is to stay), or train a new oracle on this "
       "cache")


def cache_record(cache_path: Path, run_dir: Path) -> dict[str, str]:
    """run.json's keys naming the training cache: absolute, relative to the run, as typed."""
    absolute = Path(cache_path).resolve()
    return {"train_cache": str(absolute),
            "train_cache_from_run": os.path.relpath(absolute, Path(run_dir).resolve()),
            "train_cache_given": str(cache_path)}


def candidates(run_dir: Path, run: RunFile) -> list[Path]:
    """Where the run's training cache may be, most specific first, each place once."""
    recorded = [p for p in (run.train_cache, run.train_cache_given) if p]
    found: list[Path] = []
    if run.train_cache_from_run:
        found.append(Path(run_dir) / run.train_cache_from_run)
    for text in recorded:
        path = Path(text)
        found.append(path)
        if not path.is_absolute():       # typed relative to the folder train-oracle ran in
            found += [above / path for above in Path(run_dir).resolve().parents]
    return list(dict.fromkeys(p.resolve() for p in found))


def recorded_identity(run: RunFile) -> dict[str, Any]:
    """What run.json says the training cache is (the keys it recorded; {} for the oldest runs)."""
    expected = dict(run.classifier_identity or {})
    if run.train_fingerprint:
        expected["dataset_fingerprint"] = run.train_fingerprint
    return expected


def identity_problems(run: RunFile, identity: Mapping[str, Any]) -> list[str]:
    """Each attribute in which ``identity`` differs from the run's training cache, with both."""
    expected = recorded_identity(run)
    keys = tuple(k for k in (*CLASSIFIER_KEYS, "dataset_fingerprint") if k in expected)
    return identity_diff(identity, expected, keys, found_in="cache")


def check_training_cache(run_dir: Path, run: RunFile, cache: ClassifierCache) -> None:
    """Refuse (``CacheMismatch``, every differing attribute with both values) a cache that is no
    longer the run's training cache."""
    diffs = identity_problems(run, cache.identity)
    if diffs:
        raise CacheMismatch(
            f"run {run_dir} was trained on the classifier cache {cache.path} as it was then, but "
            "that folder now holds another classifier's cache (or other rows):\n  "
            + "\n  ".join(d.replace("expected", "the run recorded") for d in diffs)
            + "\nIts classifier is not the one the oracle learned to judge, so its predictions "
              f"would be flagged by an oracle that never saw them. {FIX}.")


def training_cache(run_dir: Path, run: RunFile) -> ClassifierCache:
    """The run's training cache: the first of ``candidates`` that holds a complete cache with the
    recorded identity.  ``RunError`` where none holds a cache (naming the places looked in);
    ``CacheMismatch`` where the recorded place holds another one."""
    places = candidates(run_dir, run)
    other = None
    for path in places:
        if not (path / MANIFEST_FILE).is_file():
            continue
        cache = ClassifierCache.open(path)
        if not identity_problems(run, cache.identity):
            return cache
        other = other or cache
    if other is not None:
        check_training_cache(run_dir, run, other)
    where = places[0] if places else "(none recorded)"
    more = f"; nor at {', '.join(map(str, places[1:]))}" if len(places) > 1 else ""
    raise RunError(f"run {run_dir} was trained on the classifier cache {where}, which is not "
                   f"there now (moved or deleted{more}); it records the classifier (weights, "
                   "classes) the run's oracle judges: restore it, or re-run the same "
                   "`cli.py extract` command")
