"""Run a trained oracle over a split and write its outputs (``cli.py predict``, end of training).

resolve the run -> open each split's classifier cache (same classifier, same fingerprint rules as
stage 1) -> loader over the valid rows, this rank's contiguous share -> loop under
``torch.inference_mode()`` -> z summed over ranks -> ``outputs/<split tag>.h5`` aligned by index.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as tdist
from tqdm import tqdm

from cache.integrity import file_digest
from cache.manifest import write_json_atomic
from cache.outputs import classifier_ref, read_outputs, write_outputs
from cache.schema import CacheError, CacheMismatch, identity_diff
from cache.shards import read_attrs
from pipeline.core import dist
from pipeline.core.models import DataConfig, ModelSpec, build_model, weights_sha256
from pipeline.core.options import check_output_name
from pipeline.core.precision import autocast
from pipeline.core.timing import ModelTimer
from pipeline.data.images import GpuNormalize, ImageRows, make_loader, transform_for
from pipeline.data.sources import is_embedded
from pipeline.oracle.checkpoint import BEST, load_checkpoint, unwrap
from pipeline.oracle.model import Oracle, attach_head, build_oracle
from pipeline.oracle.runs import CHECKPOINTS, OUTPUTS, RunError, read_run_file, write_run_file
from pipeline.oracle.targets import Split, open_split


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
    pos, was_training = 0, model.training
    model.eval()
    bar = tqdm(total=len(rows), unit="img", desc=desc, disable=not (progress and info.is_main),
               dynamic_ncols=True, leave=False)
    with torch.inference_mode():
        for images, _, _ in loader:
            with timer.time(len(images)) if timer else nullcontext(), autocast(precision, device):
                z = model(normalize(images))
            n = len(images)
            out[share[pos]:share[pos] + n] = z.float()
            pos += n
            bar.update(n * info.world)
    bar.close()
    model.train(was_training)
    if info.enabled:
        if tdist.get_backend() != "nccl":
            out = out.cpu()
        tdist.all_reduce(out)
    return out.cpu().numpy()


def output_path(run_dir: Path, name: str) -> Path:
    """RUN/outputs/<name>.h5.  A split of an ImageNet-C-layout tree (``defocus_blur/5``) becomes
    ``defocus_blur_5.h5``: one flat folder, one distinct file stem (the report's split tag).  A
    name that would still leave outputs/ (a backslash, a leading '.') is refused, whoever built it."""
    name = name.replace("/", "_")
    if "\\" in name or name.startswith(".") or not name:
        raise RunError(f"output name {name!r} would not be a file inside {Path(run_dir) / OUTPUTS}"
                       " (path separators or a leading '.'); pass --name with a plain file name")
    return Path(run_dir) / OUTPUTS / f"{name}.h5"


def outputs_done(path: Path, ref: dict, record: dict, digest: dict | None = None) -> bool:
    """True if ``path`` already holds this run's outputs on this cache; refuses foreign ones.
    A damaged file (unreadable, a column off its hash, or not the size/file hash ``digest`` that
    run.json records) is removed, so it is recomputed."""
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
    diffs += identity_diff(attrs.get("run", {}), record, ("oracle", "classifier", "loss",
                                                          "variant", "seed", "group"))
    if diffs:
        raise CacheMismatch(f"{path} holds other outputs:\n  " + "\n  ".join(diffs)
                            + "\nUse another output name (--name), or delete the file.")
    return True


def write_split_outputs(model: Oracle, split: Split, path: Path, record: dict,
                        data_cfg: DataConfig, run_opts: dict, info: dist.DistInfo,
                        device: torch.device) -> dict:
    """Score every valid row of ``split`` and write the output file (rank 0).  Returns a summary."""
    cols = split.cache.load(["valid", "correct", "label", "pred"])
    rows = np.flatnonzero(cols["valid"] == 1)
    timer = ModelTimer(device)
    z_rows = oracle_z(model, split, rows, data_cfg, info=info, device=device,
                      desc=f"predict {split.tag}", timer=timer, **run_opts)
    return write_z_outputs(split, cols, rows, z_rows, path, record, info,
                           inference=timer.result(run_opts["precision"]))


def write_z_outputs(split: Split, cols: dict, rows: np.ndarray, z_rows: np.ndarray, path: Path,
                    record: dict, info: dist.DistInfo, inference: dict | None = None) -> dict:
    """Write z (len(rows),) of the valid ``rows`` of ``split`` as its output file (rank 0);
    ``cols``: the cache's valid/correct/label/pred columns; ``inference``: the oracle's timing
    on it (outputs/<name>.timing.json; none for head-only scores).  Returns a summary."""
    n = split.cache.num_rows
    z = np.zeros(n, np.float32)
    conf = np.zeros(n, np.float32)
    z[rows] = z_rows
    conf[rows] = torch.sigmoid(torch.from_numpy(np.asarray(z_rows, np.float32))).numpy()
    ref = classifier_ref(split.cache.path, split.cache.identity)
    if info.is_main:
        write_outputs(path, {"index": np.arange(n, dtype=np.int64), "valid": cols["valid"],
                             "z": z, "confidence": conf, "correct": cols["correct"],
                             "label": cols["label"], "pred": cols["pred"]}, ref, record)
        if inference is not None:
            write_json_atomic(timing_path(path), inference)
    dist.barrier(info)
    o = cols["correct"][rows].astype(bool)
    return {"split": split.tag, "rows": int(len(rows)), "path": str(path),
            "accuracy": float(o.mean()) if len(o) else float("nan"),
            "mean_confidence_correct": float(conf[rows][o].mean()) if o.any() else float("nan"),
            "mean_confidence_incorrect": float(conf[rows][~o].mean()) if (~o).any() else float("nan"),
            "inference": inference}


def timing_path(output: Path) -> Path:
    """``outputs/<name>.timing.json``: the oracle's inference time on that split (rank 0's)."""
    return Path(output).with_suffix(".timing.json")


def load_trained_oracle(run_dir: Path, run: dict) -> tuple[Oracle, DataConfig, dict]:
    """The chosen (best) oracle of a finished run, rebuilt without fetching any weights (a
    head-only run: its frozen backbone, loaded as the run recorded it and checked against the
    weights its features came from, with the trained head)."""
    info = run.get("oracle_build")
    if not info:
        raise RunError(f"{run_dir}/run.json has no oracle_build record (not a finished run?)")
    ckpt = load_checkpoint(Path(run_dir) / CHECKPOINTS / BEST)
    if info.get("head_only"):
        return _head_only_oracle(run_dir, info, ckpt), DataConfig.from_dict(info["data_config"]), ckpt
    spec = ModelSpec(info["model"], info["model_kwargs"], None, True, info["data_config"])
    model, _ = build_oracle(spec, info["head"], "model", seed=0)
    model.load_state_dict(ckpt["model"])
    return model, DataConfig.from_dict(info["data_config"]), ckpt


def _head_only_oracle(run_dir: Path, info: dict, ckpt: dict) -> Oracle:
    bb = info["backbone"]
    spec = ModelSpec(info["model"], info["model_kwargs"], bb["weights"], bb["random_init"],
                     info["data_config"])
    backbone = build_model(spec, seed=bb["seed"])
    found = weights_sha256(backbone)
    if found != bb["weights_sha256"]:
        raise RunError(f"{run_dir} is a head-only run whose head was trained on features of "
                       f"backbone weights {bb['weights_sha256'][:12]}..., but "
                       f"{bb['weights'] or 'the hub weights of ' + info['model']} now holds "
                       f"{found[:12]}...: restore those weights (or re-run the head-only training "
                       "on features of the current ones)")
    model = attach_head(backbone, info["head"], seed=0)
    model.head.load_state_dict(ckpt["head"])
    return model


def default_output_name(data: str | None, record: dict, tag: str) -> str:
    """The split tag for the run's own data root; ``<root folder>_<tag>`` for another root
    (e.g. ``defocus_blur_5`` for ImageNet-C's ``defocus_blur/5``), so outputs never collide."""
    trained_on = record["config"]["data"]
    if is_embedded(data) and is_embedded(trained_on):
        return tag
    if not is_embedded(data) and not is_embedded(trained_on) and \
            Path(data).resolve() == Path(trained_on).resolve():
        return tag
    return f"{'fashion-mnist' if is_embedded(data) else Path(data).resolve().name}_{tag}"


def finish_run(prep, objs, info: dist.DistInfo, device, sched: dict,
               best: dict | None = None, extras: dict | None = None) -> dict:
    """Score every eval split with the chosen oracle (best.pt, rebuilt as ``predict`` does);
    mark the run complete.  ``objs`` (the training objects) is None for an already complete run."""
    run = read_run_file(prep.run_dir)
    model, data_cfg, ckpt = load_trained_oracle(prep.run_dir, {**run, **(extras or {})})
    model = model.to(device)
    if objs is not None:
        unwrap(objs.model).cpu()   # free the training copy's device memory
    opts = dict(batch_size=prep.config["eval_batch_size"], workers=prep.config["workers"],
                precision=prep.config["precision"], progress=prep.config["progress"])
    outputs = dict(run.get("outputs", {}))
    digests = dict(run.get("output_files", {}))
    results = []
    for split in prep.evals:
        path = output_path(prep.run_dir, split.tag)
        ref = classifier_ref(split.cache.path, split.cache.identity)
        if outputs_done(path, ref, prep.record, digests.get(path.stem)):
            results.append({"split": split.tag, "path": str(path), "already_complete": True})
        else:
            results.append(write_split_outputs(model, split, path, prep.record, data_cfg, opts,
                                               info, device))
        outputs[split.tag] = str(path)
        if info.is_main:   # size + XXH3-128 hash by file stem, checked by `report` and a re-run
            digests[path.stem] = file_digest(path)
    extras = extras or {k: v for k, v in run.items() if k not in ("run", "status", "versions",
                                                                  "updated", "outputs",
                                                                  "output_files")}
    best = best or run.get("best") or {"step": ckpt.get("step"), "val_aupr_error": ckpt.get("score")}
    if info.is_main:
        write_run_file(prep.run_dir, prep.record, "complete", step=sched["total_steps"], best=best,
                       outputs=outputs, output_files=digests,
                       **{k: v for k, v in extras.items() if k not in ("best", "step")})
    return {"run_dir": str(prep.run_dir), "status": "complete", "best": best, "outputs": results,
            "total_steps": sched["total_steps"]}


@dataclass(frozen=True)
class PredictConfig:
    run: Path
    data: str | None
    cache: Path
    splits: tuple[str, ...]
    labels_file: str | None = None
    name: str | None = None          # output file stem when a single split is given
    batch_size: int = 256
    workers: int = 8
    precision: str = "bf16"
    device: str | None = None
    progress: bool = True


def predict(cfg: PredictConfig) -> list[dict]:
    """``cli.py predict``: a finished run's chosen oracle over new split(s)."""
    info, device = dist.init(cfg.device)
    run = read_run_file(cfg.run)
    if run.get("status") != "complete":
        raise RunError(f"run {cfg.run} is not complete (status {run.get('status')!r}); finish "
                       "training first (re-run the same train-oracle command)")
    record = run["run"]
    model, data_cfg, _ = load_trained_oracle(cfg.run, run)
    model = model.to(device)
    opts = dict(batch_size=cfg.batch_size, workers=cfg.workers, precision=cfg.precision,
                progress=cfg.progress)
    if cfg.name and len(cfg.splits) != 1:
        raise RunError("--name names one output file: give exactly one --split with it")
    if cfg.name and check_output_name(cfg.name):   # never a path out of the run folder
        raise RunError(f"--name {check_output_name(cfg.name)}")
    results = []
    for tag in cfg.splits:
        split = open_split(cfg.data, cfg.cache, record["classifier"], tag, cfg.labels_file,
                           same_classifier_as=run["classifier_identity"])
        path = output_path(cfg.run, cfg.name or default_output_name(cfg.data, record, tag))
        if outputs_done(path, classifier_ref(split.cache.path, split.cache.identity), record):
            results.append({"split": tag, "path": str(path), "already_complete": True})
            continue
        results.append(write_split_outputs(model, split, path, record, data_cfg, opts, info, device))
    return results
