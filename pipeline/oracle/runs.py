"""Run directories: naming, the group hash, the ``run`` record, run.json and log.jsonl.

A run directory is claimed like a cache directory: identical settings map to the same directory
(default name ``<oracle>-<classifier>_<loss>[_<variant>]_seed<N>_<group>``), where a complete run is
skipped, an incomplete one resumed, and a directory holding another run is refused naming the
differing settings.  See docs/DATA_CONTRACT.md (Stage 2) for the layout.
"""
from __future__ import annotations

import hashlib
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any, Mapping

import timm
import torch

from cache.lock import DirLock
from cache.manifest import read_json, write_json_atomic
from cache.reader import slug
from cache.schema import CacheError, canonical, identity_diff

RUN_FILE, VAL_FILE, LOG_FILE = "run.json", "val_split.json", "log.jsonl"
TENSORBOARD_DIR = "tensorboard"
CHECKPOINTS, OUTPUTS = "checkpoints", "outputs"

# Settings that change neither what is trained nor how: excluded from the group hash, so runs
# differing only in them (or in the seed) share a group.  Paths are replaced by the identity of
# the training cache (dataset fingerprint, classifier weights).
NOT_IN_GROUP = ("seed", "out", "runs_root", "artifacts", "data", "cache", "labels_file", "eval_splits",
                "resume", "progress", "workers", "device", "compile", "cuda_graph",
                "eval_batch_size", "ckpt_every", "log_every", "stop_at_step", "features_cache")


class RunError(RuntimeError):
    """A run directory holds another run, a run cannot resume, or training failed (NaN/inf)."""


