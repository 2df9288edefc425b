"""A run's directory, around the training: claimed (locked; new, resumed or found complete; marked
failed on any error after the claim), its held-out rows and run.json's extras written, and the
library versions every run records."""
from __future__ import annotations

import platform
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

import timm
import torch
import torch.distributed as tdist

from cache.integrity import as_no_room
from cache.outputs import MADE_ON, MadeOn
from cache.runcache import cache_record
from cache.schema import CLASSIFIER_KEYS
from cache.runs import RunError
from pipeline.core import dist
from pipeline.oracle.settings.config import NOT_IN_GROUP, TrainConfig
from pipeline.oracle.settings.prepare import Prepared

# Settings a refusal of "holds another run" names when they differ: the run part of the config.
CLAIM_COMPARED = tuple(sorted(f for f in TrainConfig.__dataclass_fields__ if f not in NOT_IN_GROUP))
CLAIM_HINTS = {"weights_sha256": "the --weights file's contents are not the ones this run was "
               "trained with (the file changed in place, or another file): restore that file to "
               "continue this run; new weights make a new run"}


def write_val_split(prep: Prepared, info: dist.DistInfo) -> None:
    """val_split.json: the held-out rows carved from the training split (rank 0)."""
    if info.is_main:
        cfg = prep.cfg
        prep.run.write_val_split({
            "split": prep.train.tag, "val_fraction": cfg.val_fraction,
            "split_seed": cfg.split_seed, "train_limit": cfg.train_limit,
            "num_train_rows": int(len(prep.train_rows)), "num_val_rows": int(len(prep.val_rows)),
            "val_rows": prep.val_rows.tolist()})


def run_extras(prep: Prepared, schedule_info: dict, made: MadeOn) -> dict:
    """What run.json records of a run besides its record and status; ``made``: what makes its
    stored scores (device, precision)."""
    ident = prep.train.cache.identity
    return {"schedule": schedule_info, "loss": prep.loss.record(),
            **cache_record(prep.train.cache.path, prep.run.path),
            "eval_caches": {s.tag: str(s.cache.path.resolve()) for s in prep.evals},
            MADE_ON: made.to_dict(),
            "classifier_identity": {k: ident[k] for k in CLASSIFIER_KEYS},
            "train_fingerprint": ident["dataset_fingerprint"],
            "class_counts": {"incorrect": prep.counts[0], "correct": prep.counts[1]},
            "rows": {"train": int(len(prep.train_rows)), "val": int(len(prep.val_rows))},
            "protocol": prep.protocol}


def versions() -> dict:
    """The library versions run.json records, and the CPU thread count: fine-tuned weights on
    the CPU depend on it (kernels split float sums by thread; docs/RESULTS.md "Determinism")."""
    return {"torch": torch.__version__, "timm": timm.__version__,
            "python": platform.python_version(), "threads": torch.get_num_threads()}


@contextmanager
def claimed(preps: list[Prepared], info: dist.DistInfo, must_resume: bool,
            kept: str) -> Iterator[list[str]]:
    """Lock and claim the runs' directories (rank 0 decides, the others follow); yields each
    run's state: new, resume or complete.  Any error after the claim marks the claimed runs
    that are not complete ``failed`` with its message (a write that finds no room: the one
    disk-full message, ``kept`` saying what survives and how to go on); a failed start leaves
    no empty run folder behind."""
    existed = [p.run.path.exists() for p in preps]
    states = ["unclaimed"] * len(preps)
    with ExitStack() as locks:
        try:
            for k, prep in enumerate(preps):
                err = None
                try:
                    locks.enter_context(prep.run.lock(info.is_main))
                except RunError as e:
                    err = e
                if not dist.all_ok(info, err is None):
                    raise err or RunError(f"rank 0 could not lock {prep.run.path}")
                states[k] = _claim(prep, must_resume, info)
            yield list(states)
        except Exception as err:
            full = as_no_room(err, preps[0].run.path, kept)
            if info.is_main:   # a run that stops is never left `running`; another run's
                for prep, state in zip(preps, states):   # run.json (a refused claim) is not
                    if state in ("new", "resume"):                # this call's to mark
                        prep.run.mark_failed(str(full or err))
            if full is None:
                raise
            raise full from None
        finally:
            locks.close()
            for prep, before in zip(preps, existed):
                if info.is_main and not before:   # a failed start leaves no empty run folder
                    _remove_if_empty(prep.run.path)


def _claim(prep: Prepared, must_resume: bool, info: dist.DistInfo) -> str:
    """Rank 0 decides; the others follow (or stop with it)."""
    err, state = None, "new"
    if info.is_main:
        try:
            state = prep.run.claim(prep.record, must_resume, CLAIM_COMPARED, CLAIM_HINTS)
        except RunError as e:
            err = e
    if not dist.all_ok(info, err is None):
        raise err or RunError(f"rank 0 refused run directory {prep.run.path}")
    if info.enabled:
        box = [state]
        tdist.broadcast_object_list(box, src=0)
        state = box[0]
    return state


def _remove_if_empty(run_dir: Path) -> None:
    try:
        run_dir.rmdir()
    except OSError:   # not empty (the run wrote something) or already gone
        pass
