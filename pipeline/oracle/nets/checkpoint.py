"""Training checkpoints: written atomically, read with ``torch.load(weights_only=True)``.

``last.pt`` holds everything needed to continue exactly: model, optimizer, scheduler and scaler
state, RNG states (as tensors), the sampler position (= the number of completed optimizer steps,
since the order is a function of (seed, step)), the best validation score so far and the resolved
config.  ``best.pt`` holds the chosen model only.  Every value is a tensor or a plain
int/float/str/bool/list/dict, so the safe unpickler reads them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from cache.atomic import atomic_file
from cache.schema import CacheError


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """Temp file + fsync + rename: a checkpoint that exists is complete, and the previous one
    survives until the new one is entirely on disk."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # torch.save wraps a full disk's OSError in a RuntimeError: cache.integrity finds it there
    with atomic_file(path, "wb", kept=f"the previous {path.name} is kept and the run resumes "
                     "from it") as fh:
        torch.save(payload, fh)


def load_checkpoint(path: Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise CacheError(f"checkpoint not found: {path}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unpickling error: name the file
        raise CacheError(f"checkpoint {path} is unreadable ({err}); delete it to restart the "
                         "run, or restore it from a copy") from None


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain module under torch.compile and DDP wrappers (stable state-dict keys)."""
    model = getattr(model, "_orig_mod", model)
    model = getattr(model, "module", model)
    return getattr(model, "_orig_mod", model)
