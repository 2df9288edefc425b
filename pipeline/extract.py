"""Stage 1: run a frozen classifier over a split once and cache what every later stage needs.

resolve config -> claim the cache directory -> loader over this rank's missing shards -> loop
under ``torch.inference_mode()`` -> one HDF5 shard per fixed row range -> manifest (rank 0, last).
"""
from __future__ import annotations

import platform
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import timm
import torch
from tqdm import tqdm

from cache import manifest as mf
from cache.schema import FEATURE_COLUMN, FLIP_COLUMNS, KIND_CLASSIFIER, SCHEMA_VERSION, CacheError
from cache.shards import read_attrs, read_columns, shard_is_complete, shard_path, shard_ranges, write_shard
from pipeline import dist
from pipeline.data import GpuNormalize, ImageRows, ResizeCrop, chunk_batches, make_loader
from pipeline.models import build_model, resolve_data_config, resolve_spec, weights_sha256
from pipeline.precision import autocast
from pipeline.sources import SampleList, is_embedded, list_split


@dataclass(frozen=True)
class ExtractConfig:
    classifier: str
    out: Path
    data: str | None = None
    split: str = "val"
    labels_file: str | None = None
    batch_size: int = 256
    workers: int = 8
    precision: str = "bf16"
    device: str | None = None
    weights: str | None = None
    random_init: bool = False
    model_kwargs: dict = field(default_factory=dict)
    preprocess: str = "model"
    features: bool = False
    flip_view: bool = False
    skip_bad: bool = False
    shard_size: int = 10_000
    compile: bool = False
    corruption: str | None = None
    severity: int = 0
    seed: int = 0
    shuffle_seed: int | None = None   # tests: permute rows inside shards to prove index placement
    progress: bool = True


def corruption_tag(cfg: ExtractConfig) -> str:
    return "none" if not cfg.corruption else f"{cfg.corruption}:{cfg.severity}:seed{cfg.seed}"


def make_corruption(cfg: ExtractConfig):
    if not cfg.corruption:
        return None
    from pipeline.corruptions import make_corruption as make
    return make(cfg.corruption, cfg.severity, cfg.seed)


def build_identity(cfg: ExtractConfig, samples: SampleList, spec, model, data_cfg) -> dict:
    num_classes = int(model.num_classes)
    top = int(samples.labels.max())
    if top >= num_classes:
        raise CacheError(f"--classifier {cfg.classifier} has {num_classes} outputs but split "
                         f"{samples.split!r} has labels up to {top} ({len(samples.classes)} "
                         "classes): use a classifier trained on this dataset's classes")
    return dict(schema_version=SCHEMA_VERSION, kind=KIND_CLASSIFIER, model=spec.name,
                model_kwargs=spec.kwargs, weights_sha256=weights_sha256(model),
                preprocess=cfg.preprocess, data_config=data_cfg.to_dict(), dataset=samples.dataset,
                dataset_fingerprint=samples.fingerprint, split=samples.split,
                corruption=corruption_tag(cfg), num_rows=len(samples), num_classes=num_classes,
                precision=cfg.precision, flip_view=cfg.flip_view, features=cfg.features,
                shard_size=cfg.shard_size)


def classify(model, x: torch.Tensor, labels: torch.Tensor, features: bool) -> dict[str, torch.Tensor]:
    """Per-row outputs of one view; softmax columns from float32 logits before fp16 storage."""
    feats = None
    if features:
        feats = model.forward_head(model.forward_features(x), pre_logits=True)
        logits = model.get_classifier()(feats)
    else:
        logits = model(x)
    logits = logits.float()
    probs = logits.softmax(dim=-1)
    pred = logits.argmax(dim=-1)
    out = {"logits": logits.half(), "pred": pred, "correct": (pred == labels).to(torch.uint8),
           "p_true": probs.gather(1, labels[:, None]).squeeze(1), "p_max": probs.max(dim=-1).values}
    if feats is not None:
        out[FEATURE_COLUMN] = feats.float().half()
    return out


class ShardBuffer:
    """Rows of one shard, placed by global index whatever order the loader delivers them in."""

    def __init__(self, start: int, stop: int, samples: SampleList):
        self.start, self.stop, self.filled = start, stop, 0
        self.columns = {"index": np.arange(start, stop, dtype=np.int64),
                        "label": samples.labels[start:stop].copy(),
                        "valid": np.zeros(stop - start, np.uint8)}

    def put(self, rows: np.ndarray, valid: np.ndarray, outputs: dict[str, torch.Tensor]) -> None:
        pos = rows - self.start
        for name, tensor in outputs.items():
            value = tensor.cpu().numpy()
            if name not in self.columns:
                self.columns[name] = np.zeros((self.stop - self.start, *value.shape[1:]), value.dtype)
            value[valid == 0] = 0  # undecodable rows carry no model output
            self.columns[name][pos] = value
        self.columns["valid"][pos] = valid
        self.filled += len(rows)

    @property
    def full(self) -> bool:
        return self.filled == self.stop - self.start


