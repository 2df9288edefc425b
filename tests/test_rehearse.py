"""bench/rehearse_imagenet.py rehearses docs/IMAGENET.md (tiny on the CPU here: every step
measured and projected), refuses a disk too small, a foreign --out and steps without their
prerequisites before writing anything; bench/runbook_table.py's output is what the docs say, and
it never puts a CPU/tiny measurement (the fixtures of bench/results/fixtures/) into them."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import pytest

from bench import rehearse_imagenet, rehearse_plan, runbook_table
from bench.rehearse_shim import added_options, train_rate
from conftest import ROOT

FIXTURES = ROOT / "bench" / "results" / "fixtures"
TINY = ["--tiny", "--train", "150", "--val", "40", "--classes", "10", "--procs", "2",
        "--set", "CLASSIFIERS=vit", "--set", "ORACLES=vit", "--attack-rows", "20"]


def refused(capsys, argv) -> str:
    assert rehearse_imagenet.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    return err


@pytest.mark.slow  # ~80 s on the shared 2-core machine: 17 cli.py processes, each importing torch
def test_a_tiny_rehearsal_measures_and_projects_every_step(tmp_path):
    """In two calls, as on a device whose commands are capped at 10 minutes: --keep, then
    --continue with the remaining steps; the second JSON holds every step of both."""
    out, report = tmp_path / "rehearsal", tmp_path / "r.json"
    script = [sys.executable, str(ROOT / "bench" / "rehearse_imagenet.py"), "--out", str(out),
              *TINY]
    first = subprocess.run([*script, "--keep", "--steps", "extract,train,report", "--json",
                            str(tmp_path / "first.json")], capture_output=True, text=True,
                           timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert (out / "imagenet").is_dir() and (out / "runbook").is_dir()      # kept
    proc = subprocess.run([*script, "--continue", "--steps", "corrupt,attack,head-only", "--json",
                           str(report)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(report.read_text())
    measured = {(m["step"], m["model"]): m for m in result["steps"]}
    expected = {(step, "vit" if per_model else "") for step, per_model in runbook_table.STEPS}
    assert set(measured) == expected
    for m in measured.values():
        for key in ("wall_s", "rows_per_s", "full_min", "rss_peak_bytes", "full_disk_bytes"):
            assert math.isfinite(m[key]) and m[key] >= 0, (m["step"], key)
        assert m["rows"] > 0 and m["wall_s"] > 0 and m["rss_peak_bytes"] > 0
        assert m["scale"].startswith(("by ", "training by rows at "))
    # the fine-tuned run's own steady rate (its log) scales its training alone
    tuned = measured[("train-oracle (fine-tuned)", "vit")]
    assert tuned["train_img_per_s"] > 0 and "(the run's log)" in tuned["scale"]
    assert measured[("attack val", "vit")]["rows"] == 20
    assert measured[("extract train+val --flip-view", "vit")]["full_rows"] == 1_331_167
    assert result["environment"]["torch"] and result["settings"]["train"] == 150
    # the labels: the classifier's own prediction on ~90% of the rows, every file distinct
    assert 0.5 < result["generation"]["accuracy"]["vit"] < 1
    # the wrong rows cycle through the --classes wnids: every folder is there
    assert result["generation"]["folders"] >= 10
    # the grid needs resnet's steps too: no total from a partial measurement
    assert result["grid"]["total_h"] is None and "train-oracle (fine-tuned)" in result["grid"]["missing"]
    assert "| train-oracle (fine-tuned) | vit | 1 |" in proc.stdout
    assert not (out / "imagenet").exists() and not (out / "runbook").exists()    # no --keep


def test_the_docs_time_table_is_what_the_script_writes_from_the_committed_results():
    assert runbook_table.main(["--check"]) == 0
    text = (ROOT / "docs" / "IMAGENET.md").read_text()
    assert "divides by roughly" not in text
    start = text.index(runbook_table.BEGIN)        # the end marker after it: the doc has others
    block = text[start:text.index(runbook_table.END, start)]
    perf = (ROOT / "bench" / "NOTES.md").read_text()
    assert block in perf
    if not (ROOT / "bench" / "results" / "rehearsal.json").is_file():   # the table measures
        table = [l for l in block.splitlines() if l.startswith("| ") and "---" not in l][1:]
        assert table and all(l.count("not measured") == 5 for l in table), table
    for run in (ROOT / "bench" / "results").glob("ddp-*.json"):   # several GPUs: as measured
        for model, res in json.loads(run.read_text())["models"].items():
            if res["train"]:
                assert f"{res['train'][1]['img_per_s']:,.0f} img/s" in block
            else:                                                   # --extract-only
                assert f"{res['extract']['ratio']:.2f}× one GPU" in block


def test_the_table_shows_what_was_measured_and_only_that():
    r = json.loads((FIXTURES / "rehearsal-tiny.json").read_text())
    t = json.loads((FIXTURES / "bench_train-tiny.json").read_text())
    block = runbook_table.render(r, t, None)
    step = next(m for m in r["steps"] if m["step"] == "train-oracle (fine-tuned)")
    assert f"| train-oracle (fine-tuned) | vit | {step['rows_per_s']:,.0f} |" in block
    assert "| train-oracle (fine-tuned) | resnet | not measured |" in block
    assert "on one GPU: not measured" in block and "Several GPUs" in block
    assert "| train-oracle step only (bench_train.py, batch 40," in block


def test_cpu_or_tiny_measurements_never_reach_the_docs(tmp_path, capsys):
    before = {p: p.read_text() for p in runbook_table.DOCS.values()}
    assert runbook_table.main(["--rehearsal", str(FIXTURES / "rehearsal-tiny.json")]) == 1
    assert "a CPU/--tiny rehearsal is a test fixture" in capsys.readouterr().err
    assert runbook_table.main(["--train-bench", str(FIXTURES / "bench_train-tiny.json")]) == 1
    assert {p: p.read_text() for p in runbook_table.DOCS.values()} == before


def test_a_disk_too_small_is_refused_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "r"
    err = refused(capsys, ["--out", str(out), "--train", str(10**10), "--val", "1000"])
    assert f"--out {out}: the rehearsal needs ~" in err and "GB free" in err
    assert "jpegs" in err and "lower --train/--val" in err
    assert not out.exists()


def test_an_out_of_another_rehearsal_or_foreign_files_is_refused(tmp_path, capsys):
    out = tmp_path / "r"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert "is not empty and holds no rehearsal (notes.txt)" in refused(
        capsys, ["--out", str(out), *TINY])
    (out / "notes.txt").unlink()
    (out / rehearse_imagenet.SETTINGS).write_text(json.dumps(
        {"train": 99, "val": 40, "classes": 10, "right": 0.9, "seed": 0, "tiny": True,
         "grid": {"CLASSIFIERS": "vit", "PREP": "paper"}}))
    err = refused(capsys, ["--out", str(out), *TINY])
    assert "holds a rehearsal with other settings: train 99 (now 150)" in err
    assert sorted(p.name for p in out.iterdir()) == [rehearse_imagenet.SETTINGS]


def test_steps_without_their_earlier_sections_and_unknown_settings_are_refused(tmp_path, capsys):
    out = tmp_path / "r"
    assert "--steps attack needs extract,train" in refused(
        capsys, ["--out", str(out), "--steps", "attack"])
    assert "--set WEIGHTS=x: expected VAR=VALUE with VAR one of" in refused(
        capsys, ["--out", str(out), "--set", "WEIGHTS=x"])
    assert not out.exists()


def test_the_shim_adds_what_a_machine_without_the_hub_needs():
    env = {"REHEARSE_ATTACK_ROWS": "300", "REHEARSE_TRAIN_ROWS": "20000"}
    assert added_options(["extract", "--classifier", "vit"], env) == ["--random-init", "--no-progress"]
    assert added_options(["attack", "--classifier", "resnet"], env) == [
        "--random-init", "--max-samples", "300", "--no-progress"]
    assert added_options(["train-oracle", "--oracle", "vit"], env) == [
        "--random-init", "--max-samples", "20000", "--no-progress"]
    assert added_options(["train-oracle", "--head-only", "--oracle", "vit"], env) == [
        "--random-init", "--no-progress"]
    assert added_options(["extract", "--weights", "w.pth"], env) == ["--no-progress"]
    tiny = added_options(["sweep", "--oracle", "resnet"], {"REHEARSE_TINY": "/t"})
    assert tiny == ["--weights", "/t/resnet.pth", "--epochs", "1", "--batch-size", "40"]


def test_the_grid_is_given_only_when_every_part_was_measured():
    steps = json.loads((FIXTURES / "rehearsal-tiny.json").read_text())["steps"]
    partial = rehearse_plan.grid(steps)
    assert partial["total_h"] is None and partial["missing"]
    both = steps + [{**m, "model": "resnet"} for m in steps if m["model"] == "vit"]
    full = rehearse_plan.grid(both)
    assert full["missing"] == [] and full["total_h"] == pytest.approx(
        sum(full["minutes"].values()) / 60)
    train = next(m for m in steps if m["step"] == "train-oracle (fine-tuned)")["full_min"]
    assert full["minutes"]["train-oracle (fine-tuned)"] == pytest.approx(4 * 18 * train)


def test_a_stored_rehearsal_is_re_projected_with_a_training_rate_and_startup():
    """Fine-tuned runs: start-up (the shortest predict of that oracle on the attack's slice) once,
    training by rows at the given rate, the rest by the images scored; every predict of the grid
    at the ImageNet-C predict's projection, not the slice's."""
    s = {"train": 10_000, "val": 1_000, "train_rows": 2_000, "attack_rows": 100}
    tuned = ["train-oracle", "--runs-root", "R", "--oracle", "vit", "--classifier", "vit"]
    records = [{"argv": tuned, "rc": 0, "wall_s": 30.0},
               {"argv": ["predict", "--run", "R/vit-vit_ss_seed0_x/", "--data", "R/adversarial"],
                "rc": 0, "wall_s": 9.0},
               {"argv": ["predict", "--run", "R/vit-vit_ss_seed0_x/", "--data", "R/adversarial"],
                "rc": 0, "wall_s": 7.0}]
    base = {"disk_fixed": True, "disk_bytes": 0, "rss_peak_bytes": 1, "gpu_peak_bytes": None}
    stored = [{**base, "step": "train-oracle (fine-tuned)", "model": "vit", "rows": 2_000,
               "full_rows": 1_217_109, "scale": "old", "commands": 1, "wall_s": 30.0},
              {**base, "step": "predict imagenet-c", "model": "", "rows": 1_000,
               "full_rows": 50_000, "scale": "by images", "commands": 1, "wall_s": 6.0},
              {**base, "step": "predict adversarial", "model": "", "rows": 100,
               "full_rows": 50_000, "scale": "by images", "commands": 1, "wall_s": 8.0}]
    out = rehearse_plan.replan({"settings": s, "steps": stored, "commands": records},
                               {"vit": (100.0, "a bench")})
    run = next(m for m in out["steps"] if m["model"] == "vit")
    assert run["rows"] == 1_900                             # --max-samples holds out 5% too
    ratio = (4 * round(1_281_167 * 0.05) + 2 * 50_000) / (4 * 100 + 2 * 1_000)
    assert rehearse_plan.inference_ratio(s) == pytest.approx(ratio)
    expected = 7.0 + 1_217_109 / 100 + (30.0 - 1_900 / 100 - 7.0) * ratio
    assert run["full_min"] == pytest.approx(expected / 60)
    assert "100 img/s (a bench)" in run["scale"] and "start-up 7 s" in run["scale"]
    predict = out["grid"]["minutes"]["predict"]
    assert predict == pytest.approx(72 * 5 * 6.0 * 50 / 60)     # the 1,000-row predict's rate


def test_replan_refuses_files_that_are_not_what_it_reads(tmp_path, capsys):
    missing = tmp_path / "none.json"
    assert "--replan " + str(missing) + ": cannot read it as JSON" in refused(
        capsys, ["--replan", str(missing)])
    bench = tmp_path / "b.json"
    bench.write_text(json.dumps({"device": "x"}))
    assert "--replan " + str(bench) + ": no settings, steps, commands; expected the JSON of a " \
        "rehearsal" in refused(capsys, ["--replan", str(bench)])
    assert "--train-bench " + str(bench) + ": no results, date; expected the JSON of " \
        "bench/bench_train.py" in refused(capsys, ["--replan", str(bench), "--train-bench", str(bench)])
    assert json.loads(bench.read_text()) == {"device": "x"}          # nothing rewritten


def test_the_shim_reads_a_fine_tuned_runs_median_logged_rate(tmp_path):
    run = tmp_path / "runs" / "vit-vit_ss_seed0_x"
    run.mkdir(parents=True)
    lines = [{"step": 1, "loss": 1.0, "img_per_s": 5.0}, {"step": 2, "loss": 0.9},
             {"step": 3, "loss": 0.8, "img_per_s": 300.0}, {"step": 5, "img_per_s": 100.0},
             {"step": 7, "img_per_s": 200.0}]
    (run / "log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    args = ["train-oracle", "--runs-root", str(tmp_path / "runs"), "--oracle", "vit"]
    assert train_rate(args, since=0.0) == 200.0             # the capture's window left out
    assert train_rate([*args, "--head-only"], since=0.0) is None
    assert train_rate(args, since=time.time() + 60) is None  # no run written by this command


def test_continue_needs_a_kept_rehearsal_and_new_steps(tmp_path, capsys):
    out = tmp_path / "r"
    assert f"--continue: --out {out} holds no kept rehearsal (run one with --keep)" in refused(
        capsys, ["--out", str(out), *TINY, "--continue", "--steps", "attack"])
    (out / rehearse_imagenet.RUNBOOK).mkdir(parents=True)
    settings = rehearse_imagenet.settings(rehearse_imagenet.parse(["--out", str(out), *TINY]))
    (out / rehearse_imagenet.SETTINGS).write_text(json.dumps({**settings, "done": ["extract"]}))
    assert "--continue --steps extract: run before in this --out" in refused(
        capsys, ["--out", str(out), *TINY, "--continue", "--steps", "extract,train"])
    assert "--steps attack needs train (the runbook's earlier sections)" in refused(
        capsys, ["--out", str(out), *TINY, "--continue", "--steps", "attack"])
