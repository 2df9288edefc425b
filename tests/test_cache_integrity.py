"""A cache that changed after it was written is never used silently.

Shards copied in from another cache, truncated shards and flipped bytes are refused by the reader
naming the file; a re-run of `extract` (with --verify for flipped bytes) recomputes exactly the
damaged shards, giving the same bytes as before; caches written before checksums stay readable;
a second `extract` into a cache in use stops at once."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from cache import manifest as mf
from cache.reader import ClassifierCache
from cache.runs import RunDir
from cache.schema import CacheError, CacheMismatch
from conftest import make_imagenet_tree
from pipeline.extract.run import extract
from pipeline.data.labels import imagenet_synsets

COLUMNS = ["index", "label", "valid", "logits", "pred", "correct", "p_true", "p_max", "source_xxh3"]


@pytest.fixture
def tree(tmp_path):
    """3 classes x 5 images = 15 rows; shard_size 6 -> shards of 6, 6, 3 rows."""
    return make_imagenet_tree(tmp_path / "imagenet", list(imagenet_synsets()[:3]), per_class=5,
                              splits=("val",))


@pytest.fixture
def cache_a(tree, tiny_extract, tmp_path):
    """A complete cache, its config and its manifest's shard records as first written."""
    cfg = tiny_extract(tree, out=tmp_path / "a", workers=0)
    extract(cfg)
    return cfg, mf.load_manifest(cfg.out)["shards"]


def file_digest(path):
    from cache.integrity import file_digest
    return file_digest(path)


def test_manifest_records_size_file_hash_and_column_hashes(cache_a):
    cfg, shards = cache_a
    assert [s["file"] for s in shards] == ["shard-00000.h5", "shard-00001.h5", "shard-00002.h5"]
    for s in shards:
        assert {k: s[k] for k in ("bytes", "xxh3_128")} == file_digest(cfg.out / s["file"])
        assert sorted(s["xxh3_64"]) == sorted(COLUMNS)
    assert ClassifierCache.open(cfg.out).has_checksums


def test_a_shard_copied_from_another_cache_is_refused_then_recomputed(cache_a, tiny_extract,
                                                                      tree, tmp_path):
    """The issue's case: caches A and B of the same data from two random inits (--seed); a shard
    of B copied into A was used silently by train-oracle.  Now: refused naming the file and the
    attribute; `extract` on A notices and recomputes exactly that shard."""
    cfg_a, shards = cache_a
    before = ClassifierCache.open(cfg_a.out).load(COLUMNS)
    cfg_b = tiny_extract(tree, out=tmp_path / "b", workers=0, seed=1)
    extract(cfg_b)
    shutil.copy(cfg_b.out / "shard-00001.h5", cfg_a.out / "shard-00001.h5")
    with pytest.raises(CacheMismatch, match=r"(?s)shard-00001.h5 does not belong here.*"
                                            r"weights_sha256: the file has .*re-run the same"):
        ClassifierCache.open(cfg_a.out).load(["correct"])
    again = extract(cfg_a)
    assert not again["already_complete"] and again["computed_rows"] == 6
    assert len(again["notes"]) == 1 and "shard-00001.h5 belongs to another cache " \
        "(weights_sha256" in again["notes"][0]
    assert mf.load_manifest(cfg_a.out)["shards"] == shards  # the same bytes as first written
    after = ClassifierCache.open(cfg_a.out).load(COLUMNS)
    for name in COLUMNS:
        np.testing.assert_array_equal(after[name], before[name])


def test_a_truncated_shard_is_named_and_exactly_it_is_recomputed(cache_a):
    cfg, shards = cache_a
    victim = cfg.out / "shard-00002.h5"
    victim.write_bytes(victim.read_bytes()[:3000])
    with pytest.raises(CacheError, match=r"shard .*shard-00002.h5 has 3000 bytes, the manifest "
                                         r"records \d+ \(truncated or replaced\); re-run the same"):
        ClassifierCache.open(cfg.out)
    again = extract(cfg)
    assert not again["already_complete"] and again["computed_rows"] == 3
    assert "shard-00002.h5 has 3000 bytes" in again["notes"][0]
    assert mf.load_manifest(cfg.out)["shards"] == shards


