"""``cli.py predict --images``: the deployment path -- new, unlabelled images through the frozen
classifier and a finished run's chosen oracle, one row per image file.

list the images (``pipeline.data.unlabelled``: a folder, nested or flat, or a glob) -> the trust
threshold (``threshold.py``: given, or picked on the run's held-out rows for a target) -> the
classifier rebuilt as its cache recorded it (the run's training cache: model, weights file, seed,
data config, classes; its weights checked against the cache's ``weights_sha256``, so a changed or
different file is refused) and the oracle of ``model.load_trained_oracle`` (``rebuild.py``) -> one
pass over the files (each decoded once, resized for each model: ``images.Views``), batched, rows
placed by index -> the table (``cache.predictions``: CSV, JSON lines or Parquet) and its meta JSON.
One batch is scored by ``score_batch``, which the Python API (``trust_oracles.oracles``) calls
too, so both give the same numbers.

Each model runs in the precision it was run in before (the classifier: its cache's; the oracle:
the run's, ``predict.run_precision``), so MSP and confidence are those the cache and the held-out
threshold were computed with; ``--precision`` overrides both.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import torch
from tqdm import tqdm

from cache.integrity import not_writable
from cache.outputs import MADE_ON
from cache.predictions import table_format, write_table
from cache.reader import slug
from cache.runcache import training_cache
from cache.runfile import RunFile
from cache.runs import RunDir, RunError
from pipeline.core import dist
from pipeline.core.models import ModelError
from pipeline.core.precision import autocast, made_on
from pipeline.data.images import GpuNormalize, ImageRows, ResizeCrop, Views, decode_file
from pipeline.data.loader import make_loader
from pipeline.data.labels import class_names
from pipeline.data.orientation import EXIF_TRANSPOSE, reading_exif
from pipeline.data.unlabelled import list_images
from pipeline.oracle.deploy.exported import (HUB_PREFIX, deployed_export, exported_choice,
                                             is_exported, open_export)
from pipeline.oracle.deploy.predict import note_other_numerics
from pipeline.oracle.deploy.rebuild import DeployedModels, complete_run, deployed_models
from pipeline.oracle.deploy.threshold import given_threshold, pick_threshold

DEFAULT_TARGET = ("tpr", 0.95)


@dataclass(frozen=True)
class DeployConfig:
    run: Path
    images: str
    out: Path | None = None          # the table; None: RUN/predictions/<name>.csv
    name: str | None = None          # None: the images' folder name
    weights: str | None = None       # the classifier's (and a head-only backbone's, where moved)
                                     # weights; None: the files the cache and the run recorded
    threshold: float | None = None
    target: tuple[str, float] | None = None   # ("tpr", 0.95) / ("risk", 0.05); None: DEFAULT
    skip_bad: bool = False
    batch_size: int = 256
    workers: int = 8
    precision: str | None = None
    device: str | None = None
    progress: bool = True


def choose_threshold(cfg: DeployConfig, run: RunFile) -> dict:
    if cfg.threshold is not None:
        return given_threshold(cfg.run, run, cfg.threshold)
    return pick_threshold(cfg.run, run, *(cfg.target or DEFAULT_TARGET))


class Source(NamedTuple):
    """What ``predict --images`` scores with: a run's, or an exported oracle's (``exported``)."""
    models: DeployedModels
    choice: dict            # the threshold and how it was chosen
    identity: dict          # the classifier's identity
    classes: list
    where: str              # where the classifier is recorded (a cache, an exported config.json)
    label: str              # the oracle's loss label
    out: Path               # the table


def predict_images(cfg: DeployConfig) -> dict:
    """``cli.py predict --images``: returns a summary (the table, its meta, counts)."""
    export = is_exported(cfg.run)
    run = None if export else complete_run(cfg.run)
    info, device = dist.init(cfg.device)
    if info.world > 1:
        raise RunError("predict --images runs in one process: start it without torchrun")
    samples = list_images(cfg.images)
    src = _from_export(cfg, device) if export else _from_run(cfg, run, samples, device)
    samples = reading_exif(samples, src.identity.get(EXIF_TRANSPOSE, False))   # as it was read
    made = made_on(device, src.models.oracle.precision)
    if run is not None:
        note_other_numerics(cfg.run, run, made)
    scores = score_files(samples, src.models, device, batch_size=cfg.batch_size,
                         workers=cfg.workers, skip_bad=cfg.skip_bad, progress=cfg.progress)
    rows = table_rows(samples, scores, class_names(src.classes), src.choice["threshold"],
                      scores.pop("views"))
    meta = {"run": str(cfg.run) if export and str(cfg.run).startswith(HUB_PREFIX) else
            str(Path(cfg.run).resolve()), "images": cfg.images, "trust": src.choice,
            "classifier": {"cache": src.where, "model": src.identity["model"],
                           "weights_sha256": src.identity["weights_sha256"],
                           "precision": src.models.classifier.precision},
            "oracle": {"precision": src.models.oracle.precision, "run": src.label,
                       MADE_ON: made.to_dict()},
            "rows": len(rows), "trusted": sum(bool(r["trust"]) for r in rows),
            "undecodable": [r["path"] for r in rows if r["error"]]}
    try:
        sidecar = write_table(src.out, rows, meta)
    except OSError as err:
        raise (not_writable(err, src.out.parent) or err) from None
    return {**meta, "table": str(src.out), "meta": str(sidecar)}


def _from_run(cfg: DeployConfig, run: RunFile, samples, device: torch.device) -> Source:
    out = Path(cfg.out) if cfg.out else RunDir(cfg.run).prediction(cfg.name or
                                                                   slug(samples.dataset))
    table_format(out)                       # an unknown format or missing pyarrow: before work
    choice = choose_threshold(cfg, run)
    cache = training_cache(cfg.run, run)
    models = deployed_models(cfg.run, run, cache, cfg.weights, cfg.precision, device)
    return Source(models, choice, dict(cache.identity), cache.manifest.get("classes") or [],
                  str(cache.path), run.labels.loss_label, out)


def _from_export(cfg: DeployConfig, device: torch.device) -> Source:
    """An exported oracle (a folder or ``hf-hub:``): its table goes to --out-file only, as the
    folder is checked by its hashes and stays as it was shared."""
    if not cfg.out:
        raise RunError(f"--run {cfg.run} is an exported oracle, whose folder is not written "
                       "into: pass --out-file FILE for the predictions table")
    out = Path(cfg.out)
    table_format(out)
    folder, config = open_export(cfg.run)
    key = float(cfg.threshold) if cfg.threshold is not None else cfg.target or DEFAULT_TARGET
    choice = exported_choice(config, key, folder, cfg.threshold is None and cfg.target is None)
    models, record = deployed_export(folder, config, cfg.weights, cfg.precision, device)
    return Source(models, choice, record.identity, record.manifest["classes"], record.path,
                  config["loss"]["label"], out)


def model_views(models: DeployedModels) -> Views:
    """The resize/crop of each model (one when both models take the same input)."""
    clf_cfg, orc_cfg = models.classifier.data_config, models.oracle.data_config
    return Views(ResizeCrop(clf_cfg)) if clf_cfg == orc_cfg else \
        Views(ResizeCrop(clf_cfg), ResizeCrop(orc_cfg))


def normalizers(models: DeployedModels,
                device: torch.device) -> tuple[GpuNormalize, GpuNormalize]:
    return (GpuNormalize(models.classifier.data_config, device),
            GpuNormalize(models.oracle.data_config, device))


def oracle_z(oracle: torch.nn.Module, precision: str, x: torch.Tensor,
             logits: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """z (B,) of the oracle on normalised ``x`` on ``device``, in its precision."""
    with autocast(precision, device):   # a stacked head reads the classifier's logits
        return oracle(x, logits) if oracle.stacked else oracle(x)


def score_batch(models: DeployedModels, norm, images,
                device: torch.device) -> dict[str, torch.Tensor]:
    """One batch through both models, the scoring step of ``predict --images`` and of the
    Python API: ``images`` is ``model_views``' uint8 (B, C, H, W) view(s) of the batch (one, or
    the classifier's and the oracle's), ``norm`` is ``normalizers(models, device)``.  Returns
    the classifier's ``pred`` (B,) and ``msp`` (B,) and the oracle's ``z`` (B,) float32, on
    ``device``.  Call it under ``torch.inference_mode()``."""
    clf, orc = models
    x_clf, x_orc = (images[0], images[0]) if len(images) == 1 else images
    with autocast(clf.precision, device):
        logits = clf.model(norm[0](x_clf))
    z = oracle_z(orc.model, orc.precision, norm[1](x_orc), logits, device)
    probs = logits.float().softmax(dim=-1)      # float32 softmax, as extract computes
    return {"pred": probs.argmax(dim=-1), "msp": probs.max(dim=-1).values, "z": z.float()}


def confidence_of(z: np.ndarray) -> np.ndarray:
    """sigmoid(z) as float32, computed as ``write_z_outputs`` computes the run's outputs."""
    return torch.sigmoid(torch.from_numpy(z)).numpy()


