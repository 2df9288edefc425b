"""The same ``fit-classifier`` / ``extract`` / ``train-oracle`` command twice on one
machine (CPU, same thread count) writes bit-identical files (docs/RESULTS.md, "Determinism").

Each round runs the demo's commands (pipeline/demo/plan.py, on a small Fashion-MNIST copy) in a
fresh process with its own PYTHONHASHSEED, so an order taken from a set of strings would differ
between the rounds, and in the same working directory, so the absolute paths that run files
record (the caches an output was scored against) are the same.  The files are then compared byte
for byte.  Left out, by name, because they hold wall times and nothing else differs in them:
the manifest's ``info.created`` and the timing keys of its ``summary``; run.json's ``updated``
and ``timing``; log.jsonl's ``img_per_s``; ``outputs/<split>.timing.json``; TensorBoard's event
files (named by the time and process id; written only where the package is installed)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cache.manifest import IDENTITY_FILE, MANIFEST_FILE
from cache.runs import BEST, LAST, VAL_FILE, RunDir, find_runs
from conftest import ROOT
from fmnist_subset import write_fmnist_subset
from oracle_fixtures import run_cli

THREADS = "2"           # both rounds: the thread count is part of the condition
CPU = ("--device", "cpu", "--no-progress")
SHIFTED = "test-gaussian_noise-5"
MANIFEST_TIMING = {"elapsed_s", "img_per_s", "steady_img_per_s", "inference"}


def commands(data: Path) -> list[list[str]]:
    """The demo's commands for <vit, vit> (fit-classifier with the test's --fit-args of
    tests/test_demo.py); the shifted split's extract and the fine-tuned run use loader workers."""
    d = ("--data", str(data))
    return [["fit-classifier", "--classifier", name, *d, "--max-samples", "300", "--epochs", "1",
             *CPU] for name in ("vit", "resnet")] + [
        ["extract", "--classifier", "vit", *d, "--split", "train", "--split", "test",
         "--flip-view", "--features", "--shard-size", "128", *CPU],
        ["extract", "--classifier", "vit", *d, "--split", "test", "--corruption", "gaussian_noise",
         "--severity", "5", "--flip-view", "--features", "--shard-size", "128", "--workers", "2",
         *CPU],
        ["train-oracle", "--classifier", "vit", "--oracle", "vit", "--loss", "ss", "--seed", "0",
         *d, "--eval-split", SHIFTED, "--epochs", "1", "--batch-size", "64", "--workers", "2", *CPU],
        ["train-oracle", "--head-only", "--classifier", "vit", "--oracle", "vit", "--loss", "ss",
         "--seed", "0", *d, "--eval-split", SHIFTED, *CPU]]


DRIVER = ("import json, sys\nfrom cli import cli\n"
          "for args in json.loads(sys.argv[1]):\n    cli.main(args, standalone_mode=False)\n")


@pytest.fixture(scope="module")
def rounds(tmp_path_factory):
    """Two rounds of the same commands in the same directory: (round 1, round 2) artifacts."""
    tmp = tmp_path_factory.mktemp("determinism")
    data = write_fmnist_subset(tmp / "fmnist", n_train=12_300, n_test=200)   # train: 300 rows
    work, kept = tmp / "work", []
    for hash_seed in ("1", "2"):
        work.mkdir()
        env = {**os.environ, "OMP_NUM_THREADS": THREADS, "PYTHONHASHSEED": hash_seed,
               "PYTHONPATH": str(ROOT)}
        proc = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(commands(data))],
                              cwd=work, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        kept.append(work.rename(tmp / f"round{hash_seed}") / "artifacts")
    return kept


def checkpoint_diff(a: Path, b: Path) -> list[str]:
    """What differs between two checkpoints: tensors by name, other values by key path."""
    out = []

    def walk(x, y, where):
        if isinstance(x, dict) and isinstance(y, dict):
            for k in sorted(set(x) | set(y), key=str):
                walk(x.get(k), y.get(k), f"{where}/{k}")
        elif isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(x, y):
                out.append(f"tensor {where}")
        elif x != y:
            out.append(f"{where}: {x!r:.60} != {y!r:.60}")
    walk(*(torch.load(p, map_location="cpu", weights_only=True) for p in (a, b)), "")
    return out


