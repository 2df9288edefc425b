"""MC-Dropout: `extract --mc-dropout T` stores the mean-softmax summaries of T
passes with only the dropout layers active, reproducibly under the seed (also after a resume),
leaving the deterministic columns and the identity of caches without it unchanged; the report
adds its two rows where a cache has the columns.  Bad input: docs/BAD_INPUT.md."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import timm
import torch
from click.testing import CliRunner

from cache.manifest import IDENTITY_FILE, MANIFEST_FILE
from cache.reader import ClassifierCache
from cache.schema import MC_COLUMNS, CacheMismatch
from cli import cli
from conftest import TINY_RESNET, TINY_VIT, assert_error, make_imagenet_tree
from pipeline.core.metrics import evaluate
from pipeline.core.models import resolve_spec
from pipeline.data.images import BadImageError
from pipeline.data.labels import imagenet_synsets
from pipeline.data.sources import list_split
from pipeline.extract import mcdropout as mc
from pipeline.extract.run import extract
from pipeline.report import baselines as B
from pipeline.report.run import ReportConfig, report

BASE = ["index", "label", "valid", "logits", "pred", "correct", "p_true", "p_max"]
MC = list(MC_COLUMNS)


@pytest.fixture
def tree(tmp_path):
    """3 classes x 5 images = 15 rows; shard_size 6 -> shards of 6, 6, 3 rows."""
    return make_imagenet_tree(tmp_path / "imagenet", list(imagenet_synsets()[:3]), per_class=5,
                              splits=("val",))


def load(cfg, columns):
    return ClassifierCache.open(cfg.out).load(columns)


def same(a, b, columns):
    for name in columns:
        np.testing.assert_array_equal(a[name], b[name], err_msg=f"column {name}")


def test_passes_are_reproducible_under_the_seed_and_leave_the_rest_unchanged(tree, tiny_extract,
                                                                            tmp_path):
    # a weights file: --seed then changes the masks alone (with --random-init, the weights too)
    torch.manual_seed(0)
    weights = tmp_path / "w.pth"
    torch.save(timm.create_model(TINY_VIT[0], **TINY_VIT[1]).state_dict(), weights)
    fixed = dict(workers=0, weights=str(weights), random_init=False)
    plain = tiny_extract(tree, out=tmp_path / "plain", **fixed)
    extract(plain)
    runs = [tiny_extract(tree, out=tmp_path / name, mc_dropout=4, mc_dropout_rate=0.3, seed=seed,
                         **fixed) for name, seed in (("a", 0), ("b", 0), ("c", 1))]
    for cfg in runs:
        extract(cfg)
    a, b, c = (load(cfg, BASE + MC) for cfg in runs)
    same(a, b, MC)                                     # the same masks under the same seed
    same(a, c, BASE)
    assert not np.array_equal(a["mcd_msp"], c["mcd_msp"])   # other masks under another seed
    assert (a["mcd_msp"] != a["p_max"]).all() and (a["mcd_mi"] > 0).all()  # dropout was active
    assert a["mcd_msp"].dtype == np.float32 and a["mcd_mi"].dtype == np.float32
    same(load(plain, BASE), a, BASE)                   # deterministic outputs: bit-identical
    # the mean softmax's entropy is at least its max's share: H >= -log(max p)
    assert (a["mcd_entropy"] >= -np.log(a["mcd_msp"]) - 1e-5).all()
    # a cache without the option keeps its identity exactly; with it, the identity records it
    ident = ClassifierCache.open(plain.out).identity
    assert "mc_dropout" not in ident and "mcd_msp" not in ClassifierCache.open(
        plain.out).manifest["columns"]
    record = ClassifierCache.open(runs[0].out).identity
    assert {k: v for k, v in record.items() if k != "mc_dropout"} == ident
    assert record["mc_dropout"] | {"masks": None} == {
        "passes": 4, "rates": {"head_drop": 0.3}, "rate_option": 0.3, "test_time_only": True,
        "head_only": True, "seed": 0, "batch_size": 4, "masks": None}


def test_head_only_passes_equal_full_passes():
    """Dropout before the head only: the backbone once and the head T times gives the numbers of
    T full passes; dropout inside the backbone makes every pass a full one."""
    spec = resolve_spec(TINY_VIT[0], False, None, True, TINY_VIT[1])
    model, _ = mc.mc_model(spec, 0, 0.3, "--classifier vit")
    assert mc.head_only(model, (3, 32, 32))
    x = torch.randn(5, 3, 32, 32)
    with torch.inference_mode():
        head = mc.mc_columns(model, x, 4, 3, 10, torch.device("cpu"), head=True)
        full = mc.mc_columns(model, x, 4, 3, 10, torch.device("cpu"), head=False)
        other = mc.mc_columns(model, x, 4, 3, 11, torch.device("cpu"), head=True)
    for name in MC:
        torch.testing.assert_close(head[name], full[name], rtol=0, atol=1e-6)
    assert not torch.equal(head["mcd_msp"], other["mcd_msp"])   # masks seeded by the first row
    inner = resolve_spec(TINY_VIT[0], False, None, True, {**TINY_VIT[1], "proj_drop_rate": 0.1})
    assert not mc.head_only(mc.mc_model(inner, 0, None, "--classifier vit")[0], (3, 32, 32))
    resnet = resolve_spec(TINY_RESNET[0], False, None, True, TINY_RESNET[1])
    assert mc.head_only(mc.mc_model(resnet, 0, 0.2, "--classifier resnet")[0], (3, 64, 64))


def test_rate_0_equals_the_deterministic_output_and_batchnorm_stays_in_eval(tree, tiny_extract,
                                                                           tmp_path):
    for model in (TINY_VIT, TINY_RESNET):
        cfg = tiny_extract(tree, out=tmp_path / model[0], model=model, workers=0, mc_dropout=3,
                           mc_dropout_rate=0.0)
        extract(cfg)
        cols = load(cfg, BASE + MC)
        # resnet: a BatchNorm in training mode would normalise by the batch's statistics
        np.testing.assert_allclose(cols["mcd_msp"], cols["p_max"], rtol=0, atol=1e-6)
        np.testing.assert_allclose(cols["mcd_mi"], 0, atol=1e-5)
    # with a rate, only the dropout runs in training mode: BatchNorm keeps eval and its statistics
    spec = resolve_spec(TINY_RESNET[0], False, None, True, TINY_RESNET[1])
    model, rates = mc.mc_model(spec, 0, 0.5, "--classifier resnet10t")
    assert rates["rates"] == {"": 0.5} and rates["test_time_only"]
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    before = [m.running_mean.clone() for m in norms]
    seen = []
    for m in norms:
        m.register_forward_pre_hook(lambda mod, _: seen.append(mod.training))
    x = torch.randn(4, 3, 64, 64)
    with torch.inference_mode():
        out = mc.mc_columns(model, x, 3, 0, 0, torch.device("cpu"))
        plain = model(x).softmax(-1).max(-1).values
    assert len(seen) == 4 * len(norms) and not any(seen)
    assert all(torch.equal(m.running_mean, r) for m, r in zip(norms, before))
    assert not model.training and not torch.allclose(out["mcd_msp"], plain)


def test_resume_after_a_failed_run_gives_identical_columns(tree, tiny_extract, tmp_path):
    """A run stopped after its first shard, resumed, and a lost shard recomputed alone (what a
    rank of a torchrun extract does) give the columns of one uninterrupted run."""
    options = dict(mc_dropout=3, mc_dropout_rate=0.25, seed=7)
    full = tiny_extract(tree, out=tmp_path / "full", **options)
    extract(full)
    broken = tmp_path / "broken"
    shutil.copytree(tree, broken)
    victim = list_split(str(broken), "val").path(8)   # in shard 1 (rows 6..11)
    good = victim.read_bytes()
    victim.write_bytes(good[: len(good) // 2])
    cfg = tiny_extract(broken, out=tmp_path / "resumed", **options)
    with pytest.raises(BadImageError, match=r"row 8"):
        extract(cfg)
    assert sorted(p.name for p in cfg.out.glob("shard-*.h5")) == ["shard-00000.h5"]
    victim.write_bytes(good)
    assert extract(cfg)["computed_rows"] == 9
    same(load(full, BASE + MC), load(cfg, BASE + MC), BASE + MC)
    (cfg.out / "shard-00001.h5").unlink()
    (cfg.out / MANIFEST_FILE).unlink()
    assert extract(cfg)["computed_rows"] == 6
    same(load(full, BASE + MC), load(cfg, BASE + MC), BASE + MC)


def test_another_t_rate_or_no_mc_on_an_mc_cache_is_refused_naming_the_attribute(tree,
                                                                                tiny_extract):
    cfg = tiny_extract(tree, workers=0, mc_dropout=2, mc_dropout_rate=0.2)
    extract(cfg)
    for change in (dict(mc_dropout=3), dict(mc_dropout_rate=0.1)):
        other = tiny_extract(tree, workers=0, **{**dict(mc_dropout=2, mc_dropout_rate=0.2),
                                                 **change})
        with pytest.raises(CacheMismatch, match=r"mc_dropout: cache has"):
            extract(other)
    assert extract(cfg)["already_complete"]


def test_a_plain_extract_takes_a_complete_mc_cache_and_refuses_an_incomplete_one(tree,
                                                                                tiny_extract):
    """Without --mc-dropout, a complete cache extracted with it is complete (the deterministic
    outputs are the same; the demo's bare `extract` finds its MC caches so); an incomplete one is
    refused, since the shards still to write would lack the columns."""
    mc = tiny_extract(tree, workers=0, mc_dropout=2, mc_dropout_rate=0.2)
    extract(mc)
    manifest = (mc.out / MANIFEST_FILE).read_bytes()
    plain = tiny_extract(tree, workers=0)
    result = extract(plain)
    assert result["already_complete"] and "MC-Dropout columns are kept" in result["notes"][0]
    assert (mc.out / MANIFEST_FILE).read_bytes() == manifest
    assert ClassifierCache.open(mc.out).identity["mc_dropout"]["passes"] == 2
    (mc.out / MANIFEST_FILE).unlink()          # as if the MC extract had stopped midway
    with pytest.raises(CacheMismatch, match=r"mc_dropout: cache has"):
        extract(plain)


TINY = ["--classifier", TINY_VIT[0], "--model-kwargs", json.dumps(TINY_VIT[1]), "--random-init",
        "--device", "cpu", "--precision", "fp32", "--workers", "0", "--batch-size", "4",
        "--shard-size", "6", "--split", "val", "--no-progress"]


def test_bad_options_and_a_model_without_dropout_are_refused(tree, tmp_path):
    def run(*args):
        return CliRunner().invoke(cli, ["extract", *TINY, "--data", str(tree), "--out",
                                        str(tmp_path / "c"), *map(str, args)])
    for t in (0, 1):
        assert_error(run("--mc-dropout", t), r"Invalid value for '--mc-dropout': .* x>=2", 2)
    for rate in (1, -0.1, 1.5, "nan"):
        assert_error(run("--mc-dropout", 2, "--mc-dropout-rate", rate),
                     r"Invalid value for '--mc-dropout-rate'", 2)
    assert_error(run("--mc-dropout-rate", 0.1), r"--mc-dropout-rate sets the rate of "
                 r"--mc-dropout T's passes: give --mc-dropout T", 2)
    result = run("--mc-dropout", 5)
    assert_error(result, r"error: --classifier vit_tiny_patch16_224 \(random init\): timm model "
                 r"vit_tiny_patch16_224 has no active dropout layer .* Give --mc-dropout-rate R")
    assert not (tmp_path / "c").exists()   # refused before the cache folder is claimed
    # the model's own dropout (proj_drop_rate) needs no rate
    kwargs = json.dumps({**TINY_VIT[1], "proj_drop_rate": 0.1})
    result = CliRunner().invoke(cli, ["extract", *TINY, "--model-kwargs", kwargs, "--data",
                                      str(tree), "--out", str(tmp_path / "own"),
                                      "--mc-dropout", "2"])
    assert result.exit_code == 0, result.output
    ident = ClassifierCache.open(tmp_path / "own" / TINY_VIT[0] / "val").identity["mc_dropout"]
    assert ident["rate_option"] is None and not ident["test_time_only"]
    # per block: attn.proj_drop, mlp.drop1, mlp.drop2
    assert set(ident["rates"].values()) == {0.1} and len(ident["rates"]) == 2 * 3
    assert B.baseline_label("mcd_msp", {"mc_dropout": ident}) == "MC-Dropout MSP"


def test_the_report_shows_the_rows_where_the_columns_exist(tree, tiny_extract, tmp_path):
    # a 3-class classifier: right on some rows (a metric needs both kinds)
    three = (TINY_VIT[0], {**TINY_VIT[1], "num_classes": 3})
    with_mc = tiny_extract(tree, out=tmp_path / "cache" / "mc" / "val", workers=0, mc_dropout=3,
                           mc_dropout_rate=0.3, model=three)
    without = tiny_extract(tree, out=tmp_path / "cache" / "plain" / "val", workers=0, model=three)
    extract(with_mc)
    extract(without)
    report(ReportConfig(caches=(str(with_mc.out), str(without.out)), out=str(tmp_path / "r"),
                        figures=False, resamples=0, jobs=1, formats=("json", "md")))
    doc = json.loads((tmp_path / "r" / "report.json").read_text())
    rows = [e for e in doc["evaluations"] if e["kind"] == "baseline"]
    labels = {c: {e["labels"]["loss_label"] for e in rows if e["cache"] == c}
              for c in {e["cache"] for e in rows}}
    mc_labels = {"MC-Dropout MSP (rate 0.3 at test time only)",
                 "MC-Dropout entropy (rate 0.3 at test time only)"}
    assert labels[str(with_mc.out)] - labels[str(without.out)] == mc_labels
    assert not any(label.startswith("MC-Dropout") for label in labels[str(without.out)])
    cols = load(with_mc, ["correct", "mcd_msp", "mcd_entropy"])
    # the rows score the deterministic prediction's correctness with the cached columns
    auc = {e["labels"]["loss"]: e for e in rows if e["cache"] == str(with_mc.out)}
    assert 0 < cols["correct"].sum() < len(cols["correct"])
    for name, score in (("mcd_msp", cols["mcd_msp"]), ("mcd_entropy", -cols["mcd_entropy"])):
        want = evaluate(score, cols["correct"].astype(bool), "standard")["values"]["auc"]
        assert auc[name]["metrics"]["standard"]["values"]["auc"] == pytest.approx(want), name
    md = (tmp_path / "r" / "report.md").read_text()
    assert "MC-Dropout MSP (rate 0.3 at test time only)" in md


def test_baseline_scores_read_the_mc_columns():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(50, 4)).astype(np.float16)
    cols = {"mcd_msp": rng.random(50).astype(np.float32),
            "mcd_entropy": rng.random(50).astype(np.float32)}
    s = B.baseline_scores(logits, chunk_rows=16, params={"ts": 1.5, "pnorm": 2}, columns=cols)
    # every logit/column baseline whose parameter was given (not REL-U's matrix)
    assert set(s) == set(B.LOGIT_BASELINES) - {"relu"}
    np.testing.assert_array_equal(s["mcd_msp"], cols["mcd_msp"])
    np.testing.assert_array_equal(s["mcd_entropy"], -cols["mcd_entropy"])
    assert set(B.baseline_scores(logits)) == {"mcp", "entropy", "maxlogit", "energy", "doctor"}
    assert B.available(B.BASELINES, ["logits"]) == B.BASELINES[:9]   # the MC ones come last


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_passes_are_reproducible_and_leave_the_rest_unchanged(tree, tiny_extract, tmp_path):
    """On the GPU the masks come from the device's generator, forked and seeded per batch too."""
    on = dict(workers=0, device="cuda", precision="bf16")
    plain = tiny_extract(tree, out=tmp_path / "plain", **on)
    extract(plain)
    runs = [tiny_extract(tree, out=tmp_path / n, mc_dropout=4, mc_dropout_rate=0.3, **on)
            for n in ("a", "b")]
    for cfg in runs:
        extract(cfg)
    a, b = (load(cfg, BASE + MC) for cfg in runs)
    same(a, b, MC)
    same(load(plain, BASE), a, BASE)
    assert (a["mcd_mi"] > 0).all()
