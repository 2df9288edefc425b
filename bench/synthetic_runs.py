"""Synthetic classifier caches and run directories that follow docs/DATA_CONTRACT.md exactly.

Used by tests/test_report.py and bench/bench_report.py.  Caches are written with the project's own
writers (cache.shards.write_shard, cache.manifest.write_json_atomic), run directories through
cache.runs.RunDir (run record, held-out rows, output file names) and outputs with
cache.outputs.write_outputs, so a report over them exercises the real reading and checking code.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from cache import manifest as mf
from cache.outputs import MadeOn, classifier_ref, write_outputs
from cache.reader import ClassifierCache
from cache.runs import RunDir
from cache.schema import KIND_CLASSIFIER, SCHEMA_VERSION
from cache.shards import shard_entry, shard_path, shard_ranges, write_shard
from pipeline.core.losses import get

# run.json records the versions of the code that trained a run; these runs were made up here
VERSIONS = {"synthetic_runs": "1"}
# what made the scores: nothing ran, no device or precision (cache.outputs.MadeOn)
SYNTHETIC = MadeOn("", "", "", "", "synthetic scores")


def _logits(rng, labels: np.ndarray, correct: np.ndarray, k: int) -> np.ndarray:
    """Random logits whose argmax is the label exactly where ``correct``."""
    n = len(labels)
    logits = rng.normal(size=(n, k)).astype(np.float32)
    rows = np.arange(n)
    top = logits.max(axis=1)
    logits[rows[correct], labels[correct]] = top[correct] + rng.exponential(2.0, correct.sum()) + 0.1
    wrong = ~correct
    other = (labels[wrong] + rng.integers(1, k, wrong.sum())) % k
    logits[rows[wrong], other] = top[wrong] + rng.exponential(1.0, wrong.sum()) + 0.1
    return logits.astype(np.float16)


def _columns(logits16: np.ndarray, labels: np.ndarray, bad: np.ndarray) -> dict:
    logits = logits16.astype(np.float32)
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    pred = logits.argmax(1)
    cols = {"index": np.arange(len(labels), dtype=np.int64), "label": labels.astype(np.int64),
            "valid": np.ones(len(labels), np.uint8), "logits": logits16,
            "pred": pred.astype(np.int64), "correct": (pred == labels).astype(np.uint8),
            "p_true": probs[np.arange(len(labels)), labels].astype(np.float32),
            "p_max": probs.max(1).astype(np.float32)}
    for name in ("valid", "logits", "pred", "correct", "p_true", "p_max"):
        cols[name][bad] = 0  # undecodable rows carry no model output (contract)
    return cols


def write_cache(cache_dir: Path, *, n: int, k: int = 10, accuracy: float = 0.8, seed: int = 0,
                model: str = "synthetic", dataset: str = "synthetic", split: str = "test",
                corruption: str = "none", bad_rows: tuple[int, ...] = (),
                shard_size: int | None = None, weights_seed: int | None = None,
                per_shard: bool = False, features: int = 0) -> Path:
    """A complete classifier cache of ``n`` rows and ``k`` classes at about ``accuracy``; caches
    with the same ``model`` and ``weights_seed`` (default ``seed``) share a classifier.
    ``per_shard``: the logits drawn shard by shard (other numbers, the same distribution), so an
    ImageNet-train-sized cache (1.28M x 1,000) is written without holding it in memory.
    ``features``: a features column of that many dimensions (0: none), around the centre of the
    predicted class (the caches of one classifier share the centres), halfway to the true
    class's centre where the prediction is wrong."""
    if features and per_shard:
        raise ValueError("features are written with whole caches only")
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, n)
    bad = np.zeros(n, bool)
    bad[list(bad_rows)] = True
    right = rng.random(n) < accuracy
    whole = None if per_shard else _columns(_logits(rng, labels, right, k), labels, bad)
    if features:
        centres = 3.0 * np.random.default_rng(
            [seed if weights_seed is None else weights_seed, 7]).normal(size=(k, features))
        # a wrong prediction's features lie between its predicted and its true class
        feats = (centres[whole["pred"]] + centres[labels]) / 2 + rng.normal(size=(n, features))
        feats[bad] = 0.0
        whole["features"] = feats.astype(np.float16)

    def columns(a: int, b: int) -> dict:
        if whole is not None:
            return {c: v[a:b] for c, v in whole.items()}
        part = _columns(_logits(rng, labels[a:b], right[a:b], k), labels[a:b], bad[a:b])
        return {**part, "index": part["index"] + a}
    shard_size = shard_size or n
    identity = dict(
        schema_version=SCHEMA_VERSION, kind=KIND_CLASSIFIER, model=model, model_kwargs={},
        weights_sha256=hashlib.sha256(
            f"{model}-{seed if weights_seed is None else weights_seed}".encode()).hexdigest(), preprocess="model",
        data_config={"input_size": [3, 28, 28]}, dataset=dataset,
        dataset_fingerprint=hashlib.sha256(f"{dataset}-{split}-{n}".encode()).hexdigest(),
        split=split, corruption=corruption, num_rows=n, num_classes=k, precision="fp32",
        flip_view=False, features=bool(features), shard_size=shard_size)
    cache_dir = Path(cache_dir)
    mf.claim_directory(cache_dir, identity)
    shards, correct = [], np.zeros(n, np.uint8)
    for s, (a, b) in enumerate(shard_ranges(n, shard_size)):
        part = columns(a, b)
        correct[a:b] = part["correct"]
        bad_here = [int(i) for i in np.flatnonzero(bad[a:b]) + a]
        write_shard(shard_path(cache_dir, s), part, {**identity, "start": a, "stop": b,
                                                     "bad_rows": bad_here})
        shards.append(shard_entry(shard_path(cache_dir, s), a, b))
    valid = ~bad
    mf.write_json_atomic(cache_dir / mf.MANIFEST_FILE, {
        "identity": identity, "columns": list(part), "shards": shards,
        "summary": {"rows": n, "valid_rows": int(valid.sum()), "bad_rows": int(bad.sum()),
                    "accuracy": float(correct[valid].mean())},
        "classes": [str(c) for c in range(k)], "root": "synthetic",
        "bad_rows": [{"index": int(i), "path": f"synthetic/{i}.png"} for i in np.flatnonzero(bad)],
        "config": {}, "info": {}})
    return cache_dir