def _flip_a_logit_byte(path):
    """Flip one bit inside the stored logits: same size, valid HDF5, different numbers."""
    with h5py.File(path, "r") as fh:
        offset = fh["logits"].id.get_offset()
    data = bytearray(path.read_bytes())
    data[offset + 7] ^= 0x10
    path.write_bytes(bytes(data))


def test_flipped_bytes_fail_the_column_check_and_verify_recomputes_them(cache_a):
    cfg, shards = cache_a
    _flip_a_logit_byte(cfg.out / "shard-00000.h5")
    cache = ClassifierCache.open(cfg.out)            # same size: the cheap check passes
    cache.load(["correct", "p_true"])                 # columns that were not touched
    with pytest.raises(CacheError, match=r"shard-00000.h5 is damaged: column 'logits' does not "
                                         r"match its checksum.*re-run the same"):
        cache.load(["logits"])
    assert extract(cfg)["already_complete"]           # the cheap check cannot see it ...
    again = extract(cfg.__class__(**{**cfg.__dict__, "verify": True}))   # ... --verify does
    assert not again["already_complete"] and again["computed_rows"] == 6
    assert "shard-00000.h5 does not match its recorded XXH3-128 hash" in again["notes"][0]
    assert mf.load_manifest(cfg.out)["shards"] == shards
    verified = extract(cfg.__class__(**{**cfg.__dict__, "verify": True}))
    assert verified["already_complete"] and verified["notes"] == []


def _make_pre_checksum(cache_dir):
    """Rewrite a cache as the writer before checksums did: no xxh3_64 attribute in the shards,
    no bytes/xxh3_128/xxh3_64 in the manifest."""
    manifest = mf.load_manifest(cache_dir)
    for entry in manifest["shards"]:
        path = cache_dir / entry["file"]
        with h5py.File(path, "r") as fh:
            attrs = {k: v for k, v in fh.attrs.items() if k != "xxh3_64"}
            cols = {k: fh[k][...] for k in fh}
        path.unlink()
        with h5py.File(path, "w") as fh:
            fh.attrs.update(attrs)
            for k, v in cols.items():
                fh.create_dataset(k, data=v)
        entry.clear()
        entry.update(file=path.name, start=int(attrs["start"]), stop=int(attrs["stop"]))
    (cache_dir / mf.MANIFEST_FILE).write_text(json.dumps(manifest))


def test_a_cache_written_before_checksums_stays_readable_and_extract_adopts_it(cache_a):
    cfg, _ = cache_a
    from cache.reader import UnverifiedCacheWarning

    before = ClassifierCache.open(cfg.out).load(COLUMNS)
    _make_pre_checksum(cfg.out)
    with pytest.warns(UnverifiedCacheWarning, match=r"written before per-shard checksums.*re-run "
                                                    r"the same `cli.py extract`"):
        old = ClassifierCache.open(cfg.out)
    assert not old.has_checksums
    for name in COLUMNS:
        np.testing.assert_array_equal(old.load([name])[name], before[name])
    again = extract(cfg)
    assert again["already_complete"] and "predates per-shard checksums" in again["notes"][0]
    shards = mf.load_manifest(cfg.out)["shards"]
    assert all(s["xxh3_128"] == file_digest(cfg.out / s["file"])["xxh3_128"] for s in shards)
    assert ClassifierCache.open(cfg.out).has_checksums


