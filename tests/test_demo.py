"""`cli.py demo`: the plan of commands, and a fast real run (a Fashion-MNIST subset, one seed, part
of the grid) whose outputs are checked: caches, runs, oracle outputs aligned with the caches,
report tables with every row and metrics in range, figures; then the bare commands find the
demo's work complete."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cache.outputs import read_outputs
from cache.reader import ClassifierCache
from conftest import ROOT
from fmnist_subset import write_fmnist_subset
from oracle_fixtures import run_cli
from pipeline.core.presets import DEMO, EMBEDDED_ORACLE

RANGE_METRICS = ("fpr95", "aupr_err", "aupr_succ", "auc", "tpr", "tnr")


def test_plan_is_the_documented_grid():
    default = run_cli(["demo", "--dry-run"]).output.splitlines()
    full = run_cli(["demo", "--dry-run", "--full"]).output.splitlines()
    trains = [l for l in full if " train-oracle " in l and "--head-only" not in l]
    heads = [l for l in full if " train-oracle --head-only --classifier " in l]
    scorers = [l for l in full if " train-oracle --head-only --head-arch confidnet " in l]
    per_seed = len(DEMO["classifiers"]) * len(DEMO["oracles"]) * (
        len(DEMO["losses"]) + len(DEMO["broadcast_losses"]))
    assert per_seed == 24 and len(trains) == len(heads) == 3 * per_seed
    assert [h.replace(" --head-only", "") for h in heads] == trains    # the same grid, head-only
    # ConfidNet's head on each classifier's own features, plain and stacked, every loss, 3 seeds
    assert len(scorers) == 3 * 2 * 2 * len(DEMO["losses"]) and DEMO["head_seeds"] == 3
    assert all("--classifier vit --oracle vit" in l or "--classifier resnet --oracle resnet" in l
               for l in scorers)
    assert sum("--head-inputs stacked" in l for l in scorers) == len(scorers) // 2
    # the default: fine-tuned pairs with O = C only, one seed; the linear head-only grid with one
    # seed; ConfidNet's head 3 seeds and the stacked one 1 seed, of TCP and SS only
    default_trains = [l for l in default if " train-oracle " in l and "--head-only" not in l]
    assert DEMO["default_broadcast_losses"] == () and not any(
        "--authors-broadcast" in l for l in default)          # the broadcasting variant: --full
    assert len(default_trains) == 2 * len(DEMO["losses"])
    default_heads = [l for l in default if " train-oracle --head-only --classifier " in l]
    assert len(default_heads) == len(DEMO["classifiers"]) * len(DEMO["oracles"]) * len(
        DEMO["losses"])
    assert all("--classifier vit --oracle vit" in l or "--classifier resnet --oracle resnet" in l
               for l in default_trains) and DEMO["seeds"] == 1
    default_scorers = [l for l in default if "--head-arch confidnet" in l]
    assert DEMO["scorer_losses"] == ("tcp", "ss") and len(default_scorers) == 2 * 2 * (3 + 1)
    assert not any(f"--loss {l} " in s for s in default_scorers for l in ("ce", "focal"))
    assert sum("--head-inputs stacked" in l for l in default_scorers) == 2 * 2
    assert len(default) == (len(full) - 3 * per_seed + len(default_trains) - 3 * per_seed
                            + len(default_heads) - len(scorers) + len(default_scorers))
    assert all("--eval-split test-gaussian_noise-5" in l for l in trains + heads + scorers)
    assert sum("--authors-broadcast" in l for l in trains) == 3 * 8
    assert len(set(trains)) == len(trains) and len(set(scorers)) == len(scorers)   # no run twice
    assert full[-2] == ("python cli.py sweep --classifier vit --oracle vit --cache "
                        "artifacts/fashion-mnist/cache")
    assert [l.split(" --split ")[0] for l in full[-4:-2]] == [
        "python cli.py predict --run RUN_DIR --data artifacts/fashion-mnist/adversarial"] * 2
    no_head = run_cli(["demo", "--dry-run", "--no-head-only"]).output.splitlines()
    assert len(no_head) == len(default) - len(default_heads) - len(default_scorers) - 1
    assert not any("--head-only" in l or " sweep " in l or " --features" in l for l in no_head)
    assert full[:2] == ["python cli.py fit-classifier --classifier vit",
                        "python cli.py fit-classifier --classifier resnet"]
    assert ("python cli.py extract --classifier resnet --split train --split test --flip-view "
            "--features") in full
    # MC-Dropout passes on the vit's evaluated splits only (presets.DEMO["mc_dropout"])
    mc = [l for l in full if "--mc-dropout 10 --mc-dropout-rate 0.1" in l]
    assert len(mc) == 3 and all(" extract --classifier vit " in l for l in mc)
    assert "python cli.py extract --classifier vit --split train --flip-view --features" in full
    assert full[-1] == "python cli.py report --runs-root artifacts/fashion-mnist/runs"
    # commands carry no hyperparameters: they come from presets.py, as for the bare commands
    assert not any(opt in l for l in full for opt in ("--lr", "--batch-size", "--epochs"))
    assert run_cli(["demo", "--dry-run", "--seeds", "2", "--full"], expect=2).exit_code == 2
    assert run_cli(["demo", "--dry-run", "--pairs", "same", "--full"], expect=2).exit_code == 2
    assert "not one of" in run_cli(["demo", "--dry-run", "--losses", "ce,bce"], expect=2).output


def test_a_machine_of_several_gpus_runs_the_short_stages_side_by_side_too():
    from pipeline.demo.run import PARALLEL_STAGES, _batch, parallel_stages
    from pipeline.demo.steps import Step

    assert parallel_stages(0) == parallel_stages(1) == PARALLEL_STAGES
    assert {"extract", "head-only", "predict"} <= set(parallel_stages(2))
    steps = [Step(stage, (stage, str(k)), f"{stage} {k}") for k, stage in enumerate(
        ["extract"] * 3 + ["attack"] * 2 + ["extract"])]
    assert [len(_batch(list(steps), 0, jobs, parallel_stages(gpus)))
            for jobs, gpus in ((4, 2), (2, 2), (4, 1), (1, 2))] == [3, 2, 1, 1]
    assert [s.label for s in _batch(list(steps), 3, 4, parallel_stages(0))] == [
        "attack 3", "attack 4"]


# The demo as `cli.py demo` runs it, but its scheduler told of two GPUs (on a CPU machine every
# step still runs on the CPU): the extractions, head-only runs and predictions then run side by
# side as subprocesses, each given a device of its own; test_demo_pretrained.py's run takes the
# one-device path (those steps one after the other, the head-only runs and predictions in the
# demo's process).
TWO_GPUS = ("import sys; sys.path.insert(0, {root!r}); import pipeline.demo.run as r; "
            "r.visible_gpus = lambda: ['0', '1']; sys.argv[0] = 'cli.py'; import cli; cli.main()")


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("demo")
    data = write_fmnist_subset(tmp / "fmnist-small", n_train=13_000, n_test=1_000)  # train = 1,000 rows
    args = [sys.executable, "-c", TWO_GPUS.format(root=str(ROOT)), "demo", "--data", str(data),
            "--classifiers", "vit", "--oracles", "vit,resnet", "--losses", "ss",
            "--broadcast-losses", "ce", "--fit-args", "--max-samples 1000 --epochs 1",
            "--train-args", "--epochs 1", "--no-progress", "--jobs", "2"]   # the 2 fine-tuned runs at once
    proc = subprocess.run(args, cwd=tmp, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"tmp": tmp, "data": data, "art": tmp / "artifacts" / "fmnist-small",
            "stdout": proc.stdout}


@pytest.mark.slow  # the module's demo run: 15 cli.py processes on 2 cores (9 took ~50 s)
def test_demo_prints_commands_and_the_main_table(demo_run):
    out = demo_run["stdout"]
    log = json.loads((demo_run["art"] / "demo.json").read_text())
    # extract: vit's train, then its test and shifted copy with MC-Dropout; resnet's train +
    # test, shifted.  Fine-tuned: <vit, vit> only (pairs O = C).  Head-only: the linear grid of
    # both oracles, ConfidNet's head (3 seeds) and the stacked one (1) on vit's own features, SS.
    # Every run then scored on the adversarial copy.
    assert [s["stage"] for s in log["steps"]] == ["fit"] * 2 + ["extract"] * 5 + [
        "attack", "extract"] + ["train"] * 2 + ["head-only"] * 8 + ["predict"] * 10 + [
        "sweep", "report"]
    assert not log["failed"] and all(s["returncode"] == 0 for s in log["steps"])
    for step in log["steps"]:
        assert f"$ {step['command']}" in out
    # two at a time (--jobs 2), every stage but the sweep and the report (one step each)
    stage = {s["label"]: s["stage"] for s in log["steps"]}
    side_by_side = [stage[line.split(": ", 1)[1]] for line in out.splitlines()
                    if "] done in " in line]
    assert sorted(set(side_by_side)) == ["extract", "fit", "head-only", "predict", "train"]
    assert side_by_side.count("head-only") == 8 and side_by_side.count("predict") == 10
    assert "demo finished: 31 commands" in out
    assert "python cli.py train-oracle --classifier vit --oracle vit" in out    # the sweep's choice
    assert "report: artifacts/fmnist-small/report/report.md (splits test, test-gaussian_noise-5" in out
    assert "### Trust metrics — paper definitions" in out and "| ⟨vit, vit⟩ | CE (broadcast) |" in out


def test_demo_caches_and_runs(demo_run):
    art = demo_run["art"]
    for tag, corruption in (("train", "none"), ("test", "none"),
                            ("test-gaussian_noise-5", "gaussian_noise:5:seed0")):
        cache = ClassifierCache.open(art / "cache" / "vit" / tag)
        assert cache.num_rows == 1000 and cache.identity["flip_view"]
        assert cache.identity["corruption"] == corruption
    clean = ClassifierCache.open(art / "cache" / "vit" / "test").manifest["summary"]["accuracy"]
    noisy = ClassifierCache.open(art / "cache" / "vit" / "test-gaussian_noise-5"
                                 ).manifest["summary"]["accuracy"]
    assert 0.3 < clean < 0.95 and noisy < clean                # a realistic share of errors, a shift
    assert ClassifierCache.open(art / "cache" / "vit" / "test").identity["mc_dropout"][
        "passes"] == DEMO["mc_dropout"]["passes"]
    assert "mc_dropout" not in ClassifierCache.open(art / "cache" / "vit" / "train").identity
    runs = sorted((art / "runs").iterdir())
    assert sorted(r.name.rsplit("_", 1)[0] for r in runs) == sorted(
        [f"vit-vit_{loss}_seed0" for loss in ("ce_broadcast", "ss")]
        + [f"{o}-vit_{loss}_head-only_seed0" for o in ("vit", "resnet")
           for loss in ("ce_broadcast", "ss")]
        + [f"vit-vit_ss_head-only_confidnet_seed{s}" for s in range(3)]
        + ["vit-vit_ss_head-only_confidnet_stacked_seed0"])
    for run in runs:
        record = json.loads((run / "run.json").read_text())
        cfg = record["run"]["config"]
        assert record["status"] == "complete" and record["protocol"]["preset"].endswith("EMBEDDED_ORACLE")
        assert (cfg["lr"], cfg["momentum"], cfg["batch_size"], cfg["precision"]) == tuple(
            EMBEDDED_ORACLE[k] for k in ("lr", "momentum", "batch_size", "precision"))
        # --train-args override the fine-tuned runs only
        assert cfg["epochs"] == (EMBEDDED_ORACLE["epochs"] if cfg["head_only"] else 1)
        for tag in ("test", "test-gaussian_noise-5"):
            check_outputs_aligned(run / "outputs" / f"{tag}.h5", art / "cache" / "vit" / tag)
        # predict: every run, fine-tuned or head-only, on its classifier's adversarial copy
        check_outputs_aligned(run / "outputs" / "test-pgd_linf.h5",
                              art / "cache" / "vit" / "test-pgd_linf-vit")
    adv = ClassifierCache.open(art / "cache" / "vit" / "test-pgd_linf-vit")
    attack = json.loads((art / "adversarial" / "test-pgd_linf-vit" / ".attack" / "manifest.json"
                         ).read_text())["summary"]
    assert adv.num_rows == attack["rows"] == 1000
    assert attack["clean_accuracy"] == pytest.approx(clean, abs=0.01)   # fp32 here, bf16 there
    assert attack["stored_accuracy"] < 0.75 * clean                       # the attack works...
    # ...and extract sees the stored pixels (both fp32; batches differ: a row at most may flip)
    assert adv.manifest["summary"]["accuracy"] == pytest.approx(attack["stored_accuracy"],
                                                                abs=0.0015)


def check_outputs_aligned(path, cache_dir):
    out = read_outputs(path).columns
    cache = ClassifierCache.open(cache_dir).load(["index", "label", "pred", "correct", "valid"])
    for name in ("index", "label", "pred", "correct", "valid"):
        np.testing.assert_array_equal(out[name], cache[name], err_msg=f"{path}: {name}")
    conf = out["confidence"]
    assert np.isfinite(out["z"]).all() and ((conf >= 0) & (conf <= 1)).all()
    np.testing.assert_allclose(conf, 1 / (1 + np.exp(-out["z"].astype(np.float64))), atol=1e-6)


# every split's vit cache has features (TrustScore) and MC-Dropout's columns (rate set at test
# time only: the embedded vit has no dropout of its own)
MC = {f"MC-Dropout {s} (rate 0.1 at test time only)" for s in ("MSP", "entropy")}


def test_demo_report_has_every_row_and_sane_metrics(demo_run):
    report = demo_run["art"] / "report"
    doc = json.loads((report / "report.json").read_text())
    splits = {s["split"]: s for s in doc["splits"]}
    assert set(splits) == {"test", "test-gaussian_noise-5", "test-pgd_linf"}
    for tag, split in splits.items():
        rows = split["rows"]
        oracle = {(r["oracle"], r["loss_label"]) for r in rows if r["kind"] == "oracle"}
        assert oracle == {("vit", "SS"), ("vit", "CE (broadcast)")} | {
            (o, l) for o in ("vit", "resnet") for l in ("SS (head-only)",
                                                        "CE (broadcast, head-only)")} | {
            ("vit", "SS (head-only, ConfidNet)"), ("vit", "SS (head-only, ConfidNet, stacked)")}
        assert {r["loss_label"] for r in rows if r["kind"] == "baseline"} == {
            "MCP", "Neg. entropy", "Max logit", "Energy", "DOCTOR (D_alpha)",
            "MSP (temp. scaled)", "MaxLogit-pNorm", "REL-U", "TrustScore"} | MC
        for row in rows:
            assert row["n"] == (3 if row["loss_label"] == "SS (head-only, ConfidNet)" else 1)
            for definition in ("paper", "standard"):
                for name in RANGE_METRICS:
                    cell = row["agg"][definition].get(name)
                    if cell and cell["mean"] is not None:
                        assert 0.0 <= cell["mean"] <= 1.0, (tag, row["oc"], name, cell)
            if row["kind"] == "oracle":
                assert row["agg"]["paper"]["auc"]["mean"] is not None
        figures = split["figures"]
        # one risk-coverage plot per <O,C> (the baselines are drawn dashed on each)
        assert figures["histograms"] and len(figures["risk_coverage"]) == 2
        for path in figures["histograms"] + list(figures["risk_coverage"].values()):
            assert (report / path).stat().st_size > 1000
    text = (report / "report.md").read_text()
    for title in ("Trust metrics — paper definitions", "Trust metrics — standard definitions",
                  "Separability (paper Table A4)", "The paper's small-scale table — standard",
                  "Learned scorers − MCP"):
        assert text.count(title) == 3                            # one per split
    assert "| paper, CIFAR-10 | MCP | 92.19 | 47.50 |" in text and "|  | SS | 92.19 | 44.69 |" in text


def test_bare_commands_find_the_demo_work_complete(demo_run):
    """The demo ran the commands a user types: the same commands again (no hyperparameters,
    flip view by default) land on the same caches and run directory and skip."""
    data, tmp = str(demo_run["data"]), demo_run["tmp"]
    run = lambda *a: subprocess.run([sys.executable, str(ROOT / "cli.py"), *a, "--data", data,  # noqa: E731
                                     "--no-progress"], cwd=tmp, capture_output=True, text=True)
    extract = run("extract", "--classifier", "vit")
    assert extract.returncode == 0, extract.stderr
    assert extract.stdout.count("already complete") == 2         # train and test
    train = run("train-oracle", "--loss", "ss", "--epochs", "1")
    assert train.returncode == 0, train.stderr
    assert train.stdout.startswith("already complete") and "vit-vit_ss_seed0_" in train.stdout


def test_the_api_evaluates_the_demos_scores_as_its_report(demo_run):
    """``trust_oracles`` on the demo's own scores: each oracle run's output file, opened with
    ``open_run`` and evaluated with ``evaluate`` (the report's default bootstrap), gives every
    number the demo's report.json holds for it: each metric of both definitions, its interval."""
    from test_api_evaluation import assert_equals_report
    from trust_oracles import evaluate, open_run

    doc = json.loads((demo_run["art"] / "report" / "report.json").read_text())
    results = [r for r in doc["evaluations"] if r["kind"] == "oracle"]
    assert len(results) >= 6
    for result in results:
        scores = open_run(result["run_dir"]).scores(Path(result["source"]).stem)
        ok = scores.valid
        ev = evaluate(scores.confidence[ok], scores.correct[ok], bootstrap=1000,
                      tnr_threshold=result["tnr_threshold"]["paper"])
        assert_equals_report(ev, result)
