"""How every run ends, fine-tuned or head-only: each evaluation split scored with the chosen
oracle and written as ``outputs/<tag>.h5`` (rows aligned by global index with the classifier
cache, ``cache.outputs``), each file's size and hash recorded in run.json (``output_files``, which
``report`` and a re-run check), and the run marked complete.  ``cli.py predict`` writes its
outputs with the same writer.

A scorer is ``(split, path[, rows]) -> summary`` (``rows``: the held-out ones written to
``heldout/<tag>.h5``, default every valid row): ``image_scorer`` runs the oracle over the split's
images (``pipeline.oracle.deploy.predict``), the head-only runs score their heads on the split's
cached features (``pipeline.oracle.headonly.train``).  It is built only when a file is missing.
"""
from __future__ import annotations

import os
from contextlib import nullcontext
from typing import Callable

import numpy as np
import torch
import torch.distributed as tdist
from tqdm import tqdm

from cache.integrity import file_digest
from cache.outputs import MadeOn, classifier_ref, write_outputs
from cache.runfile import RunFile
from cache.runs import FRAME_KEYS, RunDir, RunError
from pipeline.core import dist
from pipeline.core.inference import scoring
from pipeline.core.models import DataConfig
from pipeline.core.precision import autocast, made_on
from pipeline.core.timing import ModelTimer
from pipeline.data.images import GpuNormalize, ImageRows, transform_for
from pipeline.data.loader import make_loader
from pipeline.oracle.nets.checkpoint import unwrap
from pipeline.oracle.nets.model import Oracle, load_trained_oracle
from pipeline.oracle.loop.rundir import versions
from pipeline.oracle.settings.prepare import Prepared
from pipeline.oracle.settings.targets import Split

# (split, output file[, rows: the held-out ones, default every valid row]) -> the summary
Scorer = Callable[..., dict]


def oracle_z(model: Oracle, split: Split, rows: np.ndarray, data_cfg: DataConfig, *,
             batch_size: int, workers: int, precision: str, device: torch.device,
             info: dist.DistInfo, progress: bool = False, desc: str = "",
             timer: ModelTimer | None = None) -> np.ndarray:
    """z of ``rows`` (any order), shape (len(rows),) float32, identical on every rank.

    Each rank scores a contiguous share; the shares are summed with all_reduce (every other
    entry is 0, so the sum is exact)."""
    share = np.array_split(np.arange(len(rows)), info.world)[info.rank]
    my_rows = rows[share].tolist()
    batches = [my_rows[i:i + batch_size] for i in range(0, len(my_rows), batch_size)]
    dataset = ImageRows(split.samples, transform_for(split.samples, data_cfg),
                        split.corrupt_fn())
    loader = make_loader(dataset, batches, workers, pin_memory=device.type == "cuda")
    normalize = GpuNormalize(data_cfg, device)
    out = torch.zeros(len(rows), dtype=torch.float32, device=device)
    pos = 0
    bar = tqdm(total=len(rows), unit="img", desc=desc, disable=not (progress and info.is_main),
               dynamic_ncols=True, leave=False)
    # a head on stacked inputs reads the classifier's cached logits of the same rows
    logits = (torch.from_numpy(split.cache.load(["logits"])["logits"])
              if getattr(model, "stacked", False) else None)
    with scoring(model):      # a model in training is scored in eval mode, then restored
        for images, idx, _ in loader:
            extra = () if logits is None else (logits[idx].to(device),)
            with timer.time(len(images)) if timer else nullcontext(), autocast(precision, device):
                z = model(normalize(images), *extra)
            n = len(images)
            out[share[pos]:share[pos] + n] = z.float()
            pos += n
            bar.update(n * info.world)
    bar.close()
    if info.enabled:
        if tdist.get_backend() != "nccl":
            out = out.cpu()
        tdist.all_reduce(out)
    return out.cpu().numpy()



