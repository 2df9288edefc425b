"""``report --export fd-shifts``: each oracle run as one experiment of fd-shifts' analysis (Jaeger
et al., ICLR 2023; github IML-DKFZ/fd-shifts), so its own metrics run on our data as it is.

What fd-shifts' analysis reads (``ExperimentData.from_experiment``, README "Analysis"), per
experiment directory ``<EXPERIMENT_ROOT_DIR>/<group_name>/<name>/test_results/``:

* ``raw_logits.npz``: one array (saved positionally, key ``arr_0``) of shape N x (C + 2): the C
  logits, the label, the dataset index.  With ``val_tuning`` (its default, and required: its
  analysis refuses to run without it) index 0 is the validation set, on which it fits temperature
  and Platt scaling and its risk threshold; its test sets follow as 1, 2, ... in the order of
  ``query_studies`` (``iid_study``, then each ``in_class_study``);
* ``external_confids.npz``: ``arr_0``, the N confidences of an external scorer, row-aligned.

fd-shifts recomputes correctness as argmax(logits) == label.

Written here, under ``<report>/fd-shifts/``, one experiment per run (``<classifier>/<run>/``):
index 0 = the rows the run held out of its training split, scored by its chosen oracle
(``RUN/heldout/<split>.h5``, written by train-oracle); 1, 2, ... = each split the report
evaluates the run on, an uncorrupted one first, then by tag.  Rows are the valid rows in
global-index order.  ``index.json`` records, per experiment, that mapping and the fd-shifts
arguments that describe it (docs/METRICS.md gives the whole command).
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict
from functools import lru_cache
from pathlib import Path

import numpy as np

from cache.atomic import atomic_path
from cache.outputs import classifier_ref, read_outputs
from cache.manifest import MANIFEST_FILE
from cache.reader import ClassifierCache, slug
from cache.runfile import RunFile
from cache.runs import RUN_IDENTITY, VAL_FILE, RunDir
from cache.schema import CacheMismatch, identity_diff
from cache.shards import read_attrs
from pipeline.report.heldout import read_rows
from pipeline.report.inputs import OutputTask, ReportError

EXPORT_DIR = "fd-shifts"
EXT_CONFID = "ext"            # fd-shifts' name of an external confidence (confid_scores.py)
CSFS = ("det_mcp", "det_pe", EXT_CONFID)   # the confidence scores fd-shifts computes
COLUMNS = ("label", "valid", "logits", "pred", "correct")


def fd_shifts_logits(logits: np.ndarray, pred: np.ndarray, where: str = "rows",
                     index: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """float32 logits whose argmax is ``pred`` in every row, and how many rows needed it.

    ``pred`` was taken from the unrounded logits; rounding them to float16 can tie the predicted
    class with another one, which argmax then resolves to the lower index (2 of 10,000 rows of
    the embedded test split).  Such a row's predicted logit is raised to the next float32 above
    the tie, which moves its softmax by about 1e-7.  Rounding is monotone, so anything but a tie
    means the logits are not those ``pred`` came from: refused, naming the global ``index``."""
    out = np.asarray(logits, dtype=np.float32).copy()
    index = np.arange(len(out)) if index is None else index
    rows = np.flatnonzero(out.argmax(1) != pred)
    top = out[rows].max(1)
    below = rows[out[rows, pred[rows]] < top]
    if len(below):
        raise CacheMismatch(f"{where}: row {index[below[0]]}: the stored prediction "
                            f"{pred[below[0]]} is not a largest logit of that row ({len(below)} "
                            "such rows); the cache's columns disagree, re-extract it")
    out[rows, pred[rows]] = np.nextafter(top, np.float32(np.inf))
    return out, len(rows)


def raw_logits_array(cols: dict, dataset_idx: int, where: str = "rows",
                     index: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """N x (C + 2) float32: logits (argmax = pred) | label | ``dataset_idx``; ``cols``: COLUMNS
    of the rows to export (global ``index``).  Refuses rows whose ``correct`` is not
    pred == label, since fd-shifts derives correctness from argmax and label."""
    index = np.arange(len(cols["label"])) if index is None else index
    logits, adjusted = fd_shifts_logits(cols["logits"], cols["pred"], where, index)
    labels = cols["label"].astype(np.int64)
    disagree = np.flatnonzero((logits.argmax(1) == labels) != (cols["correct"] == 1))
    if len(disagree):
        i = disagree[0]
        raise CacheMismatch(f"{where}: row {index[i]}: correct={cols['correct'][i]} but pred "
                            f"{cols['pred'][i]} and label {labels[i]} say otherwise; the cache's "
                            "columns disagree, re-extract it")
    column = np.full((len(labels), 1), dataset_idx, np.float32)
    return np.concatenate([logits, labels.astype(np.float32)[:, None], column], axis=1), adjusted


@lru_cache(maxsize=2)
def _cache_columns(path: str) -> tuple[dict, dict]:
    """A classifier cache's COLUMNS and identity (the runs of one cache share them)."""
    cache = ClassifierCache.open(Path(path))
    return cache.load(list(COLUMNS)), cache.identity


