"""fit-classifier's checkpoint: written whole or not at all, read back, and compared with what a
command would train (a checkpoint that differs is refused unless --force).  It holds only what
determines the weights (architecture, hyperparameters, the data's fingerprint, ``meta.threads``),
so two fits of one command write the same bytes; ``pipeline.core.models`` loads it as weights."""
from __future__ import annotations

from pathlib import Path

import torch

from cache.atomic import atomic_file
from cache.schema import to_attr
from pipeline.core.heldout import HELD_OUT
from pipeline.core.models import CHECKPOINT_FORMAT, ModelError
from pipeline.data.sources import SampleList

CHECKPOINT_VERSION = 1


def save_checkpoint(path: Path, model, spec, data_cfg, meta: dict) -> None:
    """Project checkpoint (pipeline.core.models reads it): temp file + rename, never half-written."""
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    ckpt = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "model": spec.name,
            "model_kwargs": dict(spec.kwargs), "data_config": data_cfg.to_dict(),
            "state_dict": state, "meta": meta}
    path.parent.mkdir(parents=True, exist_ok=True)
    # through a file object, torch.save names the zip's folder "archive", not after the temp file
    with atomic_file(path, "wb") as fh:
        torch.save(ckpt, fh)


def read_checkpoint(path: Path) -> dict:
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise ModelError(f"{path} exists but is not a fit-classifier checkpoint; move it away or "
                         "choose another --out")
    return ckpt


def stale_reasons(ckpt: dict, spec, hp: dict, samples: SampleList,
                  init: str | None = None, held: tuple[int, ...] = ()) -> list[str]:
    """What differs between an existing checkpoint and what this command would train (``init``:
    the sha256 of the weights file it starts from; ``held``: the classes held out)."""
    meta, out = ckpt.get("meta", {}), []
    if list(meta.get(HELD_OUT) or []) != list(held):
        out.append(f"classes held out: {meta.get(HELD_OUT) or 'none'} (now {list(held) or 'none'})")
    if meta.get("init_sha256", init) != init:
        out.append(f"initial weights: fitted from a weights file of sha256 "
                   f"{str(meta.get('init_sha256'))[:12]} (now {str(init)[:12]})")
    if ckpt["model"] != spec.name or to_attr(ckpt["model_kwargs"]) != to_attr(spec.kwargs):
        out.append(f"architecture {ckpt['model']} {to_attr(ckpt['model_kwargs'])} (now "
                   f"{spec.name} {to_attr(spec.kwargs)})")
    old_hp = {k: v for k, v in meta.get("hparams", {}).items() if k not in ("workers", "precision")}
    new_hp = {k: v for k, v in hp.items() if k not in ("workers", "precision")}
    if to_attr(old_hp) != to_attr(new_hp):
        out.append(f"hyperparameters {to_attr(old_hp)} (now {to_attr(new_hp)})")
    if meta.get("dataset_fingerprint") != samples.fingerprint:
        out.append(f"data: fitted on {meta.get('dataset')}/{meta.get('split')} with another "
                   f"fingerprint than {samples.dataset}/{samples.split}")
    return out