def write_z_outputs(run: RunDir, split: Split, cols: dict, rows: np.ndarray, z_rows: np.ndarray,
                    path, record: dict, info: dist.DistInfo, made: MadeOn,
                    inference: dict | None = None) -> dict:
    """Write z (len(rows),) of the valid ``rows`` of ``split`` as its output file (rank 0), whose
    ``valid`` column marks the rows scored; ``cols``: the cache's valid/correct/label/pred
    columns; ``made``: the device and precision that made z; ``inference``: the oracle's timing
    on it (outputs/<name>.timing.json; none for head-only scores).  Returns a summary."""
    bad = np.flatnonzero(~np.isfinite(z_rows))
    if len(bad):   # e.g. the final model of a run whose last update diverged (--val-fraction 0)
        raise RunError(f"the oracle of run {run.path} gives non-finite scores (NaN or inf) on "
                       f"{len(bad)} of {len(z_rows)} rows of split {split.tag!r} (first: row "
                       f"{int(rows[bad[0]])}): its weights are not finite, so training diverged; "
                       "nothing was written. Lower --lr and train again (another --out, or "
                       "delete the run folder)")
    n = split.cache.num_rows
    z = np.zeros(n, np.float32)
    conf = np.zeros(n, np.float32)
    valid = np.zeros(n, np.uint8)     # = the cache's column when every valid row is scored
    valid[rows] = 1
    z[rows] = z_rows
    conf[rows] = torch.sigmoid(torch.from_numpy(np.asarray(z_rows, np.float32))).numpy()
    ref = classifier_ref(split.cache.path, split.cache.identity)
    files = split.samples.idx_images is None       # rows of idx arrays are no files
    if info.is_main:
        write_outputs(path, {"index": np.arange(n, dtype=np.int64), "valid": valid,
                             "z": z, "confidence": conf, "correct": cols["correct"],
                             "label": cols["label"], "pred": cols["pred"]}, ref, record, made,
                      sources=(os.path.abspath(split.samples.folder), split.samples.names)
                      if files else None)
        if inference is not None:
            run.write_timing(path, inference)
    dist.barrier(info)
    o = cols["correct"][rows].astype(bool)
    return {"split": split.tag, "rows": int(len(rows)), "path": str(path),
            "accuracy": float(o.mean()) if len(o) else float("nan"),
            "mean_confidence_correct": float(conf[rows][o].mean()) if o.any() else float("nan"),
            "mean_confidence_incorrect": float(conf[rows][~o].mean()) if (~o).any() else float("nan"),
            "inference": inference}


