"""A TrainConfig as run.json records it and as its run directory is named: the record (its loss's
own parameters at top level), the config read back from one, the group hash, the bank key.
Torch-free.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, fields
from typing import Any, Mapping

from cache.schema import canonical
from pipeline.core.losses import loss_params
from pipeline.oracle.settings.config import BANK_FREE, LATER, NOT_IN_GROUP, TrainConfig
from pipeline.oracle.settings.fields import field_default


def group_hash(config: Mapping[str, Any], train_identity: Mapping[str, Any]) -> str:
    """12 hex digits naming everything that defines a run except its seed: the ``run`` part of
    the config, with the paths replaced by the training cache's identity."""
    keep = {k: v for k, v in config.items() if k not in NOT_IN_GROUP}
    for name in LATER:      # e.g. fine-tuned runs keep the group they had before --head-only
        default = field_default(TrainConfig.__dataclass_fields__[name])
        if keep.get(name, default) == default:
            keep.pop(name, None)
    # the weights file by its contents, not its path; runs without --weights keep their group
    sha = keep.pop("weights_sha256", None)
    if keep.get("weights") is not None:
        keep["weights"] = {"sha256": sha}
    keep["train_cache"] = {k: train_identity.get(k) for k in
                           ("model", "weights_sha256", "dataset_fingerprint", "split", "corruption")}
    return hashlib.sha256(json.dumps(canonical(keep), sort_keys=True).encode()).hexdigest()[:12]


# The losses' own parameters run.json's config names at top level, null where the run's loss
# lacks them: the record every run directory's group hash was computed from.  A parameter not
# listed here is recorded only by the runs of its loss.
FLAT_PARAMS = ("gamma", "alpha_pos", "alpha_neg")


def as_record(cfg: TrainConfig) -> dict:
    """The config as run.json and every checkpoint record it (JSON types): the loss's own
    parameters at top level (``FLAT_PARAMS``)."""
    record = asdict(cfg)
    params = record.pop("loss_params")
    return canonical({**record, **dict.fromkeys(FLAT_PARAMS), **params})


def config_from_record(config: Mapping[str, Any]) -> TrainConfig:
    """run.json's config (``as_record``) as the TrainConfig it was written from."""
    names = {f.name for f in fields(TrainConfig)}
    values = {k: v for k, v in config.items() if k in names}
    values["loss_params"] = {k: v for k, v in config.items()
                             if k not in names and v is not None and k in loss_params()}
    values["eval_splits"] = tuple(values.get("eval_splits", ()))
    return TrainConfig(**values)


def bank_key(cfg: TrainConfig) -> str:
    """Runs with the same key train as one bank of heads (they differ in ``bank_free`` only)."""
    return json.dumps({k: v for k, v in asdict(cfg).items() if k not in BANK_FREE},
                      sort_keys=True, default=str)
