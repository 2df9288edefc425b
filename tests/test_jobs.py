"""The demo's plan as a job list (pipeline/demo/jobs.py): waves of independent jobs, run by
cluster/run_waves.sh through `xargs -P 2` with a job killed and resumed, and submitted by
cluster/slurm_waves.sh as one SLURM array per wave (a stand-in sbatch records the calls)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT
from fmnist_subset import write_fmnist_subset
from oracle_fixtures import run_cli

SMALL = ["--classifiers", "vit", "--oracles", "vit", "--losses", "ss", "--no-head-only",
         "--fit-args", "--max-samples 500 --epochs 1", "--train-args", "--epochs 1 --ckpt-every 1",
         "--no-progress"]


def test_waves_are_the_plans_stages_in_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = run_cli(["demo", "--job-list", "jobs.json"]).output
    doc = json.loads((tmp_path / "jobs.json").read_text())
    dry = run_cli(["demo", "--dry-run"]).output.splitlines()
    assert [j["command"] for j in doc["jobs"]] == dry            # one job a step of the plan
    waves = doc["waves"]
    assert waves[0]["first"] == 0 and waves[-1]["last"] == len(doc["jobs"]) - 1
    assert all(a["last"] + 1 == b["first"] and a["stage"] != b["stage"]
               for a, b in zip(waves, waves[1:]))
    assert [w["stage"] for w in waves][:2] == ["fit", "extract"] and waves[-1]["stage"] == "report"
    assert f"{len(doc['jobs'])} jobs in {len(waves)} waves" in out
    assert doc["config"]["dry_run"] is False and doc["folder"] == str(tmp_path.resolve())


def test_a_job_list_refuses_another_folder_another_plan_and_a_missing_job(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_cli(["demo", "--job-list", "jobs.json"])
    doc = json.loads((tmp_path / "jobs.json").read_text())
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    result = run_cli(["demo", "--job", tmp_path / "jobs.json", "0"], expect=1)
    assert f"was written in {tmp_path.resolve()}" in result.output and "run its jobs there" \
        in result.output
    monkeypatch.chdir(tmp_path)
    result = run_cli(["demo", "--job", "jobs.json", str(len(doc["jobs"]))], expect=1)
    assert f"has jobs 0 to {len(doc['jobs']) - 1}, not job {len(doc['jobs'])}" in result.output
    doc["jobs"][3]["command"] += " --seed 7"
    (tmp_path / "jobs.json").write_text(json.dumps(doc))
    result = run_cli(["demo", "--job", "jobs.json", "0"], expect=1)
    assert "written for another plan than this code makes" in result.output


@pytest.mark.slow   # a small demo's 9 commands, a training killed and resumed (~2 min, 2 cores)
def test_the_job_list_runs_through_xargs_with_a_killed_job_resumed(tmp_path):
    data = write_fmnist_subset(tmp_path / "fm", n_train=12_600, n_test=400)   # train: 600 rows
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHON": sys.executable}
    cli = [sys.executable, str(ROOT / "cli.py")]
    subprocess.run([*cli, "demo", "--data", str(data), *SMALL, "--job-list", "jobs.json"],
                   cwd=tmp_path, env=env, check=True, capture_output=True)
    doc = json.loads((tmp_path / "jobs.json").read_text())
    train = next(j["job"] for j in doc["jobs"] if j["stage"] == "train")
    for w in doc["waves"]:                # the waves before the training, as the script runs them
        if w["first"] < train:
            for job in range(w["first"], w["last"] + 1):
                subprocess.run([*cli, "demo", "--job", "jobs.json", str(job)], cwd=tmp_path,
                               env=env, check=True, capture_output=True)
    # the training job killed once its first checkpoint is written
    job = subprocess.Popen([*cli, "demo", "--job", "jobs.json", str(train)], cwd=tmp_path,
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    runs = tmp_path / "artifacts" / "fm" / "runs"
    deadline = time.time() + 300
    while not list(runs.glob("*/checkpoints/last.pt")) and time.time() < deadline:
        time.sleep(0.2)
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    [run] = list(runs.iterdir())
    assert json.loads((run / "run.json").read_text())["status"] == "running"   # killed mid-run
    done = subprocess.run([str(ROOT / "cluster" / "run_waves.sh"), "-P", "2", "jobs.json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = done.stdout + done.stderr
    assert "resumed at step" in said                        # the killed job went on from there
    assert said.count("== wave:") == len(doc["waves"])
    assert json.loads((run / "run.json").read_text())["status"] == "complete"
    assert (tmp_path / "artifacts" / "fm" / "report" / "report.json").exists()
    again = subprocess.run([str(ROOT / "cluster" / "run_waves.sh"), "-P", "2", "jobs.json"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "already complete" in again.stdout + again.stderr


def test_a_text_list_of_commands_is_one_wave(tmp_path):
    """A runbook loop listed as text (LAUNCH="echo python"): its lines are one wave's jobs, run
    two at a time by run_waves.sh; a second list runs after it; blank lines and comments skipped,
    a failing job stops the script with its exit."""
    (tmp_path / "first.jobs").write_text("# two jobs\necho one > a.txt\n\necho two > b.txt\n")
    (tmp_path / "then.jobs").write_text("cat a.txt b.txt > both.txt\n")
    done = subprocess.run([str(ROOT / "cluster" / "run_waves.sh"), "-P", "2", "first.jobs",
                           "then.jobs"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "both.txt").read_text() == "one\ntwo\n"
    assert "== wave: jobs 0-1 of first.jobs" in done.stdout
    assert "[job 1] echo two > b.txt" in done.stdout
    (tmp_path / "bad.jobs").write_text("exit 3\n")
    failed = subprocess.run([str(ROOT / "cluster" / "run_waves.sh"), "bad.jobs", "then.jobs"],
                            cwd=tmp_path, capture_output=True, text=True)
    assert failed.returncode != 0 and "of then.jobs" not in failed.stdout


def test_slurm_waves_submits_one_array_per_wave_each_after_the_last(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_cli(["demo", "--job-list", "jobs.json"])
    doc = json.loads((tmp_path / "jobs.json").read_text())
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "sbatch").write_text("#!/usr/bin/env bash\n"
                                 f"printf '%s\\n' \"$*\" >> {tmp_path}/calls\n"
                                 "n=$(wc -l < " f"{tmp_path}/calls); echo \"$((1000 + n));c1\"\n")
    (bin_ / "sbatch").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "PYTHON": sys.executable}
    (tmp_path / "train.jobs").write_text("# the runbook's stage 2, listed\npython a.py\n\n"
                                         "python b.py\n")
    out = subprocess.run([str(ROOT / "cluster" / "slurm_waves.sh"), "jobs.json", "train.jobs",
                          "--", "--partition", "gpu", "--gres", "gpu:1"], env=env,
                         capture_output=True, text=True, check=True).stdout
    calls = (tmp_path / "calls").read_text().splitlines()
    waves = [(w["first"], w["last"], "jobs.json") for w in doc["waves"]] + [(0, 1, "train.jobs")]
    assert len(calls) == len(waves)
    for k, (call, (first, last, name)) in enumerate(zip(calls, waves)):
        assert f"--array={first}-{last}" in call and "--partition gpu --gres gpu:1" in call
        assert ("--dependency=afterok:" + str(1000 + k)) in call if k else "--dependency" not in call
        assert call.endswith(f"{ROOT / 'cluster' / 'task.sh'} {name} $SLURM_ARRAY_TASK_ID")
    assert f"array job {1000 + len(calls)}" in out


def test_the_runbooks_loops_list_their_commands_as_job_lists(tmp_path):
    """docs/IMAGENET.md, "On a cluster": with LAUNCH="echo python", sections 1 and 2 print one
    command a job (2 extraction jobs a classifier; the 72 runs of the paper's grid)."""
    import re
    text = (ROOT / "docs" / "IMAGENET.md").read_text()
    blocks = {m.group(1): m.group(2) for m in re.finditer(
        r"\n## (\d)\. [^\n]*\n.*?```bash\n(.*?)```", text, re.S)}
    script = blocks["0"] + 'LAUNCH="echo python"\n'
    for section, name in (("1", "extract.jobs"), ("2", "train.jobs")):
        (tmp_path / f"{section}.sh").write_text(script + blocks[section])
        with open(tmp_path / name, "w") as out:
            subprocess.run(["bash", str(tmp_path / f"{section}.sh")], stdout=out, check=True)
    extract = (tmp_path / "extract.jobs").read_text().splitlines()
    train = (tmp_path / "train.jobs").read_text().splitlines()
    assert len(extract) == 4 and all(l.startswith("python cli.py extract ") for l in extract)
    assert len(train) == 72 and all(l.startswith("python cli.py train-oracle ") for l in train)
    assert len(set(train)) == 72