def extract(cfg: ExtractConfig) -> dict:
    """Run stage 1 for one split; returns the summary dict (also stored in the manifest)."""
    info, device = dist.init(cfg.device)
    samples = list_split(cfg.data, cfg.split, cfg.labels_file)
    spec = resolve_spec(cfg.classifier, is_embedded(cfg.data) or samples.dataset == "fashion-mnist",
                        cfg.weights, cfg.random_init, cfg.model_kwargs)
    model = build_model(spec, seed=cfg.seed)
    data_cfg = resolve_data_config(model, spec, cfg.preprocess)
    identity = build_identity(cfg, samples, spec, model, data_cfg)
    complete = _claim(cfg.out, identity, info)
    ranges = shard_ranges(len(samples), cfg.shard_size)
    if not complete:
        todo = [s for s in range(info.rank, len(ranges), info.world)
                if not shard_is_complete(shard_path(cfg.out, s), identity, *ranges[s])]
        elapsed, n_done = _run_shards(cfg, samples, model, data_cfg, identity, ranges, todo,
                                      info, device)
        n_done = dist.sum_int(info, n_done)
        if info.is_main:
            _write_manifest(cfg, samples, identity, ranges, elapsed, n_done, info)
        dist.barrier(info)
    summary = mf.load_manifest(cfg.out)["summary"]
    return {**summary, "out": str(cfg.out), "already_complete": complete}


def _claim(out: Path, identity: dict, info: dist.DistInfo) -> bool:
    """Rank 0 creates/validates the directory; the other ranks learn the outcome."""
    err = None
    if info.is_main:
        try:
            complete = mf.claim_directory(out, identity)
        except CacheError as e:
            err, complete = e, False
    if not dist.all_ok(info, err is None):
        raise err or CacheError(f"rank 0 refused cache directory {out}")
    if not info.is_main:
        complete = (Path(out) / mf.MANIFEST_FILE).exists()
    return complete


def _run_shards(cfg, samples, model, data_cfg, identity, ranges, todo, info, device):
    for s in todo:  # stale temporaries of an interrupted run of this rank's shards
        for tmp in Path(cfg.out).glob(f".{shard_path(cfg.out, s).name}.tmp-*"):
            tmp.unlink(missing_ok=True)
    my_ranges = [ranges[s] for s in todo]
    dataset = ImageRows(samples, ResizeCrop(data_cfg), make_corruption(cfg), cfg.skip_bad)
    loader = make_loader(dataset, chunk_batches(my_ranges, cfg.batch_size, cfg.shuffle_seed),
                         cfg.workers, pin_memory=device.type == "cuda")
    model = model.to(device).to(memory_format=torch.channels_last)
    run_model = torch.compile(model) if cfg.compile else model
    normalize = GpuNormalize(data_cfg, device)
    labels_all = torch.from_numpy(samples.labels)
    total = sum(b - a for a, b in my_ranges)
    bar = tqdm(total=total, unit="img", disable=not (cfg.progress and info.is_main),
               desc=f"extract {samples.split}", dynamic_ncols=True)
    buffers = {s: None for s in todo}
    start = time.perf_counter()
    with torch.inference_mode():
        for images, rows, valid in loader:
            rows_np, valid_np = rows.numpy(), valid.numpy()
            s = int(rows_np[0]) // cfg.shard_size
            buf = buffers[s] = buffers[s] or ShardBuffer(*ranges[s], samples)
            x = normalize(images)
            labels = labels_all[rows].to(device, non_blocking=True)
            with autocast(cfg.precision, device):
                outputs = classify(run_model, x, labels, cfg.features)
                if cfg.flip_view:
                    flipped = classify(run_model, x.flip(-1), labels, False)
                    outputs.update({f"{k}_flip": v for k, v in flipped.items()})
            buf.put(rows_np, valid_np, outputs)
            bar.update(len(rows_np))
            if buf.full:
                attrs = {**identity, "start": buf.start, "stop": buf.stop,
                         "bad_rows": buf.columns["index"][buf.columns["valid"] == 0].tolist()}
                write_shard(shard_path(cfg.out, s), buf.columns, attrs)
                buffers[s] = None
    bar.close()
    return time.perf_counter() - start, total


def _write_manifest(cfg, samples, identity, ranges, elapsed, n_done, info) -> None:
    shards, bad, correct, valid = [], [], 0, 0
    for s, (a, b) in enumerate(ranges):
        path = shard_path(cfg.out, s)
        if not shard_is_complete(path, identity, a, b):
            raise CacheError(f"shard {path} is missing after extraction; re-run to resume")
        cols = read_columns(path, ["correct", "valid"])
        valid += int(cols["valid"].sum())
        correct += int(cols["correct"][cols["valid"] == 1].sum())
        bad.extend(read_attrs(path)["bad_rows"])
        shards.append({"file": path.name, "start": a, "stop": b})
    columns = ["index", "label", "valid", "logits", "pred", "correct", "p_true", "p_max"]
    columns += [f"{c}_flip" for c in FLIP_COLUMNS] if cfg.flip_view else []
    columns += [FEATURE_COLUMN] if cfg.features else []
    summary = {"rows": len(samples), "valid_rows": valid, "bad_rows": len(bad),
               "accuracy": correct / valid if valid else float("nan"),
               "elapsed_s": round(elapsed, 3), "computed_rows": n_done,
               "img_per_s": round(n_done / elapsed, 1) if elapsed > 0 else None}
    mf.write_json_atomic(Path(cfg.out) / mf.MANIFEST_FILE, {
        "identity": identity, "columns": columns, "shards": shards, "summary": summary,
        "classes": list(samples.classes), "root": samples.root,
        "bad_rows": [{"index": i, "path": str(samples.path(i))} for i in bad],
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
        "info": {"torch": torch.__version__, "timm": timm.__version__, "host": socket.gethostname(),
                 "python": platform.python_version(), "world_size": info.world,
                 "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}})
