"""Build frozen classifiers and oracle backbones from timm names, hub weights or local files.

Weights come from (first match wins): ``--weights FILE`` (a plain state dict, safetensors, or a
project checkpoint written by ``fit-classifier`` which also names its architecture), the embedded
dataset's fitted checkpoints, timm's hub download (``pipeline.core.hub``: local caches first, an
unreachable hub refused in seconds), or a seeded random init (``--random-init``).
"""
from __future__ import annotations

import difflib
import hashlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import timm
import torch
from torch import nn

from cache import integrity
from pipeline.core.errors import HubUnreachable, ModelError
from pipeline.core.heldout import held_out_of, mask_held_out
from pipeline.core.hub import create_pretrained
from pipeline.core.inference import for_inference, for_training
from pipeline.core.presets import (CHECKPOINT_NAMES, EMBEDDED_ARCH, EMBEDDED_DATA_CONFIG, IMAGENET_PRESETS,
                                   embedded_classifier_path)


@dataclass(frozen=True)
class DataConfig:
    """Resolved preprocessing, stored beside every cache and run (timm's data-config keys)."""
    input_size: tuple[int, int, int]      # (C, H, W)
    interpolation: str                    # bilinear | bicubic | nearest
    crop_pct: float                       # resize shorter side to floor(H / crop_pct), then crop
    crop_mode: str                        # "center" (timm eval) | "squash" (paper: resize to HxW)
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DataConfig":
        return cls(tuple(d["input_size"]), d["interpolation"], float(d["crop_pct"]),
                   d["crop_mode"], tuple(d["mean"]), tuple(d["std"]))


CHECKPOINT_FORMAT = "trust-oracles-classifier"


@dataclass(frozen=True)
class ModelSpec:
    """What to build: resolved timm name, constructor kwargs, and where the weights come from."""
    name: str
    kwargs: dict = field(default_factory=dict)
    weights: str | None = None          # file path; None = hub (pretrained) or random init
    random_init: bool = False
    data_config: dict | None = None     # preset/checkpoint data config (overrides timm's)


def resolve_spec(name: str, embedded: bool, weights: str | None = None,
                 random_init: bool = False, kwargs: dict | None = None) -> ModelSpec:
    """Map a preset or timm name (plus options) to a ModelSpec; unknown names get suggestions."""
    kwargs = dict(kwargs or {})
    if weights and is_project_checkpoint(weights):
        ckpt = _load_file(weights)
        check_named_model(name, embedded, weights, ckpt["model"])
        return ModelSpec(ckpt["model"], {**ckpt["model_kwargs"], **kwargs}, weights, False,
                         ckpt.get("data_config"))
    if embedded and name in EMBEDDED_ARCH:
        arch, arch_kwargs = EMBEDDED_ARCH[name]
        path = weights or (None if random_init else str(embedded_classifier_path(name)))
        if path and not Path(path).exists():
            raise ModelError(f"the embedded dataset's {name!r} classifier has not been fitted yet "
                             f"({path} missing): run `python cli.py fit-classifier --classifier "
                             f"{name}` (or `make demo`) first")
        if path and is_project_checkpoint(path):
            return resolve_spec(name, embedded, path, False, kwargs)
        return ModelSpec(arch, {**arch_kwargs, **kwargs}, path, random_init, EMBEDDED_DATA_CONFIG)
    name = IMAGENET_PRESETS.get(name, name)
    check_model_name(name)
    return ModelSpec(name, kwargs, weights, random_init)


def check_named_model(name: str, embedded: bool, weights: str, held: str) -> None:
    """Refuse a checkpoint whose model is not the architecture ``name`` stands for: a demo
    checkpoint's name (presets.CHECKPOINT_NAMES), an embedded preset, or a timm model name.  Any
    other name is a label the user chose, and the checkpoint says what it holds."""
    named = CHECKPOINT_NAMES.get(name) or (EMBEDDED_ARCH[name][0] if embedded and name in
                                           EMBEDDED_ARCH else None)
    if named is None and timm.is_model(timm.models.split_model_name_tag(name)[0]):
        named = timm.models.split_model_name_tag(name)[0]
    if named is not None and named != held:
        raise ModelError(f"--weights {weights} holds a {held}, but {name!r} names a {named}: "
                         f"pass the {name} checkpoint, or name the model after what the file "
                         "holds")


