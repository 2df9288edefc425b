"""Stage 1 on CPU: every cached row is the model's output on its own image, whatever the loader
order, the number of shards, workers or decoders; resume, bad files and foreign caches."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from cache.manifest import IDENTITY_FILE, MANIFEST_FILE
from cache.reader import ClassifierCache
from cache.schema import CacheMismatch
from conftest import TINY_RESNET, TINY_VIT, make_imagenet_tree
from pipeline.data.images import BadImageError, GpuNormalize, ResizeCrop, decode_file
from pipeline.data.loader import chunk_batches
from pipeline.extract.run import extract
from pipeline.data.labels import imagenet_synsets
from pipeline.core.models import build_model, resolve_data_config, resolve_spec
from pipeline.data.sources import list_split

BASE = ["index", "label", "valid", "logits", "pred", "correct", "p_true", "p_max"]
FLIP = ["logits_flip", "pred_flip", "correct_flip", "p_true_flip", "p_max_flip"]


@pytest.fixture
def tree(tmp_path):
    """3 classes x 5 images in val/<wnid>/ = 15 rows; shard_size 6 -> shards of 6, 6, 3 rows."""
    return make_imagenet_tree(tmp_path / "imagenet", list(imagenet_synsets()[:3]), per_class=5,
                              splits=("val",))


def reference(cfg, rows, flip=False):
    """The model's fp32 output on each image alone, preprocessed independently of the loader."""
    samples = list_split(cfg.data, cfg.split)
    spec = resolve_spec(cfg.classifier, False, None, True, cfg.model_kwargs)
    model = build_model(spec, seed=cfg.seed)
    dcfg = resolve_data_config(model, spec, cfg.preprocess)
    normalize = GpuNormalize(dcfg, torch.device("cpu"))
    out = []
    with torch.inference_mode():
        for i in rows:
            x = normalize(ResizeCrop(dcfg)(decode_file(str(samples.path(i))))[None])
            out.append(model(x.flip(-1) if flip else x)[0].float().numpy())
    return np.stack(out), model


def load_all(cfg, extra=()):
    return ClassifierCache.open(cfg.out).load(BASE + list(extra))


def assert_same_cache(a, b, columns):
    for name in columns:
        np.testing.assert_array_equal(a[name], b[name], err_msg=f"column {name}")


def shards_of(out):
    return sorted(p.name for p in out.glob("shard-*.h5"))


@pytest.mark.parametrize("model", [TINY_VIT, TINY_RESNET], ids=["vit", "resnet"])
def test_row_i_is_the_model_output_on_image_i(tree, tiny_extract, model):
    cfg = tiny_extract(tree, model=model, shuffle_seed=3, flip_view=True, features=True)
    batches = chunk_batches([(0, 6), (6, 12), (12, 15)], cfg.batch_size, cfg.shuffle_seed)
    assert [r for b in batches for r in b] != list(range(15))  # the loader order is shuffled
    summary = extract(cfg)
    assert summary["rows"] == summary["valid_rows"] == 15 and summary["computed_rows"] == 15
    assert shards_of(cfg.out) == ["shard-00000.h5", "shard-00001.h5", "shard-00002.h5"]
    cols = load_all(cfg, FLIP + ["features"])
    samples = list_split(cfg.data, "val")
    np.testing.assert_array_equal(cols["index"], np.arange(15))
    np.testing.assert_array_equal(cols["label"], samples.labels)
    rows = [0, 5, 7, 13, 14]
    ref, net = reference(cfg, rows)
    logits = cols["logits"][rows].astype(np.float32)
    np.testing.assert_allclose(logits, ref, rtol=2e-3, atol=2e-3)
    # the check can fail: each row is far from every other row's output
    gaps = [np.abs(ref[a] - ref[b]).max() for a in range(len(rows)) for b in range(a)]
    assert min(gaps) > 20 * 2e-3
    flip_ref, _ = reference(cfg, rows, flip=True)
    np.testing.assert_allclose(cols["logits_flip"][rows].astype(np.float32), flip_ref,
                               rtol=2e-3, atol=2e-3)
    # derived columns follow the float32 logits
    probs = torch.from_numpy(ref).softmax(-1).numpy()
    labels = samples.labels[rows]
    np.testing.assert_array_equal(cols["pred"][rows], ref.argmax(1))
    np.testing.assert_array_equal(cols["correct"][rows], ref.argmax(1) == labels)
    np.testing.assert_allclose(cols["p_true"][rows], probs[np.arange(len(rows)), labels], atol=1e-4)
    np.testing.assert_allclose(cols["p_max"][rows], probs.max(1), atol=1e-4)
    assert cols["logits"].dtype == np.float16 and cols["p_true"].dtype == np.float32
    # pooled pre-logit features: the classifier head maps them back onto the logits
    feats = torch.from_numpy(cols["features"][rows].astype(np.float32))
    with torch.inference_mode():
        head = net.get_classifier()(feats).numpy()
    np.testing.assert_allclose(head, ref, rtol=1e-2, atol=1e-2)


