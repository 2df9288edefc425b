"""Writing an adversarial split (format: ``pipeline.data.attacked``): claim the folder, write
PNGs and one record per completed shard, then the manifest.

Every file is written under a temporary hidden name and renamed, so an interrupted run leaves
whole files only; a shard counts as done when its record exists (written after its PNGs) for the
same identity and all its files are there.  Re-running re-attacks exactly the missing shards and
overwrites their files by name, so no row is ever duplicated.
"""
from __future__ import annotations

import json
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from torchvision.io import encode_png

from cache.atomic import atomic_file, atomic_path
from cache.claim import Claim
from pipeline.data import attacked as fmt
from pipeline.data.sources import SampleList
from pipeline.attack.methods import AttackError

RECORD_COLUMNS = ("position", "source_index", "label", "clean_pred", "adv_pred", "stored_pred",
                  "stored_logits", "linf")


# The split folder's claim (cache.claim): .attack/claim.json first, .attack/manifest.json last.
CLAIM = Claim(
    record=f"{fmt.META_DIR}/{fmt.CLAIM_FILE}", marker=f"{fmt.META_DIR}/{fmt.MANIFEST_FILE}",
    what="attack claim", error=AttackError,
    refused="{folder} holds an adversarial split written by another attack run",
    fix="Choose another --out-split or --out, or delete the folder to rebuild it.",
    foreign="{folder} exists and was not written by `cli.py attack` (no {record}); choose "
            "another --out-split or --out")


def claim(split_dir: Path, identity: dict) -> bool:
    """Create or re-open ``split_dir`` for ``identity``; True if it is already complete.  A folder
    holding another attack's (or classifier's, or parameters') images is refused, naming what
    differs; a folder holding anything else is refused too."""
    return CLAIM.take(split_dir, identity) == "complete"


def claim_classes(root: Path, dataset: str, dirnames: tuple[str, ...]) -> None:
    """Make ROOT's class list the source's, so the original labels survive the listing: ImageNet
    wnid folders need nothing; otherwise ROOT/classes.txt (or an existing train/ whose folders
    are these classes).  An existing, different class list is refused."""
    if dataset == "imagenet":
        return
    root = Path(root)
    path = root / fmt.CLASSES_FILE
    if path.exists():
        have = tuple(l.strip() for l in path.read_text().splitlines() if l.strip())
        if have != dirnames:
            raise AttackError(f"{path} lists other classes ({len(have)}: {list(have[:3])}...) than "
                              f"the attacked split's ({len(dirnames)}: {list(dirnames[:3])}...); "
                              "write the split into another --out")
        return
    train = root / "train"
    if train.is_dir() and tuple(sorted(p.name for p in train.iterdir() if p.is_dir()
                                       and not p.name.startswith("."))) == dirnames:
        return
    root.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "w") as fh:
        fh.write("".join(f"{c}\n" for c in dirnames))


def output_files(samples: SampleList, rows: np.ndarray, dirnames: tuple[str, ...]) -> list[str]:
    """Relative path of each attacked row: <class folder>/<stem>.png."""
    stems = fmt.file_stems(samples.names, rows.tolist(), samples.split)
    return [f"{dirnames[samples.labels[i]]}/{s}.png" for i, s in zip(rows.tolist(), stems)]


def _write_png(path: Path, image: torch.Tensor) -> None:
    with warnings.catch_warnings():  # torchvision >= 0.29 deprecates its codecs (still fine)
        warnings.simplefilter("ignore", DeprecationWarning)
        data = encode_png(image, compression_level=6).numpy().tobytes()
    # not fsynced: a shard's images, each made again with its shard when the record is missing
    with atomic_path(path, durable=False) as tmp:
        tmp.write_bytes(data)


class ShardWriter:
    """PNG encoding on a few threads (zlib releases the GIL), then one record per shard."""

    def __init__(self, split_dir: Path, identity: dict, threads: int = 4):
        self.split_dir, self.identity = Path(split_dir), identity
        self.pool = ThreadPoolExecutor(max_workers=max(1, threads))
        self.pending: list[Future] = []

    def images(self, files: list[str], images: torch.Tensor) -> None:
        """``images``: uint8 (n, C, H, W) on the CPU, one per file."""
        for rel, img in zip(files, images):
            path = self.split_dir / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            self.pending.append(self.pool.submit(_write_png, path, img.contiguous()))

    def record(self, shard: int, columns: dict[str, np.ndarray], files: list[str]) -> None:
        """Wait for the shard's PNGs, then write its record (the shard's completion mark)."""
        for f in self.pending:
            f.result()
        self.pending = []
        path = fmt.shard_record(self.split_dir, shard)
        with atomic_path(path, suffix=".npz") as tmp:   # numpy adds .npz to a name without it
            np.savez(tmp, identity=np.array(json.dumps(self.identity, sort_keys=True)),
                     files=np.array(files), **columns)

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def read_record(split_dir: Path, shard: int) -> dict[str, np.ndarray] | None:
    path = fmt.shard_record(split_dir, shard)
    if not path.exists():
        return None
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def shard_done(split_dir: Path, shard: int, identity: dict, files: list[str]) -> bool:
    rec = read_record(split_dir, shard)
    if rec is None or json.loads(str(rec["identity"])) != json.loads(json.dumps(identity)):
        return False
    return rec["files"].tolist() == files and all((split_dir / f).is_file() for f in files)


def check_listing(split_dir: Path, files: list[str]) -> None:
    """The folder must hold exactly the written images (a stray file would become a row)."""
    found = {f"{d.name}/{p.name}" for d in Path(split_dir).iterdir()
             if d.is_dir() and not d.name.startswith(".") for p in d.iterdir()
             if not p.name.startswith(".")}
    extra = sorted(found - set(files))
    if extra:
        raise AttackError(f"{split_dir} holds {len(extra)} file(s) the attack did not write, e.g. "
                          f"{extra[:3]}; remove them (they would become rows of the split)")
