"""The rehearsal's ImageNet-layout tree: distinct JPEGs made from real photos, each filed under
an ImageNet wnid so that the runbook's classifiers are right on a chosen share of the rows.

Images: bench/make_jpegs.py (the repository's real photos, randomly cut, rescaled, flipped,
colour-jittered and re-encoded at ImageNet's sizes: mostly 500x375, ~95 KB), made in parallel
over the cores into one staging folder.  Labels: each classifier of the rehearsal (the runbook's
CLASSIFIERS, built as its commands build them: random-init presets, or the tiny stand-ins)
classifies the staging folder through `cli.py extract` itself (same preprocessing, precision
and model as the runbook's extract); then each image is given one of those classifiers at random
in turn (image i to classifier i mod n, so each split is shared exactly) and, with probability
``right``, that classifier's prediction as its label, else the next of ``classes`` wnids (spread
over the 1,000) in a cycle, skipping those the classifiers predicted for the image.  So each of n
classifiers is right on ~right/n of the rows at least (plus the rows where they agree), every
split mixes correct and incorrect rows as a real classifier's would, and a split with at least
``classes`` wrong rows fills (nearly) every one of the ``classes`` folders: random-init classifiers
predict a few dozen classes at most, so the folders come from the wrong rows.  With the
runbook's two random-init classifiers, 50% right for each and 1,000 folders cannot both hold:
each classifier is wrong wherever the other's prediction is the label, so 50% needs every row
labelled by a prediction (``right`` 1.0, a few dozen folders); the default 0.9 keeps the folders
and gives each ~45%.  A pretrained
classifier (EfficientNet-Lite0) would label by meaning, but the runbook's classifiers, random
without the hub, would then be right on ~0.1% of the rows and train-oracle refuses such a split.
Everything is drawn from ``seed`` and the image's index.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import make_jpegs  # noqa: E402
from cache.reader import ClassifierCache  # noqa: E402
from pipeline.data.labels import imagenet_synsets  # noqa: E402

STAGING = "staging"


def predictions(staging: Path, classifier: str, prep: str, env: dict) -> np.ndarray:
    """``pred`` of every staged image (row order = sorted file names = image index)."""
    cache = staging / "cache"
    cmd = [sys.executable, str(ROOT / "bench" / "rehearse_shim.py"), "cli.py", "extract",
           "--classifier", classifier, "--preprocess", prep, "--data", str(staging),
           "--split", "val", "--out", str(cache)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"labelling with {classifier} failed:\n{proc.stdout[-2000:]}"
                           f"{proc.stderr[-2000:]}")
    cols = ClassifierCache.open(cache / classifier / "val").load(["index", "pred"])
    return cols["pred"][np.argsort(cols["index"])]


def generate(out: Path, s: dict, procs: int, env: dict) -> dict:
    """Writes ``out/train/<wnid>/*.JPEG`` and ``out/val/<wnid>/*.JPEG``; returns what it made."""
    start = time.perf_counter()
    staging = out.parent / STAGING
    shutil.rmtree(staging, ignore_errors=True)
    n = s["train"] + s["val"]
    made = make_jpegs.generate(staging, 0, n, 1, s["seed"], procs)
    made_s = time.perf_counter() - start
    files = sorted((staging / "val").rglob("*.JPEG"))
    clfs = s["grid"]["CLASSIFIERS"].split()
    preds = np.stack([predictions(staging, c, s["grid"]["PREP"], env) for c in clfs])
    synsets = imagenet_synsets()
    wrong_pool = np.unique(np.linspace(0, len(synsets) - 1, s["classes"]).astype(int))
    labels, cursor = np.empty(n, dtype=np.int64), 0
    for i in range(n):
        rng = np.random.default_rng([s["seed"], i, 7])
        j, right = i % len(clfs), rng.random() < s["right"]
        if right:
            labels[i] = preds[j, i]
            continue
        for _ in range(len(wrong_pool)):      # the cycle's next wnid no classifier predicted
            labels[i], cursor = wrong_pool[cursor % len(wrong_pool)], cursor + 1
            if labels[i] not in preds[:, i]:
                break
        else:
            labels[i] = np.setdiff1d(np.arange(1000), preds[:, i])[0]
    for i, path in enumerate(files):
        wnid = synsets[labels[i]]
        target = out / ("train" if i < s["train"] else "val") / wnid / f"{wnid}_{i:07d}.JPEG"
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
    shutil.rmtree(staging)
    elapsed = time.perf_counter() - start
    return {"images": n, "train": s["train"], "val": s["val"], "mean_kb": made["mean_kb"],
            "source_photos": made["source_photos"], "folders": int(len(np.unique(labels))),
            "right_target": s["right"],
            "accuracy": {c: round(float((preds[k] == labels).mean()), 4) for k, c in enumerate(clfs)},
            "procs": procs, "make_s": round(made_s, 1), "wall_s": round(elapsed, 1),
            "images_per_s": round(n / made_s, 1)}


def rate_probe(n: int = 6) -> float:
    """Images per second of one process making JPEGs (for the up-front estimate)."""
    make_jpegs._init(make_jpegs.load_photos())
    start = time.perf_counter()
    for i in range(n):
        make_jpegs.make_image(i, 12345)
    return n / (time.perf_counter() - start)


def record(folder: Path, info: dict) -> None:
    (folder / ".complete").write_text(json.dumps(info))
