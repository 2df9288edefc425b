"""``cli.py attack``: perturb a split against the frozen classifier and store it as a dataset.

resolve params -> list the split -> build the classifier -> check it can be differentiated ->
claim the output folder -> loader over this rank's missing shards -> per batch: clean logits,
the attack (unquantised float pixels), its logits, uint8 quantisation, the stored image's logits
(computed exactly as ``extract`` will: uint8 -> GpuNormalize -> model) -> PNGs + a shard record
-> manifest (rank 0, last) with the classifier's accuracy on the stored images beside the
attack's success on the unquantised ones.

Rows are split across torchrun processes by shard, as in ``extract``; each batch's random start
is seeded from (seed, its first row), so the images do not depend on the number of processes.
"""
from __future__ import annotations

import os
import platform
import socket
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import timm
import torch
from tqdm import tqdm

from cache.manifest import write_json_atomic
from cache.shards import shard_ranges
from pipeline.attack import store
from pipeline.attack.methods import (ATTACKS, DEFAULTS_SOURCE, AttackError, PixelClassifier,
                                     build_attack, check_channels, check_differentiable,
                                     library_version, resolve_params)
from pipeline.core import dist
from pipeline.core.models import build_model, resolve_data_config, resolve_spec, weights_sha256
from pipeline.core.precision import autocast, default_precision
from pipeline.data import attacked as fmt
from pipeline.data.images import GpuNormalize, ImageRows, transform_for
from pipeline.data.loader import default_workers, make_loader
from pipeline.data.sources import SampleList, is_embedded_dataset, list_split


@dataclass(frozen=True)
class AttackConfig:
    classifier: str
    out: Path                          # data root the split folder is written into
    name: str                          # the split folder: --data <out> --split <name> reads it
    data: str | None = None
    split: str = "val"
    labels_file: str | None = None
    attack: str = "pgd_linf"
    eps: float | str | None = None     # None: the attack's default (methods.ATTACKS)
    alpha: float | str | None = None
    steps: int | None = None
    random_start: bool | None = None
    max_samples: int | None = None     # a seeded subset of the split (sorted)
    batch_size: int = 64
    workers: int | None = None
    precision: str | None = None       # None: PRECISION_RULE (core/precision.py) for the device
    device: str | None = None
    weights: str | None = None
    random_init: bool = False
    model_kwargs: dict = field(default_factory=dict)
    preprocess: str = "model"
    shard_size: int = 625              # ImageNet val: 80 shards, even over 1/2/4/8/16 GPUs
    seed: int = 0
    progress: bool = True


def plan_rows(n: int, max_samples: int | None, seed: int) -> np.ndarray:
    """Source rows to attack, ascending: all, or a seeded subset of ``max_samples``."""
    if max_samples is None or max_samples >= n:
        return np.arange(n, dtype=np.int64)
    if max_samples < 1:
        raise AttackError(f"--max-samples {max_samples}: expected a positive number of rows")
    return np.sort(np.random.default_rng(seed).choice(n, max_samples, replace=False))


def build_identity(cfg, params, samples: SampleList, spec, model, data_cfg, rows) -> dict:
    num_classes = int(model.num_classes)
    if int(samples.labels.max()) >= num_classes:
        raise AttackError(f"--classifier {cfg.classifier} has {num_classes} outputs but split "
                          f"{samples.split!r} has labels up to {int(samples.labels.max())}; use "
                          "a classifier trained on this dataset's classes")
    return dict(
        format=fmt.FORMAT, format_version=fmt.FORMAT_VERSION, attack=cfg.attack, params=params,
        library=library_version(cfg.attack), seed=cfg.seed, batch_size=cfg.batch_size,
        shard_size=cfg.shard_size, precision=cfg.precision, input_size=list(data_cfg.input_size),
        classifier=dict(name=cfg.classifier, model=spec.name, model_kwargs=spec.kwargs,
                        weights_sha256=weights_sha256(model), preprocess=cfg.preprocess,
                        data_config=data_cfg.to_dict(), num_classes=num_classes),
        source=dict(dataset=samples.dataset, fingerprint=samples.fingerprint,
                    split=samples.split, num_rows=len(samples), rows=len(rows),
                    max_samples=cfg.max_samples))


