"""Generate an ImageNet-shaped JPEG set for extraction benchmarks (no network, no ImageNet).

Real photos (scikit-image's chelsea/coffee/astronaut/rocket/... when installed, always
scikit-learn's two sample images) are randomly cut, rescaled, flipped and colour-jittered, then
re-encoded like ImageNet's files: mostly 500x375 or 375x500, some other sizes with a 500-px
longer side, baseline JPEG at ~100 KB on average, laid out as ``ROOT/train/<wnid>/*.JPEG`` and
``ROOT/val/<wnid>/*.JPEG`` with real ImageNet wnids.

    python bench/make_jpegs.py --out /tmp/jpegs --n-val 10240 --n-train 1024

Needs only numpy, Pillow and scikit-learn (scikit-image optional).  Deterministic given --seed.
"""
from __future__ import annotations

import argparse
import io
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageEnhance

ROOT = Path(__file__).resolve().parents[1]
SKIMAGE_PHOTOS = ("chelsea", "coffee", "astronaut", "rocket", "cat", "immunohistochemistry")
_PHOTOS: list[np.ndarray] = []


def load_photos() -> list[np.ndarray]:
    from sklearn.datasets import load_sample_images

    photos = [np.asarray(img) for img in load_sample_images().images]
    try:
        import skimage.data
        for name in SKIMAGE_PHOTOS:
            try:
                photos.append(np.asarray(getattr(skimage.data, name)()))
            except Exception:  # noqa: BLE001 - a photo that needs a download is skipped
                pass
    except ImportError:
        pass
    return [p for p in photos if p.ndim == 3 and p.shape[2] == 3]


def wnids(n: int) -> list[str]:
    """n real ImageNet synsets spread over the 1000 (timm's list, else a stable fallback)."""
    try:
        import importlib.resources
        text = importlib.resources.files("timm.data").joinpath("_info/imagenet_synsets.txt")
        synsets = [s.strip() for s in text.read_text().splitlines() if s.strip()]
    except Exception:  # noqa: BLE001 - any timm layout problem: synthetic wnid-like names
        synsets = [f"n{10_000_000 + i:08d}" for i in range(1000)]
    return [synsets[i] for i in np.linspace(0, len(synsets) - 1, n).astype(int)]


def output_size(rng: np.random.Generator) -> tuple[int, int]:
    """(width, height) distributed roughly like ImageNet's: 500x375 dominates."""
    u = rng.random()
    if u < 0.6:
        return 500, 375
    if u < 0.75:
        return 375, 500
    short = int(rng.integers(250, 501))
    return (500, short) if rng.random() < 0.7 else (short, 500)


def make_image(index: int, seed: int) -> bytes:
    rng = np.random.default_rng([seed, index])
    photo = _PHOTOS[index % len(_PHOTOS)]
    h, w = photo.shape[:2]
    out_w, out_h = output_size(rng)
    aspect = out_w / out_h * np.exp(rng.uniform(-0.15, 0.15))
    area = rng.uniform(0.25, 1.0) * h * w
    ch = int(min(h, np.sqrt(area / aspect)))
    cw = int(min(w, ch * aspect))
    y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
    img = Image.fromarray(photo[y:y + ch, x:x + cw]).resize((out_w, out_h), Image.BICUBIC)
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    for enhance in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
        img = enhance(img).enhance(rng.uniform(0.7, 1.3))
    arr = np.asarray(img, dtype=np.int16)
    # sensor-like grain: upscaled crops are smoother than camera images; with it and quality
    # 92-97 the files average ~100 KB like ImageNet's (entropy decoding dominates decode time)
    arr = arr + rng.normal(0, rng.uniform(4, 10), arr.shape).astype(np.int16)
    buf = io.BytesIO()
    Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)).save(
        buf, "JPEG", quality=int(rng.integers(92, 98)))
    return buf.getvalue()


def _write(job: tuple) -> int:
    path, index, seed = job
    data = make_image(index, seed)
    Path(path).write_bytes(data)
    return len(data)


def _init(photos):
    global _PHOTOS
    _PHOTOS = photos


def generate(out: Path, n_train: int, n_val: int, classes: int, seed: int, procs: int) -> dict:
    photos = load_photos()
    names = wnids(classes)
    jobs = []
    for split, n, offset in (("train", n_train, 0), ("val", n_val, n_train)):
        for i in range(n):
            wnid = names[i % classes]
            path = out / split / wnid / f"{wnid}_{split}_{i:07d}.JPEG"
            jobs.append((str(path), offset + i, seed))
    for wnid in names:
        for split, n in (("train", n_train), ("val", n_val)):
            if n:
                (out / split / wnid).mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with mp.get_context("fork").Pool(procs, _init, (photos,)) as pool:
        sizes = pool.map(_write, jobs, chunksize=64)
    elapsed = time.perf_counter() - start
    return {"images": len(jobs), "train": n_train, "val": n_val, "classes": classes,
            "source_photos": len(photos), "mean_kb": round(float(np.mean(sizes)) / 1e3, 1),
            "elapsed_s": round(elapsed, 1), "out": str(out)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--n-val", type=int, default=10_240)
    ap.add_argument("--n-train", type=int, default=1_024)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--procs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    if args.out.exists() and any(args.out.iterdir()):
        sys.exit(f"--out {args.out} is not empty; choose a new directory")
    info = generate(args.out, args.n_train, args.n_val, args.classes, args.seed, args.procs)
    print(f"wrote {info['images']} JPEGs ({info['mean_kb']} KB average, {info['source_photos']} "
          f"source photos) to {info['out']} in {info['elapsed_s']} s")


if __name__ == "__main__":
    main()
