"""Run directories: the one module that names, reads and writes their files.

    run = RunDir(path)
    run.record()                    # run.json, typed (cache.runfile.RunFile)
    run.log_entries()               # log.jsonl, a torn last line dropped with a note
    run.val_split()                 # val_split.json, or None when the run held out nothing
    run.output("test")              # RUN/outputs/test.h5 (names that would leave outputs/ refused)

A run directory is claimed like a cache directory: identical settings map to the same directory
(default name ``<oracle>-<classifier>_<loss>[_<variant>]_seed<N>_<group>``), where a complete run is
skipped, an incomplete one resumed, and a directory holding another run is refused naming the
differing settings.  Checkpoints are torch files: their paths are named here, their bytes are
written by ``pipeline.oracle.nets.checkpoint``.  Torch-free (``cli.py report`` reads run
directories).  See docs/DATA_CONTRACT.md (Stage 2) for the layout.
"""
from __future__ import annotations

import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Iterable, Mapping

from cache.atomic import read_json, write_json_atomic
from cache.claim import Claim
from cache.lock import DirLock
from cache.manifest import IDENTITY_FILE, MANIFEST_FILE
from cache.outputs import read_outputs
from cache.reader import slug
from cache.runfile import RunError, RunFile
from cache.runlog import read_log
from cache.schema import CacheError, CacheMismatch, canonical, identity_diff
from cache.shards import read_attrs

RUN_FILE, VAL_FILE, LOG_FILE = "run.json", "val_split.json", "log.jsonl"
CHECKPOINTS, OUTPUTS, TENSORBOARD_DIR = "checkpoints", "outputs", "tensorboard"
HELDOUT = "heldout"
PREDICTIONS = "predictions"     # predict --images: one table per image folder
LAST, BEST = "last.pt", "best.pt"
TIMING_SUFFIX = ".timing.json"
# The labels of the ``run`` record that name a run (run.json and every output file's attribute).
RUN_IDENTITY = ("oracle", "classifier", "loss", "variant", "seed", "group")
# run.json keys written by ``write`` itself, not part of a run's extras.
FRAME_KEYS = ("run", "status", "versions", "updated")
# A run directory's claim (cache.claim): run.json, written by ``write`` once the run starts.
RUN_CLAIM = Claim(
    record=RUN_FILE, section="run", write=None, what="run file", error=RunError,
    finished=lambda payload: payload.get("status") == "complete",
    keys=RUN_IDENTITY, found_in="run", expected_in="expected", nested=False, show=None,
    refused="run directory {folder} holds another run",
    fix="Use another --out, or delete that directory to start over.",
    foreign="--out {folder} is not empty and is not a run directory (no {record}); choose an "
            "empty or new directory")


class RunLock(DirLock):
    """``RUN_DIR/.lock`` held by the process (rank 0) that trains or scores a run, so two
    launches of the same settings never write into one directory at once (cache.lock.DirLock,
    which also locks classifier caches; a lock of a process gone from this host is taken over)."""

    error = RunError


def run_record(config: Mapping[str, Any], *, oracle_model: str, variant: str, loss_label: str,
               group: str, dataset: str, num_classes: int, tnr: str) -> dict:
    """The ``run`` record of DATA_CONTRACT.md (run.json and every output file's ``run`` attr);
    ``tnr``: the loss's TNR rule (pipeline.core.losses.base.TNR_RULES), which the report applies
    without knowing the loss."""
    return {"oracle": config["oracle"], "oracle_model": oracle_model,
            "classifier": config["classifier"], "loss": config["loss"], "variant": variant,
            "loss_label": loss_label, "seed": int(config["seed"]), "group": group,
            "dataset": dataset, "num_classes": int(num_classes), "tnr": tnr,
            "config": canonical(dict(config))}


def default_run_dir(runs_root: Path, record: Mapping[str, Any]) -> Path:
    variant = f"_{record['variant'].replace('+', '_')}" if record["variant"] else ""
    name = (f"{slug(record['oracle'])}-{slug(record['classifier'])}_{record['loss']}{variant}"
            f"_seed{record['seed']}_{record['group']}")
    return Path(runs_root) / name


def is_run_dir(path: Path) -> bool:
    return (Path(path) / RUN_FILE).is_file() or (Path(path) / OUTPUTS).is_dir()


def find_runs(root: Path) -> list[Path]:
    """Every run directory under ``root`` (a run.json, or outputs/*.h5 of a copied run), resolved
    and sorted."""
    root = Path(root)
    found = {p.parent.resolve() for p in root.rglob(RUN_FILE)}
    found |= {p.parent.parent.resolve() for p in root.rglob(f"{OUTPUTS}/*.h5")}
    return sorted(found)