def attack(cfg: AttackConfig) -> dict:
    """Write (or finish) one adversarial split; returns the manifest's summary."""
    params = resolve_params(cfg.attack, cfg.eps, cfg.alpha, cfg.steps, cfg.random_start)
    library_version(cfg.attack)          # a missing library fails before any model or file
    info, device = dist.init(cfg.device)
    # resolved before the identity is built: the split records the precision it was attacked in
    cfg = replace(cfg, precision=default_precision(cfg.precision, device))
    samples = list_split(cfg.data, cfg.split, cfg.labels_file)
    if cfg.workers is None:
        cfg = replace(cfg, workers=0 if samples.idx_images is not None
                      else default_workers(dist.local_world()))
    spec = resolve_spec(cfg.classifier, is_embedded_dataset(samples.dataset),
                        cfg.weights, cfg.random_init, cfg.model_kwargs)
    model = build_model(spec, seed=cfg.seed)
    data_cfg = resolve_data_config(model, spec, cfg.preprocess)
    check_channels(cfg.attack, data_cfg.input_size[0], cfg.classifier)
    rows = plan_rows(len(samples), cfg.max_samples, cfg.seed)
    identity = build_identity(cfg, params, samples, spec, model, data_cfg, rows)
    dirnames = fmt.class_dirnames(samples.classes)
    files = store.output_files(samples, rows, dirnames)
    model = model.to(device).to(memory_format=torch.channels_last)
    pixels = PixelClassifier(model, data_cfg, cfg.precision, device).to(device)
    dataset = ImageRows(samples, transform_for(samples, data_cfg))
    probe = dataset[int(rows[0])][0][None].to(device).float() / 255.0
    check_differentiable(pixels, probe, torch.from_numpy(samples.labels[rows[:1]]).to(device),
                         cfg.classifier)
    split_dir = Path(cfg.out) / cfg.name
    complete = _claim(cfg, split_dir, identity, samples.dataset, dirnames, info)
    ranges = shard_ranges(len(rows), cfg.shard_size)
    if not complete:
        todo = [s for s in range(info.rank, len(ranges), info.world)
                if not store.shard_done(split_dir, s, identity, files[slice(*ranges[s])])]
        start = time.perf_counter()
        n = _run_shards(cfg, params, dataset, pixels, model, data_cfg, identity, split_dir,
                        rows, files, ranges, todo, info, device)
        n = dist.sum_int(info, n)
        if info.is_main:
            _write_manifest(cfg, samples, identity, split_dir, files, ranges, dirnames,
                            {"computed_rows": n, "elapsed_s": time.perf_counter() - start}, info)
        dist.barrier(info)
    doc = fmt.read_manifest(split_dir)
    return {**doc["summary"], "out": str(split_dir), "already_complete": complete}


def _claim(cfg, split_dir, identity, dataset, dirnames, info) -> bool:
    err, complete = None, False
    if info.is_main:
        try:
            store.claim_classes(Path(cfg.out), dataset, dirnames)
            complete = store.claim(split_dir, identity)
        except AttackError as e:
            err = e
    if not dist.all_ok(info, err is None):
        raise err or AttackError(f"rank 0 refused {split_dir}")
    return complete if info.is_main else (fmt.meta_dir(split_dir) / fmt.MANIFEST_FILE).exists()


def _run_shards(cfg, params, dataset, pixels, model, data_cfg, identity, split_dir, rows, files,
                ranges, todo, info, device) -> int:
    """Attack this rank's missing shards; returns the number of rows attacked."""
    batches, owner = [], []
    for s in todo:
        a, b = ranges[s]
        for p in range(a, b, cfg.batch_size):
            batches.append(rows[p:min(p + cfg.batch_size, b)].tolist())
            owner.append((s, p))
    loader = make_loader(dataset, batches, cfg.workers, pin_memory=device.type == "cuda")
    atk = build_attack(cfg.attack, pixels, params)
    normalize = GpuNormalize(data_cfg, device)
    labels_all = torch.from_numpy(dataset.samples.labels)
    writer = store.ShardWriter(split_dir, identity, threads=min(8, os.cpu_count() or 1))
    total = sum(ranges[s][1] - ranges[s][0] for s in todo)
    bar = tqdm(total=total, unit="img", disable=not (cfg.progress and info.is_main),
               desc=f"attack {cfg.name}", dynamic_ncols=True)
    cols: dict[str, list] = {k: [] for k in store.RECORD_COLUMNS}
    try:
        for (images, idx, _), (shard, first) in zip(loader, owner):
            torch.manual_seed(cfg.seed * 1_000_003 + int(rows[first]))
            out = attack_batch(atk, pixels, model, normalize, images.to(device),
                               labels_all[idx].to(device), cfg.precision, device)
            a, b = ranges[shard]
            writer.images(files[first:first + len(idx)], out.pop("stored").cpu())
            out.update(position=torch.arange(first, first + len(idx)), source_index=idx,
                       label=labels_all[idx])
            for k in store.RECORD_COLUMNS:
                cols[k].append(out[k].cpu().numpy())
            bar.update(len(idx))
            if first + len(idx) == b:   # the shard's last batch
                writer.record(shard, {k: np.concatenate(v) for k, v in cols.items()},
                              files[a:b])
                cols = {k: [] for k in store.RECORD_COLUMNS}
    finally:
        writer.close()
        bar.close()
    return total


