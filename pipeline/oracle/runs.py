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
import os
import platform
import socket
import time
from pathlib import Path
from typing import Any, Mapping

import timm
import torch

from cache.manifest import read_json, write_json_atomic
from cache.reader import slug
from cache.schema import canonical, identity_diff

RUN_FILE, VAL_FILE, LOG_FILE = "run.json", "val_split.json", "log.jsonl"
CHECKPOINTS, OUTPUTS = "checkpoints", "outputs"

# Settings that change neither what is trained nor how: excluded from the group hash, so runs
# differing only in them (or in the seed) share a group.  Paths are replaced by the identity of
# the training cache (dataset fingerprint, classifier weights).
NOT_IN_GROUP = ("seed", "out", "runs_root", "artifacts", "data", "cache", "labels_file", "eval_splits",
                "resume", "progress", "workers", "device", "compile", "eval_batch_size",
                "ckpt_every", "log_every", "stop_at_step", "features_cache")


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


def read_run_file(run_dir: Path) -> dict:
    return read_json(Path(run_dir) / RUN_FILE, "run file")


class StepLog:
    """log.jsonl: one JSON line per logged step or validation.  On resume, lines after the
    checkpoint's step are dropped, so the log equals an uninterrupted run's."""

    def __init__(self, run_dir: Path, resume_step: int | None, enabled: bool):
        self.path = Path(run_dir) / LOG_FILE
        self.enabled = enabled
        if not enabled:
            return
        lines = []
        if resume_step is not None and self.path.exists():
            lines = [l for l in self.path.read_text().splitlines()
                     if l.strip() and json.loads(l).get("step", 0) <= resume_step]
        self.path.write_text("".join(l + "\n" for l in lines))

    def write(self, entry: Mapping[str, Any]) -> None:
        if self.enabled:
            with open(self.path, "a") as fh:
                fh.write(json.dumps(_finite(dict(entry)), sort_keys=True) + "\n")


def _finite(value: Any) -> Any:
    """Strict JSON: undefined metrics (NaN) are written as null."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunLock:
    """``RUN_DIR/.lock`` held by the process (rank 0) that trains or scores a run, so two
    launches of the same settings never write into one directory at once.  A lock left by a
    process that no longer runs on this host is taken over."""

    def __init__(self, run_dir: Path, enabled: bool = True):
        self.path, self.enabled = Path(run_dir) / ".lock", enabled

    def __enter__(self):
        if not self.enabled:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = {"pid": os.getpid(), "host": socket.gethostname()}
        for _ in range(2):
            try:
                with open(self.path, "x") as fh:
                    json.dump(me, fh)
                return self
            except FileExistsError:
                if not self._stale():
                    raise RunError(f"{self.path.parent} is in use by another process "
                                   f"({self.path.read_text().strip()}); wait for it, or delete "
                                   f"{self.path} if that process is gone") from None
                self.path.unlink(missing_ok=True)
        raise RunError(f"could not take {self.path}")

    def _stale(self) -> bool:
        try:
            owner = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return False          # being written right now
        if owner.get("host") != socket.gethostname():
            return False          # cannot tell from here
        try:
            os.kill(int(owner["pid"]), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def __exit__(self, *exc):
        if self.enabled:
            self.path.unlink(missing_ok=True)
        return False
