"""bench/vit_roofline.py's accounting on the CPU (the kernel profile needs CUDA): one eager step
of the tiny ViT split into GEMMs, attention and the rest, the FLOPs of the calls kept for timing
equal to torch's FLOP counter over the same step, and kernels grouped by their names."""
from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from bench.train_parts import resident_step, spec
from bench.vit_roofline import StepOps, bound, kernel_group, op_group


def test_a_steps_ops_are_grouped_and_their_flops_are_torchs():
    step, record = resident_step(spec("vit_tiny_patch16_224", tiny=True), 4, False, "off",
                              torch.device("cpu"))
    assert record["mode"] == "eager"
    step()
    with StepOps() as ops:
        step()
    with FlopCounterMode(display=False) as counter:
        step()
    kept = sum(c["flops"] * c["count"] for c in ops.calls.values())
    assert kept == counter.get_total_flops() > 0
    groups = {c["group"] for c in ops.calls.values()}
    assert groups == {"gemm", "attention"}
    names = {c["name"] for c in ops.calls.values()}
    assert {"addmm", "mm"} <= names
    assert "convolution" not in names          # the patch embedding runs as one GEMM (patchgemm)
    assert any("scaled_dot_product" in n for n in names)
    # the rest: the bytes of real data movement (layer norms, GELU, the loss, SGD), no views
    assert ops.ops["memory"] > 100 and 1e5 < ops.bytes < 1e9
    b = bound(ops, torch.device("cpu"), reps=1)
    assert b["total_ms"] == pytest.approx(sum(b["parts_ms"].values()), abs=0.01)
    assert min(b["parts_ms"].values()) > 0
    flops = {g: sum(c["flops"] * c["count"] for c in ops.calls.values() if c["group"] == g)
             for g in ("gemm", "attention")}
    assert flops["gemm"] > 0      # torch has no FLOP formula for the CPU's attention kernel
    assert b["gflop"] == {g: round(f / 1e9, 2) for g, f in flops.items()}


def test_kernels_and_ops_are_named_into_their_groups():
    assert op_group("addmm") == op_group("convolution_backward") == "gemm"
    assert op_group("_scaled_dot_product_flash_attention_backward") == "attention"
    assert op_group("native_layer_norm") == op_group("add_") == "memory"
    assert kernel_group("flash_bwd_kernel<Flash_bwd_kernel_traits<64, 128>>") == "attention"
    assert kernel_group("cudnn_generated_fort_native_sdpa_sm90_flash_fprop") == "attention"
    assert kernel_group("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "gemm"
    assert kernel_group("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NNT") == "gemm"
    assert kernel_group("triton_per_fused_native_layer_norm_0") == "other"
    assert kernel_group("void at::native::vectorized_elementwise_kernel<4>") == "other"