class TrainingDiverged(RunError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


def group_hash(config: Mapping[str, Any], train_identity: Mapping[str, Any]) -> str:
    """12 hex digits naming everything that defines a run except its seed."""
    keep = {k: v for k, v in config.items() if k not in NOT_IN_GROUP}
    if not keep.get("head_only"):      # fine-tuned runs keep the group they had before --head-only
        keep.pop("head_only", None)
    keep["train_cache"] = {k: train_identity.get(k) for k in
                           ("model", "weights_sha256", "dataset_fingerprint", "split", "corruption")}
    return hashlib.sha256(json.dumps(canonical(keep), sort_keys=True).encode()).hexdigest()[:12]


def run_record(config: Mapping[str, Any], *, oracle_model: str, variant: str, loss_label: str,
               group: str, dataset: str, num_classes: int) -> dict:
    """The ``run`` record of DATA_CONTRACT.md (run.json and every output file's ``run`` attr)."""
    return {"oracle": config["oracle"], "oracle_model": oracle_model,
            "classifier": config["classifier"], "loss": config["loss"], "variant": variant,
            "loss_label": loss_label, "seed": int(config["seed"]), "group": group,
            "dataset": dataset, "num_classes": int(num_classes), "config": canonical(dict(config))}


def default_run_dir(runs_root: Path, record: Mapping[str, Any]) -> Path:
    variant = f"_{record['variant'].replace('+', '_')}" if record["variant"] else ""
    name = (f"{slug(record['oracle'])}-{slug(record['classifier'])}_{record['loss']}{variant}"
            f"_seed{record['seed']}_{record['group']}")
    return Path(runs_root) / name


def claim_run(run_dir: Path, record: Mapping[str, Any], must_resume: bool) -> str:
    """'new', 'resume' or 'complete'.  Refuses a directory that holds another run."""
    run_dir = Path(run_dir)
    path = run_dir / RUN_FILE
    if path.exists():
        found = read_json(path, "run file")
        old, new = found.get("run", {}), dict(record)
        keys = ("oracle", "classifier", "loss", "variant", "seed", "group")
        diffs = identity_diff(old, new, keys)
        if diffs:
            cfg_diffs = identity_diff(old.get("config", {}), new["config"],
                                      tuple(k for k in new["config"] if k not in NOT_IN_GROUP))
            raise RunError(f"run directory {run_dir} holds another run:\n  "
                           + "\n  ".join(diffs + cfg_diffs)
                           + "\nUse another --out, or delete that directory to start over.")
        if found.get("status") == "complete":
            return "complete"
        if (run_dir / CHECKPOINTS / "last.pt").exists():
            return "resume"
    elif run_dir.exists() and any(not p.name.startswith(".") for p in run_dir.iterdir()):
        raise RunError(f"--out {run_dir} is not empty and is not a run directory (no {RUN_FILE}); "
                       "choose an empty or new directory")
    if must_resume:
        raise RunError(f"--resume: {run_dir} has no checkpoint to resume from (settings that "
                       "differ from the interrupted run change the run directory; compare "
                       "run.json of the runs under its parent)")
    return "new"


def write_run_file(run_dir: Path, record: Mapping[str, Any], status: str, **extra) -> None:
    payload = {"run": dict(record), "status": status, **extra,
               "versions": {"torch": torch.__version__, "timm": timm.__version__,
                            "python": platform.python_version()},
               "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    write_json_atomic(Path(run_dir) / RUN_FILE, payload)


def mark_failed(run_dir: Path, error: str) -> None:
    """Set run.json's status to ``failed`` with ``error``, if run.json exists and can be written
    (after a full disk it may not: the run then still reads ``running``, as after a kill)."""
    path = Path(run_dir) / RUN_FILE
    if not path.exists():
        return
    try:
        payload = read_json(path, "run file")
        write_json_atomic(path, {**payload, "status": "failed", "error": error,
                                 "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    except CacheError:
        pass


def read_run_file(run_dir: Path) -> dict:
    return read_json(Path(run_dir) / RUN_FILE, "run file")


class StepLog:
    """log.jsonl: one JSON line per logged step or validation.  On resume, lines after the
    checkpoint's step are dropped, so the log equals an uninterrupted run's.

    When the ``tensorboard`` package is installed (extra ``tensorboard``), the same numbers also
    go to TensorBoard event files in RUN_DIR/tensorboard/ (``train/<key>`` per logged step,
    ``val/<metric>`` per validation); on resume, events after the checkpoint's step are purged
    the same way (``purge_step``)."""

    def __init__(self, run_dir: Path, resume_step: int | None, enabled: bool):
        self.path = Path(run_dir) / LOG_FILE
        self.enabled = enabled
        self.tb = None
        if not enabled:
            return
        lines = []
        if resume_step is not None and self.path.exists():
            lines = [l for l, entry in read_log(self.path) if entry.get("step", 0) <= resume_step]
        self.path.write_text("".join(l + "\n" for l in lines))
        self.tb = tensorboard_writer(Path(run_dir) / TENSORBOARD_DIR, resume_step)

    def write(self, entry: Mapping[str, Any]) -> None:
        if self.enabled:
            with open(self.path, "a") as fh:
                fh.write(json.dumps(_finite(dict(entry)), sort_keys=True) + "\n")
        if self.tb is not None:
            step = int(entry["step"])
            for tag, value in scalars(entry):
                self.tb.add_scalar(tag, value, step)
            if "val" in entry:
                self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None


def tensorboard_writer(log_dir: Path, resume_step: int | None):
    """A SummaryWriter, or None when the optional ``tensorboard`` package is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:     # torch's writer needs the tensorboard package: the extra
        return None
    purge = resume_step + 1 if resume_step else None
    return SummaryWriter(str(log_dir), purge_step=purge)


def scalars(entry: Mapping[str, Any]) -> list[tuple[str, float]]:
    """(tag, value) of the finite numbers of a log entry: ``train/loss`` ... ``val/auc``."""
    out = []
    for key, value in entry.items():
        if key == "step":
            continue
        items = value.items() if isinstance(value, Mapping) else [(None, value)]
        for sub, v in items:
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                out.append((f"{key}/{sub}" if sub else f"train/{key}", float(v)))
    return out


def read_log(path: Path) -> list[tuple[str, dict]]:
    """(line, entry) of every line of log.jsonl.  A last line that is not JSON is the trace of a
    write cut short (full disk, kill -9): it is dropped with a note, and the run resumes from its
    checkpoint, which is older.  A damaged line before the last is not explained by that and
    is refused naming the line."""
    out = []
    lines = Path(path).read_text(errors="replace").splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            out.append((line, json.loads(line)))
        except json.JSONDecodeError as err:
            if number < len(lines):
                raise RunError(f"{path} line {number} is not JSON ({err}); the log is damaged: "
                               "delete the run directory to start over") from None
            print(f"note: {path}: dropped a torn last line ({len(line)} characters, not JSON: "
                  "a write cut short by a crash or a full disk); the run resumes from its "
                  "last checkpoint", file=sys.stderr, flush=True)
    return out


def _finite(value: Any) -> Any:
    """Strict JSON: undefined metrics (NaN) are written as null."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunLock(DirLock):
    """``RUN_DIR/.lock`` held by the process (rank 0) that trains or scores a run, so two
    launches of the same settings never write into one directory at once (cache.lock.DirLock,
    which also locks classifier caches; a lock of a process gone from this host is taken over)."""

    error = RunError
