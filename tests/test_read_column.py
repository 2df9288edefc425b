"""read_column_into: a feature column read by threads at its byte offset equals h5py's read of
it, verifies its checksum, and refuses damaged or foreign layouts by name."""
from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pytest

from bench.bench_head import write_feature_cache
from cache.schema import CacheError
from cache.shards import read_column_into


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("cols") / "train"
    write_feature_cache(path, 2_500, 24, seed=3, shard=700)        # 4 shards, the last partial
    return path


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


def test_a_changed_byte_is_refused_naming_the_shard(cache, tmp_path):
    bad = tmp_path / "train"
    shutil.copytree(cache, bad)
    shard = bad / manifest(bad)["shards"][2]["file"]
    with h5py.File(shard, "r") as fh:
        offset = fh["features"].id.get_offset()
    with open(shard, "r+b") as fh:
        fh.seek(offset + 101)
        byte = fh.read(1)
        fh.seek(offset + 101)
        fh.write(bytes([byte[0] ^ 0x10]))
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
    with pytest.raises(ValueError, match="expected 2500 C-contiguous rows"):
        read_column_into(cache, manifest(cache), "features", np.zeros((2_400, 24), np.float16))
    with pytest.raises(ValueError, match="C-contiguous"):
        read_column_into(cache, manifest(cache), "features",
                         np.zeros((2_500, 48), np.float16)[:, ::2])
    with pytest.raises(CacheError, match="column 'features' is float16 .* expected float32"):
        read_column_into(cache, manifest(cache), "features", np.zeros((2_500, 24), np.float32))
