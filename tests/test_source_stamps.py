"""Images changed after a cache was extracted are never paired with its trust labels. The dataset
fingerprint hashes paths and labels only; each shard also records the XXH3-128 hash of every
image file it was computed from and a digest of the files' (size, mtime_ns) stamps: `extract`
recomputes exactly the shards of changed images, the stages that read pixels with a cache's
targets refuse it, and a cache written before the stamps is adopted."""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from cache import manifest as mf
from cache.integrity import file_digest
from cache.reader import ClassifierCache
from cache.schema import SOURCE_HASH_COLUMN, SOURCE_STAMP, from_attr
from cache.shards import HASHES, write_shard
from oracle_fixtures import CLASSIFIER, extract, run_cli, train_args, write_colour_tree

SHARDS = ("--shard-size", 4)   # val: 3 classes x 4 images -> shards of rows 0-3, 4-7, 8-11
FAST = ("--epochs", 2, "--batch-size", 4)   # enough optimizer steps for the schedule


def _tree(tmp_path: Path) -> Path:
    return write_colour_tree(tmp_path / "data", {"train": 8, "val": 4})


def _digests(cache: Path) -> dict[str, str]:
    return {p.name: file_digest(p)["xxh3_128"] for p in sorted(cache.glob("shard-*.h5"))}


def _accuracy(output: str) -> str:
    return re.search(r"\[val\] 12 rows, accuracy ([\d.]+)%", output).group(1)


def test_changed_images_are_recomputed_by_extract_and_refused_by_train_oracle(tmp_path):
    data, cache = _tree(tmp_path), tmp_path / "cache"
    extract(data, cache, extra=SHARDS)
    val = cache / CLASSIFIER / "val"
    before = _digests(val)
    # the user's case: other images copied over two files of shard 1, names kept
    wnids = sorted(p.name for p in (data / "val").iterdir())
    victims = [data / "val" / wnids[1] / f"{wnids[1]}_{i}.JPEG" for i in (0, 1)]
    for i, victim in enumerate(victims):
        shutil.copyfile(data / "val" / wnids[2] / f"{wnids[2]}_{i}.JPEG", victim)

    result = run_cli(train_args(data, cache, tmp_path / "run", *FAST), expect=1)
    assert re.search(r"error: cache .*val: 2 image\(s\) \(.*_0.JPEG, .*_1.JPEG\) of --data "
                     r"changed since it was extracted .* Re-run the same `cli.py extract` "
                     r"command: it recomputes the shards of the changed images", result.output)
    assert "Traceback" not in result.output and not (tmp_path / "run").exists()

    result = extract(data, cache, extra=SHARDS)
    assert re.search(r"note: 2 image\(s\) \(.*\) changed since cache .*val was extracted .*"
                     r"recomputing the 1 shard\(s\) holding them", result.output)
    assert re.search(r"note: shard .*shard-00001.h5 holds 2 changed image\(s\): recomputing it",
                     result.output)
    after = _digests(val)
    assert after["shard-00000.h5"] == before["shard-00000.h5"]
    assert after["shard-00002.h5"] == before["shard-00002.h5"]
    assert after["shard-00001.h5"] != before["shard-00001.h5"]
    # the repaired cache is the cache a fresh extract of the new images writes
    fresh = extract(data, tmp_path / "fresh", splits=("val",), extra=SHARDS)
    assert _accuracy(result.output) == _accuracy(fresh.output)
    assert _digests(val) == _digests(tmp_path / "fresh" / CLASSIFIER / "val")
    run_cli(train_args(data, cache, tmp_path / "run", *FAST))
    # predict reads pixels with the cache's targets too
    shutil.copyfile(data / "val" / wnids[0] / f"{wnids[0]}_0.JPEG", victims[0])
    result = run_cli(["predict", "--run", tmp_path / "run", "--data", data, "--cache", cache,
                      "--split", "val", "--name", "again", "--device", "cpu", "--no-progress"],
                     expect=1)
    assert re.search(r"error: cache .*val: 1 image\(s\) \(.*_0.JPEG\) of --data changed",
                     result.output)
    assert not (tmp_path / "run" / "outputs" / "again.h5").exists()