def test_a_second_extract_into_a_cache_in_use_stops_at_once(cache_a, tmp_path):
    """Issue: two extracts into one cache both did all the work and the second deleted the
    first one's temporary file.  A live holder (another process) makes `extract` refuse, touching
    nothing; a lock left by a dead process is taken over."""
    cfg, _ = cache_a
    (cfg.out / mf.MANIFEST_FILE).unlink()
    (cfg.out / "shard-00002.h5").unlink()
    in_flight = cfg.out / f".shard-00002.h5.tmp-{os.getpid() + 1}"
    in_flight.write_bytes(b"the other process is writing this")
    # another live process holding the cache's lock, as extract (and train-oracle for run
    # directories) takes it: DIR/.lock naming its pid and host
    holder = subprocess.Popen([sys.executable, "-c", (
        "import json, os, socket, sys, time\n"
        "with open(sys.argv[1], 'x') as fh:\n"
        "    json.dump({'pid': os.getpid(), 'host': socket.gethostname()}, fh)\n"
        "print('locked', flush=True); time.sleep(60)"), str(cfg.out / ".lock")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(CacheError, match=r"is in use by another process \(pid "
                                             rf"{holder.pid} on host .*\); wait for it, or "
                                             r"delete .*\.lock"):
            extract(cfg)
        assert in_flight.exists() and not (cfg.out / "shard-00002.h5").exists()
    finally:
        holder.kill()
        holder.wait()
    # killed with the lock file left behind: the next extract takes it over and finishes
    assert (cfg.out / ".lock").exists()
    done = extract(cfg)
    assert done["computed_rows"] == 3 and not (cfg.out / ".lock").exists()


def test_lock_refusal_names_the_owner(tmp_path):
    from cache.lock import DirLock

    with DirLock(tmp_path / "d"):
        with pytest.raises(CacheError, match=r"d is in use by another process"):
            DirLock(tmp_path / "d").__enter__()
    assert not (tmp_path / "d" / ".lock").exists()


def test_report_names_a_damaged_file_found_by_its_workers(tmp_path):
    """Flipped bytes in a cache shard are found where the baselines read the logits (a joblib
    worker); a truncated output file where it is planned; an output file that no longer has the
    size and XXH3-128 hash its run.json records, where it is scored."""
    from click.testing import CliRunner

    from bench.synthetic_runs import write_study
    from cli import cli

    runs, caches = write_study(tmp_path / "study", n=300, losses=("ce", "ss"), seeds=(0, 1))

    def report():
        result = CliRunner().invoke(cli, ["report", "--runs-root", str(runs), "--out",
                                          str(tmp_path / "rep"), "--no-figures"])
        assert result.exit_code == 1 and "Traceback" not in result.output, result.output
        return result.output

    shard = caches / "vit" / "test" / "shard-00000.h5"
    pristine = shard.read_bytes()
    _flip_a_logit_byte(shard)
    assert re.search(rf"error: {shard} is damaged: column 'logits' does not match its checksum",
                     report())
    shard.write_bytes(pristine)
    output = sorted(runs.glob("*/outputs/test.h5"))[0]
    record_path = RunDir(output.parent.parent).run_file
    record = json.loads(record_path.read_text())
    record_path.write_text(json.dumps({**record, "output_files": {"test": file_digest(output)}}))
    with open(output, "ab") as fh:                 # still valid HDF5, same columns
        fh.write(b"\0" * 16)
    assert re.search(rf"error: {output} is damaged: \d+ bytes with another XXH3-128 hash than "
                     r"the \d+ bytes its run.json records; re-run the command that wrote it",
                     report())
    output.write_bytes(output.read_bytes()[:2000])
    assert re.search(rf"error: {output} is not a readable HDF5 file \(.*truncated", report())


@pytest.mark.slow
def test_the_verification_benchmark_runs(tmp_path):
    """bench/bench_integrity.py --quick: every figure of bench/NOTES.md's checksum paragraph comes out."""
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "bench" / "bench_integrity.py"), "--quick"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = [l for l in proc.stdout.splitlines() if l.startswith("BENCH_INTEGRITY ")][-1]
    result = json.loads(line.split(" ", 1)[1])
    assert set(result["shard"]["ms"]) == {"write_before", "write_checksummed", "manifest_entry",
                                          "load_before", "load_checked", "verify_file_hash"}
    assert all(v > 0 for v in result["shard"]["ms"].values())
    rates = result["extract_cpu"]["img_per_s"]
    assert rates["on"] > 0 and rates["off"] > 0
    assert result["extract_cpu"]["ratio_cpu_on_over_off"] > 0
    assert set(result["stamps"]["us_per_file"]) == {"list_split", "stamp_check", "read_files",
                                                    "hash_files"}
    assert all(v > 0 for v in result["stamps"]["us_per_file"].values())
