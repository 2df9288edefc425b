"""The oracle: the pretrained backbone of a named model, classifier head removed, + a scalar head.

    spec = resolve_spec("vit", embedded=False)               # pipeline.core.models, as for classifiers
    oracle, data_cfg = build_oracle(spec, head="hyperplane", preprocess="model", seed=0)
    z = oracle(x)                                            # (B,) float32; confidence = sigmoid(z)

Heads: ``linear`` z = w.x + b (CE, focal, TCP; SS's Table A3 variant) and ``hyperplane``
z = (w.x + b) / (||w|| + 1e-7), the signed distance to the hyperplane (SS, the authors'
``Hyperplane`` module).  The head runs in float32 outside autocast: it is tiny, and SS squashes z
through z / (1 + |z|), where bf16's 8 mantissa bits would be visible.
"""
from __future__ import annotations

import torch
from torch import nn

from pipeline.core.models import DataConfig, ModelError, ModelSpec, build_model, resolve_data_config

HEADS = ("linear", "hyperplane")
HYPERPLANE_EPS = 1e-7


class ScalarHead(nn.Module):
    """One output unit; ``normalised`` divides by the weight norm (the signed distance)."""

    def __init__(self, in_features: int, normalised: bool):
        super().__init__()
        self.linear = nn.Linear(in_features, 1)
        self.normalised = normalised

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        z = self.linear(feats)[:, 0]
        if self.normalised:
            z = z / (self.linear.weight.norm() + HYPERPLANE_EPS)
        return z

    @torch.no_grad()
    def input_grad_norms(self, z_grad: torch.Tensor) -> torch.Tensor:
        """Per-sample ||dL/dfeats_i|| from dL/dz_i: z is linear in the features, dz_i/dfeats_i
        = w (or w / (||w|| + eps) for the hyperplane) for every sample, so the norm is
        |dL/dz_i| * ||dz/dfeats|| — the head's input gradient without a second backward."""
        w = self.linear.weight.detach().float().norm()
        jac = w / (w + HYPERPLANE_EPS) if self.normalised else w
        return z_grad.detach().float().abs() * jac


class Oracle(nn.Module):
    """backbone(x) -> pooled features -> head -> z of shape (B,)."""

    def __init__(self, backbone: nn.Module, head: ScalarHead):
        super().__init__()
        self.backbone, self.head = backbone, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = self.backbone(x)
        with torch.autocast(device_type=x.device.type, enabled=False):
            return self.head(feats.float())


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
    initialised from ``seed``.  Returns the oracle (train mode, CPU) and ITS data config."""
    if head not in HEADS:
        raise ModelError(f"oracle head {head!r}: expected one of {HEADS}")
    backbone = build_model(spec, seed=seed)
    data_cfg = resolve_data_config(backbone, spec, preprocess)
    return attach_head(backbone, head, seed), data_cfg


def attach_head(backbone: nn.Module, head: str, seed: int) -> Oracle:
    """``backbone`` (a timm classifier) without its classifier, plus a fresh head initialised
    from ``seed`` (the head a head-only run of that seed starts from, too)."""
    dim = feature_dim(backbone)
    backbone.reset_classifier(0)
    torch.manual_seed(seed)
    oracle = Oracle(backbone, ScalarHead(dim, normalised=head == "hyperplane"))
    return oracle.train()