def scored_rows(valid: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """The rows a scorer scores: every valid row, or the valid ones of ``rows`` (held-out)."""
    ok = valid == 1
    if rows is None:
        return np.flatnonzero(ok)
    rows = np.sort(np.asarray(rows, dtype=np.int64))
    return rows[ok[rows]]


def score_images(run: RunDir, model, split: Split, path, record: dict, data_cfg, opts: dict,
                 info: dist.DistInfo, device: torch.device, rows: np.ndarray | None = None) -> dict:
    """Score every valid row of ``split`` (or of ``rows``) with ``model`` on its images and write
    the output file (rank 0), with the model's inference time.  Returns a summary."""
    cols = split.cache.load(["valid", "correct", "label", "pred"])
    rows = scored_rows(cols["valid"], rows)
    timer = ModelTimer(device)
    z_rows = oracle_z(model, split, rows, data_cfg, info=info, device=device,
                      desc=f"predict {split.tag}", timer=timer, **opts)
    return write_z_outputs(run, split, cols, rows, z_rows, path, record, info,
                           made_on(device, opts["precision"]),
                           inference=timer.result(opts["precision"]))


def image_scorer(prep: Prepared, info: dist.DistInfo, device: torch.device, run: RunFile,
                 objs=None) -> Scorer:
    """A fine-tuned run's scorer: its chosen oracle (best.pt, rebuilt as ``predict`` does) over
    each split's images; the training copy (``objs``) leaves the device first."""
    loaded = {}
    opts = dict(batch_size=prep.cfg.eval_batch_size, workers=prep.cfg.workers,
                precision=prep.cfg.precision, progress=prep.cfg.progress)

    def score(split: Split, path, rows: np.ndarray | None = None) -> dict:
        if not loaded:
            model, data_cfg, _ = load_trained_oracle(prep.run.path, run)
            if objs is not None:
                unwrap(objs.model).cpu()   # free the training copy's device memory
            loaded.update(model=model.to(device), data_cfg=data_cfg)
        return score_images(prep.run, loaded["model"], split, path, prep.record,
                            loaded["data_cfg"], opts, info, device, rows)
    return score


def finish_run(prep: Prepared, scorer: Callable[[RunFile], Scorer], info: dist.DistInfo,
               total_steps: int, best: dict | None = None, extras: dict | None = None) -> dict:
    """Outputs of every eval split and of the held-out rows (missing or damaged ones only) from
    the chosen oracle; run complete.  ``scorer(run)`` builds the scorer on the first file
    that needs it; ``extras``: what run.json records of a run just trained (None: an already
    complete run, whose run.json is kept as it was when nothing is missing)."""
    run_json = prep.run.read()      # rewritten below: what RunFile does not name is kept
    if extras is not None:
        run_json = {**run_json, **extras}
    run = RunFile.from_json(run_json, str(prep.run.run_file))
    outputs, digests = dict(run.outputs), {k: dict(v) for k, v in run.output_files.items()}
    built: list[Scorer] = []

    def score() -> Scorer:
        built[:] = built or [scorer(run)]
        return built[0]

    results = []
    for split in prep.evals:
        path = prep.run.output(split.tag)
        ref = classifier_ref(split.cache.path, split.cache.identity)
        if prep.run.outputs_done(path, ref, prep.record, digests.get(path.stem)):
            results.append({"split": split.tag, "path": str(path), "already_complete": True})
        else:
            results.append(score()(split, path))
        outputs[split.tag] = str(path)
        if info.is_main:   # size + XXH3-128 hash by file stem, checked by `report` and a re-run
            digests[path.stem] = file_digest(path)
    heldout, held_digest = _heldout_outputs(prep, run.heldout_output, score, info)
    best = best or run.best
    summary = {"run_dir": str(prep.run.path), "status": "complete", "best": best,
               "outputs": results, "heldout": heldout, "total_steps": total_steps}
    unchanged = (extras is None and not built and run.complete
                 and digests == run.output_files and held_digest == run.heldout_output)
    if info.is_main and not unchanged:
        drop = (*FRAME_KEYS, "best", "step", "outputs", "output_files", "heldout_output", "error")
        keep = {k: v for k, v in run_json.items() if k not in drop}
        held = {"heldout_output": held_digest} if held_digest else {}
        prep.run.write(prep.record, "complete", versions(), step=total_steps, best=best,
                       outputs=outputs, output_files=digests, **held, **keep)
    return summary


def _heldout_outputs(prep: Prepared, recorded: dict | None, score: Callable[[], Scorer],
                     info: dist.DistInfo) -> tuple[dict | None, dict | None]:
    """The chosen oracle's scores of the held-out training rows (RUN/heldout/<tag>.h5, the
    validation set of fd-shifts' analysis), unless already written; (summary, run.json's
    ``heldout_output``: split, size and XXH3-128 hash).  None without held-out rows."""
    if not len(prep.val_rows):
        return None, None
    path = prep.run.heldout_output(prep.train.tag)
    ref = classifier_ref(prep.train.cache.path, prep.train.cache.identity)
    if prep.run.outputs_done(path, ref, prep.record, recorded):
        summary = {"split": prep.train.tag, "path": str(path), "already_complete": True}
    else:
        summary = score()(prep.train, path, rows=prep.val_rows)
    if not info.is_main:
        return summary, None
    return summary, {"split": prep.train.tag, **file_digest(path)}
