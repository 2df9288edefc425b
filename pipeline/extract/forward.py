"""The classifier's forward passes of ``extract``: the per-row columns of one view (``classify``),
the loop over the loader's batches (the flipped view and the MC-Dropout passes beside the
deterministic one) and the warm-up before the loader starts.

Every pass runs under ``torch.inference_mode()`` and ``core/precision.py``'s autocast; the softmax
columns come from float32 logits, before the logits are stored as fp16.
"""
from __future__ import annotations

import time

import torch

from cache.schema import FEATURE_COLUMN, FEATURE_DTYPE, MC_DROPOUT
from pipeline.core.precision import autocast
from pipeline.extract import mcdropout as mc
from pipeline.extract.sink import FINITE, closing_loop


def forward_fn(model, features: bool, compile_: bool):
    """x -> (logits, pooled pre-logit features or None); compiled as one graph with --compile."""
    def logits_only(x):
        return model(x), None

    def with_features(x):
        feats = model.forward_head(model.forward_features(x), pre_logits=True)
        return model.get_classifier()(feats), feats

    fn = with_features if features else logits_only
    return torch.compile(fn) if compile_ else fn


def classify(fn, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-row outputs of one view; softmax columns from float32 logits before fp16 storage."""
    logits, feats = fn(x)
    logits = logits.float()
    probs = logits.softmax(dim=-1)
    pred = logits.argmax(dim=-1)
    out = {FINITE: torch.isfinite(logits).all(dim=-1),   # checked (and dropped) by the sink
           "logits": logits.half(), "pred": pred, "correct": (pred == labels).to(torch.uint8),
           "p_true": probs.gather(1, labels[:, None]).squeeze(1), "p_max": probs.max(dim=-1).values}
    if feats is not None:
        out[FEATURE_COLUMN] = feats.float().to(getattr(torch, FEATURE_DTYPE))
    return out


def classify_batches(cfg, batches, sink, stop, model, labels_all, bar, device):
    """The loop of ``run._run_shards``; returns the first batch's rows and when the second began.
    Ctrl-C stops it between batches (``StopSignals``); ``closing_loop`` keeps every shard the
    classified batches complete."""
    fn, normalize, timer, model = model
    first, t_first = 0, None
    # backbone passes per row (MC-Dropout: one where all its dropout is in the head)
    head = bool(cfg.mc_dropout) and sink.identity[MC_DROPOUT]["head_only"]
    views = (2 if cfg.flip_view else 1) + (1 if head else cfg.mc_dropout)
    with torch.inference_mode(), closing_loop(sink, batches):
        for images, rows, valid in batches:
            if stop.requested:
                raise KeyboardInterrupt
            if t_first is None and first:  # the second batch: start-up (workers, compile) is over
                t_first = time.perf_counter()
            labels = labels_all[rows].to(device, non_blocking=True)
            with timer.time(len(rows), views=views), \
                    autocast(cfg.precision, device):
                x = normalize(images)
                outputs = classify(fn, x, labels)
                if cfg.flip_view:
                    flipped = classify(fn, x.flip(-1), labels)   # features -> features_flip
                    outputs.update({f"{k}_flip": v for k, v in flipped.items()})
                if cfg.mc_dropout:   # after the deterministic passes, which it leaves unchanged
                    outputs.update(mc.mc_columns(model, x, cfg.mc_dropout, cfg.seed,
                                                 int(rows.min()), device, head))
            sink.push(rows, valid, outputs)
            first = first or len(rows)
            bar.update(len(rows))
    return first, t_first


def warm_up(cfg, fn, normalize, data_cfg, rows: int, device) -> None:
    """Compile / let cuDNN pick kernels on a batch of the first batch's shape before the loader
    workers start: otherwise they prefetch batches meanwhile (workers x 2), the first batches
    after start-up arrive at once, and the throughput measured after the first batch is inflated
    (up to 2x in the extraction benchmark)."""
    x = torch.randint(0, 256, (rows, *data_cfg.input_size), dtype=torch.uint8, device=device)
    labels = torch.zeros(rows, dtype=torch.int64, device=device)
    with torch.inference_mode(), autocast(cfg.precision, device):
        classify(fn, normalize(x), labels)
        if cfg.flip_view:
            classify(fn, normalize(x).flip(-1), labels)
    torch.cuda.synchronize(device)
