"""read_column_into: a feature column read by threads at its byte offset equals h5py's read of
it, into an array or through a sink's staging buffers (the GPU's pinned ones on a CUDA device),
verifies its checksum, and refuses damaged or foreign layouts by name."""
from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pytest
import torch

import cache.columns as columns

from bench.bench_head import write_feature_cache
from cache.schema import CacheError
from cache.columns import read_column_into, read_columns_into


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("cols") / "train"
    write_feature_cache(path, 2_500, 24, seed=3, shard=700)        # 4 shards, the last partial
    return path


@pytest.fixture(autouse=True)
def every_thread(monkeypatch):
    """Small test columns: as many threads as asked (not one, as their size would give)."""
    monkeypatch.setattr(columns, "BYTES_A_THREAD", 1)


def manifest(path):
    return json.loads((path / "manifest.json").read_text())


def h5py_column(path, name):
    m = manifest(path)
    return np.concatenate([h5py.File(path / s["file"], "r")[name][...] for s in m["shards"]])


@pytest.mark.parametrize("threads", [1, 3, 16])
def test_the_threaded_read_is_h5pys_read(cache, threads):
    for name in ("features", "features_flip"):
        out = np.full((2_500, 24), np.nan, np.float16)
        read_column_into(cache, manifest(cache), name, out, threads=threads)
        assert np.array_equal(out, h5py_column(cache, name))


def flipped_copy(cache, dest, shard_no, at, mask):
    """A copy of ``cache`` at ``dest`` with byte ``at`` of shard ``shard_no``'s features XORed
    with ``mask``; returns the damaged shard's path."""
    shutil.copytree(cache, dest)
    shard = dest / manifest(dest)["shards"][shard_no]["file"]
    with h5py.File(shard, "r") as fh:
        offset = fh["features"].id.get_offset()
    with open(shard, "r+b") as fh:
        fh.seek(offset + at)
        byte = fh.read(1)
        fh.seek(offset + at)
        fh.write(bytes([byte[0] ^ mask]))
    return shard


def test_a_changed_byte_is_refused_naming_the_shard(cache, tmp_path):
    bad = tmp_path / "train"
    shard = flipped_copy(cache, bad, 2, 101, 0x10)
    out = np.zeros((2_500, 24), np.float16)
    with pytest.raises(CacheError, match=f"{shard.name} is damaged: column 'features' does not "
                                         "match its checksum"):
        read_column_into(bad, manifest(bad), "features", out)
    read_column_into(bad, manifest(bad), "features_flip", out)     # the other column is intact


def test_a_chunked_column_is_read_through_h5py_and_still_verified(cache, tmp_path):
    """A layout another writer might choose (chunked, compressed): no byte offset to read at."""
    other = tmp_path / "train"
    shutil.copytree(cache, other)
    shard = other / manifest(other)["shards"][0]["file"]
    with h5py.File(shard, "r+") as fh:
        data = fh["features"][...]
        del fh["features"]
        fh.create_dataset("features", data=data, chunks=(50, 24), compression="gzip")
    out = np.zeros((2_500, 24), np.float16)
    read_column_into(other, manifest(other), "features", out)
    assert np.array_equal(out, h5py_column(cache, "features"))


def test_wrong_output_buffers_are_refused(cache):
    with pytest.raises(ValueError, match="out has 2400 rows, expected 2500"):
        read_column_into(cache, manifest(cache), "features", np.zeros((2_400, 24), np.float16))
    with pytest.raises(ValueError, match="C-contiguous"):
        read_column_into(cache, manifest(cache), "features",
                         np.zeros((2_500, 48), np.float16)[:, ::2])
    with pytest.raises(CacheError, match="column 'features' is float16 .* expected float32"):
        read_column_into(cache, manifest(cache), "features", np.zeros((2_500, 24), np.float32))


class _Staged:
    """A sink with staging buffers of its own (as the GPU's pinned ones), copied out at put."""

    def __init__(self, out):
        self.rows, self.row_shape, self.dtype = out.shape[0], out.shape[1:], out.dtype
        self.flat, self.pieces = memoryview(out).cast("B"), []

    def buffer(self, at, size):
        return memoryview(bytearray(size))

    def put(self, at, buf):
        self.flat[at:at + len(buf)] = buf
        self.pieces.append(len(buf))


@pytest.mark.parametrize("piece", [1000, 1 << 20])
def test_a_sink_takes_the_column_in_pieces_hashed_as_they_stream(cache, tmp_path, monkeypatch,
                                                                  piece):
    """Pieces that end mid-row, and one a shard: the same bytes, the same checksum test."""
    monkeypatch.setattr(columns, "PIECE_BYTES", piece)
    out = np.full((2_500, 24), np.nan, np.float16)
    sink = _Staged(out)
    read_column_into(cache, manifest(cache), "features", sink, threads=3)
    assert np.array_equal(out, h5py_column(cache, "features"))
    assert max(sink.pieces) <= piece and sum(sink.pieces) == out.nbytes
    bad = tmp_path / "train"
    shard = flipped_copy(cache, bad, 3, 2_000, 0x01)
    with pytest.raises(CacheError, match=f"{shard.name} is damaged"):
        read_column_into(bad, manifest(bad), "features", _Staged(np.zeros_like(out)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("piece", [1000, 1 << 20])
def test_the_device_sink_puts_both_views_on_the_gpu(cache, monkeypatch, piece):
    from pipeline.oracle.headonly.staging import DeviceSink, Staging

    monkeypatch.setattr(columns, "PIECE_BYTES", piece)
    x = torch.full((2 * 2_500, 24), float("nan"), dtype=torch.float16, device="cuda")
    staging = Staging(x.device, piece=piece)
    read_columns_into(cache, manifest(cache), {"features": DeviceSink(x[:2_500], staging),
                                               "features_flip": DeviceSink(x[2_500:], staging)},
                      threads=3)
    staging.wait()
    expected = np.concatenate([h5py_column(cache, n) for n in ("features", "features_flip")])
    assert np.array_equal(x.cpu().numpy(), expected)


def _swap(path, i, j):
    a, b = (path / manifest(path)["shards"][k]["file"] for k in (i, j))
    tmp = a.with_suffix(".tmp")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)
    return a


def test_a_shard_file_in_another_ones_place_is_refused(cache, tmp_path):
    """Two shards of the same size swapped: each is intact, but not the rows of its place."""
    moved = tmp_path / "moved"
    shutil.copytree(cache, moved)
    first = _swap(moved, 0, 1)
    out = np.zeros((2_500, 24), np.float16)
    with pytest.raises(CacheError, match=f"{first.name} is not the shard the manifest records"):
        read_column_into(moved, manifest(moved), "features", out)
    old = tmp_path / "old"          # a manifest without the columns' checksums: the index says
    shutil.copytree(moved, old)
    m = manifest(old)
    for entry in m["shards"]:
        entry.pop("xxh3_64")
    with pytest.raises(CacheError, match=f"{first.name}: rows are not the indices 0..699"):
        read_column_into(old, m, "features", out)
    m = manifest(cache)
    for entry in m["shards"]:
        entry.pop("xxh3_64")
    read_columns_into(cache, m, {"features": out, "features_flip": np.zeros_like(out)})
    assert np.array_equal(out, h5py_column(cache, "features"))


def test_a_missing_column_is_named(cache):
    with pytest.raises(CacheError, match="has no column 'logits'"):
        read_column_into(cache, manifest(cache), "logits", np.zeros((2_500, 24), np.float16))
