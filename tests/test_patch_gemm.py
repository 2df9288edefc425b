"""pipeline/oracle/nets/patchgemm.py: a ViT's patch embedding as one GEMM gives the convolution's
outputs and gradients up to float rounding, keeps its parameters (the same state dict), falls back
to the convolution where the input's sides are not multiples of the patch, and leaves models
without a patch embedding alone; build_oracle's ViT oracles use it."""
from __future__ import annotations

import timm
import torch

from pipeline.core.models import ModelSpec
from pipeline.oracle.nets.model import build_oracle
from pipeline.oracle.nets.patchgemm import PatchGemm, patch_gemm


def _vit():
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64, depth=1)


def test_the_gemm_gives_the_convolutions_outputs_and_gradients():
    conv, gemm = _vit(), _vit()
    keys = list(gemm.state_dict())
    assert patch_gemm(gemm) == 1 and isinstance(gemm.patch_embed.proj, PatchGemm)
    assert list(gemm.state_dict()) == keys          # checkpoints and exports see no change
    torch.testing.assert_close(gemm.state_dict(), conv.state_dict(), rtol=0, atol=0)
    x = torch.randn(3, 3, 64, 64)
    for model in (conv, gemm):
        model.to(memory_format=torch.channels_last)(x.contiguous(
            memory_format=torch.channels_last)).square().sum().backward()
    torch.testing.assert_close(gemm(x), conv(x), rtol=1e-5, atol=1e-5)
    for (name, a), b in zip(gemm.named_parameters(), conv.parameters()):   # float rounding
        assert (a.grad - b.grad).norm() <= 1e-5 * b.grad.norm(), name


def test_other_sides_go_through_the_convolution_and_other_models_are_left_alone():
    conv = torch.nn.Conv2d(3, 8, 4, stride=4)
    x = torch.randn(2, 3, 10, 12)                    # 10 is not a multiple of 4
    torch.testing.assert_close(PatchGemm(conv)(x), conv(x), rtol=0, atol=0)
    assert patch_gemm(timm.create_model("resnet10t", pretrained=False)) == 0
    overlapping = torch.nn.Sequential()
    overlapping.patch_embed = torch.nn.Module()
    overlapping.patch_embed.proj = torch.nn.Conv2d(3, 8, 7, stride=4, padding=3)
    assert patch_gemm(overlapping) == 0


def test_build_oracle_runs_a_vits_patch_embedding_as_a_gemm():
    spec = ModelSpec("vit_tiny_patch16_224", {"img_size": 32, "depth": 1}, None, True,
                     {"input_size": (3, 32, 32), "interpolation": "bilinear", "crop_pct": 1.0,
                      "crop_mode": "center", "mean": (0.5,) * 3, "std": (0.5,) * 3})
    oracle, _ = build_oracle(spec, "linear", "model", 0)
    assert isinstance(oracle.backbone.patch_embed.proj, PatchGemm)
