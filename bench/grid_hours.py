"""The paper's grid in hours on one device, from bench_train.py's measured rates: one definition
for bench_train.py's projection and the table of docs/PERFORMANCE.md that states where the hours
go.  Pure arithmetic on the recorded figures (no torch), so the docs' generator can use it.

The grid: every <oracle, classifier> pair of the preset models x 4 losses, each one epoch over
ImageNet train's kept rows (5% held out, validated 4 times) plus scoring val, and one extraction
of train (with its flipped view) and val per classifier.
"""
from __future__ import annotations

N_TRAIN, N_VAL, HELD_OUT, VALIDATIONS = 1_281_167, 50_000, 0.05, 4
LOSSES = 4


def grid_parts(res: dict, key: str, paths, models: list[str]) -> dict[str, float]:
    """Hours per part: each oracle model's runs (at its fastest measured step among ``paths``,
    ``key`` "paper" (batch 40) or "fill"; its validations and val scoring at its inference
    rate), and "extraction".  ``res``: bench_train.py's results by model name; a model's
    ``extract`` (img/s of ``extract`` end to end, one view, when measured) makes its extraction
    that rate over train and val plus the flipped view's forward passes at the inference rate,
    else every forward pass at the inference rate (no decoding counted)."""
    rows = N_TRAIN * (1 - HELD_OUT)
    infer_imgs = N_VAL + VALIDATIONS * HELD_OUT * N_TRAIN
    out = {}
    for o in models:
        rate = max(r["e2e"] for p, r in res[o]["steps"][key].items() if p in paths)
        out[o] = LOSSES * len(models) * (rows / rate + infer_imgs / res[o]["infer"]) / 3600
    out["extraction"] = sum(extraction_seconds(res[c]) for c in models) / 3600
    return out


def extraction_seconds(r: dict) -> float:
    """Seconds of one classifier's extraction of train (and its flipped view) and val."""
    if r.get("extract"):
        return (N_TRAIN + N_VAL) / r["extract"] + N_TRAIN / r["infer"]
    return (2 * N_TRAIN + N_VAL) / r["infer"]


def grid_on_gpus(res: dict, key: str, paths, models: list[str], gpus: int, seeds: int = 3,
                 variants: int = LOSSES + 2) -> dict[str, float]:
    """The runbook's grid as independent jobs on ``gpus`` GPUs (a job array, one GPU a job):
    the extractions first (one job per classifier), then the fine-tuned runs (``variants``
    losses, the authors' broadcasting CE and focal included, x ``seeds`` per pair), each wave
    packed longest job first onto the GPU free soonest.  Returns the wall hours of each wave,
    their sum and the GPU hours; a run is one GPU's job from start to end (no start-up
    counted, as ``grid_parts``)."""
    parts = grid_parts(res, key, paths, models)
    per_run = {o: parts[o] / (LOSSES * len(models)) for o in models}
    extract = [extraction_seconds(res[c]) / 3600 for c in models]
    runs = [per_run[o] for o in models for _ in range(len(models) * variants * seeds)]
    waves = {"extraction": _packed(extract, gpus), "runs": _packed(runs, gpus)}
    return {**waves, "wall": sum(waves.values()), "gpu_hours": sum(extract) + sum(runs)}


def _packed(jobs: list[float], gpus: int) -> float:
    """The makespan of ``jobs`` (hours) on ``gpus`` machines, longest first to the freest."""
    loads = [0.0] * gpus
    for job in sorted(jobs, reverse=True):
        loads[loads.index(min(loads))] += job
    return max(loads)
