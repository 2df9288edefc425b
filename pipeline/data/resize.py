"""Resize + centre-crop a list of differently sized images in a few batched matrix products.

``ResizeCrop`` resizes one size at a time; on the accelerator that means one chain of small
kernels per distinct input size, and ImageNet has hundreds of sizes, so a 256-image batch cost
~70 such chains.  An antialiased resize is separable and linear: ``out = Wy @ img @ Wx.T`` with
``Wy`` (H_out, H_in) and ``Wx`` (W_out, W_in) holding the interpolation weights, and the centre
crop is just a choice of rows of ``Wy`` / ``Wx``.  So images of any sizes are zero-padded into one
buffer, the per-image weight matrices (zero over the padding) are computed on the device in a
handful of vectorised ops, and two batched matrix products give the cropped result.

The weights are those of ``torch.nn.functional.interpolate(..., antialias=True)`` (PIL's filters:
bilinear, bicubic with a = -0.5) and of mode "nearest", evaluated in float32 like PyTorch's CUDA
kernel; rounding/clamping follow ``torchvision.transforms.v2.functional.resize`` on a uint8 CUDA
tensor.  So the result equals ``ResizeCrop`` on the accelerator up to float summation order (rare
+-1 at .5), and ``ResizeCrop`` on the CPU up to its fixed-point uint8 arithmetic (+-1).
"""
from __future__ import annotations

import torch

from pipeline.core.models import DataConfig
from pipeline.data.images import ResizeCrop

_CHUNK_ELEMS = 1 << 27        # padded pixels per chunk (fp32: 512 MB) -- bounds memory for big images
_HALF_SUPPORT = {"bilinear": 1.0, "bicubic": 2.0}


def _filter(x: torch.Tensor, interpolation: str) -> torch.Tensor:
    x = x.abs()
    if interpolation == "bilinear":
        return (1.0 - x).clamp_(min=0.0)
    a = -0.5  # PIL / PyTorch antialias bicubic
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    far = (((x - 5.0) * x + 8.0) * x - 4.0) * a
    return torch.where(x < 1.0, near, torch.where(x < 2.0, far, torch.zeros_like(x)))


def axis_weights(in_size: torch.Tensor, out_size: torch.Tensor, offset: torch.Tensor, length: int,
                 padded: int, interpolation: str) -> torch.Tensor:
    """(n, length, padded) float32: row i of image k = the weights of resized pixel
    ``offset[k] + i`` (resizing ``in_size[k]`` -> ``out_size[k]`` pixels) over input pixels
    0..padded-1; zero beyond ``in_size[k]``.  Inputs are (n,) tensors on the target device."""
    dev = in_size.device
    inp = in_size.to(torch.float32)[:, None, None]
    scale = inp / out_size.to(torch.float32)[:, None, None]
    i = (torch.arange(length, device=dev)[None, :, None] + offset[:, None, None]).to(torch.float32)
    j = torch.arange(padded, device=dev, dtype=torch.float32)[None, None, :]
    if interpolation == "nearest":  # PyTorch "nearest": src = min(floor(dst * scale), in - 1)
        src = torch.minimum(torch.floor(i * scale), inp - 1.0)
        return (j == src).to(torch.float32)
    half = _HALF_SUPPORT[interpolation]
    support = torch.where(scale >= 1.0, half * scale, torch.full_like(scale, half))
    invscale = torch.where(scale >= 1.0, 1.0 / scale, torch.ones_like(scale))
    center = scale * (i + 0.5)
    lo = torch.trunc(center - support + 0.5).clamp_(min=0.0)       # C++ int cast: toward zero
    hi = torch.minimum(torch.trunc(center + support + 0.5), inp)
    w = _filter((j - center + 0.5) * invscale, interpolation) * ((j >= lo) & (j < hi))
    total = w.sum(-1, keepdim=True)
    return w / torch.where(total != 0, total, torch.ones_like(total))


