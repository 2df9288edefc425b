"""Corrupt a split into an ImageNet-C-layout folder tree.

    out/manifest.json                          what was written: source, protocol, seed, format
    out/<corruption>/<severity>/<class>/<name> one file per source row
    out/classes.txt                            class folder names in label order (non-ImageNet)

Protocols: ``imagenet-c`` reproduces ImageNet-C's pipeline (``make_imagenet_c.py``): resize the
shorter side to 256, centre-crop 224, corrupt at 224 px, store JPEG quality 85.  ``native``
corrupts the decoded image at its own size and stores lossless PNG: the files hold exactly the
pixels ``extract --corruption NAME --severity S --seed N`` computes on the fly.  Row ``i`` of the
source split is seeded with ``(seed, i)`` in both, as in ``extract``.

Read the result back with ``extract --data OUT --split <corruption>/<severity>``.  Files are written
atomically and skipped when present, so an interrupted run resumes; a manifest written by another
source, protocol, seed or format is refused.
"""
from __future__ import annotations

import io
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from PIL import Image
from torchvision.transforms.v2 import functional as TF
from tqdm import tqdm

from cache.atomic import atomic_file, atomic_path
from cache.claim import Claim
from pipeline.data.corruptions import make_corruption
from pipeline.data.errors import DataError
from pipeline.data.imagecorruptions_compat import installed_version as imagecorruptions_version
from pipeline.data.images import ImageRows
from pipeline.data.loader import chunk_batches, default_workers, make_loader
from pipeline.data.labels import imagenet_synsets
from pipeline.data.sources import SampleList, list_split

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
PROTOCOLS = ("imagenet-c", "native")
FORMATS = {"jpeg": ".JPEG", "png": ".png"}
JPEG_QUALITY = 85               # ImageNet-C stored its files as JPEG quality 85
RESIZE, CROP = 256, 224         # ... of the 256-resized, 224-centre-cropped validation image


@dataclass(frozen=True)
class CorruptConfig:
    out: Path
    data: str | None
    split: str
    corruptions: tuple[str, ...]
    severities: tuple[int, ...]
    seed: int = 0
    protocol: str = "native"
    format: str = "png"
    labels_file: str | None = None
    workers: int | None = None
    progress: bool = True


def class_dirs(samples: SampleList) -> tuple[list[str], bool]:
    """Folder name per class; True when a classes.txt must pin the label order (any dataset
    whose classes are not ImageNet's wnids: folders are read back in sorted order)."""
    if samples.dataset == "imagenet" and tuple(samples.classes) == tuple(imagenet_synsets()):
        return list(samples.classes), False
    width = len(str(len(samples.classes) - 1))
    safe = [re.sub(r"[^A-Za-z0-9._-]+", "_", c).strip("._") for c in samples.classes]
    return [f"{i:0{width}d}_{s}" for i, s in enumerate(safe)], True


def file_stem(samples: SampleList, i: int) -> str:
    if samples.idx_images is not None:
        return f"{samples.split}_{i:06d}"
    return Path(samples.names[i]).stem


def manifest_for(cfg: CorruptConfig, samples: SampleList) -> dict:
    return {"format_version": FORMAT_VERSION, "writer": "cli.py corrupt",
            "source": {"dataset": samples.dataset, "split": samples.split, "rows": len(samples),
                       "fingerprint": samples.fingerprint},
            "protocol": cfg.protocol, "format": cfg.format, "seed": cfg.seed,
            "jpeg_quality": JPEG_QUALITY if cfg.format == "jpeg" else None,
            "imagecorruptions": imagecorruptions_version()}


def _write_manifest(path: Path, manifest: dict) -> None:
    with atomic_file(path, "w") as fh:
        fh.write(json.dumps(manifest, indent=2))


# The output folder's claim (cache.claim): manifest.json first; files are skipped one by one, so
# there is no completion mark, and a folder without a manifest is taken.
CLAIM = Claim(record=MANIFEST, write=_write_manifest, what="corruption manifest", error=DataError,
              refused="{folder} was written by another corruption run",
              fix="Use another --out, or delete the folder to write it again.")


class CorruptRows(ImageRows):
    """Row i -> every requested (corruption, severity) of it written to disk; returns the count
    of files written (0 when all existed).  Runs in the loader workers."""

    def __init__(self, samples, cfg: CorruptConfig, dirs: list[str]):
        super().__init__(samples, transform=lambda x: x)
        self.cfg, self.dirs = cfg, dirs

    def __getitem__(self, i: int):
        todo = []
        for name in self.cfg.corruptions:
            for s in self.cfg.severities:
                path = (self.cfg.out / name / str(s) / self.dirs[int(self.samples.labels[i])] /
                        (file_stem(self.samples, i) + FORMATS[self.cfg.format]))
                if not path.exists():
                    todo.append((name, s, path))
        if not todo:
            return torch.tensor([0, i])
        img = self._load(i)
        if self.cfg.protocol == "imagenet-c":
            img = TF.center_crop(TF.resize(img, [RESIZE], antialias=True), [CROP, CROP])
        for name, s, path in todo:
            write_image(make_corruption(name, s, self.cfg.seed)(img, i), path, self.cfg.format)
        return torch.tensor([len(todo), i])


def write_image(img: torch.Tensor, path: Path, fmt: str) -> None:
    arr = img.permute(1, 2, 0).numpy()
    pil = Image.fromarray(arr[..., 0] if arr.shape[-1] == 1 else arr)
    buf = io.BytesIO()
    pil.save(buf, "JPEG", quality=JPEG_QUALITY) if fmt == "jpeg" else pil.save(buf, "PNG")
    path.parent.mkdir(parents=True, exist_ok=True)
    # not fsynced: thousands of images, each made again by a re-run when it is missing
    with atomic_path(path, durable=False) as tmp:
        tmp.write_bytes(buf.getvalue())


def corrupt_split(cfg: CorruptConfig) -> dict:
    """Write every requested corruption and severity of the split; returns a summary dict."""
    samples = list_split(cfg.data, cfg.split, cfg.labels_file)
    CLAIM.take(cfg.out, manifest_for(cfg, samples))   # refuses another run's folder
    dirs, pin = class_dirs(samples)
    if pin:
        (cfg.out / "classes.txt").write_text("\n".join(dirs) + "\n")
    workers = default_workers() if cfg.workers is None else cfg.workers
    batches = chunk_batches([(0, len(samples))], 8)
    loader = make_loader(CorruptRows(samples, cfg, dirs), batches, workers, False)
    written = 0
    with tqdm(total=len(samples), disable=not cfg.progress, unit="img") as bar:
        for out in loader:
            written += int(out[:, 0].sum())
            bar.update(len(out))
    return {"out": str(cfg.out), "rows": len(samples), "files_written": written,
            "files_total": len(samples) * len(cfg.corruptions) * len(cfg.severities),
            "splits": [f"{c}/{s}" for c in cfg.corruptions for s in cfg.severities],
            "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()}}
