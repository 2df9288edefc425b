"""The on-disk contract: atomic shard/JSON writes (disk full, interrupts), identity checks,
index-ordered loading, and what --out may point at."""
from __future__ import annotations

import errno
import json

import h5py
import numpy as np
import pytest

from cache import atomic, manifest as mf
from cache.schema import (SCHEMA_VERSION, CacheError, CacheMismatch, canonical, check_identity,
                          identity_diff)
from cache.shards import load_split, read_columns, shard_is_complete, write_shard

IDENT = {"schema_version": SCHEMA_VERSION, "kind": "classifier", "model": "m", "num_rows": 6,
         "data_config": {"input_size": (3, 8, 8)}}


def columns(start, stop):
    n = stop - start
    return {"index": np.arange(start, stop), "logits": np.full((n, 3), start, np.float16)}


def no_temporaries(directory):
    return not [p for p in directory.iterdir() if ".tmp-" in p.name]


def raise_on_create(exc):
    def create_dataset(self, *args, **kwargs):
        raise exc
    return create_dataset


def test_write_shard_is_atomic_and_reports_disk_full(tmp_path, monkeypatch):
    path = tmp_path / "shard-00000.h5"
    write_shard(path, columns(0, 3), {**IDENT, "start": 0, "stop": 3})
    before = path.read_bytes()
    monkeypatch.setattr(h5py.Group, "create_dataset",
                        raise_on_create(OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(CacheError, match=r"disk full while writing .*shard-00000.h5.*re-run"):
        write_shard(path, columns(0, 3), {**IDENT, "start": 0, "stop": 3})
    assert path.read_bytes() == before and no_temporaries(tmp_path)
    monkeypatch.setattr(h5py.Group, "create_dataset", raise_on_create(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        write_shard(tmp_path / "shard-00001.h5", columns(3, 6), {**IDENT, "start": 3, "stop": 6})
    assert not (tmp_path / "shard-00001.h5").exists() and no_temporaries(tmp_path)


def test_json_writes_are_atomic_and_report_disk_full(tmp_path, monkeypatch):
    path = tmp_path / mf.MANIFEST_FILE
    mf.write_json_atomic(path, {"a": (1, 2)})
    assert json.loads(path.read_text()) == {"a": [1, 2]}

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(atomic.os, "fsync", full)      # the one writer (cache.atomic)
    with pytest.raises(CacheError, match="disk full while writing .*manifest.json"):
        mf.write_json_atomic(path, {"a": 3})
    assert json.loads(path.read_text()) == {"a": [1, 2]} and no_temporaries(tmp_path)


def test_shard_completeness_and_identity(tmp_path):
    path = tmp_path / "shard-00001.h5"
    assert not shard_is_complete(path, IDENT, 3, 6)
    write_shard(path, columns(3, 6), {**IDENT, "start": 3, "stop": 6})
    assert shard_is_complete(path, IDENT, 3, 6)
    assert not shard_is_complete(path, IDENT, 3, 5)  # another shard size's range
    with pytest.raises(CacheMismatch, match=r'model: cache has "m", expected "other"'):
        shard_is_complete(path, {**IDENT, "model": "other"}, 3, 6)
    path.write_bytes(b"half a file")
    with pytest.raises(CacheError, match="not a readable HDF5 file"):
        shard_is_complete(path, IDENT, 3, 6)


def test_load_split_orders_by_index_and_refuses_gaps(tmp_path):
    for s, (a, b) in enumerate([(0, 3), (3, 6)]):
        write_shard(tmp_path / f"shard-{s:05d}.h5", columns(a, b), {**IDENT, "start": a, "stop": b})
    shards = [{"file": "shard-00000.h5", "start": 0, "stop": 3},
              {"file": "shard-00001.h5", "start": 3, "stop": 6}]
    out = load_split(tmp_path, {"identity": IDENT, "shards": shards}, ["logits"])
    np.testing.assert_array_equal(out["index"], np.arange(6))
    np.testing.assert_array_equal(out["logits"][:, 0], [0, 0, 0, 3, 3, 3])
    with pytest.raises(CacheError, match=r"not the indices 0..5"):
        load_split(tmp_path, {"identity": IDENT, "shards": shards[::-1]}, ["logits"])
    with pytest.raises(CacheError, match=r"no column\(s\) \['p_max'\]"):
        read_columns(tmp_path / "shard-00000.h5", ["p_max"])


def test_identity_checks_name_every_difference():
    assert canonical({"s": (1, 2)}) == {"s": [1, 2]}
    assert identity_diff(IDENT, json.loads(json.dumps(IDENT))) == []
    found = {**IDENT, "model": "a", "num_rows": 7}
    diffs = identity_diff(found, IDENT)
    assert [d.split(":")[0] for d in diffs] == ["model", "num_rows"]
    with pytest.raises(CacheMismatch, match="schema version 0"):
        check_identity({**IDENT, "schema_version": 0}, IDENT, "x")
    with pytest.raises(CacheMismatch, match=r"(?s)model: .*num_rows: .*use another"):
        check_identity(found, IDENT, "x", hint="use another")


def test_claim_directory(tmp_path):
    d = tmp_path / "cache" / "vit" / "val"
    assert mf.claim_directory(d, IDENT) is False and (d / mf.IDENTITY_FILE).exists()
    assert mf.claim_directory(d, IDENT) is False  # same identity: resume
    (d / mf.MANIFEST_FILE).write_text("{}")
    assert mf.claim_directory(d, IDENT) is True
    with pytest.raises(CacheMismatch, match="model: cache has"):
        mf.claim_directory(d, {**IDENT, "model": "other"})
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("mine")
    with pytest.raises(CacheError, match="is not empty and holds no cache"):
        mf.claim_directory(other, IDENT)
    assert (other / "todo.txt").read_text() == "mine"
    with pytest.raises(CacheError, match="cannot create the cache directory .*todo.txt/vit"):
        mf.claim_directory(other / "todo.txt" / "vit", IDENT)  # a file in the way


def test_cache_root_check(tmp_path):
    mf.check_cache_root(tmp_path / "new")  # absent: fine
    root = tmp_path / "cache"
    mf.claim_directory(root / "vit" / "val", IDENT)
    (root / "resnet" / "train").mkdir(parents=True)  # an empty, just-created cache dir
    mf.check_cache_root(root)
    with pytest.raises(CacheError, match=r"itself a cache directory.*--out .*cache"):
        mf.check_cache_root(root / "vit" / "val")
    (root / "vit" / "stray.txt").write_text("x")
    with pytest.raises(CacheError, match=r"not a cache root: \['vit/stray.txt'\]"):
        mf.check_cache_root(root)
    home = tmp_path / "home"
    (home / "photos").mkdir(parents=True)
    (home / "photos" / "a.jpg").write_text("x")
    (home / "thesis.tex").write_text("x")
    with pytest.raises(CacheError, match="not empty and is not a cache root"):
        mf.check_cache_root(home)
    (tmp_path / "file").write_text("x")
    with pytest.raises(CacheError, match="is a file"):
        mf.check_cache_root(tmp_path / "file")