def attack_batch(atk, pixels, model, normalize, images, labels, precision, device) -> dict:
    """uint8 (n, C, H, W) on ``device`` -> predictions before/after, the stored uint8 images and
    their logits (as ``extract`` computes them), and each row's L-inf change in grey levels."""
    x = images.float() / 255.0
    with torch.no_grad():
        clean_pred = pixels(x).argmax(1)
    adv = atk(x, labels)
    with torch.no_grad():
        adv_pred = pixels(adv).argmax(1)
    stored = (adv * 255.0).round_().clamp_(0, 255).to(torch.uint8)
    with torch.inference_mode(), autocast(precision, device):
        stored_logits = model(normalize(stored)).float()
    linf = (stored.int() - images.int()).abs().amax(dim=(1, 2, 3)).to(torch.uint8)
    return {"clean_pred": clean_pred, "adv_pred": adv_pred, "stored": stored,
            "stored_logits": stored_logits, "stored_pred": stored_logits.argmax(1), "linf": linf}


def summarize(records: list[dict], timing: dict) -> dict:
    r = {k: np.concatenate([x[k] for x in records]) for k in ("label", "clean_pred", "adv_pred",
                                                                "stored_pred", "linf")}
    y, ok = r["label"], r["clean_pred"] == r["label"]

    def rate(mask):
        return float(mask.mean()) if len(mask) else float("nan")
    return {
        "rows": int(len(y)), "clean_accuracy": rate(ok),
        # the attack on its own terms: float pixels, never rounded
        "unquantised_accuracy": rate(r["adv_pred"] == y),
        "unquantised_success": rate(r["adv_pred"][ok] != y[ok]),
        # what every later stage sees: the stored uint8 PNGs
        "stored_accuracy": rate(r["stored_pred"] == y),
        "stored_success": rate(r["stored_pred"][ok] != y[ok]),
        "quantisation_flips": rate(r["stored_pred"] != r["adv_pred"]),
        "linf_max_levels": int(r["linf"].max()) if len(y) else 0,
        "linf_mean_levels": float(r["linf"].mean()) if len(y) else 0.0,
        "computed_rows": timing["computed_rows"], "elapsed_s": round(timing["elapsed_s"], 3),
        "img_per_s": round(timing["computed_rows"] / timing["elapsed_s"], 1)
        if timing["elapsed_s"] else None}


def _write_manifest(cfg, samples, identity, split_dir, files, ranges, dirnames, timing,
                    info) -> None:
    records = []
    for s, (a, b) in enumerate(ranges):
        if not store.shard_done(split_dir, s, identity, files[a:b]):
            raise AttackError(f"shard {s} of {split_dir} is missing after the attack; re-run the "
                              "same command to resume")
        records.append(store.read_record(split_dir, s))
    store.check_listing(split_dir, files)
    write_json_atomic(fmt.meta_dir(split_dir) / fmt.MANIFEST_FILE, {
        "identity": identity, "identity_sha256": fmt.identity_sha256(identity),
        "summary": summarize(records, timing), "classes": list(samples.classes),
        "class_dirs": list(dirnames), "source_root": samples.root,
        "shards": [{"record": fmt.shard_record(split_dir, s).name, "start": a, "stop": b}
                   for s, (a, b) in enumerate(ranges)],
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
        "defaults": {"source": DEFAULTS_SOURCE[ATTACKS[cfg.attack][0]],
                     "values": ATTACKS[cfg.attack][2]},
        "info": {"torch": torch.__version__, "timm": timm.__version__,
                 "host": socket.gethostname(), "python": platform.python_version(),
                 "world_size": info.world, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}})
