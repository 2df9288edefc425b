"""Stage 1: run a frozen classifier over a split once and cache what every later stage needs.

resolve config -> claim the cache directory -> loader over this rank's missing shards -> loop
under ``torch.inference_mode()`` (``forward.py``) -> one HDF5 shard per fixed row range
(``sink.py``) -> manifest (rank 0, last: ``finish.py``).

Shard boundaries and the batches inside a shard depend only on the split, ``--shard-size`` and
``--batch-size``: the cache is the same whatever the number of processes, and an interrupted run
resumes by computing only the shards that are missing.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from tqdm import tqdm

from cache import manifest as mf
from cache.atomic import temp_files
from cache.schema import KIND_CLASSIFIER, MC_DROPOUT, SCHEMA_VERSION
from cache.shards import shard_is_complete, shard_path, shard_ranges
from pipeline.core import dist
from pipeline.core.models import (build_model, held_out_classes, resolve_data_config, resolve_spec,
                                  weights_sha256)
from pipeline.core.precision import default_precision
from pipeline.core.stop import StopSignals
from pipeline.data.classes import check_num_classes
from pipeline.core.timing import ModelTimer
from pipeline.data.corruptions import make_corruption as corruption_fn
from pipeline.data.decode import DeviceDecoder, collate_raw, make_dataset
from pipeline.data.images import GpuNormalize, transform_for
from pipeline.data.errors import DataError
from pipeline.data.loader import chunk_batches, default_workers, make_loader
from pipeline.data.newclass import CLASSES_KEPT, kept_classes, select_classes
from pipeline.data.orientation import EXIF_TRANSPOSE, reading_exif
from pipeline.data.prefetch import StagedPrefetch
from pipeline.data.sources import SampleList, is_embedded_dataset, list_split
from pipeline.extract import mcdropout as mc
from pipeline.extract.claim import claim, locked
from pipeline.data.stamps import SourceRecorder
from pipeline.extract.finish import write_manifest
from pipeline.extract.forward import classify_batches, forward_fn, warm_up
from pipeline.extract.sink import ShardSink, check_finite_parameters, model_text

@dataclass(frozen=True)
class ExtractConfig:
    classifier: str
    out: Path
    data: str | None = None
    split: str = "val"
    labels_file: str | None = None
    batch_size: int = 256
    workers: int | None = None        # None: default_workers() (cores per local rank - 1)
    precision: str | None = None      # None: PRECISION_RULE (core/precision.py) for the device
    device: str | None = None
    weights: str | None = None
    random_init: bool = False
    model_kwargs: dict = field(default_factory=dict)
    preprocess: str = "model"
    features: bool = False
    flip_view: bool = False
    skip_bad: bool = False
    shard_size: int = 3125            # ImageNet val = 16 equal shards; see cli.py --shard-size
    compile: bool = False
    decode: str = "cpu"               # cpu | gpu | mixed | hw | hw-mixed (pipeline.data.jpeg)
    exif_transpose: bool = False      # turn images upright by EXIF (pipeline/data/orientation.py)
    corruption: str | None = None
    severity: int = 0
    seed: int = 0
    verify: bool = False              # re-read every shard of a complete cache (XXH3-128 hash)
    mc_dropout: int = 0               # T >= 2 MC-Dropout passes (pipeline/extract/mcdropout.py)
    mc_dropout_rate: float | None = None   # timm drop_rate to rebuild the classifier with
    new_classes: bool = False         # the rows of the classes the classifier held out only
    shuffle_seed: int | None = None   # tests: permute rows inside shards to prove index placement
    progress: bool = True


def corruption_tag(cfg: ExtractConfig) -> str:
    return "none" if not cfg.corruption else f"{cfg.corruption}:{cfg.severity}:seed{cfg.seed}"


def make_corruption(cfg: ExtractConfig):
    if not cfg.corruption:
        return None
    return corruption_fn(cfg.corruption, cfg.severity, cfg.seed)


def build_identity(cfg: ExtractConfig, samples: SampleList, spec, model, data_cfg,
                   mc_rates: dict | None = None, kept: tuple[int, ...] | None = None) -> dict:
    num_classes = int(model.num_classes)   # checked against the classes by check_num_classes
    # features_flip only where both views' features are stored: older caches keep their identity,
    # and an older partial cache with --features --flip-view (no flipped features) is refused
    both = {"features_flip": True} if cfg.features and cfg.flip_view else {}
    if cfg.mc_dropout:   # absent without it, so caches extracted without it keep their identity
        both[MC_DROPOUT] = mc.record(cfg.mc_dropout, mc_rates, cfg.seed, cfg.batch_size)
    if samples.exif_transpose:   # likewise: absent means the pixels as stored
        both[EXIF_TRANSPOSE] = True
    if kept is not None:         # likewise: absent means every row of the split
        both[CLASSES_KEPT] = list(kept)
    return dict(schema_version=SCHEMA_VERSION, kind=KIND_CLASSIFIER, model=spec.name,
                model_kwargs=spec.kwargs, weights_sha256=weights_sha256(model),
                preprocess=cfg.preprocess, data_config=data_cfg.to_dict(), dataset=samples.dataset,
                dataset_fingerprint=samples.fingerprint, split=samples.split,
                corruption=corruption_tag(cfg), num_rows=len(samples), num_classes=num_classes,
                precision=cfg.precision, flip_view=cfg.flip_view, features=cfg.features,
                shard_size=cfg.shard_size, decode=cfg.decode, **both)


def select_rows(cfg: ExtractConfig, samples: SampleList, spec):
    """The rows a classifier that holds classes out is cached on (pipeline/data/newclass.py):
    its known classes' rows, or with ``--new-classes`` the held-out ones'; every row otherwise.
    Returns the rows and the classes kept (None: no selection)."""
    held = held_out_classes(spec.weights)
    if cfg.new_classes and not held:
        raise DataError(f"--new-classes caches the rows of the classes a classifier was fitted "
                        f"without, but --classifier {cfg.classifier} ({spec.weights or spec.name})"
                        " holds out no class: fit one with `cli.py fit-classifier "
                        "--holdout-classes LIST` and pass it, or leave --new-classes out")
    if not held:
        return samples, None
    kept = kept_classes(held, len(samples.classes), cfg.new_classes)
    selected = select_classes(samples, kept)
    if not len(selected):
        names = ", ".join(samples.classes[k] for k in kept)
        raise DataError(f"split {samples.split!r} has no row of the classes {names} that "
                        f"{'--new-classes caches' if cfg.new_classes else 'the classifier knows'}"
                        ": extract another --split")
    return selected, kept


def extract(cfg: ExtractConfig) -> dict:
    """Run stage 1 for one split; returns the summary dict (also stored in the manifest)."""
    info, device = dist.init(cfg.device)
    # resolved before the identity is built: a cache records the precision it was computed in
    cfg = replace(cfg, precision=default_precision(cfg.precision, device))
    samples = reading_exif(list_split(cfg.data, cfg.split, cfg.labels_file), cfg.exif_transpose)
    if cfg.workers is None:  # in-memory idx images: worker IPC would cost more than the work
        cfg = replace(cfg, workers=0 if samples.idx_images is not None and not cfg.corruption
                      else default_workers(dist.local_world()))
    spec = resolve_spec(cfg.classifier, is_embedded_dataset(samples.dataset),
                        cfg.weights, cfg.random_init, cfg.model_kwargs)
    samples, kept = select_rows(cfg, samples, spec)
    text = model_text(cfg, spec)
    model, mc_rates = mc.mc_model(spec, cfg.seed, cfg.mc_dropout_rate, text) if cfg.mc_dropout \
        else (build_model(spec, seed=cfg.seed), None)
    check_finite_parameters(model, text)
    data_cfg = resolve_data_config(model, spec, cfg.preprocess)
    if mc_rates is not None:   # the backbone once per batch where no dropout acts in it
        mc_rates = {**mc_rates, "head_only": mc.head_only(model, data_cfg.input_size)}
    dataset = make_dataset(samples, transform_for(samples, data_cfg), cfg.decode,
                           make_corruption(cfg), cfg.skip_bad)
    # --decode gpu/mixed: decoded in the main process; built (and self-tested) before the cache
    # directory is claimed, so an unusable decoder leaves nothing behind
    decoder = DeviceDecoder(samples, dataset.transform, device, cfg.skip_bad, cfg.decode) \
        if cfg.decode != "cpu" else None
    if samples.idx_images is None:   # files: stamped and hashed where the workers read them
        dataset.recorder = SourceRecorder(len(samples))
    class_notes = check_num_classes(int(model.num_classes), samples, cfg.classifier)
    identity = build_identity(cfg, samples, spec, model, data_cfg, mc_rates, kept)
    # every node the same command: the cache and the rows each rank computes (paths may differ)
    dist.agree(info, "extract settings", {**identity, "batch_size": cfg.batch_size,
                                          "verify": cfg.verify, "skip_bad": cfg.skip_bad})
    ranges = shard_ranges(len(samples), cfg.shard_size)
    with locked(cfg.out, info) as writable:
        complete, claim_notes = claim(cfg.out, identity, ranges, cfg.verify, info, samples,
                                      writable)
        _extract_missing(cfg, complete, samples, dataset, decoder, (model, text), data_cfg,
                         identity, ranges, info, device)
    summary = mf.load_manifest(cfg.out)["summary"]
    return {**summary, "out": str(cfg.out), "already_complete": complete,
            "notes": class_notes + claim_notes}


def _extract_missing(cfg, complete, samples, dataset, decoder, model, data_cfg, identity, ranges,
                     info, device) -> None:
    if not complete:
        todo = [s for s in range(info.rank, len(ranges), info.world)
                if not shard_is_complete(shard_path(cfg.out, s), identity, *ranges[s])]
        start = time.perf_counter()
        timing = _run_shards(cfg, dataset, decoder, model, data_cfg, identity, ranges, todo,
                             info, device)
        n_done = dist.sum_int(info, timing["rows"])  # also waits until every rank is done
        # every rank's steady rows over the slowest rank's steady time: the global rate
        timing.update(rows=n_done, elapsed=time.perf_counter() - start,
                      steady_rows=dist.sum_int(info, timing["steady_rows"]),
                      steady_s=dist.max_float(info, timing["steady_s"] or 0.0) or None)
        if info.is_main:
            write_manifest(cfg, samples, identity, ranges, timing, info, device)
        dist.barrier(info)


def _run_shards(cfg, dataset, decoder, model, data_cfg, identity, ranges, todo, info,
                device) -> dict:
    """Compute this rank's missing shards; returns rows computed and timings.  ``model``: the
    classifier and how messages name it."""
    model, text = model
    for s in todo:  # stale temporaries of an interrupted run of this rank's shards
        for tmp in temp_files(shard_path(cfg.out, s)):
            tmp.unlink(missing_ok=True)
    my_ranges = [ranges[s] for s in todo]
    batch_rows = chunk_batches(my_ranges, cfg.batch_size, cfg.shuffle_seed)
    # --decode gpu/mixed: the batches are mostly file bytes, which nvJPEG reads from any host
    # memory; pinning them would only add a copy of every batch
    loader = make_loader(dataset, batch_rows, cfg.workers,
                         pin_memory=device.type == "cuda" and decoder is None,
                         collate_fn=collate_raw if decoder is not None else None)
    # cuDNN picks its convolution kernels by its heuristics, not by timing them
    # (cudnn.benchmark): a pick by timing can change between processes, and with it the last
    # bits of the features a head-only oracle is trained on and later recomputes
    model = model.to(device).to(memory_format=torch.channels_last)
    fn = forward_fn(model, cfg.features, cfg.compile)
    normalize = GpuNormalize(data_cfg, device)
    if device.type == "cuda" and batch_rows:
        warm_up(cfg, fn, normalize, data_cfg, len(batch_rows[0]), device)
    labels_all = torch.from_numpy(dataset.samples.labels)
    sink = ShardSink(cfg.out, identity, ranges, dataset.samples, dataset.recorder, text)
    total = sum(b - a for a, b in my_ranges)
    bar = tqdm(total=total, unit="img", disable=not (cfg.progress and info.is_main),
               desc=f"extract {dataset.samples.split}", dynamic_ncols=True)
    timer = ModelTimer(device)
    with StopSignals() as stop:   # before iter(loader) forks the workers: they inherit it
        batches = iter(loader) if decoder is None else StagedPrefetch(iter(loader),
                                                                      decoder.stages, device)
        first, t_first = classify_batches(cfg, batches, sink, stop,
                                          (fn, normalize, timer, model), labels_all, bar, device)
    bar.close()
    steady = time.perf_counter() - t_first if t_first else None
    return {"rows": total, "steady_rows": total - first, "steady_s": steady,
            "model": timer.result(cfg.precision)}
