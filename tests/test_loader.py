"""pipeline/data/loader.py: in-process loading (no workers) reads and collates each batch with one
intra-op thread, gives the same batches as any thread count, and hands the caller's count back."""
from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from pipeline.core.models import DataConfig
from pipeline.data.images import ResizeCrop
from pipeline.data.loader import chunk_batches, make_loader

# Fashion-MNIST-sized grey images upscaled to 112 px on 3 channels, bicubic: the pretrained
# Lite0's preprocessing (presets.PRETRAINED), the case where in-process loading does real work
UPSCALE = DataConfig(input_size=(3, 112, 112), interpolation="bicubic", crop_pct=1.0,
                     crop_mode="center", mean=(0.5,) * 3, std=(0.5,) * 3)


class Upscaled(Dataset):
    def __init__(self, n: int):
        rng = np.random.default_rng(0)
        self.images = torch.from_numpy(rng.integers(0, 256, (n, 1, 28, 28), dtype=np.uint8))
        self.transform, self.threads = ResizeCrop(UPSCALE), []

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        self.threads.append(torch.get_num_threads())
        return self.transform(self.images[i]), i


def test_in_process_batches_use_one_thread_and_equal_a_plain_loaders():
    callers = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        data, batches = Upscaled(20), chunk_batches([(0, 20)], 8)
        plain = [b[0] for b in DataLoader(data, batch_sampler=batches)]
        data.threads.clear()
        got = []
        for images, rows in make_loader(data, batches, workers=0, pin_memory=False):
            assert torch.get_num_threads() == 2      # the caller's count, between batches
            got.append(images)
        assert data.threads == [1] * 20
        assert [g.shape for g in got] == [(8, 3, 112, 112)] * 2 + [(4, 3, 112, 112)]
        assert all(torch.equal(a, b) for a, b in zip(got, plain))
    finally:
        torch.set_num_threads(callers)


def test_a_loader_stopped_early_restores_the_callers_threads():
    callers = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        batches = iter(make_loader(Upscaled(16), chunk_batches([(0, 16)], 4), 0, False))
        next(batches)
        batches.close()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(callers)
