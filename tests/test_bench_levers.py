"""bench/step_levers.py on the CPU (tiny models, eager steps: capture and kernel profiles need
CUDA): each lever's variant is built and timed, the base's numerics are its own, a numeric lever
(GELU's tanh approximation) shows its difference, the ResNet's batch ratio and the grid in hours
come out; and bench/grid_hours.py's extraction term with a measured extraction rate."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.grid_hours import N_TRAIN, N_VAL, extraction_seconds

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_levers_are_timed_against_the_base_and_the_grid_is_projected(tmp_path):
    extract = tmp_path / "extract.json"
    extract.write_text(json.dumps({"models": {"resnet10t": {"extract": {"steady_img_per_s": 50.0}}}}))
    out = tmp_path / "levers.json"
    run = subprocess.run(
        [sys.executable, "bench/step_levers.py", "--tiny", "--device", "cpu", "--rounds", "2",
         "--steps", "1", "--levers", "base,gelu-tanh,foreach-sgd", "--batches", "40,48",
         "--grid", "--extract-json", str(extract), "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    d = json.loads(out.read_text())
    assert d["command"].startswith("python bench/step_levers.py --tiny")
    vit = d["results"]["vit_tiny_patch16_224"]["40"]
    assert vit["base"]["numerics"] == {"loss_rel": 0.0, "grad_norm_rel": 0.0}
    assert vit["base"]["vs_base"] == 1.0 and len(vit["base"]["rounds_ms"]) == 2
    assert vit["gelu-tanh"]["numerics"]["loss_rel"] > 0        # a different function
    assert vit["gelu-tanh"]["step_ms"] > 0
    assert set(d["ratios"]) == {"vit_tiny_patch16_224", "resnet10t"}   # batches 40 and 48
    grid = d["grid"]
    assert grid["extract_img_per_s"] == {"resnet10t": 50.0}
    base = grid["hours"]["base"]
    assert base["total_h"] == pytest.approx(sum(base["parts_h"].values()), abs=0.01)
    assert grid["hours"]["fastest"]["total_h"] <= base["total_h"] + 1e-9
    assert "| vit_tiny_patch16_224 | 40 | gelu-tanh |" in run.stdout


def test_a_measured_extraction_rate_replaces_the_inference_only_estimate():
    assert extraction_seconds({"infer": 1000.0}) == (2 * N_TRAIN + N_VAL) / 1000.0
    # one view end to end (decoding included), the flipped view's forward passes beside it
    assert extraction_seconds({"infer": 1000.0, "extract": 500.0}) == pytest.approx(
        (N_TRAIN + N_VAL) / 500.0 + N_TRAIN / 1000.0)
