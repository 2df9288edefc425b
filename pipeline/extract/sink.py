"""Where extracted rows go: per-shard buffers filled by global index, written when full, with
what the rows were computed from (pipeline/data/stamps.py).  A classifier with non-finite
weights, or a batch with non-finite logits, is refused here before anything is written.

Device->host copies of a batch's outputs are asynchronous and consumed one batch later, so the
accelerator already runs the next batch while the host files this one.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from cache.shards import shard_path, write_shard
from pipeline.core.models import ModelError
from pipeline.data.sources import SampleList
from pipeline.data.stamps import SourceRecorder, shard_sources

FINITE = "finite"   # per-row flag of ``classify`` (and ``finite_flip``): checked here, not stored


def model_text(cfg, spec) -> str:
    """The classifier and where its weights came from, as a message names them."""
    weights = cfg.weights or spec.weights
    return f"--classifier {cfg.classifier} (" + (f"weights {weights}" if weights else
                                                 "random init" if cfg.random_init else
                                                 "pretrained weights") + ")"


def check_finite_parameters(model, text: str) -> None:
    """NaN/inf weights make every logit NaN: refused by parameter name before any work."""
    bad = [name for name, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise ModelError(f"{text} has non-finite values (NaN or inf) in {len(bad)} parameter(s): "
                         f"{', '.join(bad[:5])}{', ...' if len(bad) > 5 else ''}; its outputs "
                         "would be NaN. Use an undamaged weights file (a checkpoint from before "
                         "training diverged)")


class ShardBuffer:
    """Rows of one shard, placed by global index whatever order the loader delivers them in."""

    def __init__(self, start: int, stop: int, samples: SampleList):
        self.start, self.stop, self.filled = start, stop, 0
        self.columns = {"index": np.arange(start, stop, dtype=np.int64),
                        "label": samples.labels[start:stop].copy(),
                        "valid": np.zeros(stop - start, np.uint8)}

    def put(self, rows: np.ndarray, valid: np.ndarray, outputs: dict[str, torch.Tensor]) -> None:
        pos = rows - self.start
        for name, tensor in outputs.items():
            value = tensor.numpy()
            if name not in self.columns:
                self.columns[name] = np.zeros((self.stop - self.start, *value.shape[1:]), value.dtype)
            self.columns[name][pos] = value
            self.columns[name][pos[valid == 0]] = 0  # undecodable rows carry no model output
        self.columns["valid"][pos] = valid
        self.filled += len(rows)

    @property
    def full(self) -> bool:
        return self.filled == self.stop - self.start


class ShardSink:
    """Collects batches into shard buffers and writes each shard as soon as it is full.

    Device->host copies are asynchronous: a batch's outputs are consumed one step later, so the
    accelerator already runs the next batch while the host files this one.
    """

    def __init__(self, out: Path, identity: dict, ranges: list, samples: SampleList,
                 recorder: SourceRecorder | None, model_text: str):
        self.out, self.identity, self.ranges, self.samples = Path(out), identity, ranges, samples
        self.shard_size, self.buffers, self.pending = identity["shard_size"], {}, None
        self.recorder, self.model_text = recorder, model_text

    def push(self, rows: torch.Tensor, valid: torch.Tensor, outputs: dict) -> None:
        staged = {k: v.to("cpu", non_blocking=True) for k, v in outputs.items()}
        event = None
        if next(iter(outputs.values())).device.type == "cuda":
            # blocking: the host thread sleeps until the device is done instead of spinning on a
            # core, which the loader's workers need (bench/profile_extract.py, "device_wait")
            event = torch.cuda.Event(blocking=True)
            event.record()
        self.flush()
        self.pending = (rows.numpy(), valid.numpy(), staged, event)

    def flush(self) -> None:
        if self.pending is None:
            return
        rows, valid, staged, event = self.pending
        self.pending = None
        if event is not None:
            event.synchronize()
        self._check_finite(rows, valid, staged)
        s = int(rows[0]) // self.shard_size
        buf = self.buffers.get(s) or ShardBuffer(*self.ranges[s], self.samples)
        self.buffers[s] = buf
        buf.put(rows, valid, staged)
        if buf.full:
            sources, stamp = shard_sources(self.samples, self.recorder, buf.start, buf.stop)
            attrs = {**self.identity, "start": buf.start, "stop": buf.stop, **stamp,
                     "bad_rows": buf.columns["index"][buf.columns["valid"] == 0].tolist()}
            write_shard(shard_path(self.out, s), {**buf.columns, **sources}, attrs)
            del self.buffers[s]

    def _check_finite(self, rows: np.ndarray, valid: np.ndarray, staged: dict) -> None:
        """NaN or inf logits give pred 0 and a trust label that only says label == 0: refused
        before the batch's shard is written (the shards already complete are kept)."""
        finite = np.ones(len(rows), bool)
        for key in [k for k in staged if k.startswith(FINITE)]:
            finite &= staged.pop(key).numpy()
        bad = rows[~finite & (valid == 1)]
        if len(bad):
            shown = ", ".join(f"{self.samples.path(int(i))} (row {i})" for i in bad[:3])
            raise ModelError(f"{self.model_text} gives non-finite logits (NaN or inf) on "
                             f"{len(bad)} of {len(rows)} images of this batch, e.g. {shown}: its "
                             "predictions and trust labels would be meaningless. Check the weights "
                             "(a damaged or diverged checkpoint), or --precision fp32 if fp16/bf16 "
                             "overflows")


@contextmanager
def closing_loop(sink: ShardSink, batches):
    """File the last computed batch even when the loop stops early (bad file, interrupt), so a
    shard it completes is kept for the resume; then stop the loader workers at once (a loader
    iterator kept alive by the exception's traceback otherwise stalls ~5 s per worker later).
    ``batches``: a loader iterator, or a ``StagedPrefetch`` over one (its ``close`` stops its
    threads, then the workers)."""
    try:
        yield
    finally:
        try:
            sink.flush()
        finally:
            stop = getattr(batches, "close", None) or getattr(batches, "_shutdown_workers", None)
            if stop is not None:
                stop()