def write_run(run_dir: Path, cache_dir: Path, *, oracle: str, classifier: str, loss: str,
              seed: int, group: str, separation: float = 1.5, variant: str = "",
              loss_label: str | None = None, tag: str | None = None, dataset: str = "synthetic",
              nan_rows: tuple[int, ...] = (), status: str = "complete",
              train_cache: Path | None = None, val_rows: list[int] | None = None) -> Path:
    """A run directory (run.json + outputs/<tag>.h5) whose confidences separate correct from
    incorrect rows by ``separation`` (in logit units); TCP confidences are squashed toward 0."""
    cache = ClassifierCache.open(Path(cache_dir))
    cols = cache.load(["label", "valid", "pred", "correct"])
    n = cache.num_rows
    rng = np.random.default_rng([seed, *f"{oracle}/{classifier}/{loss}/{variant}".encode()])
    z = separation * (2.0 * cols["correct"] - 1.0) + rng.normal(size=n)
    z = (z - 3.0) if loss == "tcp" else z
    z[cols["valid"] == 0] = 0.0
    conf = (1.0 / (1.0 + np.exp(-z))).astype(np.float32)
    conf[list(nan_rows)] = np.nan
    record = {"oracle": oracle, "oracle_model": f"{oracle}-model", "classifier": classifier,
              "loss": loss, "variant": variant, "seed": seed, "group": group, "dataset": dataset,
              "loss_label": loss_label or get(loss).label,
              "num_classes": cache.identity["num_classes"], "config": {"loss": loss, "seed": seed}}
    tag = tag or Path(cache_dir).name
    run = RunDir(Path(run_dir))
    write_outputs(run.output(tag),
                  {"index": np.arange(n, dtype=np.int64), "valid": cols["valid"], "z": z,
                   "confidence": conf, "correct": cols["correct"], "label": cols["label"],
                   "pred": cols["pred"]},
                  classifier_ref(cache.path, cache.identity), record, SYNTHETIC)
    extra = {"train_cache": str(train_cache)} if train_cache else {}
    run.write(record, status, VERSIONS, **extra)
    if val_rows is not None:     # as train-oracle's held-out rows
        run.write_val_split({
            "split": "train", "val_fraction": None, "split_seed": 0, "train_limit": None,
            "num_val_rows": len(val_rows), "val_rows": [int(i) for i in val_rows]})
    return Path(run_dir)


def write_study(root: Path, *, n: int, k: int = 10, pairs=(("vit", "vit"),),
                losses=("ce", "focal", "tcp", "ss"), seeds=(0, 1, 2), tag: str = "test",
                bad_rows: tuple[int, ...] = (), held_out: float | None = 0.1,
                n_train: int | None = None, train_shard: int | None = None,
                features: int = 0) -> tuple[Path, Path]:
    """artifacts-like tree: <root>/cache/<classifier>/<tag>, <root>/runs/<run name>; with
    ``held_out``, also each classifier's training cache <root>/cache/<classifier>/train
    (``n_train`` rows, default ``n``) whose seeded ``held_out`` fraction every run lists in its
    val_split.json, as train-oracle does; ``train_shard``: those caches in shards of that many
    rows (as extract writes them), drawn shard by shard; ``features``: every cache with a
    features column of that many dimensions."""
    separation = {"ce": 0.8, "focal": 0.7, "tcp": 1.2, "ss": 1.8}
    caches, train = {}, {}
    val_rows = None
    for i, clf in enumerate(sorted({c for _, c in pairs})):
        caches[clf] = write_cache(root / "cache" / clf / tag, n=n, k=k, seed=i, model=clf,
                                  split=tag, accuracy=0.84 - 0.15 * i, bad_rows=bad_rows,
                                  features=features)
        if held_out:
            m = n_train or n
            train[clf] = write_cache(root / "cache" / clf / "train", n=m, k=k, seed=100 + i,
                                     weights_seed=i, model=clf, split="train",
                                     accuracy=0.86 - 0.15 * i, shard_size=train_shard,
                                     per_shard=train_shard is not None, features=features)
            pick = np.random.default_rng(0).permutation(m)[:max(1, int(held_out * m))]
            val_rows = np.sort(pick).tolist()
    for oracle, clf in pairs:
        for loss in losses:
            for seed in seeds:
                group = hashlib.sha256(f"{oracle}{clf}{loss}".encode()).hexdigest()[:12]
                write_run(root / "runs" / f"{oracle}-{clf}_{loss}_seed{seed}_{group}", caches[clf],
                          oracle=oracle, classifier=clf, loss=loss, seed=seed, group=group,
                          separation=separation.get(loss, 1.0), tag=tag,
                          train_cache=train.get(clf), val_rows=val_rows if held_out else None)
    return root / "runs", root / "cache"
