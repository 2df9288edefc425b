"""Splits for oracle training and evaluation: samples + their classifier cache, checked together.

A split is named by its cache tag (``train``, ``val``, ``test-defocus_blur-5``).  The cache's
identity says which dataset split and which corruption it holds; the samples are listed again
from ``--data`` and must have the cache's fingerprint, so pixels and targets can never be
misaligned.  Targets are read into RAM in the calling (main) process.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from cache.reader import ClassifierCache, UnstampedCacheWarning, cache_dir_for, note_once, slug
from cache.schema import CLASSIFIER_KEYS, CacheError, check_identity
from pipeline.data.corruptions import make_corruption, parse_corruption_tag
from pipeline.data.newclass import CLASSES_KEPT, select_classes
from pipeline.data.orientation import EXIF_TRANSPOSE, reading_exif
from pipeline.data.sources import SampleList, list_split
from pipeline.data.stamps import check_sources


@dataclass(frozen=True)
class Split:
    tag: str
    cache: ClassifierCache
    samples: SampleList
    corruption: tuple[str, int, int] | None     # (name, severity, seed) applied to the pixels

    def corrupt_fn(self) -> Callable | None:
        if self.corruption is None:
            return None
        return make_corruption(*self.corruption)


@dataclass
class SplitMemo:
    """What the runs of one sweep would otherwise redo per point: each split listed from --data
    once, and each cache's image check (stamps, then hashes) passed once.  A sweep owns one in its
    process and drops it when it ends, so images changed before the next sweep are caught there."""
    listings: dict = field(default_factory=dict)
    checked: set = field(default_factory=set)

    def samples(self, data: str | None, split: str, labels_file: str | None) -> SampleList:
        key = (data, split, labels_file)
        if key not in self.listings:
            self.listings[key] = list_split(data, split, labels_file)
        return self.listings[key]

    def clear(self) -> None:
        self.listings.clear()
        self.checked.clear()


def parse_corruption(spec: str) -> tuple[str, int, int] | None:
    """The cache's ``corruption`` attribute "name:severity:seedN" (or "none")."""
    if not spec or spec == "none":
        return None
    return parse_corruption_tag(spec)


def open_split(data: str | None, cache_root: Path, classifier: str, tag: str,
               labels_file: str | None = None,
               same_classifier_as: Mapping | None = None, memo: SplitMemo | None = None) -> Split:
    """Open the complete cache of ``classifier`` for ``tag`` and list its samples from ``data``.

    Refuses (naming the attribute) a cache whose dataset fingerprint or row count differs from
    the samples listed now, or — with ``same_classifier_as`` (another cache's identity) — a cache
    of a different classifier (model, weights, preprocessing).  ``memo`` (a sweep's) lists each
    split and checks each cache's images once for all its runs.
    """
    path = cache_dir_for(cache_root, classifier, tag)
    if not path.exists():
        embedded = ("; no --data was given, which means the embedded Fashion-MNIST: pass --data "
                    "ROOT for your own dataset" if data is None else "")
        raise CacheError(f"no classifier cache for split {tag!r} at {path}: run `python cli.py "
                         f"extract --classifier {classifier} [--weights FILE] --split <split> "
                         f"[--corruption NAME --severity N]` with the same --data first, or pass "
                         f"--cache ROOT{embedded}")
    cache = ClassifierCache.open(path)
    ident = cache.identity
    check_classifier(cache, classifier)
    # the rows the cache holds: those of the classes it kept (a classifier that held classes
    # out, pipeline/data/newclass.py), then checked by the fingerprint of exactly those rows
    samples = select_classes((memo or SplitMemo()).samples(data, ident["split"], labels_file),
                             ident.get(CLASSES_KEPT))
    if ident.get("dataset_fingerprint") == samples.fingerprint and \
            ident.get("num_rows") != len(samples):
        # the fingerprint hashes exactly the listed rows: the data is the same, the cache is not
        raise CacheError(f"cache {path}: its manifest.json says num_rows {ident.get('num_rows')}, "
                         f"but its dataset fingerprint is that of the {len(samples)} rows listed "
                         "from --data: the manifest is damaged or edited. Delete "
                         f"{path / 'manifest.json'} and re-run the same `cli.py extract` command "
                         "(it checks the shards and writes the manifest again)")
    check_identity(ident, {"dataset": samples.dataset, "dataset_fingerprint": samples.fingerprint,
                           "num_rows": len(samples)}, f"cache {path}",
                   hint=f"The split {ident['split']!r} listed from --data {data or '(embedded)'} "
                        "is not the one this cache was extracted from: pass the same --data, or "
                        "re-extract.")
    if same_classifier_as is not None:
        check_identity(ident, dict(same_classifier_as), f"cache {path}", keys=CLASSIFIER_KEYS,
                       hint="It was extracted with another classifier than the training split's "
                            "cache; re-extract it with the same --classifier, --weights FILE, "
                            "--model-kwargs and --preprocess.")
    check_images(cache, samples, memo)
    # pixels read as the cache read them (EXIF orientation applied only where it recorded so)
    samples = reading_exif(samples, ident.get(EXIF_TRANSPOSE, False))
    return Split(tag, cache, samples, parse_corruption(ident.get("corruption", "none")))