def test_cpu_gpu_and_mixed_decoding_agree(tree, tiny_extract, tmp_path):
    """--decode gpu/mixed run their real code path on the CPU device here (batched decode_jpeg in
    the main process, grouped resize); non-baseline files take the CPU path in the workers."""
    from PIL import Image

    d = tree / "val" / imagenet_synsets()[1]
    img = Image.open(d / f"{imagenet_synsets()[1]}_0.JPEG")
    img.save(d / "progressive.JPEG", progressive=True, quality=90)
    img.convert("L").save(d / "grey.JPEG")
    img.save(d / "png.png")
    # row 8: headers and EOI intact (so it goes to the device decoder), Huffman table broken
    bad = d / f"{imagenet_synsets()[1]}_2.JPEG"
    data = bytearray(bad.read_bytes())
    dht = data.find(b"\xff\xc4")
    data[dht + 5: dht + 20] = b"\xff" * 15
    bad.write_bytes(bytes(data))
    with pytest.raises(BadImageError, match=rf"cannot decode {bad} \(row 8\)"):
        extract(tiny_extract(tree, out=tmp_path / "strict", decode="gpu"))
    (d / f"{imagenet_synsets()[1]}_3.JPEG").write_bytes(b"not an image")  # row 9: CPU path
    caches = {}
    for mode in ("cpu", "gpu", "mixed"):
        cfg = tiny_extract(tree, out=tmp_path / mode, decode=mode, skip_bad=True, shuffle_seed=1)
        summary = extract(cfg)
        assert summary["rows"] == 18 and summary["bad_rows"] == 2
        assert [r["index"] for r in ClassifierCache.open(cfg.out).bad_rows()] == [8, 9]
        caches[mode] = load_all(cfg)
        assert ClassifierCache.open(cfg.out).identity["decode"] == mode
    for mode in ("gpu", "mixed"):  # same decoder on the CPU; the batched float resize rounds
        # +-1 where the CPU path's fixed-point uint8 resize differs (pipeline/data/resize.py)
        assert_same_cache(caches["cpu"], caches[mode], ["index", "label", "valid"])
        diff = np.abs(caches[mode]["logits"].astype(np.float32) -
                      caches["cpu"]["logits"].astype(np.float32))
        assert diff.max() < 0.01  # other rows' outputs differ by > 0.04 (first test)


