"""The training recipe of ``cli.py fit-classifier``: AdamW with a linear warm-up then cosine
decay (``lr_at``), random-crop (zero padding) + horizontal-flip augmentation of uint8 batches
(``augment``), cross-entropy with label smoothing, one record per epoch (``train_epochs``), and
top-1 accuracy on the held-out rows (``evaluate``).  What to fit and where it goes is ``fit.py``'s.
"""
from __future__ import annotations

import math

import timm.optim
import torch
import torch.nn.functional as F
from tqdm import tqdm

from pipeline.core.inference import scoring
from pipeline.core.models import ModelError
from pipeline.core.precision import autocast
from pipeline.data.images import GpuNormalize, ImageRows, ResizeCrop
from pipeline.data.loader import make_loader


def augment(x: torch.Tensor, pad: int, flip: bool, gen: torch.Generator) -> torch.Tensor:
    """uint8 (B, C, H, W): random crop from a zero-padded image and random horizontal flip, as
    ONE gather (few large ops: small ones stall when the cores are shared)."""
    b, c, h, w = x.shape
    hp, wp = h + 2 * pad, w + 2 * pad
    xp = x.new_zeros((b, c, hp, wp))
    xp[:, :, pad:pad + h, pad:pad + w] = x
    dy, dx = torch.randint(0, 2 * pad + 1, (2, b, 1, 1), generator=gen)
    cols = torch.arange(w).view(1, 1, w).expand(b, 1, w)
    if flip:
        flipped = (torch.rand(b, generator=gen) < 0.5).view(b, 1, 1)
        cols = torch.where(flipped, w - 1 - cols, cols)
    index = (dy + torch.arange(h).view(1, h, 1)) * wp + dx + cols          # (B, H, W)
    out = xp.view(b, c, hp * wp).gather(2, index.view(b, 1, h * w).expand(b, c, h * w))
    return out.view(b, c, h, w)


def lr_at(step: int, total: int, warmup: int, peak: float) -> float:
    """Linear warm-up to ``peak`` then cosine decay to 0."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def train_epochs(model, samples, data_cfg, rows, hp, device, seed, progress) -> list[dict]:
    """The training loop; returns one record per epoch (loss, accuracy on augmented batches)."""
    opt = timm.optim.create_optimizer_v2(model, "adamw", lr=hp["lr"],
                                         weight_decay=hp["weight_decay"])
    steps_per_epoch = math.ceil(len(rows) / hp["batch_size"])
    total = hp["epochs"] * steps_per_epoch
    warmup = min(total - 1, round(hp["warmup_epochs"] * steps_per_epoch))
    normalize = GpuNormalize(data_cfg, device, channels_last=device.type == "cuda")
    labels_all = torch.from_numpy(samples.labels)
    dataset = ImageRows(samples, ResizeCrop(data_cfg))
    gen = torch.Generator().manual_seed(seed)
    bar = tqdm(total=total, unit="step", desc="fit", disable=not progress, dynamic_ncols=True)
    history, step = [], 0
    for epoch in range(hp["epochs"]):
        order = rows[torch.randperm(len(rows), generator=gen).numpy()]
        batches = [order[i:i + hp["batch_size"]].tolist() for i in range(0, len(order), hp["batch_size"])]
        loader = make_loader(dataset, batches, hp["workers"], pin_memory=device.type == "cuda")
        loss_sum = torch.zeros((), device=device)
        correct = torch.zeros((), device=device, dtype=torch.long)
        for images, idx, _ in loader:
            for group in opt.param_groups:
                group["lr"] = lr_at(step, total, warmup, hp["lr"])
            x = normalize(augment(images, hp["pad"], hp["flip"], gen))
            y = labels_all[idx].to(device, non_blocking=True)
            with autocast(hp["precision"], device):
                logits = model(x).float()
            loss = F.cross_entropy(logits, y, label_smoothing=hp["label_smoothing"])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_sum += loss.detach() * len(y)
            correct += (logits.argmax(1) == y).sum()
            step += 1
            bar.update(1)
        record = {"epoch": epoch + 1, "loss": loss_sum.item() / len(rows),
                  "train_accuracy": correct.item() / len(rows)}
        if not math.isfinite(record["loss"]):
            raise ModelError(f"fit-classifier diverged (loss {record['loss']}) in epoch "
                             f"{epoch + 1}: lower --lr (now {hp['lr']})")
        history.append(record)
        bar.set_postfix(loss=f"{record['loss']:.3f}", acc=f"{record['train_accuracy']:.3f}")
    bar.close()
    return history


def evaluate(model, samples, data_cfg, rows, hp, device) -> float:
    """Top-1 accuracy on ``rows`` (eval mode, no augmentation)."""
    normalize = GpuNormalize(data_cfg, device, channels_last=device.type == "cuda")
    batches = [rows[i:i + 512].tolist() for i in range(0, len(rows), 512)]
    loader = make_loader(ImageRows(samples, ResizeCrop(data_cfg)), batches, hp["workers"],
                         pin_memory=device.type == "cuda")
    labels_all = torch.from_numpy(samples.labels)
    correct = 0
    with scoring(model), autocast(hp["precision"], device):
        for images, idx, _ in loader:
            pred = model(normalize(images)).argmax(1).cpu()
            correct += int((pred == labels_all[idx]).sum())
    return correct / len(rows)