def check_classifier(cache: ClassifierCache, classifier: str) -> None:
    """The cache found under ``--classifier``'s name must be that classifier's: a cache copied or
    moved under another name would be trained on, and recorded, as the wrong model."""
    recorded = cache.manifest.get("config", {}).get("classifier")
    if recorded is not None and slug(recorded) != slug(classifier):
        ident = cache.identity
        raise CacheError(f"cache {cache.path} was extracted with --classifier {recorded} (model "
                         f"{ident['model']}, model_kwargs {json.dumps(ident['model_kwargs'])}), "
                         f"not --classifier {classifier}: it was copied or moved under this name. "
                         f"Pass --classifier {recorded}, or extract {classifier}'s own cache with "
                         f"`cli.py extract --classifier {classifier}`")


def check_images(cache: ClassifierCache, samples: SampleList,
                 memo: SplitMemo | None = None) -> None:
    """Pixels read from --data meet targets read from the cache: the images must be the ones the
    cache was computed from (stamps, then content hashes: pipeline/data/stamps.py).  With ``memo``,
    a check this cache (its shards' entries) and listing passed is not repeated."""
    key = (str(cache.path.resolve()), json.dumps(cache.manifest["shards"], sort_keys=True),
           samples.fingerprint)
    if memo is not None and key in memo.checked:
        return
    found = check_sources(cache.path, cache.manifest["shards"], samples)
    if found.changed:
        raise CacheError(f"cache {cache.path}: {found.changed_text(samples)} of --data changed "
                         "since it was extracted (their content differs from the hashes it "
                         "records), so its trust labels do not describe them. Re-run the same "
                         "`cli.py extract` command: it recomputes the shards of the changed images")
    if found.unstamped:
        note_once(f"stamps {cache.path.resolve()}", f"cache {cache.path} was written before image "
                  "stamps: changed images of --data cannot be found; re-run the same `cli.py "
                  "extract` command once to record them", UnstampedCacheWarning)
    if found.restamp:
        note_once(f"restamp {cache.path.resolve()}", f"cache {cache.path}: the image files of "
                  f"{len(found.restamp)} shard(s) have new sizes or modification times but the "
                  "content the cache was computed from (checked by hashing them); re-run the "
                  "same `cli.py extract` command to record their stamps and skip this check")
    if memo is not None:
        memo.checked.add(key)


def training_targets(split: Split) -> dict[str, np.ndarray]:
    """o and the TCP target of every row, for the unflipped and (when cached) flipped view."""
    cols = ["valid", "correct", "p_true"]
    flip = bool(split.cache.identity.get("flip_view"))
    if flip:
        cols += ["correct_flip", "p_true_flip"]
    data = split.cache.load(cols)
    out = {"valid": data["valid"].astype(bool), "correct": data["correct"].astype(np.float32),
           "p_true": data["p_true"].astype(np.float32)}
    out["correct_flip"] = data["correct_flip"].astype(np.float32) if flip else out["correct"]
    out["p_true_flip"] = data["p_true_flip"].astype(np.float32) if flip else out["p_true"]
    return out


def check_both_classes(correct: np.ndarray, where: str) -> tuple[int, int]:
    """(n_incorrect, n_correct); refuses a split where every prediction is right (or wrong)."""
    n_pos = int(correct.sum())
    n_neg = int(len(correct) - n_pos)
    if n_pos == 0 or n_neg == 0:
        state = "correct" if n_neg == 0 else "incorrect"
        raise CacheError(f"{where}: the classifier's cached predictions are ALL {state} on the "
                         f"{len(correct)} training rows, so there is nothing to tell apart; use "
                         "more rows (--max-samples), another split or another classifier")
    return n_neg, n_pos
