"""Model-only inference time (``extract`` and ``predict`` time themselves).

``ModelTimer`` measures the forward passes alone — the uint8 batch's copy to the device, its
normalisation there and the model under the run's precision; not data loading or decoding — with
CUDA events on a GPU (recorded on the stream: the loop never waits for the device) and
``perf_counter`` on a CPU.  The first ``skip`` batches (warm-up: cuDNN autotuning, compilation,
lazy initialisation) are left out, unless there are no others (then ``includes_warmup`` is
true).  The figure is milliseconds per image and view, comparable with the paper's appendix
("oracle 1.53 ms/img vs classifier 1.64 ms/img").
"""
from __future__ import annotations

import time
from contextlib import contextmanager

import torch


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


class ModelTimer:
    def __init__(self, device: torch.device, skip: int = 1):
        self.device, self.skip = device, skip
        self.cuda = device.type == "cuda"
        self.spans: list = []          # ((start, end) events or seconds, images x views) per batch
        self.batch_size = 0

    @contextmanager
    def time(self, images: int, views: int = 1):
        """Time the block's device work for ``images`` images x ``views`` forward passes."""
        self.batch_size = max(self.batch_size, images)
        if self.cuda:
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            yield
            end.record()
            self.spans.append(((start, end), images * views))
        else:
            t0 = time.perf_counter()
            yield
            self.spans.append((time.perf_counter() - t0, images * views))

    def result(self, precision: str) -> dict:
        """{'model_ms_per_img', 'timed_images', 'includes_warmup', 'batch_size', 'device',
        'precision', 'what'}; model_ms_per_img is None when nothing was timed."""
        warm = len(self.spans) <= self.skip
        spans = self.spans if warm else self.spans[self.skip:]
        if self.cuda and spans:
            torch.cuda.synchronize(self.device)
        seconds = sum(s[0].elapsed_time(s[1]) / 1000.0 if self.cuda else s for s, _ in spans)
        images = sum(n for _, n in spans)
        return {"model_ms_per_img": 1000.0 * seconds / images if images else None,
                "timed_images": images, "includes_warmup": warm and bool(spans),
                "batch_size": self.batch_size,
                "device": device_name(self.device), "precision": precision,
                "what": "forward only (uint8 batch to the device, normalisation, model), per image "
                        f"and view; excludes data loading and the first {self.skip} batch(es)"}
