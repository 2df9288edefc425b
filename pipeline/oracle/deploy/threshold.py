"""The trust threshold of ``predict --images``: given (``--threshold X``) or picked on the run's
held-out rows (RUN/heldout/<tag>.h5, the chosen oracle's scores of the training rows it never
trained on) for a target (``--target tpr=0.95`` / ``--target risk=0.05``).

A row is trusted when its oracle confidence is >= the threshold.  Thresholds are the held-out
rows' distinct confidences (ties grouped: a threshold keeps or rejects a whole tie group, as the
report's working points, ``pipeline.core.selective``):

* ``tpr=T``: the HIGHEST threshold whose TPR (share of the correctly classified held-out rows
  trusted) is >= T -- the fewest wrong answers trusted while keeping T of the right ones;
* ``risk=R``: the LOWEST threshold whose selective risk (share of wrong answers among the trusted
  held-out rows) is <= R -- the most images trusted at that risk (``coverage_at_risk``).

Torch-free: numbers in, numbers out, every choice recorded with what it reached on those rows.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from cache.outputs import read_outputs
from cache.runfile import RunFile
from cache.runs import RunDir, RunError
from pipeline.core.metrics import rank
from pipeline.core.selective import coverage_at_risk

TARGETS = {"tpr": "true positive rate: share of the classifier's correct answers trusted",
           "risk": "selective risk: share of wrong answers among the trusted ones"}


def parse_target(text: str) -> tuple[str, float]:
    """``tpr=0.95`` -> ("tpr", 0.95); ValueError saying what is expected otherwise."""
    kind, _, value = text.partition("=")
    kind = kind.strip().lower()
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if kind not in TARGETS or not np.isfinite(number):
        raise ValueError(f"{text!r} is not a target: expected tpr=T (0 < T <= 1, e.g. tpr=0.95) "
                         "or risk=R (0 <= R < 1, e.g. risk=0.05)")
    if (kind == "tpr" and not 0 < number <= 1) or (kind == "risk" and not 0 <= number < 1):
        raise ValueError(f"{text!r}: {kind} must be in " + ("(0, 1]" if kind == "tpr" else "[0, 1)"))
    return kind, number


def heldout_scores(run_dir: Path, run: RunFile) -> tuple[np.ndarray, np.ndarray, Path]:
    """(confidence, correct) of the run's held-out rows, from RUN/heldout/<tag>.h5 checked
    against the size and hash run.json records; refuses a run that held out none."""
    recorded = run.heldout_output
    if not recorded:
        why = ("it held out no training rows (--val-fraction 0)"
               if run.rows.get("val") == 0 else
               "it has no scores of its held-out rows (trained before they were written: re-run "
               "the same `cli.py train-oracle` command, which adds them without training again)")
        raise RunError(f"--target needs the oracle's scores of run {run_dir}'s held-out rows, but "
                       f"{why}; pass --threshold X instead")
    path = RunDir(run_dir).heldout_output(recorded["split"])
    out = read_outputs(path, digest=dict(recorded))
    rows = out.columns["valid"] == 1
    return out.columns["confidence"][rows], out.columns["correct"][rows].astype(bool), path


def reached(confidence: np.ndarray, correct: np.ndarray, threshold: float) -> dict:
    """What ``threshold`` gives on labelled rows: TPR, FPR, coverage, selective risk."""
    keep = confidence >= threshold
    n_pos, n_neg, kept = int(correct.sum()), int((~correct).sum()), int(keep.sum())
    wrong = int((keep & ~correct).sum())
    return {"rows": int(len(correct)), "correct_rows": n_pos,
            "tpr": float((keep & correct).sum() / n_pos) if n_pos else None,
            "fpr": float(wrong / n_neg) if n_neg else None,
            "coverage": float(kept / len(correct)) if len(correct) else None,
            "risk": float(wrong / kept) if kept else None}


def pick_threshold(run_dir: Path, run: RunFile, kind: str, target: float) -> dict:
    """The threshold meeting ``kind=target`` on the held-out rows, with how it was chosen."""
    conf, correct, path = heldout_scores(run_dir, run)
    where = f"the {len(conf)} held-out rows of run {run_dir} ({path})"
    r = rank(conf, correct)
    if kind == "tpr":
        if r.n_pos == 0:
            raise RunError(f"--target tpr={target:g}: the classifier is wrong on every one of "
                           f"{where}, so no TPR exists; pass --threshold X instead")
        k = int(np.argmax(r.tp / r.n_pos >= target))
        threshold = float(r.thresholds[k])
    else:
        _, found = coverage_at_risk(r, risk=100 * target, return_details=True)
        if found["threshold"] is None:
            best = reached(conf, correct, float(r.thresholds[0]))
            raise RunError(f"--target risk={target:g} cannot be reached on {where}: even the "
                           f"most confident {100 * best['coverage']:.1f}% of them have a selective "
                           f"risk of {best['risk']:.3f}. Choose a larger risk, or pass "
                           "--threshold X")
        threshold = float(found["threshold"])
    return {"threshold": threshold, "chosen_by": f"{kind}={target:g}", "target": TARGETS[kind],
            "on": {"what": "held-out rows of the run's training split (never trained on)",
                   "file": str(path)}, "reached": reached(conf, correct, threshold)}


def given_threshold(run_dir: Path, run: RunFile, threshold: float) -> dict:
    """``--threshold X`` as given; what it reaches on the held-out rows, where the run has them."""
    choice = {"threshold": float(threshold), "chosen_by": "--threshold"}
    if run.heldout_output:
        conf, correct, path = heldout_scores(run_dir, run)
        choice["on"] = {"what": "held-out rows of the run's training split (for reference)",
                        "file": str(path)}
        choice["reached"] = reached(conf, correct, float(threshold))
    return choice
