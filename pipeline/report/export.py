"""``report --export fd-shifts``: our caches and oracle outputs as the inputs of fd-shifts' analysis
(Jaeger et al., ICLR 2023; github IML-DKFZ/fd-shifts), so its own metrics run on our data.

What fd-shifts reads (its ``ExperimentData.from_experiment``, README "Analysis"), per experiment
directory ``<exp>/test_results/``:

* ``raw_logits.npz``: one array (saved positionally, key ``arr_0``) of shape N x (C + 2): the C
  logits, then the label, then the dataset index (0 = the first test set; 0 is the validation set
  instead when the config sets ``val_tuning``);
* ``external_confids.npz``: one array (``arr_0``) of the N confidences of an external scorer,
  row-aligned with raw_logits.

Written here, under ``<report>/fd-shifts/`` (EXPERIMENT_ROOT_DIR for fd-shifts)::

    <classifier>/<split>/posthoc/test_results/raw_logits.npz      the classifier alone
    <classifier>/<split>/<run>/test_results/raw_logits.npz         same file (hard link or copy)
    <classifier>/<split>/<run>/test_results/external_confids.npz   that run's oracle confidences
    index.json                                                     what every directory holds

Rows: the cache's valid rows (valid == 1, as every metric of the report) in global-index order;
dataset index 0 for every row (one experiment per split: configure fd-shifts with that split as
its only, i.i.d. test set).  Values are float32 (fd-shifts casts to float64 on load).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from cache.outputs import read_outputs
from cache.reader import ClassifierCache, slug
from cache.schema import CacheMismatch

EXPORT_DIR = "fd-shifts"
POSTHOC = "posthoc"


def raw_logits_array(cols: dict) -> np.ndarray:
    """N x (C + 2) float32: logits | label | dataset index 0, valid rows only."""
    valid = cols["valid"] == 1
    logits = cols["logits"][valid].astype(np.float32)
    labels = cols["label"][valid].astype(np.float32)[:, None]
    return np.concatenate([logits, labels, np.zeros_like(labels)], axis=1)


def _write_npz(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}.npz")
    np.savez_compressed(tmp, array)
    tmp.replace(path)


def _link(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists():
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:              # another file system, or links not allowed
        shutil.copyfile(src, dst)


def export_fd_shifts(out: Path, caches: list[tuple[str, str, str]], outputs: list[dict]) -> str:
    """Write the fd-shifts inputs.  ``caches``: [(cache path, classifier label, split tag)];
    ``outputs``: [{"cache", "output", "run_dir", "tag"}].  Returns the index file's path."""
    root = Path(out) / EXPORT_DIR
    index: dict = {"format": "fd-shifts raw_logits.npz / external_confids.npz (key arr_0)",
                   "dataset_idx": 0, "experiments": []}
    for cache_path, classifier, tag in caches:
        cache = ClassifierCache.open(Path(cache_path))
        cols = cache.load(["label", "valid", "logits"])
        valid = cols["valid"] == 1
        base = root / slug(classifier) / tag
        raw = base / POSTHOC / "test_results" / "raw_logits.npz"
        _write_npz(raw, raw_logits_array(cols))
        entry = {"dir": str(raw.parent.parent.relative_to(root)), "cache": str(cache.path),
                 "split": tag, "rows": int(valid.sum()),
                 "num_classes": int(cache.identity["num_classes"]),
                 "excluded_indices": np.flatnonzero(~valid).tolist(), "run": None}
        index["experiments"].append(entry)
        for o in (o for o in outputs if o["cache"] == cache_path and o["tag"] == tag):
            data = read_outputs(Path(o["output"]))
            if not np.array_equal(data.columns["valid"], cols["valid"]):
                raise CacheMismatch(f"{o['output']}: valid rows differ from cache {cache.path}")
            run_dir = base / slug(Path(o["run_dir"]).name) / "test_results"
            _link(raw, run_dir / "raw_logits.npz")
            confids = data.columns["confidence"][valid].astype(np.float32)
            _write_npz(run_dir / "external_confids.npz", confids)
            index["experiments"].append({**entry, "dir": str(run_dir.parent.relative_to(root)),
                                         "run": o["run_dir"], "labels": data.run})
    root.mkdir(parents=True, exist_ok=True)
    (root / "index.json").write_text(json.dumps(index, indent=1, default=str) + "\n",
                                     encoding="utf-8")
    return str(root / "index.json")
