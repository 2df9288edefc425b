"""The heads of an oracle, and what a head-only head reads.

Architectures (``--head-arch``), each a scalar z per row and a bank of P heads at once:

* ``linear`` (``Head``): z = w.x + b, or with ``normalised`` (SS's hyperplane head)
  z = (w.x + b) / (||w|| + 1e-7), the signed distance to the hyperplane.  Every oracle's head.
* ``confidnet`` (``MLPHead``): ConfidNet's confidence network (valeoai/ConfidNet,
  ``*_selfconfid_classic.py``) on the classifier's penultimate features: Linear(D, 400) -> ReLU ->
  3 x [Linear(400, 400) -> ReLU] -> Linear(400, 1).  ``normalised`` divides by the norm of the
  LAST layer's weights: the signed distance to the last layer's hyperplane in the space of the
  last hidden activations.

Inputs (``--head-inputs``): ``features`` (the backbone's pooled features) or ``stacked``: the
features followed by ``STATS``, the statistics of the classifier's logits of the same row and view
(``logit_stats``), standardised by the training rows' mean and std, which the head keeps as
buffers (``stats_mean``, ``stats_std``) so best.pt carries them to every scorer.  ``logit_stats``
is the torch form, run on the training device inside the loop; ``pipeline.core.logits`` is the
numpy form the report's baselines share (tests/test_logit_stats.py holds the two equal).

A bank starts every head from the one head the seed draws (torch's default ``nn.Linear`` init, as
ConfidNet's).  The MLP's weights are stacked (P, in, out) and each head is its own chain of
``addmm`` products on its slice: a batched ``bmm`` rounds a head's products differently with P,
so a bank's scores would not be those of its heads trained alone.
"""
from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

from pipeline.core.logits import STATS
from pipeline.core.losses import HEAD_ARCHS as ARCHS

HYPERPLANE_EPS = 1e-7
CONFIDNET_WIDTH = 400
CONFIDNET_HIDDEN = 4          # Linear layers followed by a ReLU; then Linear(400, 1)


@torch.no_grad()
def logit_stats(logits: torch.Tensor) -> torch.Tensor:
    """(B, K) logits -> (B, len(STATS)) float32: MSP, max logit, margin (top-1 - top-2 logit),
    negative entropy sum p log p, energy logsumexp(z), MaxLogit-pNorm with p = 2 (max of the
    centred logits over their 2-norm; 0 for constant logits).  The logits are rounded to float16
    first, as the classifier cache stores them, so a cached row and the same image's fresh logits
    give the same statistics."""
    z = logits.to(torch.float16).float()
    logp = torch.log_softmax(z, dim=1)
    top = z.topk(2, dim=1).values if z.shape[1] > 1 else torch.cat([z, z], dim=1)
    centred = z - z.mean(dim=1, keepdim=True)
    norm = centred.norm(dim=1)
    # constant logits are told by their range, not by the norm: on CUDA the mean of K equal
    # values can be an ulp off, leaving a centred row of rounding noise whose pNorm is 1/sqrt(K)
    varied = (norm > 0) & (top[:, 0] > z.min(dim=1).values)
    pnorm = torch.where(varied, centred.max(dim=1).values / norm.clamp_min(1e-30),
                        torch.zeros_like(norm))
    return torch.stack([logp.exp().max(dim=1).values, top[:, 0], top[:, 0] - top[:, 1],
                        (logp.exp() * logp).sum(dim=1), torch.logsumexp(z, dim=1), pnorm], dim=1)


