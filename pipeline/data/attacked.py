"""The on-disk format of an adversarial split written by ``cli.py attack`` (torch-free).

    ROOT/classes.txt                   class names in label order (not for ImageNet: wnid folders)
    ROOT/<name>/<class>/<stem>.png     the perturbed images, uint8, at the classifier's input
                                       resolution (after its resize/crop), lossless
    ROOT/<name>/.attack/claim.json     the identity, written first (what is being written)
    ROOT/<name>/.attack/shard-NNNNN.npz one per completed shard: rows, files, logged outputs
    ROOT/<name>/.attack/manifest.json  written last: identity + summary; its presence = complete

``ROOT/<name>`` is an ordinary ImageFolder split, so ``--data ROOT --split <name>`` reads it; the
``.attack`` folder (hidden, ignored by the listing) tells the reader two things no image file can:
the images are already at a model's input resolution (read them without another resize/crop, so
the classifier sees exactly the pixels that were attacked), and which attack made them (its hash
enters the dataset fingerprint, so a cache of an earlier attack into the same folder is refused).
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from pipeline.data.errors import DataError

FORMAT = "trust-oracles-adversarial-split"
FORMAT_VERSION = 1
META_DIR = ".attack"
CLAIM_FILE = "claim.json"
MANIFEST_FILE = "manifest.json"
CLASSES_FILE = "classes.txt"


def meta_dir(split_dir: Path) -> Path:
    return Path(split_dir) / META_DIR


def shard_record(split_dir: Path, shard: int) -> Path:
    return meta_dir(split_dir) / f"shard-{shard:05d}.npz"


def class_dirnames(classes: tuple[str, ...]) -> tuple[str, ...]:
    """A folder name per class: the name itself where it is a safe file name (ImageNet wnids,
    ImageFolder classes), else with unsafe characters replaced ("T-shirt/top" -> "T-shirt_top").
    Still-colliding names get their label index as a prefix, so the mapping stays one-to-one."""
    safe = [re.sub(r"[^\w.+-]+", "_", c).strip("._") or "class" for c in classes]
    if len(set(safe)) < len(safe):
        safe = [f"{i:04d}_{s}" for i, s in enumerate(safe)]
    return tuple(safe)


def file_stems(names: tuple[str, ...], rows, split: str) -> list[str]:
    """Output file stem of each source row: its own file stem (an ImageNet val image keeps
    ILSVRC2012_val_00000001), ``<split>_<row>`` for rows of an idx file; a stem that occurs twice
    (a.jpg and a.png) gets ``_<row>`` appended to both."""
    stems = [f"{split}_{i:06d}" if names[i].endswith("]") else Path(names[i]).stem for i in rows]
    seen: dict[str, int] = {}
    for s in stems:
        seen[s] = seen.get(s, 0) + 1
    return [f"{s}_{i}" if seen[s] > 1 else s for s, i in zip(stems, rows)]


def identity_sha256(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def read_manifest(split_dir: Path) -> dict | None:
    """The manifest of an attack-written split; None for any other folder.  A split the attack
    has not finished is refused: its images are only part of the split."""
    meta = meta_dir(split_dir)
    if not meta.is_dir():
        return None
    path = meta / MANIFEST_FILE
    if not path.exists():
        raise DataError(f"{split_dir} is an adversarial split that `cli.py attack` has not "
                        f"finished ({path} missing): re-run the same attack command to complete "
                        "it before reading it")
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise DataError(f"{path} is unreadable ({err}); re-run the attack into a new folder") \
            from None
    if doc.get("identity", {}).get("format") != FORMAT or \
            doc["identity"].get("format_version") != FORMAT_VERSION:
        raise DataError(f"{path}: not a version-{FORMAT_VERSION} adversarial split manifest; "
                        "re-create it with this code's `cli.py attack`")
    return doc


def check_listing(split_dir: Path, doc: dict, names: tuple[str, ...]) -> None:
    """The folder must hold exactly the images the attack wrote (none added, none lost)."""
    expected = doc["summary"]["rows"]
    if len(names) != expected:
        raise DataError(f"{split_dir} holds {len(names)} images but the attack wrote {expected} "
                        f"({Path(split_dir) / META_DIR / MANIFEST_FILE}); images were added or "
                        "removed since: re-create the split with `cli.py attack` into a new folder")
