"""``cli.py predict``: a finished run's chosen oracle over new split(s).

resolve the run (its best.pt, rebuilt without fetching weights) -> open each split's classifier
cache (same classifier, same fingerprint rules as stage 1) -> score its valid rows on the images
(``pipeline.oracle.loop.outputs``: this rank's contiguous share, summed over ranks) ->
``outputs/<name>.h5`` aligned by index, beside the run's own outputs.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cache.outputs import MadeOn, OtherDeviceNote, classifier_ref
from cache.reader import note_once
from cache.runcache import training_cache
from cache.runfile import RunFile, RunLabels
from cache.runs import RunDir, RunError
from cache.schema import CacheError
from pipeline.core import dist
from pipeline.core.options import check_output_name
from pipeline.core.precision import made_on
from pipeline.data.sources import data_name, is_embedded
from pipeline.oracle.loop.outputs import score_images
from pipeline.oracle.nets.model import load_trained_oracle
from pipeline.oracle.settings.targets import open_split


def default_output_name(data: str | None, labels: RunLabels, tag: str) -> str:
    """The split tag for the run's own data root; ``<root folder>_<tag>`` for another root
    (e.g. ``defocus_blur_5`` for ImageNet-C's ``defocus_blur/5``), so outputs never collide."""
    trained_on = labels.config["data"]
    if is_embedded(data) and is_embedded(trained_on):
        return tag
    if not is_embedded(data) and not is_embedded(trained_on) and \
            Path(data).resolve() == Path(trained_on).resolve():
        return tag
    return f"{data_name(data)}_{tag}"


def run_precision(run: RunFile) -> str:
    """The precision a run's oracle saw its images in: the run's own, or for a head-only run
    that of the feature cache its head was trained on (the backbone reproduces those features)."""
    if run.head_only:
        train = run.feature_caches.get(run.config["train_split"]) or {}
        if train.get("precision"):
            return train["precision"]
    return run.config["precision"]


def note_other_numerics(run_dir: Path, run: RunFile, made: MadeOn) -> None:
    """Say once (a note) when scores are made on another device or in another precision than the
    run's stored ones: they are then not the run's numbers (docs/METRICS.md, "Scores on another
    device", for the differences measured).  Silent for a run that did not record its own."""
    theirs = MadeOn.from_dict(run.made_on)
    if theirs is None or not theirs.known or theirs.same_numerics(made):
        return
    inputs = " (its features')" if theirs.inputs != "images" else ""
    note_once(f"numerics {Path(run_dir).resolve()} {made}",
              f"run {run_dir}'s stored scores were made on {theirs.describe()}{inputs}; these are "
              f"made on {made.describe()}, so they differ from the run's in their last digits or "
              "more and a confidence near the trust threshold can fall on its other side "
              "(docs/METRICS.md, \"Scores on another device\"); score on the run's device and "
              "precision for its own numbers", OtherDeviceNote)


def check_not_training_rows(run_dir: Path, run: RunFile, split) -> None:
    """Refuse to score the images the run's oracle was trained on (train-oracle refuses to
    evaluate them too: prepare.check_not_trained_on).  The training split's fingerprint is in
    run.json; a run written before it is recorded there is checked against its training cache
    when that is still where it was."""
    trained = run.train_fingerprint
    if trained is None:
        try:
            trained = training_cache(run_dir, run).identity["dataset_fingerprint"]
        except (CacheError, RunError):
            trained = None
    found = split.cache.identity["dataset_fingerprint"]
    if found == trained:
        raise RunError(f"--split {split.tag} lists the images run {run_dir} was trained on "
                       f"(dataset fingerprint {found[:12]}): its scores would be training-set "
                       "numbers, and the report's baselines are fitted on held-out rows of that "
                       "split. Predict on another split.")


@dataclass(frozen=True)
class PredictConfig:
    run: Path
    data: str | None
    cache: Path
    splits: tuple[str, ...]
    labels_file: str | None = None
    name: str | None = None          # output file stem when a single split is given
    weights: str | None = None       # a head-only run's backbone weights, where moved
    batch_size: int = 256
    workers: int = 8
    precision: str | None = None     # None: the precision the run was trained with
    device: str | None = None
    progress: bool = True
    out: Path | None = None          # an exported oracle's one split: the output file


def predict(cfg: PredictConfig) -> list[dict]:
    """``cli.py predict``: a finished run's chosen oracle over new split(s)."""
    info, device = dist.init(cfg.device)
    run_dir = RunDir(cfg.run)
    run = run_dir.require_record().require_complete(cfg.run)
    record = run.labels
    model, data_cfg, _ = load_trained_oracle(cfg.run, run, cfg.weights)
    model = model.to(device)
    opts = dict(batch_size=cfg.batch_size, workers=cfg.workers,
                precision=cfg.precision or run_precision(run),
                progress=cfg.progress)
    note_other_numerics(cfg.run, run, made_on(device, opts["precision"]))
    if cfg.name and len(cfg.splits) != 1:
        raise RunError("--out-name names one output file: give exactly one --split with it")
    if cfg.name and check_output_name(cfg.name):   # never a path out of the run folder
        raise RunError(f"--out-name {check_output_name(cfg.name)}")
    results = []
    for tag in cfg.splits:
        split = open_split(cfg.data, cfg.cache, record.classifier, tag, cfg.labels_file,
                           same_classifier_as=run.classifier_identity)
        check_not_training_rows(cfg.run, run, split)
        path = run_dir.output(cfg.name or default_output_name(cfg.data, record, tag))
        if run_dir.outputs_done(path, classifier_ref(split.cache.path, split.cache.identity),
                                run.raw["run"]):
            results.append({"split": tag, "path": str(path), "already_complete": True})
            continue
        results.append(score_images(run_dir, model, split, path, run.raw["run"], data_cfg, opts,
                                    info, device))
    return results