def test_new_stamps_with_the_same_content_are_re_recorded_and_verify_finds_same_size_edits(
        tmp_path):
    data, cache = _tree(tmp_path), tmp_path / "cache"
    extract(data, cache, splits=("val",), extra=SHARDS)
    val = cache / CLASSIFIER / "val"
    before = _digests(val)
    image = sorted((data / "val").rglob("*.JPEG"))[5]            # row 5: shard 1
    os.utime(image, ns=(image.stat().st_atime_ns, image.stat().st_mtime_ns + 10**9))  # touch
    result = extract(data, cache, splits=("val",), extra=SHARDS)
    assert re.search(r"note: the image files of 1 shard\(s\) of cache .* have new sizes or "
                     r"modification times but the content it was computed from .* their stamps "
                     r"are now recorded", result.output)
    assert "already complete" in result.output and _digests(val) == before
    assert "are now recorded" not in extract(data, cache, splits=("val",), extra=SHARDS).output

    # same size, same mtime, other bytes: the stamps cannot see it, the content hashes can
    st = image.stat()
    raw = bytearray(image.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    image.write_bytes(bytes(raw))
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert "already complete" in extract(data, cache, splits=("val",), extra=SHARDS).output
    result = extract(data, cache, splits=("val",), extra=SHARDS + ("--verify",))
    assert re.search(r"note: 1 image\(s\) \(.*\) changed since cache", result.output)
    assert _digests(val)["shard-00000.h5"] == before["shard-00000.h5"]


def _strip_stamps(cache: Path) -> None:
    """The cache as the version before image stamps wrote it: no source column or stamp."""
    for path in sorted(cache.glob("shard-*.h5")):
        with h5py.File(path, "r") as fh:
            cols = {k: fh[k][...] for k in fh.keys() if k != SOURCE_HASH_COLUMN}
            attrs = {k: from_attr(v) for k, v in fh.attrs.items()
                     if k not in (SOURCE_STAMP, HASHES)}
        write_shard(path, cols, attrs)
    manifest = mf.load_manifest(cache)
    manifest["columns"].remove(SOURCE_HASH_COLUMN)
    manifest["shards"] = [mf.shard_entry(cache / e["file"], e["start"], e["stop"])
                          for e in manifest["shards"]]
    mf.write_json_atomic(cache / mf.MANIFEST_FILE, manifest)


def test_a_cache_written_before_stamps_stays_usable_and_extract_adopts_it(tmp_path):
    data, cache = _tree(tmp_path), tmp_path / "cache"
    extract(data, cache, extra=SHARDS)
    val = cache / CLASSIFIER / "val"
    logits = ClassifierCache.open(val).load(["logits"])["logits"]
    for split in ("train", "val"):
        _strip_stamps(cache / CLASSIFIER / split)
    result = run_cli(train_args(data, cache, tmp_path / "run", *FAST))
    assert re.search(r"note: cache .*val was written before image stamps: changed images of "
                     r"--data cannot be found; re-run the same `cli.py extract` command once",
                     result.output)
    result = extract(data, cache, extra=SHARDS)
    assert re.search(r"note: cache .*val predates image stamps: the content hashes and stamps "
                     r"of the 12 image\(s\) of --data are now recorded", result.output)
    assert "already complete" in result.output
    cache_val = ClassifierCache.open(val)
    assert np.array_equal(cache_val.load(["logits"])["logits"], logits)
    assert SOURCE_HASH_COLUMN in cache_val.manifest["columns"]
    assert not cache_val.problems(full=True)                 # the rewritten shards are recorded
    image = sorted((data / "val").rglob("*.JPEG"))[0]
    image.write_bytes(sorted((data / "val").rglob("*.JPEG"))[11].read_bytes())
    result = run_cli(train_args(data, cache, tmp_path / "run2", *FAST), expect=1)
    assert "1 image(s)" in result.output and "changed since it was extracted" in result.output


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def test_changed_idx_rows_are_found_by_their_hashes(tmp_path, tiny_extract):
    """Fashion-MNIST idx rows live in memory: their stamp is their content hash."""
    from pipeline.extract.run import extract as run_extract

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (10, 28, 28))
    root = tmp_path / "fm"
    root.mkdir()
    _write_idx(root / "t10k-images-idx3-ubyte", images)
    _write_idx(root / "t10k-labels-idx1-ubyte", rng.integers(0, 10, 10))
    cfg = tiny_extract(root, out=tmp_path / "c", split="test", workers=0, shard_size=4,
                       model_kwargs={"img_size": 28, "patch_size": 7, "depth": 1, "embed_dim": 24,
                                     "num_heads": 2, "num_classes": 10, "in_chans": 1})
    run_extract(cfg)
    before = _digests(cfg.out)
    images[6] = 255 - images[6]                       # row 6: shard 1 of rows 4-7
    _write_idx(root / "t10k-images-idx3-ubyte", images)
    summary = run_extract(cfg)
    assert not summary["already_complete"] and summary["computed_rows"] == 4
    assert any("1 image(s)" in n and "t10k-images-idx3-ubyte[6]" in n for n in summary["notes"])
    after = _digests(cfg.out)
    assert [after[k] == before[k] for k in sorted(before)] == [True, False, True]