def _heldout_part(task: OutputTask) -> dict:
    """Dataset 0: the run's held-out training rows, scored by its oracle (RUN/heldout/)."""
    run, record = RunDir(Path(task.run_dir)), task.run_file.heldout_output
    if not record:
        val = run.val_split()
        if not val or not val.get("val_rows"):
            raise ReportError(f"run {task.run_dir} held out no training rows (--val-fraction 0), "
                              "and fd-shifts' analysis needs them as its validation set (dataset "
                              "index 0); train it with --val-fraction > 0, or leave out --export")
        raise ReportError(f"run {task.run_dir} has no oracle scores of its held-out rows, which "
                          "fd-shifts' analysis needs as its validation set (dataset index 0): "
                          "re-run the same `cli.py train-oracle` command, which adds them to the "
                          "complete run without training it again")
    path = run.heldout_output(record["split"])
    cache_path = Path(read_attrs(path).get("classifier_cache", {}).get("path", "")) \
        if path.exists() else None
    if cache_path is not None and not (cache_path / MANIFEST_FILE).exists():
        raise ReportError(f"run {task.run_dir}: the training cache of {path.name} is not at "
                          f"{cache_path}; fd-shifts' validation rows are read from it")
    cache = ClassifierCache.open(cache_path) if cache_path else None
    data = read_outputs(path, digest=record, expect_classifier=cache and classifier_ref(
        cache.path, cache.identity))
    diffs = identity_diff(data.run, _labels(task.run_file) or data.run, RUN_IDENTITY)
    rows = np.flatnonzero(data.columns["valid"] == 1)
    held = set((run.val_split() or {}).get("val_rows", []))
    if diffs or not set(rows.tolist()) <= held:
        why = "; ".join(diffs) or f"rows outside its {VAL_FILE}"
        raise CacheMismatch(f"{path} does not hold this run's held-out rows ({why}); delete it "
                            "and re-run the same `cli.py train-oracle` command")
    cols = read_rows(cache.path, rows, COLUMNS)
    return {"study": "val_tuning", "name": "val_tuning", "split": record["split"],
            "cache": str(cache.path), "cols": cols, "rows": rows,
            "confids": data.columns["confidence"][rows], "excluded": []}


def _split_part(task: OutputTask) -> dict:
    cols, identity = _cache_columns(task.cache)
    data = read_outputs(Path(task.output))
    if not np.array_equal(data.columns["valid"], cols["valid"]):
        raise CacheMismatch(f"{task.output}: valid rows differ from cache {task.cache}")
    valid = cols["valid"] == 1
    c, h, w = identity["data_config"]["input_size"]
    return {"split": task.tag, "name": task.tag, "cache": task.cache,
            "cols": {k: v[valid] for k, v in cols.items()}, "rows": np.flatnonzero(valid),
            "confids": data.columns["confidence"][valid], "img_size": [h, w, c],
            "excluded": np.flatnonzero(~valid).tolist(),
            "clean": (task.ref.get("corruption") or "none") == "none"}


def _experiment(tasks: list[OutputTask], held: dict) -> tuple[list[dict], int]:
    """The parts of one run's experiment in dataset-index order, and num_classes."""
    splits = sorted((_split_part(t) for t in tasks), key=lambda p: (not p["clean"], p["split"]))
    for i, part in enumerate(splits):
        part["study"] = "iid_study" if i == 0 else "in_class_study"
    num_classes = int(_cache_columns(tasks[0].cache)[1]["num_classes"])
    return [held, *splits], num_classes