def check_model_name(name: str) -> None:
    arch, tag = timm.models.split_model_name_tag(name)
    if timm.is_model(arch) and (not tag or name in timm.list_pretrained(name)):
        return
    pool = timm.list_models() + timm.list_pretrained()
    close = difflib.get_close_matches(name, pool, n=5, cutoff=0.6)
    raise ModelError(f"unknown model {name!r}: not a preset ({', '.join(IMAGENET_PRESETS)}) or a "
                     f"timm model name" + (f"; did you mean {', '.join(close)}?" if close else ""))


def is_project_checkpoint(path: str) -> bool:
    return checkpoint_model(path) is not None


def checkpoint_model(path: str) -> str | None:
    """The timm model a ``fit-classifier`` checkpoint names, or None for any other file."""
    if not str(path).endswith((".pt", ".pth")) or not Path(path).exists():
        return None
    obj = _load_file(path)
    return obj.get("model") if isinstance(obj, dict) and obj.get("format") == CHECKPOINT_FORMAT \
        else None


def held_out_classes(path: str | None) -> tuple[int, ...]:
    """The classes a fit-classifier checkpoint was fitted without (``core/heldout.py``); none
    for any other weights file, hub weights or a random init."""
    if not path or not str(path).endswith((".pt", ".pth")) or not Path(path).exists():
        return ()
    return held_out_of(_load_file(path))


def _check_file(path: Path) -> None:
    if not path.exists():
        raise ModelError(f"--weights {path}: file not found")
    if path.is_dir():
        raise ModelError(f"--weights {path} is a directory; pass the weights file itself")


def file_sha256(path: str) -> str:
    """sha256 of a weights file's bytes: what identifies the weights of a run (its group hash,
    the same-run check), whatever path names the file and whenever it is read."""
    path = Path(path)
    _check_file(path)
    return integrity.file_sha256(path)


def _load_file(path: str):
    path = Path(path)
    _check_file(path)
    kind = _file_kind(path)
    if kind == "text":
        raise ModelError(f"--weights {path} is a text file, not a weights file: expected a "
                         f"{WEIGHT_FORMATS}")
    try:
        if kind == "safetensors":
            from safetensors.torch import load_file
            return load_file(str(path))
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - report any unpickling/format error with the path
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        if kind == "unknown":
            raise ModelError(f"--weights {path} is not a PyTorch (torch.save) or safetensors "
                             f"file: expected a {WEIGHT_FORMATS}") from None
        raise ModelError(f"--weights {path}: cannot read it as a {kind} file ({first})") from None


WEIGHT_FORMATS = ("state dict saved with torch.save (.pth/.pt), a safetensors file, or a "
                  "fit-classifier checkpoint")


def _file_kind(path: Path) -> str:
    """What the first bytes say: torch.save's zip or legacy pickle, safetensors (a little-endian
    header length then a JSON header), text, or unknown."""
    with open(path, "rb") as fh:
        head = fh.read(512)
    if head[:4] == b"PK\x03\x04" or head[:1] == b"\x80":
        return "PyTorch"
    header = int.from_bytes(head[:8], "little") if len(head) > 8 else 0
    if path.suffix == ".safetensors" or (head[8:9] == b"{" and 8 + header <= path.stat().st_size):
        return "safetensors"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return "unknown"
    return "text" if head and all(c.isprintable() or c in "\n\r\t" for c in text) else "unknown"


def state_dict_from_file(path: str, obj=None) -> dict[str, torch.Tensor]:
    """The state dict of a weights file (``obj``: the file already loaded)."""
    obj = _load_file(path) if obj is None else obj
    for key in ("state_dict", "model", "model_state"):  # common checkpoint wrappers
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ModelError(f"--weights {path}: expected a state dict of tensors")
    return {k.removeprefix("module."): v for k, v in obj.items()}


def load_weights(model: nn.Module, path: str,
                 state: dict[str, torch.Tensor] | None = None) -> None:
    """Load a state dict (``state``, else read from ``path``) strictly, except BatchNorm's
    ``num_batches_tracked`` counters (unused in eval mode and absent from many exported files);
    every mismatch is a ModelError naming ``path``."""
    state = state_dict_from_file(path) if state is None else state
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as err:  # shape mismatches
        lines = [l.strip() for l in str(err).splitlines() if "size mismatch" in l]
        raise ModelError(f"--weights {path} does not fit {type(model).__name__}: "
                         f"{'; '.join(lines[:3]) or err}") from None
    missing = [k for k in result.missing_keys if not k.endswith("num_batches_tracked")]
    if missing or result.unexpected_keys:
        raise ModelError(
            f"--weights {path} does not fit {type(model).__name__}: "
            f"{len(missing)} missing key(s) {missing[:4]}, "
            f"{len(result.unexpected_keys)} unexpected {result.unexpected_keys[:4]}. Save the "
            "weights under timm's key names (model.state_dict() of the timm model).")