def test_resume_after_a_failed_run_gives_the_identical_cache(tree, tiny_extract, tmp_path):
    full = tiny_extract(tree, out=tmp_path / "full", shuffle_seed=5)
    extract(full)
    broken = tmp_path / "broken"
    shutil.copytree(tree, broken)
    samples = list_split(str(broken), "val")
    victim = samples.path(8)  # in shard 1 (rows 6..11)
    good = victim.read_bytes()
    victim.write_bytes(good[: len(good) // 2])
    cfg = tiny_extract(broken, out=tmp_path / "resumed", shuffle_seed=5)
    with pytest.raises(BadImageError, match=r"row 8") as info:
        extract(cfg)
    assert str(victim) in str(info.value)
    assert shards_of(cfg.out) == ["shard-00000.h5"]  # completed work kept
    assert not (cfg.out / MANIFEST_FILE).exists() and (cfg.out / IDENTITY_FILE).exists()
    assert not list(cfg.out.glob(".*tmp*"))
    kept = (cfg.out / "shard-00000.h5").stat()
    victim.write_bytes(good)
    summary = extract(cfg)
    assert summary["computed_rows"] == 9  # shards 1 and 2 only
    after = (cfg.out / "shard-00000.h5").stat()
    assert (after.st_ino, after.st_mtime_ns) == (kept.st_ino, kept.st_mtime_ns)
    assert_same_cache(load_all(full), load_all(cfg), BASE)
    # a lost shard (and manifest) is recomputed alone, identically
    (cfg.out / "shard-00001.h5").unlink()
    (cfg.out / MANIFEST_FILE).unlink()
    assert extract(cfg)["computed_rows"] == 6
    assert_same_cache(load_all(full), load_all(cfg), BASE)
    assert extract(cfg)["already_complete"]


def test_skip_bad_records_rows_without_shifting(tree, tiny_extract, tmp_path):
    clean = tiny_extract(tree, out=tmp_path / "clean")
    extract(clean)
    samples = list_split(str(tree), "val")
    truncated, garbage = samples.path(4), samples.path(10)
    truncated.write_bytes(truncated.read_bytes()[:300])
    garbage.write_bytes(b"\x00" * 64)
    strict = tiny_extract(tree, out=tmp_path / "strict")
    with pytest.raises(BadImageError, match=r"row 4"):
        extract(strict)
    assert not (strict.out / MANIFEST_FILE).exists()
    cfg = tiny_extract(tree, out=tmp_path / "skip", skip_bad=True)
    summary = extract(cfg)
    assert summary["bad_rows"] == 2 and summary["valid_rows"] == 13
    cache = ClassifierCache.open(cfg.out)
    assert cache.bad_rows() == [{"index": 4, "path": str(truncated)},
                                {"index": 10, "path": str(garbage)}]
    a, b = load_all(clean), load_all(cfg)
    bad = np.array([4, 10])
    ok = np.setdiff1d(np.arange(15), bad)
    np.testing.assert_array_equal(b["valid"][bad], 0)
    assert not b["logits"][bad].any() and not b["p_true"][bad].any() and not b["correct"][bad].any()
    np.testing.assert_array_equal(b["label"], a["label"])  # labels are still the true labels
    np.testing.assert_allclose(b["logits"][ok].astype(np.float32), a["logits"][ok].astype(np.float32),
                               rtol=1e-3, atol=1e-3)
    np.testing.assert_array_equal(b["pred"][ok], a["pred"][ok])
    acc = b["correct"][ok].mean()
    assert summary["accuracy"] == pytest.approx(acc)
    # without --skip-bad the same directory is another cache (strict runs never mix with it)
    assert cache.identity["num_rows"] == 15


@pytest.mark.parametrize("change, attribute", [
    (dict(model_kwargs={**TINY_VIT[1], "depth": 1}), "model_kwargs"),
    (dict(classifier="resnet10t", model_kwargs={}), "model"),
    (dict(preprocess="paper"), "preprocess"),
    (dict(precision="bf16"), "precision"),
    (dict(flip_view=True), "flip_view"),
])
def test_foreign_cache_is_refused_naming_the_attribute(tree, tiny_extract, change, attribute):
    extract(tiny_extract(tree))
    cfg = tiny_extract(tree, **change)
    before = {p.name: p.stat().st_mtime_ns for p in cfg.out.iterdir()}
    with pytest.raises(CacheMismatch, match=rf"\b{attribute}: cache has"):
        extract(cfg)
    assert {p.name: p.stat().st_mtime_ns for p in cfg.out.iterdir()} == before


def test_foreign_dataset_and_schema_version_are_refused(tree, tiny_extract, tmp_path):
    cfg = tiny_extract(tree)
    extract(cfg)
    other = make_imagenet_tree(tmp_path / "other", list(imagenet_synsets()[:3]), per_class=4,
                               splits=("val",))
    with pytest.raises(CacheMismatch, match=r"dataset_fingerprint: cache has"):
        extract(tiny_extract(other))
    ident = (cfg.out / IDENTITY_FILE).read_text().replace('"schema_version": 1', '"schema_version": 0')
    (cfg.out / IDENTITY_FILE).write_text(ident)
    with pytest.raises(CacheMismatch, match=r"schema version 0"):
        extract(cfg)


def test_reader_checks_identity_and_completeness(tree, tiny_extract):
    from cache.schema import CacheError

    cfg = tiny_extract(tree)
    extract(cfg)
    fp = list_split(cfg.data, "val").fingerprint
    cache = ClassifierCache.open(cfg.out, expect={"dataset_fingerprint": fp, "split": "val",
                                                  "model": "vit_tiny_patch16_224"})
    assert cache.num_rows == 15 and cache.identity["num_classes"] == 1000
    data = cache.load(["p_true", "correct"])
    assert set(data) == {"index", "p_true", "correct"} and data["p_true"].shape == (15,)
    with pytest.raises(CacheMismatch, match=r"split: cache has \"val\", expected \"train\""):
        ClassifierCache.open(cfg.out, expect={"split": "train"})
    with pytest.raises(CacheError, match=r"no column\(s\) \['features'\].*--features"):
        cache.load(["features"])
    (cfg.out / MANIFEST_FILE).unlink()
    with pytest.raises(CacheError, match="incomplete"):
        ClassifierCache.open(cfg.out)


@pytest.mark.parametrize("mode, pct", [("center", 0.875), ("squash", 0.9), ("center", 1.0)])
def test_preprocessing_matches_timms_eval_transform(tmp_path, mode, pct):
    """Our uint8 resize/crop + device normalisation ~= timm's PIL transform (antialias rounding)."""
    import timm.data
    from PIL import Image

    from pipeline.core.models import DataConfig
    rng = np.random.default_rng(0)
    smooth = rng.integers(0, 256, (12, 16, 3)).astype(np.uint8)
    img = Image.fromarray(smooth).resize((160, 120), Image.BICUBIC)  # photo-like, not noise
    img.save(tmp_path / "x.png")
    cfg = DataConfig((3, 64, 64), "bicubic", pct, mode, (0.5, 0.4, 0.3), (0.2, 0.25, 0.3))
    ours = GpuNormalize(cfg, torch.device("cpu"), channels_last=False)(
        ResizeCrop(cfg)(decode_file(str(tmp_path / "x.png")))[None])[0]
    tf = timm.data.create_transform(input_size=cfg.input_size, interpolation="bicubic",
                                    crop_pct=pct, crop_mode=mode, mean=cfg.mean, std=cfg.std)
    theirs = tf(Image.open(tmp_path / "x.png").convert("RGB"))
    assert ours.shape == theirs.shape
    diff = (ours - theirs).abs() * torch.tensor(cfg.std).view(3, 1, 1) * 255  # in grey levels
    assert diff.mean() < 1.0 and diff.max() < 12
