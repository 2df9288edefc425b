"""How far scores made on another device or in another precision are from a run's stored ones:
runs trained on a GPU, then their test split scored again on the same GPU (the run's own
numbers: expected bit for bit) and on the CPU (the usual way to deploy), fine-tuned and head-only.

    python bench/device_drift.py --data DIR --json bench/results/device-drift-1xH200.json

On the embedded Fashion-MNIST (``--data``: a folder of its four idx files, or left out for the
installed package) and its two small classifiers, fitted first unless their checkpoints exist
(``artifacts/fashion-mnist/classifiers/``): per classifier, a fine-tuned SS oracle at bf16 (the
GPU's default) and at fp32, and a head-only SS oracle (on features extracted at bf16).  Every
command is the user's (``cli.py``); scores are compared row for row with the run's own
``outputs/test.h5``: the largest and 99th-percentile absolute difference of the confidence, the
rows that differ by more than 1e-4, and the rows whose trust flag (the run's threshold for
``--target tpr=0.95``, picked on its held-out rows) flips.  The fp32 runs are also scored on the
GPU with PyTorch's default TF32 convolutions, the baseline measured in the same call
(``pipeline.core.precision`` turns TF32 off: fp32 means float32).  Needs a CUDA GPU.
docs/METRICS.md's "Scores on another device" table is generated from the JSON
(bench/doc_tables.py).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cache.outputs import read_outputs  # noqa: E402
from cache.runs import RunDir  # noqa: E402
from pipeline.core.precision import cpu_name  # noqa: E402
from pipeline.core.presets import embedded_classifier_path  # noqa: E402
from pipeline.oracle.deploy.threshold import pick_threshold  # noqa: E402

CLASSIFIERS = ("vit", "resnet")
# (name, train-oracle options): the runs compared, per classifier
RUNS = (("fine-tuned, bf16", ("--precision", "bf16")),
        ("fine-tuned, fp32", ("--precision", "fp32")),
        ("head-only", ("--head-only",)))


def cli(*args, quiet: bool = True) -> None:
    cmd = [sys.executable, str(ROOT / "cli.py"), *map(str, args)]
    print("$", shlex.join(cmd[1:]), flush=True)
    subprocess.run(cmd + (["--no-progress"] if quiet else []), check=True, cwd=ROOT)


def prepare(data: list[str], work: Path) -> dict[str, dict[str, Path]]:
    """Fit (where missing), extract and train; {classifier: {run name: run dir}}."""
    runs: dict[str, dict[str, Path]] = {}
    for clf in CLASSIFIERS:
        if not embedded_classifier_path(clf).is_file():
            cli("fit-classifier", "--classifier", clf, *data)
        cli("extract", "--classifier", clf, *data, "--split", "train", "--split", "test",
            "--features", "--flip-view", "--out", work / "cache")
        runs[clf] = {}
        for name, opts in RUNS:
            out = work / "runs" / f"{clf}-{name.replace(', ', '-')}"
            cli("train-oracle", "--classifier", clf, "--oracle", clf, "--loss", "ss", *data,
                "--cache", work / "cache", *opts, "--out", out)
            runs[clf][name] = out
    return runs


def rescore(run: Path, data: list[str], cache: Path, name: str, *opts) -> np.ndarray:
    """The run's test split scored again (``predict --split test``) -> confidence (N,)."""
    cli("predict", "--run", run, *data, "--cache", cache, "--split", "test", "--out-name", name,
        *opts)
    return read_outputs(RunDir(run).output(name)).columns["confidence"]


def rescore_tf32(run: Path, data: list[str], cache: Path) -> np.ndarray:
    """As ``rescore`` on the GPU, in this process, with PyTorch's default TF32 convolutions."""
    import torch

    from pipeline.core.precision import ieee_fp32
    from pipeline.oracle.deploy.predict import PredictConfig, predict

    ieee_fp32()                                     # once per process: then back to the default
    torch.backends.cudnn.allow_tf32 = True
    try:
        predict(PredictConfig(run=run, data=data[1] if data else None, cache=cache,
                              splits=("test",), name="test-gpu-tf32", device="cuda",
                              progress=False))
    finally:
        torch.backends.cudnn.allow_tf32 = False
    return read_outputs(RunDir(run).output("test-gpu-tf32")).columns["confidence"]


def compare(stored: np.ndarray, valid: np.ndarray, other: np.ndarray, cut: float) -> dict:
    d = np.abs(other[valid].astype(np.float64) - stored[valid])
    flips = (other[valid] >= cut) != (stored[valid] >= cut)
    return {"max_abs": float(d.max()), "p99_abs": float(np.quantile(d, 0.99)),
            "rows_over_1e-4": int((d > 1e-4).sum()), "trust_flips": int(flips.sum()),
            "rows": int(valid.sum())}


def measure(run: Path, data: list[str], cache: Path, fp32: bool) -> dict:
    out = read_outputs(RunDir(run).output("test")).columns
    stored, valid = out["confidence"], out["valid"] == 1
    record = RunDir(run).record()
    cut = pick_threshold(run, record, "tpr", 0.95)["threshold"]
    precision = "fp32" if fp32 else "bf16"
    result = {"made_on": dict(record.made_on or {}), "threshold": cut, "compared": {
        "same GPU": compare(stored, valid, rescore(run, data, cache, "test-gpu"), cut),
        f"CPU, {precision}": compare(stored, valid, rescore(run, data, cache, "test-cpu",
                                                              "--device", "cpu"), cut)}}
    if fp32:
        result["compared"]["same GPU, TF32"] = compare(stored, valid,
                                                       rescore_tf32(run, data, cache), cut)
    else:
        result["compared"]["CPU, fp32"] = compare(stored, valid, rescore(
            run, data, cache, "test-cpu-fp32", "--device", "cpu", "--precision", "fp32"), cut)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", help="folder of Fashion-MNIST's idx files (default: the package)")
    ap.add_argument("--work", default="artifacts/device-drift", help="caches and runs go here")
    ap.add_argument("--json", required=True, help="where the figures go")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("device_drift.py compares a GPU's scores with the CPU's: no CUDA GPU here",
              file=sys.stderr)
        return 1
    data = ["--data", str(Path(args.data).resolve())] if args.data else []
    work = (ROOT / args.work).resolve()
    started = time.time()
    runs = prepare(data, work)
    results = {clf: {name: measure(run, data, work / "cache", "fp32" in name)
                     for name, run in by_name.items()} for clf, by_name in runs.items()}
    report = {"device": "cuda", "device_name": torch.cuda.get_device_name(0),
              "cpu": cpu_name(), "cpu_isa": torch.backends.cpu.get_cpu_capability(),
              "cpus": os.cpu_count(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
              "command": shlex.join(["python", "bench/device_drift.py", *(argv or sys.argv[1:])]),
              "seconds": round(time.time() - started, 1), "loss": "ss", "split": "test",
              "results": results}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
