"""The end of an ``extract`` run, on rank 0 once every rank's shards are written: each shard checked
complete, then ``manifest.json`` written last -- its presence is what marks the cache complete --
with the shards' entries, the run's summary and what made the logits.
"""
from __future__ import annotations

import platform
import socket
import time
from dataclasses import asdict
from pathlib import Path

import timm
import torch

from cache import manifest as mf
from cache.outputs import MADE_ON
from cache.schema import CacheError, cache_columns
from cache.shards import read_attrs, read_columns, shard_entry, shard_is_complete, shard_path
from pipeline.core.models import file_sha256
from pipeline.core.precision import made_on
from pipeline.data.decode import uses_hardware
from pipeline.data.hwdecode import version as nvimgcodec_version


def _summary(samples, shard_stats: tuple, timing: dict) -> dict:
    valid, correct, bad = shard_stats
    steady = timing.get("steady_s")
    return {"rows": len(samples), "valid_rows": valid, "bad_rows": len(bad),
            "accuracy": correct / valid if valid else float("nan"),
            "elapsed_s": round(timing["elapsed"], 3), "computed_rows": timing["rows"],
            "img_per_s": round(timing["rows"] / timing["elapsed"], 1) if timing["elapsed"] else None,
            # throughput after each process's first batch (excludes worker start-up and
            # compilation), over every process's rows
            "steady_img_per_s": round(timing["steady_rows"] / steady, 1) if steady else None,
            "steady_rows": timing["steady_rows"],
            # this process's forward passes alone (pipeline/core/timing.py)
            "inference": {**timing.get("model", {}), "wall_ms_per_img": round(
                1000.0 * steady / timing["steady_rows"], 4) if steady and timing["steady_rows"]
                else None, "wall_what": "steady wall time per image incl. data loading"}}


def write_manifest(cfg, samples, identity, ranges, timing, info, device) -> None:
    shards, bad, correct, valid = [], [], 0, 0
    for s, (a, b) in enumerate(ranges):
        path = shard_path(cfg.out, s)
        if not shard_is_complete(path, identity, a, b):
            raise CacheError(f"shard {path} is missing after extraction; re-run to resume")
        cols = read_columns(path, ["correct", "valid"])
        valid += int(cols["valid"].sum())
        correct += int(cols["correct"][cols["valid"] == 1].sum())
        bad.extend(read_attrs(path)["bad_rows"])
        shards.append(shard_entry(path, a, b))
    columns = cache_columns(cfg.flip_view, cfg.features, bool(cfg.mc_dropout))
    mf.write_json_atomic(Path(cfg.out) / mf.MANIFEST_FILE, {
        "identity": identity, "columns": columns, "shards": shards,
        "summary": _summary(samples, (valid, correct, bad), timing),
        "classes": list(samples.classes), "root": samples.root,
        "bad_rows": [{"index": i, "path": str(samples.path(i))} for i in bad],
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
        # where train-oracle finds the classifier's weights from any working directory (an
        # oracle of its architecture starts from them; checked against weights_sha256), and the
        # file's own hash, which refuses another file before any model is built (predict)
        **({"weights_file": str(Path(cfg.weights).resolve()),
            "weights_file_sha256": file_sha256(cfg.weights)} if cfg.weights else {}),
        "info": {"torch": torch.__version__, "timm": timm.__version__, "host": socket.gethostname(),
                 "python": platform.python_version(), "world_size": info.world,
                 "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                 # what made the logits and features (a head-only run's scores are made from them)
                 MADE_ON: made_on(device, cfg.precision).to_dict(),
                 # the hardware decoder's pixels come from this library (identity: decode)
                 **({"nvimgcodec": nvimgcodec_version()} if uses_hardware(cfg.decode) else {})}})