class BatchResize:
    """uint8 RGB images (3, H_k, W_k) on one device -> uint8 (n, 3, th, tw), as ``ResizeCrop``."""

    def __init__(self, cfg: DataConfig):
        self.cfg, self.single = cfg, ResizeCrop(cfg)

    def supports(self, h: int, w: int) -> bool:
        """False where ``ResizeCrop`` would change channels or pad (grey models, border mode,
        crop larger than the resized image): those images take ``ResizeCrop`` itself."""
        c, th, tw = self.cfg.input_size
        rh, rw = self.single.resize_size(h, w)
        return c == 3 and rh >= th and rw >= tw

    def plan(self, h: int, w: int) -> tuple[int, int, int, int]:
        """(resized height, resized width, crop top, crop left): torchvision's centre crop."""
        _, th, tw = self.cfg.input_size
        rh, rw = self.single.resize_size(h, w)
        return rh, rw, int(round((rh - th) / 2.0)), int(round((rw - tw) / 2.0))

    def __call__(self, images: list[torch.Tensor]) -> list[tuple[list[int], torch.Tensor]]:
        """-> [(indices into ``images``, uint8 (len(indices), 3, th, tw))] in a few chunks."""
        def key(k):  # orientation, then area (less padding), then size (equal sizes adjacent)
            h, w = images[k].shape[-2:]
            return h > w, -h * w, h, w

        order = sorted(range(len(images)), key=key)
        chunks, cur, hm, wm = [], [], 0, 0
        for k in order:
            h, w = images[k].shape[-2:]
            if cur and (len(cur) + 1) * max(hm, h) * max(wm, w) * 3 > _CHUNK_ELEMS:
                chunks.append(cur)
                cur, hm, wm = [], 0, 0
            cur.append(k)
            hm, wm = max(hm, h), max(wm, w)
        if cur:
            chunks.append(cur)
        return [(ks, self._chunk([images[k] for k in ks])) for ks in chunks]

    def _chunk(self, images: list[torch.Tensor]) -> torch.Tensor:
        _, th, tw = self.cfg.input_size
        dev, n = images[0].device, len(images)
        hm = max(int(im.shape[-2]) for im in images)
        wm = max(int(im.shape[-1]) for im in images)
        # (n, H, 3, W): one bmm contracts H for all three channels; the padding's content is
        # irrelevant (any uint8 value times an exact 0 weight), so no memset
        buf = torch.empty((n, hm, 3, wm), dtype=torch.uint8, device=dev)
        plans = []
        start = 0
        for k, im in enumerate(images):  # one copy per run of equal sizes (adjacent: __call__)
            h, w = im.shape[-2:]
            plans.append((h, w, *self.plan(h, w)))
            if k + 1 == n or tuple(images[k + 1].shape[-2:]) != (h, w):
                src = im[None] if k == start else torch.stack(images[start:k + 1])
                buf[start:k + 1, :h, :, :w].copy_(src.permute(0, 2, 1, 3))
                start = k + 1
        wy = self._weights([(h, rh, top) for h, _, rh, _, top, _ in plans], th, hm, dev)
        wx = self._weights([(w, rw, left) for _, w, _, rw, _, left in plans], tw, wm, dev)
        dtype = _matmul_dtype(dev)
        x = buf.to(dtype)
        a = torch.bmm(wy.to(dtype), x.view(n, hm, 3 * wm))                  # (n, th, 3 * wm)
        b = torch.bmm(a.view(n, th * 3, wm), wx.to(dtype).transpose(1, 2))  # (n, 3 * th, tw)
        out = b.view(n, th, 3, tw).permute(0, 2, 1, 3)
        return out.clamp_(0, 255).round_().to(torch.uint8).contiguous()


    def _weights(self, keys: list[tuple], length: int, padded: int, dev) -> torch.Tensor:
        """(n, length, padded) for (input size, resized size, crop offset) per image, computed
        once per distinct key (most images of a batch share a few sizes)."""
        index: dict[tuple, int] = {}
        rows = [index.setdefault(key, len(index)) for key in keys]
        uniq = torch.tensor(list(index), dtype=torch.int64).to(dev, non_blocking=True)
        w = axis_weights(uniq[:, 0], uniq[:, 1], uniq[:, 2], length, padded, self.cfg.interpolation)
        if len(index) == len(keys) and rows == list(range(len(keys))):
            return w
        return w[torch.tensor(rows).to(dev, non_blocking=True)]


def _matmul_dtype(device: torch.device) -> torch.dtype:
    """float32, or float64 where the process lets cuBLAS use TF32 (10-bit mantissa: +-1 errors
    in ~a quarter of the pixels)."""
    if device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        return torch.float64
    return torch.float32