def fd_shifts_args(group: str, name: str, parts: list[dict], num_classes: int) -> list[str]:
    """The ``fd-shifts analysis`` arguments of one experiment (dataset names = our split tags)."""
    in_class = ", ".join(f"{{dataset: {p['name']}, img_size: {p['img_size']}}}" for p in parts[2:])
    return ["analysis", f"--config.exp.group_name={group}", f"--config.exp.name={name}",
            f"--config.data.num_classes={num_classes}",
            f"--config.eval.query_studies.iid_study={parts[1]['name']}",
            f"--config.eval.query_studies.in_class_study=[{in_class}]",
            f"--config.eval.ext_confid_name={EXT_CONFID}",
            f"--config.eval.confidence_measures.test=[{', '.join(CSFS)}]"]


def _write_npz(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, suffix=".npz") as tmp:    # numpy adds .npz to a name without it
        np.savez_compressed(tmp, array)


def _write_experiment(exp_dir: Path, parts: list[dict]) -> list[dict]:
    raws, confids, described = [], [], []
    for idx, part in enumerate(parts):
        raw, adjusted = raw_logits_array(part["cols"], idx, f"cache {part['cache']}",
                                         part["rows"])
        raws.append(raw)
        confids.append(part["confids"].astype(np.float32))
        described.append({"dataset_idx": idx, "study": part["study"], "name": part["name"],
                          "split": part["split"], "cache": part["cache"], "rows": len(raw),
                          "excluded_indices": part["excluded"], "argmax_adjusted_rows": adjusted})
    _write_npz(exp_dir / "test_results" / "raw_logits.npz", np.concatenate(raws))
    _write_npz(exp_dir / "test_results" / "external_confids.npz", np.concatenate(confids))
    return described


def export_fd_shifts(out: Path, tasks: list[OutputTask]) -> str:
    """Write one fd-shifts experiment per run of ``tasks`` (the report's output tasks).  Every
    run is checked for its held-out scores before anything is written.  Returns index.json's
    path."""
    by_run: dict[str, list[OutputTask]] = defaultdict(list)
    for t in tasks:
        by_run[t.run_dir].append(t)
    if not by_run:
        raise ReportError("--export fd-shifts: no oracle run among the inputs; fd-shifts' "
                          "experiments are oracle runs (their held-out rows and evaluated splits)")
    held, missing = {}, []
    for run_dir, run_tasks in by_run.items():
        try:
            held[run_dir] = _heldout_part(run_tasks[0])
        except ReportError as err:
            missing.append(str(err))
    if missing:
        raise ReportError("--export fd-shifts (the report itself is written):\n  "
                          + "\n  ".join(missing))
    root = Path(out) / EXPORT_DIR
    index: dict = {"format": "fd-shifts raw_logits.npz / external_confids.npz (key arr_0)",
                   "ext_confid_name": EXT_CONFID, "experiments": []}
    names: set[tuple[str, str]] = set()
    for run_dir, run_tasks in by_run.items():
        parts, num_classes = _experiment(run_tasks, held.pop(run_dir))
        group = slug(run_tasks[0].classifier or "classifier")
        name = base = slug(Path(run_dir).name)
        for k in range(2, len(names) + 2):       # one run folder name under two roots
            if (group, name) not in names:
                break
            name = f"{base}-{k}"
        names.add((group, name))
        datasets = _write_experiment(root / group / name, parts)
        index["experiments"].append({
            "dir": f"{group}/{name}", "run": run_dir, "labels": _labels(run_tasks[0].run_file),
            "datasets": datasets,
            "fd_shifts_args": fd_shifts_args(group, name, parts, num_classes)})
    _cache_columns.cache_clear()
    root.mkdir(parents=True, exist_ok=True)
    (root / "index.json").write_text(json.dumps(index, indent=1, default=str) + "\n",
                                     encoding="utf-8")
    return str(root / "index.json")


def _labels(run_file: RunFile) -> dict | None:
    """The run record as run.json holds it (None for a copied run without one)."""
    return asdict(run_file.labels) if run_file.labels else None
