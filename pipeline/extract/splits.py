"""``cli.py extract``'s work below its options: one ``ExtractConfig`` per split, each extracted.

What the data decides is decided here: the cache root (beside the data's other artifacts), the
embedded Fashion-MNIST's flip view, features and precision (``presets.EMBEDDED_EXTRACT``, so the
bare command writes the demo's caches), the splits present.  A start that fails before writing a
shard leaves no claimed cache folder behind.
"""
from __future__ import annotations

from pathlib import Path

from cache.manifest import IDENTITY_FILE, check_cache_root
from cache.reader import cache_dir_for, split_tag
from pipeline.core import dist
from pipeline.core.presets import EMBEDDED_EXTRACT
from pipeline.data.newclass import newclass_tag
from pipeline.data.sources import check_splits, default_artifacts, default_splits, embedded_data
from pipeline.extract.run import ExtractConfig, extract


def split_configs(out: Path | None, splits: tuple[str, ...], corruption: str | None,
                  severity: int, **fields) -> list[ExtractConfig]:
    """The config of each split (``out``: the cache root, None: the data's artifacts root;
    ``fields``: the other ``ExtractConfig`` fields as the options give them, ``flip_view``,
    ``features`` and ``precision`` None where the data decides); the root and the splits are
    checked first."""
    data = fields["data"]
    root = out or default_artifacts(data) / "cache"
    check_cache_root(root)
    if fields["flip_view"] is None:
        fields["flip_view"] = embedded_data(data) and EMBEDDED_EXTRACT["flip_view"]
    if fields["features"] is None:
        fields["features"] = embedded_data(data) and EMBEDDED_EXTRACT["features"]
    if fields["precision"] is None and embedded_data(data):
        fields["precision"] = EMBEDDED_EXTRACT["precision"]
    splits = splits or default_splits(data)
    check_splits(data, splits)
    new = fields.get("new_classes", False)   # the held-out classes' rows: <split>-newclass
    return [ExtractConfig(out=cache_dir_for(root, fields["classifier"],
                                            split_tag(newclass_tag(split, new), corruption,
                                                      severity)),
                          split=split, corruption=corruption,
                          severity=severity if corruption else 0, **fields)
            for split in splits]


def extract_split(cfg: ExtractConfig) -> dict:
    """``run.extract`` of one split; a start that fails is unclaimed
    (``_unclaim_if_nothing_written``)."""
    existed = cfg.out.exists()
    try:
        return extract(cfg)
    except BaseException:
        _unclaim_if_nothing_written(cfg.out, existed, dist.info().world)
        raise


def _unclaim_if_nothing_written(out: Path, existed: bool, world: int) -> None:
    """A start that failed before any shard was written (a bad first image, a model that does
    not fit the device...) leaves no claimed cache folder behind: identity.json goes, and the
    folders this run created if they are then empty.  Single process only: under torchrun another
    rank may still be writing."""
    if existed or world > 1 or not out.is_dir() or any(out.glob("*.h5")):
        return
    (out / IDENTITY_FILE).unlink(missing_ok=True)
    for folder in (out, out.parent):   # <root>/<classifier>/<split tag>
        try:
            folder.rmdir()              # only if empty
        except OSError:
            return