@pytest.mark.parametrize("decode", ["cpu", "gpu"])
def test_loader_workers_record_the_hash_and_stamp_of_each_file_they_read(tmp_path, tiny_extract,
                                                                        decode):
    """Recorded in forked loader workers (shared memory), on the CPU decode path and the device
    decoder's (run on the CPU here, as the Python API allows): exactly the files' hashes."""
    import xxhash

    from cache.integrity import column_hash
    from pipeline.data.sources import list_split
    from pipeline.extract.run import extract as run_extract

    data = _tree(tmp_path)
    cfg = tiny_extract(data, out=tmp_path / "c", workers=2, shard_size=4, decode=decode)
    run_extract(cfg)
    samples = list_split(str(data), "val")
    cache = ClassifierCache.open(cfg.out)
    hashes = cache.load([SOURCE_HASH_COLUMN])[SOURCE_HASH_COLUMN]
    expect = [xxhash.xxh3_128_digest(samples.path(i).read_bytes()) for i in range(len(samples))]
    assert [bytes(h) for h in hashes] == expect
    for entry in cache.manifest["shards"]:
        stats = np.array([(samples.path(i).stat().st_size, samples.path(i).stat().st_mtime_ns)
                          for i in range(entry["start"], entry["stop"])], np.int64)
        assert entry[SOURCE_STAMP] == column_hash(stats)
    summary = run_extract(cfg)
    assert summary["already_complete"] and not summary["notes"]


def test_head_only_refuses_an_oracle_feature_cache_of_images_changed_since(tmp_path):
    """The classifier cache re-extracted after images changed (so its stamps are current) must
    not be joined with another backbone's features of the old images (--features-cache)."""
    from test_head_only import head_args

    data = write_colour_tree(tmp_path / "data", {"train": 8, "val": 4})
    extract(data, tmp_path / "cache", extra=("--features",))
    extract(data, tmp_path / "ofeat", seed=1, extra=("--features",))
    wnids = sorted(p.name for p in (data / "train").iterdir())
    shutil.copyfile(data / "train" / wnids[1] / f"{wnids[1]}_0.JPEG",
                    data / "train" / wnids[0] / f"{wnids[0]}_0.JPEG")
    extract(data, tmp_path / "cache", extra=("--features",))      # C's cache repaired only
    result = run_cli(head_args(tmp_path, data, "--features-cache", tmp_path / "ofeat",
                               "--no-flip", "--batch-size", 4), expect=1)
    assert re.search(r"error: cache .*ofeat.*train: 1 image\(s\) \(.*_0.JPEG\) of --data "
                     r"changed since it was extracted", result.output), result.output
    assert "Traceback" not in result.output