class RunDir:
    """One run directory (see the module docstring); every path inside it comes from here."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # -- paths -----------------------------------------------------------------------------
    @property
    def run_file(self) -> Path:
        return self.path / RUN_FILE

    @property
    def log_file(self) -> Path:
        return self.path / LOG_FILE

    @property
    def tensorboard_dir(self) -> Path:
        return self.path / TENSORBOARD_DIR

    def checkpoint(self, name: str) -> Path:
        """``checkpoints/last.pt`` or ``checkpoints/best.pt``."""
        return self.path / CHECKPOINTS / name

    def output(self, name: str) -> Path:
        """RUN/outputs/<name>.h5.  A split of an ImageNet-C-layout tree (``defocus_blur/5``)
        becomes ``defocus_blur_5.h5``: one flat folder, one distinct file stem (the report's split
        tag).  A name that would still leave outputs/ (a backslash, a leading '.') is refused,
        whoever built it."""
        name = name.replace("/", "_")
        if "\\" in name or name.startswith(".") or not name:
            raise RunError(f"output name {name!r} would not be a file inside {self.path / OUTPUTS}"
                           " (path separators or a leading '.'); pass --out-name with a plain file "
                           "name")
        return self.path / OUTPUTS / f"{name}.h5"

    def heldout_output(self, split_tag: str) -> Path:
        """RUN/heldout/<training split tag>.h5: the chosen oracle's scores of the rows the run
        held out of its training split (val_split.json), as an oracle output file of the training
        cache whose ``valid`` is 1 on those rows only.  Outside outputs/: not an evaluated split
        (fd-shifts' analysis needs them as its validation set, ``report --export fd-shifts``)."""
        return self.path / HELDOUT / f"{split_tag.replace('/', '_')}.h5"

    def prediction(self, name: str, suffix: str = ".csv") -> Path:
        """RUN/predictions/<name><suffix>: ``predict --images``' table of new images (one row
        per file; cache/predictions.py writes it).  ``name`` as for ``output``."""
        return self.path / PREDICTIONS / f"{self.output(name).stem}{suffix}"   # output's checks

    def outputs(self) -> list[Path]:
        """The output files present, sorted by name."""
        return sorted((self.path / OUTPUTS).glob("*.h5"))

    def lock(self, enabled: bool = True) -> RunLock:
        return RunLock(self.path, enabled)

    # -- run.json ----------------------------------------------------------------------------
    def exists(self) -> bool:
        return self.run_file.exists()

    def read(self) -> dict:
        """run.json as JSON (for the writers that rewrite it; readers take ``record()``)."""
        return read_json(self.run_file, "run file")

    def record(self) -> RunFile:
        """run.json, typed (CacheError when missing or damaged)."""
        return RunFile.from_json(self.read(), str(self.run_file))

    def require_record(self) -> RunFile:
        """run.json, typed; a folder without one is refused (``RunError``) saying what it is."""
        if not self.run_file.is_file():
            cache = any((self.path / f).is_file() for f in (MANIFEST_FILE, IDENTITY_FILE))
            what = ("a classifier cache, not a train-oracle run directory" if cache else
                    "not a train-oracle run directory (no run.json)" if self.path.is_dir() else
                    "not there")
            raise RunError(f"{self.path} is {what}: pass the folder train-oracle wrote (its --out, "
                           "or artifacts/<dataset>/runs/<run>)")
        return self.record()

    def record_if_any(self) -> RunFile:
        """run.json, or an empty record for a directory that only holds outputs (a copied run)."""
        return self.record() if self.run_file.exists() else RunFile.empty()

    def write(self, record: Mapping[str, Any], status: str, versions: Mapping[str, str],
              **extra) -> None:
        """run.json: the run record, its status, what the run recorded (``extra``), versions."""
        self.path.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.run_file, {"run": dict(record), "status": status, **extra,
                                          "versions": dict(versions), "updated": _now()})

    def mark_failed(self, error: str) -> None:
        """Set run.json's status to ``failed`` with ``error``, if run.json exists and can be written
        (after a full disk it may not: the run then still reads ``running``, as after a kill).
        A complete run stays complete."""
        if not self.run_file.exists():
            return
        try:
            payload = self.read()
            if payload.get("status") == "complete":
                return
            write_json_atomic(self.run_file, {**payload, "status": "failed", "error": error,
                                              "updated": _now()})
        except CacheError:    # unreadable or unwritable (a full disk): the caller's error stands
            return

    def claim(self, record: Mapping[str, Any], must_resume: bool,
              compared: Iterable[str], hints: Mapping[str, str] | None = None) -> str:
        """'new', 'resume' or 'complete' (``RUN_CLAIM``; resumed only from a last checkpoint).
        Refuses a directory that holds another run, naming the differing labels and the
        differing settings among ``compared`` (with ``hints[setting]``, what to do about that
        one, where given)."""
        explain = partial(_setting_diffs, tuple(compared), dict(hints or {}))
        state = replace(RUN_CLAIM, explain=explain).take(self.path, record)
        if state == "resume" and not self.checkpoint(LAST).exists():
            state = "new"
        if state == "new" and must_resume:
            raise RunError(f"--resume: {self.path} has no checkpoint to resume from (settings "
                           "that differ from the interrupted run change the run directory; "
                           "compare run.json of the runs under its parent)")
        return state

    # -- val_split.json ----------------------------------------------------------------------
    def write_val_split(self, payload: Mapping[str, Any]) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.path / VAL_FILE, payload)

    def val_split(self) -> dict | None:
        """The held-out rows the run carved from its training split, or None (it held out none,
        or the file is not there)."""
        path = self.path / VAL_FILE
        return read_json(path, "held-out rows") if path.exists() else None

    # -- log.jsonl ---------------------------------------------------------------------------
    def log_entries(self) -> list[dict]:
        return [entry for _, entry in read_log(self.log_file)] if self.log_file.exists() else []

    def restart_log(self, resume_step: int | None) -> None:
        """Keep the lines up to ``resume_step`` (None: none), so a resumed log equals an
        uninterrupted run's."""
        lines = []
        if resume_step is not None and self.log_file.exists():
            lines = [l for l, e in read_log(self.log_file) if e.get("step", 0) <= resume_step]
        self.path.mkdir(parents=True, exist_ok=True)
        self.log_file.write_text("".join(l + "\n" for l in lines))

    def append_log(self, text: str) -> None:
        """Append lines ``log_line`` made, in one append."""
        with open(self.log_file, "a") as fh:
            fh.write(text)

    # -- outputs and their timing ----------------------------------------------------------------
    def output_digest(self, run: RunFile, output: Path) -> dict | None:
        """The size and XXH3-128 hash run.json records for ``output`` (None: not recorded)."""
        return run.output_digest(output)

    def outputs_done(self, path: Path, ref: dict, record: Mapping[str, Any],
                     digest: dict | None = None) -> bool:
        """True if ``path`` already holds this run's outputs on this cache; refuses foreign
        ones.  A damaged file (unreadable, a column off its hash, or not the size/file hash
        ``digest`` that run.json records) is removed, so it is recomputed."""
        if not path.exists():
            return False
        try:
            read_outputs(path, digest=digest)
        except CacheMismatch:
            raise
        except CacheError:
            path.unlink(missing_ok=True)
            return False
        attrs = read_attrs(path)
        keys = tuple(k for k in ref if k != "path")
        diffs = identity_diff(attrs.get("classifier_cache", {}), ref, keys)
        diffs += identity_diff(attrs.get("run", {}), record, RUN_IDENTITY)
        if diffs:
            raise CacheMismatch(f"{path} holds other outputs:\n  " + "\n  ".join(diffs)
                                + "\nUse another output name (--out-name), or delete the file.")
        return True

    @staticmethod
    def timing_path(output: Path) -> Path:
        """``outputs/<name>.timing.json``: the oracle's inference time on that split."""
        return Path(output).with_suffix(TIMING_SUFFIX)

    def write_timing(self, output: Path, inference: Mapping[str, Any]) -> None:
        write_json_atomic(self.timing_path(output), inference)

    def read_timing(self, output: Path) -> dict | None:
        """The timing of ``output``, or None where none was written (head-only outputs)."""
        path = self.timing_path(output)
        return read_json(path, "inference timing") if path.exists() else None


def _setting_diffs(compared: tuple[str, ...], hints: Mapping[str, str], old: Mapping[str, Any],
                   new: Mapping[str, Any]) -> list[str]:
    """A refused run's differing settings among ``compared``, then the hints of those."""
    before, now = old.get("config", {}), new["config"]
    return identity_diff(before, now, compared, found_in="run") + [
        hints[k] for k in compared if k in hints and identity_diff(before, now, (k,))]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