def score_files(samples, models: DeployedModels, device: torch.device, *, batch_size: int = 256,
                workers: int = 0, skip_bad: bool = False, progress: bool = False) -> dict:
    """One pass over every file: (pred, msp) of the classifier and z of the oracle, by row;
    ``models`` as ``deployed_models`` returns them."""
    views = model_views(models)
    dataset = ImageRows(samples, views, skip_bad=skip_bad)
    order = list(range(len(samples)))
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    loader = make_loader(dataset, batches, workers, pin_memory=device.type == "cuda")
    norm = normalizers(models, device)
    n = len(samples)
    out = {"pred": np.full(n, -1, np.int64), "msp": np.zeros(n, np.float32),
           "z": np.zeros(n, np.float32), "valid": np.zeros(n, bool)}
    bar = tqdm(total=n, unit="img", desc="predict", disable=not progress, dynamic_ncols=True,
               leave=False)
    with torch.inference_mode():
        for images, rows, valid in loader:
            batch = score_batch(models, norm, images, device)
            rows = rows.numpy()
            for key in ("pred", "msp", "z"):
                out[key][rows] = batch[key].cpu().numpy()
            out["valid"][rows] = valid.numpy().astype(bool)
            bar.update(len(rows))
    bar.close()
    check_finite(samples.path, out)
    out["confidence"] = confidence_of(out["z"])
    out["views"] = views
    return out