def same_bytes(a: Path, b: Path) -> None:
    """Fails naming what differs (for checkpoints: which tensors and values), without a diff of
    the bytes themselves."""
    if a.read_bytes() != b.read_bytes():
        what = (checkpoint_diff(a, b)[:8] or ["equal contents, other zip layout"]
                if a.suffix == ".pt" else "differ")
        pytest.fail(f"{a} and {b}: {what}")


def without(doc: dict, *keys: str) -> dict:
    return {k: v for k, v in doc.items() if k not in keys}


# ------------------------------------------------------------------------------ fit-classifier --
def test_fit_classifier_twice_writes_the_same_checkpoint(rounds):
    first, second = (r / "fashion-mnist" / "classifiers" for r in rounds)
    for name in ("vit.pt", "resnet.pt"):
        same_bytes(first / name, second / name)
        meta = torch.load(first / name, weights_only=True)["meta"]
        assert meta["threads"] == int(THREADS) and "created" not in meta


def test_a_force_refit_or_another_out_writes_the_same_bytes(tmp_path):
    """--force and --out say where and whether, not what: the checkpoint's bytes do not hold them
    (before: the config's out and force, the fit time, the date, and the inner folder of the
    zip named after the file)."""
    data = write_fmnist_subset(tmp_path / "fm", n_train=600, n_test=10)
    args = ["fit-classifier", "--classifier", "resnet", "--data", data, "--max-samples", "200",
            "--epochs", "1", *CPU]
    run_cli([*args, "--out", tmp_path / "a.pt"])
    first = (tmp_path / "a.pt").read_bytes()
    run_cli([*args, "--out", tmp_path / "a.pt", "--force"])
    run_cli([*args, "--out", tmp_path / "b.pt"])
    same_bytes(tmp_path / "a.pt", tmp_path / "b.pt")
    assert (tmp_path / "a.pt").read_bytes() == first, "the --force refit differs"
    skipped = run_cli([*args, "--out", tmp_path / "a.pt"]).output   # fitted = the file's time
    assert "exists" in skipped and ", fitted 20" in skipped


# ------------------------------------------------------------------------------------- extract --
def test_extract_twice_writes_the_same_caches(rounds):
    first, second = rounds
    caches = sorted(p.parent.relative_to(first) for p in first.rglob(MANIFEST_FILE))
    assert sorted(c.name for c in caches) == ["test", SHIFTED, "train"]
    for cache in caches:
        a, b = first / cache, second / cache
        shards = sorted(p.name for p in a.glob("shard-*.h5"))
        assert len(shards) >= 2 and shards == sorted(p.name for p in b.glob("shard-*.h5"))
        for name in [IDENTITY_FILE, *shards]:
            same_bytes(a / name, b / name)
        ma, mb = (json.loads((p / MANIFEST_FILE).read_text()) for p in (a, b))
        assert ma["shards"] == mb["shards"]          # sizes, XXH3-128 and per-column XXH3-64
        assert without(ma["info"], "created") == without(mb["info"], "created")
        assert without(ma["summary"], *MANIFEST_TIMING) == without(mb["summary"], *MANIFEST_TIMING)
        assert without(ma, "info", "summary") == without(mb, "info", "summary")


# -------------------------------------------------------------------------------- train-oracle --
def test_train_oracle_twice_writes_the_same_runs(rounds):
    first, second = rounds
    runs = find_runs(first / "fmnist" / "runs")
    assert len(runs) == 2                                  # fine-tuned and head-only
    for path in runs:
        a, b = RunDir(path), RunDir(second / path.relative_to(first.resolve()))
        checkpoints = [n for n in (LAST, BEST) if a.checkpoint(n).exists()]
        assert BEST in checkpoints
        for name in checkpoints:
            same_bytes(a.checkpoint(name), b.checkpoint(name))
        assert [p.name for p in a.outputs()] == [p.name for p in b.outputs()] == [
            f"{SHIFTED}.h5", "test.h5"]
        for out_a, out_b in zip(a.outputs(), b.outputs()):
            same_bytes(out_a, out_b)
        same_bytes(a.path / VAL_FILE, b.path / VAL_FILE)
        assert without(a.read(), "updated", "timing") == without(b.read(), "updated", "timing")
        assert [without(e, "img_per_s") for e in a.log_entries()] == \
               [without(e, "img_per_s") for e in b.log_entries()]