def build_model(spec: ModelSpec, seed: int = 0, num_classes: int | None = None, *,
                train: bool = False) -> nn.Module:
    """Instantiate ``spec`` on the CPU with its weights loaded: ready to score
    (``pipeline.core.inference.for_inference``: eval mode, frozen), or ready to train with
    ``train=True``."""
    kwargs = dict(spec.kwargs)
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    pretrained = spec.weights is None and not spec.random_init
    torch.manual_seed(seed)  # random init must be reproducible (tests, benchmarks)
    try:
        model = (create_pretrained(spec.name, kwargs) if pretrained
                 else timm.create_model(spec.name, pretrained=False, **kwargs))
    except HubUnreachable as err:
        raise ModelError(f"could not fetch pretrained weights for {spec.name}: {err}. Pass "
                         "--weights FILE (a timm state dict, downloaded elsewhere), or use "
                         "--random-init for a test run.") from None
    except Exception as err:  # noqa: BLE001 - hub/network errors come in many classes
        if pretrained:
            raise ModelError(f"could not fetch pretrained weights for {spec.name} from the model "
                             f"hub ({type(err).__name__}: {err}). Offline, download them elsewhere "
                             "and pass --weights FILE (a timm state dict), or use --random-init "
                             "for a test run.") from None
        raise ModelError(f"timm.create_model({spec.name!r}, **{kwargs}) failed: "
                         f"{type(err).__name__}: {err} (check --model-kwargs)") from None
    if spec.weights is not None:
        obj = _load_file(spec.weights)
        state = state_dict_from_file(spec.weights, obj)
        stored = stored_num_classes(model, state)
        if stored is not None and stored != model.num_classes and "num_classes" not in kwargs:
            model.reset_classifier(stored)   # e.g. resnet18 fine-tuned on a 3-class folder
        load_weights(model, spec.weights, state)
        # classes held out of its fit: never predicted, here for every stage (core/heldout.py)
        mask_held_out(model, held_out_of(obj))
    return for_training(model) if train else for_inference(model)


def stored_num_classes(model: nn.Module, state: dict[str, torch.Tensor]) -> int | None:
    """The number of outputs of the classifier head stored in ``state`` (the first dimension of
    the weight of ``model.get_classifier()``, found under its module name), or None when the
    model has no single linear/1x1-conv head or the file does not hold it."""
    head = model.get_classifier() if hasattr(model, "get_classifier") else None
    if not isinstance(head, (nn.Linear, nn.Conv2d)):
        return None
    name = next((n for n, m in model.named_modules() if m is head), None)
    weight = state.get(f"{name}.weight") if name else None
    return int(weight.shape[0]) if weight is not None and weight.ndim >= 2 else None


def weights_sha256(model: nn.Module) -> str:
    """Identity of the weights actually loaded (names, shapes, dtypes and bytes, in order)."""
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def resolve_data_config(model: nn.Module, spec: ModelSpec, preprocess: str) -> DataConfig:
    """``model``: the model's own timm eval config; ``paper``: square resize, mean = std = 0.5."""
    if spec.data_config is not None:
        base = DataConfig.from_dict(spec.data_config)
    else:
        cfg = timm.data.resolve_model_data_config(model)
        size = tuple(cfg["input_size"])
        embed = getattr(model, "patch_embed", None)
        if embed is not None and getattr(embed, "img_size", None):  # img_size= kwarg wins
            size = (size[0], *embed.img_size)
        first_conv = next((m for m in model.modules() if isinstance(m, nn.Conv2d)), None)
        in_chans = first_conv.in_channels if first_conv is not None else size[0]
        base = DataConfig((in_chans, *size[1:]), cfg["interpolation"], float(cfg["crop_pct"]),
                          "squash" if cfg.get("crop_mode") == "squash" else "center",
                          tuple(cfg["mean"]), tuple(cfg["std"]))
    if base.interpolation not in ("bilinear", "bicubic", "nearest"):
        raise ModelError(f"{spec.name}'s data config asks for {base.interpolation!r} "
                         "interpolation; supported: bilinear, bicubic, nearest (or use "
                         "--preprocess paper)")
    if preprocess == "paper":
        c = base.input_size[0]
        return DataConfig(base.input_size, "bilinear", 1.0, "squash", (0.5,) * c, (0.5,) * c)
    if preprocess != "model":
        raise ModelError(f"--preprocess {preprocess!r}: expected 'model' or 'paper'")
    return base
