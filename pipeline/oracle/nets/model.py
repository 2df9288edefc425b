"""The oracle: the pretrained backbone of a named model, classifier head removed, + a scalar head;
and a trained oracle rebuilt from its run directory.

    spec = resolve_spec("vit", embedded=False)               # pipeline.core.models, as for classifiers
    oracle, data_cfg = build_oracle(spec, head="hyperplane", preprocess="model", seed=0)  # to train
    oracle, data_cfg, ckpt = load_trained_oracle(run_dir, RunDir(run_dir).record())  # best.pt
    z = oracle(x)                                            # (B,) float32; confidence = sigmoid(z)

A built oracle is in training mode (it is built to be trained); a loaded one is ready to score
(``pipeline.core.inference.for_inference``: eval mode, frozen), so its scores do not depend on
which images share a batch, and scoring never updates its BatchNorm statistics.

Heads: ``linear`` z = w.x + b (CE, focal, TCP; SS's Table A3 variant) and ``hyperplane``
z = (w.x + b) / (||w|| + 1e-7), the signed distance to the hyperplane (SS, the authors'
``Hyperplane`` module), both ``pipeline.oracle.nets.heads.Head``; a head-only run may train another
architecture of ``pipeline.oracle.nets.heads`` (ConfidNet's MLP), on stacked inputs.  The head runs
in float32 outside autocast: it is tiny, and SS squashes z through z / (1 + |z|), where bf16's 8
mantissa bits would be visible.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from cache.reader import ClassifierCache
from cache.runfile import RunFile
from cache.runs import BEST, RunDir, RunError
from cache.schema import FEATURE_DTYPE
from pipeline.core.inference import for_inference, for_training
from pipeline.core.losses import HEADS
from pipeline.core.models import (DataConfig, ModelError, ModelSpec, build_model, file_sha256,
                                  resolve_data_config, resolve_spec, weights_sha256)
from pipeline.data.sources import is_embedded_dataset
from pipeline.oracle.nets.checkpoint import load_checkpoint
from pipeline.oracle.nets.heads import Head, head_from_checkpoint, logit_stats
from pipeline.oracle.nets.patchgemm import patch_gemm


class Oracle(nn.Module):
    """backbone(x) -> pooled features -> one head -> z of shape (B,).  A head on stacked inputs
    (``stacked``) also reads the classifier's logits of the same images (``logits``).

    ``cached_features``: the head of a head-only run was trained, and its run's scores computed,
    on features rounded to the feature cache's dtype (``cache.schema.FEATURE_DTYPE``); its deployed
    oracle rounds its backbone's features the same way, so the same images at the same precision
    give the run's own scores (the stacked head's logits are rounded as cached likewise,
    ``heads.logit_stats``)."""

    def __init__(self, backbone: nn.Module, head: nn.Module, cached_features: bool = False):
        super().__init__()
        self.backbone, self.head = backbone, head
        self.feature_dtype = getattr(torch, FEATURE_DTYPE) if cached_features else None

    @property
    def stacked(self) -> bool:
        return bool(getattr(self.head, "stacked", False))

    def forward(self, x: torch.Tensor, logits: torch.Tensor | None = None) -> torch.Tensor:
        feats = self.backbone(x)
        with torch.autocast(device_type=x.device.type, enabled=False):
            feats = feats.float()
            if self.feature_dtype is not None:
                feats = feats.to(self.feature_dtype).float()
            if self.stacked:
                if logits is None:
                    raise ValueError("this oracle's head reads the classifier's logits too")
                feats = torch.cat([feats, logit_stats(logits)], dim=1)
            return self.head(feats)


def feature_dim(model: nn.Module) -> int:
    """Width of the pooled pre-logit features (timm: head_hidden_size when a pre-logits layer
    exists, else num_features)."""
    dim = getattr(model, "head_hidden_size", None) or getattr(model, "num_features", None)
    if not dim:
        raise ModelError(f"{type(model).__name__} does not report its feature width "
                         "(num_features); use a timm model as the oracle backbone")
    return int(dim)


def build_oracle(spec: ModelSpec, head: str, preprocess: str,
                 seed: int) -> tuple[Oracle, DataConfig]:
    """The named model with its weights (hub, file, fitted checkpoint or seeded random init),
    its classifier removed (``reset_classifier(0)``: pooled features out), and a fresh head
    initialised from ``seed``; a ViT's patch embedding runs as one GEMM (``patchgemm``, the same
    weights).  Returns the oracle (train mode, CPU) and ITS data config."""
    if head not in HEADS:
        raise ModelError(f"oracle head {head!r}: expected one of {HEADS}")
    backbone = build_model(spec, seed=seed, train=True)
    data_cfg = resolve_data_config(backbone, spec, preprocess)
    patch_gemm(backbone)
    return attach_head(backbone, head, seed), data_cfg


def attach_head(backbone: nn.Module, head: str, seed: int) -> Oracle:
    """``backbone`` (a timm classifier) without its classifier, plus a fresh head initialised
    from ``seed`` (the head a head-only run of that seed starts from, too)."""
    dim = feature_dim(backbone)
    backbone.reset_classifier(0)
    torch.manual_seed(seed)
    return for_training(Oracle(backbone, Head(dim, normalised=head == "hyperplane")))


def load_trained_oracle(run_dir: Path, run: RunFile, weights: str | None = None,
                        option: str = "--weights {}") -> tuple[Oracle, DataConfig, dict]:
    """The chosen (best) oracle of a finished run, ready to score (eval mode, frozen), rebuilt
    without fetching any weights.  A head-only run's frozen backbone is loaded as the run
    recorded it, or from ``weights`` (the same weights at another path, e.g. moved; named
    ``option`` in messages) where the recorded source does not hold them; either way checked
    against the weights its features came from."""
    info = run.oracle_build
    if not info:
        raise RunError(f"{run_dir}/run.json has no oracle_build record (not a finished run?)")
    ckpt = load_checkpoint(RunDir(run_dir).checkpoint(BEST))
    data_cfg = DataConfig.from_dict(info["data_config"])
    if info.get("head_only"):
        # in extract's memory format: the same kernels, so the same features as cached
        backbone = head_only_backbone(run_dir, info, weights, option).to(
            memory_format=torch.channels_last)
        head = head_from_checkpoint(ckpt, info["head"] == "hyperplane")
        return for_inference(Oracle(backbone, head, cached_features=True)), data_cfg, ckpt
    spec = ModelSpec(info["model"], info["model_kwargs"], None, True, info["data_config"])
    model, _ = build_oracle(spec, info["head"], "model", seed=0)
    model.load_state_dict(ckpt["model"])
    return for_inference(model), data_cfg, ckpt


def head_only_backbone(run_dir: Path, info: dict, weights: str | None,
                       option: str = "--weights {}") -> nn.Module:
    """A head-only run's backbone (classifier removed), built from the first source that holds
    the recorded weights: the run's recorded file (or the hub / seeded random init it recorded),
    then ``weights``.  A file whose bytes are not the recorded file's (runs since record its
    sha256) is passed over without building a model.  Each source is tried once; none holding
    them is a RunError naming each."""
    bb = info["backbone"]
    sources = [bb["weights"]] + ([weights] if weights and not bb["random_init"] else [])
    looked = []
    for path in dict.fromkeys(str(Path(p).resolve()) if p else None for p in sources):
        name = f"{path}" if path else f"the hub weights of {info['model']}"
        problem = _file_problem(path, bb.get("weights_file_sha256"))
        if problem:
            looked.append(f"{name} ({problem})")
            continue
        spec = ModelSpec(info["model"], info["model_kwargs"], path, bb["random_init"] and not path,
                         info["data_config"])
        try:
            backbone = build_model(spec, seed=bb["seed"])
        except ModelError as err:
            looked.append(f"{name} ({err})")
            continue
        found = weights_sha256(backbone)
        if found == bb["weights_sha256"]:
            backbone.reset_classifier(0)
            return backbone
        looked.append(f"{name} (holds other weights, {found[:12]}...)")
    raise RunError(f"{run_dir} is a head-only run whose head was trained on features of backbone "
                   f"weights {bb['weights_sha256'][:12]}... ({info['model']}); looked in: "
                   f"{'; '.join(looked)}. Pass {option.format('FILE')} with those weights (checked by "
                   "their hash), restore them where the run recorded them, or re-run the "
                   "head-only training on features of the current ones")


def _file_problem(path: str | None, want: str | None) -> str:
    """Why ``path`` cannot hold the recorded weights without building a model ("" if it may)."""
    if path and not Path(path).is_file():
        return "not there"
    found = file_sha256(path) if path and want else want
    return "" if found == want else \
        f"another file: sha256 {found[:12]}..., the run recorded {want[:12]}..."


# ------------------------------------------------------- the classifier a cache recorded --
def recorded_weights(cache: ClassifierCache) -> str | None:
    """The weights file the cache's classifier was built from (``extract --weights``): its
    absolute path where the manifest records one, else the path as it was given."""
    return cache.manifest.get("weights_file") or cache.manifest.get("config", {}).get("weights")


def cache_classifier(cache: ClassifierCache, weights: str | None,
                     random_init: bool = False) -> nn.Module:
    """The classifier of ``cache`` rebuilt as its ``extract`` built it (name, model kwargs, seed),
    from ``weights``; the caller compares its ``weights_sha256`` with the cache's."""
    ident, config = cache.identity, cache.manifest.get("config", {})
    spec = resolve_spec(config.get("classifier", ident["model"]),
                        is_embedded_dataset(ident["dataset"]), weights, random_init,
                        config.get("model_kwargs") or ident.get("model_kwargs") or {})
    return build_model(spec, seed=int(config.get("seed") or 0))
