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
    rate), and "extraction".  ``res``: bench_train.py's results by model name."""
    rows = N_TRAIN * (1 - HELD_OUT)
    infer_imgs = N_VAL + VALIDATIONS * HELD_OUT * N_TRAIN
    out = {}
    for o in models:
        rate = max(r["e2e"] for p, r in res[o]["steps"][key].items() if p in paths)
        out[o] = LOSSES * len(models) * (rows / rate + infer_imgs / res[o]["infer"]) / 3600
    out["extraction"] = sum((2 * N_TRAIN + N_VAL) / res[c]["infer"] for c in models) / 3600
    return out
