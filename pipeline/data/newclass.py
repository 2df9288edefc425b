"""Classes held out of a classifier's training, and a split's rows of some classes only.

``fit-classifier --holdout-classes`` names classes of the dataset (names or indices) that the
classifier never sees; ``extract`` then caches the rows of its known classes (every split), or
with ``--new-classes`` the rows of the held-out ones (split tag ``<split>-newclass``), where every
prediction is wrong.  Labels stay the dataset's class indices.  The classes kept are recorded in
the cache identity (``CLASSES_KEPT``, present only where a selection was made) and every reader
that lists a split again for a cache selects the same rows before checking the fingerprint, which
hashes the names and labels of exactly the rows kept.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable

import numpy as np

from pipeline.data.errors import DataError
from pipeline.data.samples import SampleList

CLASSES_KEPT = "classes_kept"      # the cache identity's key: sorted class indices of the rows
NEWCLASS_SUFFIX = "-newclass"      # the split tag of the held-out classes' rows: test-newclass


def resolve_holdout(given: Iterable[str], classes: tuple[str, ...]) -> tuple[int, ...]:
    """The sorted class indices ``given`` names (class names of the data, else indices), refusing
    a class the data lack and a hold-out that leaves fewer than 2 classes to fit on."""
    given = [g.strip() for g in given if g.strip()]
    listing = ", ".join(f"{i} {c}" for i, c in enumerate(classes))
    out = set()
    for name in given:
        if name in classes:
            out.add(classes.index(name))
        elif name.isdigit() and int(name) < len(classes):
            out.add(int(name))
        else:
            raise DataError(f"--holdout-classes: the data have no class {name!r}; name classes "
                            f"of the data (or their indices): {listing}")
    left = len(classes) - len(out)
    if left < 2:
        raise DataError(f"--holdout-classes holds out {len(out)} of the data's {len(classes)} "
                        f"classes, leaving {left} to fit on: hold out at most "
                        f"{len(classes) - 2} classes so the classifier still tells 2 apart")
    return tuple(sorted(out))


def parse_holdout(text: str | None) -> tuple[str, ...]:
    """``--holdout-classes LIST``: comma-separated names or indices (empty: none)."""
    return tuple(t.strip() for t in (text or "").split(",") if t.strip())


def kept_classes(held_out: tuple[int, ...], num_classes: int, new_classes: bool) -> tuple[int, ...]:
    """The classes whose rows a cache keeps: the held-out ones (``new_classes``), else the rest."""
    if new_classes:
        return tuple(sorted(held_out))
    return tuple(k for k in range(num_classes) if k not in set(held_out))


def select_classes(samples: SampleList, kept: Iterable[int] | None) -> SampleList:
    """The rows of ``samples`` whose label is in ``kept``, in their order (None: all rows).  The
    fingerprint of the result hashes only those rows, so it differs from the whole split's."""
    if kept is None:
        return samples
    rows = np.flatnonzero(np.isin(samples.labels, np.asarray(list(kept), dtype=np.int64)))
    images = samples.idx_images[rows] if samples.idx_images is not None else None
    return replace(samples, names=tuple(samples.names[i] for i in rows.tolist()),
                   labels=samples.labels[rows].copy(), idx_images=images)


def newclass_tag(split: str, new_classes: bool) -> str:
    """The split name a cache of ``split`` is tagged with: ``test-newclass`` for the held-out
    classes' rows, the split's own name otherwise."""
    return f"{split}{NEWCLASS_SUFFIX}" if new_classes else split