class _Stacked(nn.Module):
    """Standardises the last len(STATS) input columns with the training rows' moments."""

    def _init_stats(self, stacked: bool) -> None:
        self.stacked = stacked
        if stacked:
            self.register_buffer("stats_mean", torch.zeros(len(STATS)))
            self.register_buffer("stats_std", torch.ones(len(STATS)))

    def set_stats(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.stats_mean.copy_(mean)
        self.stats_std.copy_(std)

    def _inputs(self, x: torch.Tensor) -> torch.Tensor:
        if not self.stacked:
            return x
        s = len(STATS)
        return torch.cat([x[:, :-s], (x[:, -s:] - self.stats_mean) / self.stats_std], dim=1)

    def _buffers_of(self) -> dict:
        return ({"stats_mean": self.stats_mean.detach().cpu().clone(),
                 "stats_std": self.stats_std.detach().cpu().clone()} if self.stacked else {})


class Head(_Stacked):
    """Scalar linear heads on the same inputs.  ``Head(D, normalised)`` is one head, z (B,);
    ``count=P`` makes a bank of P heads, z (B, P), every head starting from the one head the seed
    gives (so each follows the trajectory it would follow alone): a head-only sweep's points.
    ``normalised`` divides each head's output by its weight norm (the signed distance to its
    hyperplane)."""

    def __init__(self, in_features: int, normalised: bool, count: int | None = None,
                 stacked: bool = False):
        super().__init__()
        self.linear = nn.Linear(in_features, 1)      # the seed's draw is that of one head
        if count is not None and count > 1:
            self.linear.weight = nn.Parameter(self.linear.weight.detach().repeat(count, 1))
            self.linear.bias = nn.Parameter(self.linear.bias.detach().repeat(count))
        self.normalised, self.single = normalised, count is None
        self._init_stats(stacked)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        z = self.linear(self._inputs(feats))
        if self.normalised:
            z = z / (self.linear.weight.norm(dim=1) + HYPERPLANE_EPS)
        return z[:, 0] if self.single else z

    @property
    def heads(self) -> int:
        return self.linear.weight.shape[0]

    def state_of(self, p: int) -> dict:
        """Head ``p``'s parameters as one head's state dict (CPU copies)."""
        return {"linear.weight": self.linear.weight[p:p + 1].detach().cpu().clone(),
                "linear.bias": self.linear.bias[p:p + 1].detach().cpu().clone(),
                **self._buffers_of()}

    @torch.no_grad()
    def input_grad_norms(self, z_grad: torch.Tensor) -> torch.Tensor:
        """Per-sample ||dL/dfeats_i|| from dL/dz_i (B,) of one head: z is linear in the
        features, dz_i/dfeats_i = w (or w / (||w|| + eps) for the hyperplane) for every sample, so
        the norm is |dL/dz_i| * ||dz/dfeats|| -- the head's input gradient without a second
        backward."""
        w = self.linear.weight.detach().float().norm()
        jac = w / (w + HYPERPLANE_EPS) if self.normalised else w
        return z_grad.detach().float().abs() * jac


class MLPHead(_Stacked):
    """ConfidNet's confidence network (module docstring) as a bank: layer i has weights
    ``w{i}`` (P, in, out) and biases ``b{i}`` (P, 1, out); ``count=None`` is one head, z (B,)."""

    def __init__(self, in_features: int, normalised: bool, count: int | None = None,
                 stacked: bool = False):
        super().__init__()
        widths = [in_features] + [CONFIDNET_WIDTH] * CONFIDNET_HIDDEN + [1]
        layers = [nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:])]  # the seed's draws
        p = count or 1
        for i, lin in enumerate(layers):
            self.register_parameter(f"w{i}", nn.Parameter(
                lin.weight.detach().t().contiguous().unsqueeze(0).repeat(p, 1, 1)))
            self.register_parameter(f"b{i}", nn.Parameter(
                lin.bias.detach().view(1, 1, -1).repeat(p, 1, 1)))
        self.depth, self.normalised, self.single = len(layers), normalised, count is None
        self._init_stats(stacked)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        x = self._inputs(feats)
        last = self.depth - 1
        zs = []
        for p in range(self.heads):
            h = x
            for i in range(self.depth):
                h = torch.addmm(getattr(self, f"b{i}")[p], h, getattr(self, f"w{i}")[p])
                if i < last:
                    h = torch.relu(h)
            if self.normalised:     # each head's own norm: a (P, 400) norm rounds with P
                h = h / (getattr(self, f"w{last}")[p].norm() + HYPERPLANE_EPS)
            zs.append(h)
        z = torch.cat(zs, dim=1)                                      # (B, P)
        return z[:, 0] if self.single else z

    @property
    def heads(self) -> int:
        return getattr(self, "w0").shape[0]

    def state_of(self, p: int) -> dict:
        """Head ``p`` as one head's state dict (CPU copies)."""
        out = {name: t[p:p + 1].detach().cpu().clone() for name, t in self.named_parameters()}
        return {**out, **self._buffers_of()}


def make_head(arch: str, in_features: int, normalised: bool, count: int | None = None,
              stacked: bool = False) -> nn.Module:
    """A fresh head of ``arch`` drawn from torch's current RNG state (the caller seeds it)."""
    if arch not in ARCHS:
        raise ValueError(f"head architecture {arch!r}: expected one of {ARCHS}")
    cls = MLPHead if arch == "confidnet" else Head
    return cls(in_features, normalised, count, stacked)


def head_from_checkpoint(ckpt: Mapping, normalised: bool, count: int | None = None) -> nn.Module:
    """A head-only run's chosen head from its best.pt (``arch``/``inputs`` absent: a linear head
    on features, as every run before the head family); ``count=1``: z of shape (B, 1)."""
    state = ckpt["head"]
    arch, stacked = ckpt.get("arch", "linear"), ckpt.get("inputs", "features") == "stacked"
    dim = state["linear.weight"].shape[1] if arch == "linear" else state["w0"].shape[1]
    head = make_head(arch, dim, normalised, count, stacked)
    head.load_state_dict(state)
    return head
