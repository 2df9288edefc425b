"""A split's rows -> batches -> a DataLoader: batches that never cross a shard, the loader
workers a process starts, and in-process loading with one intra-op thread."""
from __future__ import annotations

import random
import sys
from typing import Callable, Sequence

import torch
from torch.utils.data import DataLoader, Dataset

from pipeline.core.options import usable_cores


def chunk_batches(ranges: Sequence[tuple[int, int]], batch_size: int,
                  shuffle_seed: int | None = None) -> list[list[int]]:
    """Batches that never cross a range boundary, so each shard's batches are the same whatever
    the number of processes.  ``shuffle_seed`` permutes rows inside each range (tests use it to
    prove rows are placed by index, not by arrival order)."""
    out = []
    for start, stop in ranges:
        rows = list(range(start, stop))
        if shuffle_seed is not None:
            random.Random(shuffle_seed + start).shuffle(rows)
        out.extend(rows[i:i + batch_size] for i in range(0, len(rows), batch_size))
    return out


def default_workers(local_world: int = 1) -> int:
    """Loader workers per process: the cores this process may use, shared between the local
    ranks, leaving one core for the main process (which feeds the accelerator)."""
    return max(1, min(32, usable_cores() // max(local_world, 1) - 1))


def _quiet_hangups(_worker_id: int) -> None:
    """A loader worker hands each batch's memory to the main process over a socket
    (multiprocessing's resource sharer).  When the main process is interrupted (Ctrl-C) in the
    middle of that handshake, the worker's serving thread sees the peer hang up and would print a
    traceback beside the main process's one-line "interrupted" message.  In a worker, that hang-up
    can only mean the consumer went away, so it is dropped; every other error still prints."""
    default = sys.excepthook

    def hook(kind, value, tb):
        if not issubclass(kind, (EOFError, ConnectionError)):
            default(kind, value, tb)
    sys.excepthook = hook


def make_loader(dataset: Dataset, batches: list[list[int]], workers: int,
                pin_memory: bool, collate_fn: Callable | None = None) -> DataLoader:
    # prefetch 2 batches per worker: 16 workers x 2 x 256 x 384^2 x 3 B = 3.6 GB of shared
    # memory at ViT@384 already; more only costs memory.  A worker beyond one per batch would
    # only be started (a fork of this process each) and stopped: a 1,000-row split of 4 batches
    # gets 4, whatever the cores.
    workers = min(workers, len(batches))
    return Loader(dataset, batch_sampler=batches, num_workers=workers, pin_memory=pin_memory,
                  collate_fn=collate_fn, prefetch_factor=2 if workers > 0 else None,
                  persistent_workers=False, multiprocessing_context="fork" if workers else None,
                  worker_init_fn=_quiet_hangups if workers else None)


class Loader(DataLoader):
    """A DataLoader that, without workers, reads and collates each batch with one intra-op
    thread (the caller's count is restored between batches, so the model keeps it).

    In-process loading is per-image work of small ops (a resize, a copy into the batch), and
    every parallel region of such an op waits for each of torch's threads, one per core by
    default: on a 64-core virtual machine, extracting Fashion-MNIST upscaled to 112 px ran at
    about 140 images a second with 64 threads, 2,100 with 8 and 4,000 with one.  The values are
    the same with any count (no op here reduces across threads)."""

    def __iter__(self):
        batches = super().__iter__()
        return batches if self.num_workers else _one_thread(batches)


def _one_thread(batches):
    while True:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            batch = next(batches)
        except StopIteration:
            return
        finally:
            torch.set_num_threads(threads)
        yield batch
