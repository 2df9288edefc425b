"""bench/bench_ddp.py's CPU-checkable parts (its figures need GPUs: docs/PERFORMANCE.md)."""
from __future__ import annotations

import json
import subprocess
import sys

from bench.bench_ddp import model_options
from conftest import ROOT


def test_the_models_get_the_trees_classes_listed_in_output_order(tmp_path):
    for wnid in ("n02", "n01", "n03"):
        (tmp_path / "train" / wnid).mkdir(parents=True)
    opts = model_options(tmp_path)
    assert opts[:2] == ["--random-init", "--model-kwargs"]
    assert json.loads(opts[2]) == {"num_classes": 3}
    assert (tmp_path / "classes.txt").read_text().split() == ["n01", "n02", "n03"]


def test_more_gpus_than_the_machine_has_are_refused_in_one_line():
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_ddp.py"), "--gpus", "64"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "--gpus 64 but" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_recorded_command_leaves_out_where_the_figures_went():
    from bench.bench_ddp import command
    argv = ["--gpus", "2", "--workdir", "/scratch/w", "--decode", "gpu", "--json=/x/out.json",
            "--extract-only"]
    assert command(argv) == "python bench/bench_ddp.py --gpus 2 --decode gpu --extract-only"


def test_the_generated_jpegs_serve_a_second_benchmark_in_the_same_workdir(tmp_path):
    from bench.bench_ddp import generated
    data = generated(tmp_path / "jpegs", 12)
    files = sorted(data.rglob("*.JPEG"))
    assert len(files) == 12 + 200
    stamp = files[0].stat().st_mtime_ns
    assert generated(tmp_path / "jpegs", 12) == data and files[0].stat().st_mtime_ns == stamp
    assert len(sorted(generated(tmp_path / "jpegs", 16).rglob("*.JPEG"))) == 16 + 200