def check_finite(name: Callable[[int], object], out: dict) -> None:
    """NaN logits would give class 0 and NaN an untrusted row, silently: refused by file
    (``name(i)``: how row i's image is named, e.g. ``samples.path``)."""
    for key, what in (("msp", "the classifier gives non-finite logits"),
                      ("z", "the oracle gives non-finite scores")):
        bad = np.flatnonzero(out["valid"] & ~np.isfinite(out[key]))
        if len(bad):
            raise ModelError(f"{what} (NaN or inf) on {len(bad)} image(s), e.g. "
                             f"{name(int(bad[0]))}: its weights are damaged or overflow "
                             "in this precision; try --precision fp32")


def table_rows(samples, scores: dict, names: list[str], threshold: float,
               views: Views) -> list[dict]:
    """One dict per file, in row (sorted path) order; undecodable files (``--skip-bad``) keep
    their path and the decoder's message, and no prediction."""
    rows = []
    for i in range(len(samples)):
        path = str(samples.path(i))
        if not scores["valid"][i]:
            rows.append({"path": path, "pred": None, "class_name": None, "msp": None,
                         "confidence": None, "trust": None,
                         "error": _why_unusable(path, views)})
            continue
        pred, conf = int(scores["pred"][i]), float(scores["confidence"][i])
        rows.append({"path": path, "pred": pred,
                     "class_name": names[pred] if pred < len(names) else str(pred),
                     "msp": float(scores["msp"][i]), "confidence": conf,
                     "trust": bool(scores["confidence"][i] >= threshold), "error": ""})
    return rows


def _why_unusable(path: str, views: Views) -> str:
    """Why the loader workers marked a file invalid (they only mark it): the decoder's or the
    resize's message, found again for these few files."""
    try:
        views(decode_file(path))
    except Exception as err:  # noqa: BLE001 - any decoder failure, as ImageRows treats it
        return (str(err).strip().splitlines() or [type(err).__name__])[0]
    return "could not be decoded"
