"""A cache's feature columns onto the device (``read_features``): on a GPU straight from the shards
through pinned staging buffers.

A CUDA device copies from pageable host memory through a driver-owned staging buffer, one piece
after another and at a fraction of the bus's speed; pinning the whole destination (ImageNet's
3.9 GB of features, both views) costs more than the faster copy saves once per process.  Here the
reading threads of ``cache.columns.read_columns_into`` read each piece of the file into a small
pinned buffer of their own (two a thread: one filling while the other's copy runs) and queue its
copy to the device on their own stream, so reading the page cache and copying to the device
overlap and no host copy of the column is kept (``DeviceSink``; measured in bench/NOTES.md,
"Head-only runs and sweeps").  The device's rows are valid once ``read_columns_into`` has
returned and ``Staging.wait`` has run: a damaged shard raises first.
"""
from __future__ import annotations

import threading

import h5py
import numpy as np
import torch

from cache.columns import PIECE_BYTES, read_columns_into
from cache.reader import ClassifierCache
from cache.schema import FEATURE_COLUMN


class Staging:
    """Two pinned buffers of ``piece`` bytes and a copy stream per reading thread, shared by the
    sinks of one read (``DeviceSink``)."""

    def __init__(self, device: torch.device, piece: int = PIECE_BYTES):
        self.device, self.piece = device, piece
        self.local, self.lock = threading.local(), threading.Lock()
        self.streams: list[torch.cuda.Stream] = []
        self.held: list[torch.Tensor] = []      # the buffers, kept until ``wait``

    def take(self, size: int):
        """This thread's next buffer (its last copy done): (thread state, pinned tensor)."""
        if size > self.piece:
            raise ValueError(f"Staging: a piece of {size} bytes, its buffers hold {self.piece}")
        t = self.local
        if not hasattr(t, "stream"):
            t.stream = torch.cuda.Stream(self.device)
            t.host = [torch.empty(self.piece, dtype=torch.uint8, pin_memory=True)
                      for _ in range(2)]
            t.done = [torch.cuda.Event() for _ in range(2)]
            t.turn = 1
            with self.lock:
                self.streams.append(t.stream)
                self.held.extend(t.host)
        t.turn ^= 1
        t.done[t.turn].synchronize()        # that buffer's last copy has left it
        return t, t.host[t.turn]

    def wait(self) -> None:
        """Every queued copy done (any stream may read the rows from here on)."""
        for stream in self.streams:
            stream.synchronize()
        self.held.clear()


class DeviceSink:
    """``cache.columns.ColumnSink`` onto ``out``, a C-contiguous CUDA tensor (N, ...), through
    ``staging``'s pinned buffers."""

    def __init__(self, out: torch.Tensor, staging: Staging):
        if out.device.type != "cuda" or not out.is_contiguous():
            raise ValueError(f"DeviceSink: out must be a contiguous CUDA tensor, got {out.device}")
        self.rows, self.row_shape = out.shape[0], tuple(out.shape[1:])
        self.dtype = np.dtype(str(out.dtype).removeprefix("torch."))
        self.flat, self.staging = out.view(-1).view(torch.uint8), staging

    def buffer(self, at: int, size: int) -> memoryview:
        _, host = self.staging.take(size)
        return memoryview(host.numpy())[:size]

    def put(self, at: int, buf: memoryview) -> None:
        t = self.staging.local
        with torch.cuda.stream(t.stream):
            self.flat[at:at + len(buf)].copy_(t.host[t.turn][:len(buf)], non_blocking=True)
            t.done[t.turn].record(t.stream)


def read_features(cache: ClassifierCache, columns: tuple[str, ...],
                  device: torch.device) -> torch.Tensor:
    """(len(columns) N, D) float16 on ``device``: the feature columns of ``cache`` one after the
    other, read from the shards by threads and verified (``cache.columns.read_columns_into``): on
    a CUDA device straight into it through pinned staging buffers (module docstring), elsewhere
    in place; each shard opened once for both views."""
    n, dim = cache.num_rows, feature_dim(cache)
    if device.type != "cuda":
        buf = np.empty((len(columns) * n, dim), np.float16)
        read_columns_into(cache.path, cache.manifest,
                          {name: buf[i * n:(i + 1) * n] for i, name in enumerate(columns)})
        return torch.from_numpy(buf).to(device)
    x = torch.empty((len(columns) * n, dim), dtype=torch.float16, device=device)
    staging = Staging(device)
    read_columns_into(cache.path, cache.manifest, {
        name: DeviceSink(x[i * n:(i + 1) * n], staging) for i, name in enumerate(columns)})
    staging.wait()
    return x


def feature_dim(cache: ClassifierCache) -> int:
    """D, the width of ``cache``'s features (its first shard's)."""
    first = cache.path / cache.manifest["shards"][0]["file"]
    with h5py.File(first, "r") as fh:
        return int(fh[FEATURE_COLUMN].shape[1])
