"""A ViT's patch embedding as one matrix product (``patch_gemm``).

timm's ``PatchEmbed`` runs a convolution whose kernel equals its stride (16 x 16 patches that do
not overlap): the same products as one GEMM of the image's patches, (B * patches, C * 16 * 16) x
(C * 16 * 16, width).  cuDNN runs that convolution at a few percent of the tensor cores' rate
(bench/NOTES.md, the ViT roofline: 1.4 ms of a ViT-B/16@384 training step at batch 40 for 2% of
its FLOPs); cuBLAS runs the GEMM at its full rate.  The weights are the convolution's own
parameters (the same state-dict keys), so checkpoints, exports and timm's loaders see no change;
the outputs equal the convolution's up to the order of the sums (float rounding).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class PatchGemm(nn.Module):
    """``conv`` (kernel = stride, no padding, dilation 1, one group) as a GEMM over patches; an
    input whose sides are not multiples of the kernel goes through the convolution itself."""

    def __init__(self, conv: nn.Conv2d):
        super().__init__()
        self.weight, self.bias = conv.weight, conv.bias        # the same Parameters
        self.kernel = conv.kernel_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        (b, c, h, w), (kh, kw) = x.shape, self.kernel
        if h % kh or w % kw:
            return F.conv2d(x, self.weight, self.bias, stride=self.kernel)
        gh, gw = h // kh, w // kw
        patches = x.reshape(b, c, gh, kh, gw, kw).permute(0, 2, 4, 1, 3, 5).reshape(
            b * gh * gw, c * kh * kw)
        y = F.linear(patches, self.weight.reshape(self.weight.shape[0], -1), self.bias)
        # the convolution's (B, width, gh, gw), laid out channels-last: timm's flatten(2) and
        # transpose(1, 2) that follow are views of it
        return y.reshape(b, gh, gw, -1).permute(0, 3, 1, 2)


def patch_gemm(model: nn.Module) -> int:
    """Every patch-embedding convolution of ``model`` (a kernel-equals-stride ``Conv2d`` named
    ``proj`` under a ``patch_embed``) replaced by its ``PatchGemm``, in place; how many."""
    n = 0
    for name, module in list(model.named_modules()):
        conv = getattr(module, "proj", None)
        if name.split(".")[-1] == "patch_embed" and _is_patch_conv(conv):
            module.proj = PatchGemm(conv)
            n += 1
    return n


def _is_patch_conv(conv) -> bool:
    return (isinstance(conv, nn.Conv2d) and conv.kernel_size == conv.stride
            and conv.padding == (0, 0) and conv.dilation == (1, 1) and conv.groups == 1
            and conv.padding_mode == "zeros")
