"""A train-oracle run directory read from Python: what was trained, and the oracle's scores of
each split it scored, row for row with that split's classifier cache.

    run = open_run(run_dir)
    run.record.loss, run.splits                    # "ss", ("test", "test-gaussian_noise-5")
    s = run.scores("test")                         # outputs/test.h5, verified
    s.confidence[s.valid], s.correct[s.valid]      # what the report evaluates

The scores are the run's output files (``outputs/<tag>.h5``, ``heldout/<tag>.h5``; written by
``train-oracle`` and ``predict``), read by the reader every stage uses
(``cache.outputs.read_outputs``: each column checked against its hash, the file against the
digest run.json records), so row i is the row i of the classifier cache the report pairs it with.
No torch is loaded.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cache.outputs import MadeOn, output_paths, read_outputs
from cache.runfile import RunLabels
from cache.runs import RunDir, RunError

__all__ = ["MadeOn", "Run", "RunRecord", "SplitScores", "open_run"]


RunRecord = RunLabels
"""run.json's ``run`` record (docs/DATA_CONTRACT.md): what was trained; the type every stage reads
run.json with (``cache.runfile.RunLabels``), under the API's name."""


@dataclass(frozen=True)
class SplitScores:
    """The oracle's scores of one split, one row per row of its classifier cache.

    Attributes
    ----------
    split : str
        The output's name (a split tag such as ``test``, or ``predict --out-name``'s).
    z, confidence : ndarray, shape (N,), float32
        The head's output and sigmoid(z).
    correct, valid : ndarray, shape (N,), bool
        The classifier's correctness (copied from its cache) and whether the row was scored
        (an undecodable image is not: evaluate ``[valid]`` rows, as the report does).
    index, label, pred : ndarray, shape (N,), int64
        The cache's global row index, the label and the classifier's prediction.
    paths : list of str, or None
        Each row's image file (None for in-memory datasets such as the embedded Fashion-MNIST).
    made_on : MadeOn or None
        What made the scores: ``device`` (cpu, cuda), ``name`` (the GPU, or the CPU's model),
        ``isa`` (the CPU's vector instructions), ``precision`` (bf16, fp16, fp32) and ``inputs``
        ("images", or "cached features" for a head-only run's own scores, whose features the
        named device made).  ``load_oracle`` on the same device and precision gives these
        scores bit for bit from the same images; elsewhere they differ a little (docs/METRICS.md,
        "Scores on another device").  None for files written before it was recorded.
    """
    split: str
    z: np.ndarray
    confidence: np.ndarray
    correct: np.ndarray
    valid: np.ndarray
    index: np.ndarray
    label: np.ndarray
    pred: np.ndarray
    paths: list[str] | None
    made_on: MadeOn | None


@dataclass(frozen=True)
class Run:
    """A ``train-oracle`` run directory, as ``open_run`` reads it.

    Attributes
    ----------
    path : Path
        The run directory.
    record : RunRecord
        What was trained (run.json's ``run`` record).
    status : str
        "complete", or the state of a run still training or stopped.
    head_only : bool
        A head on cached features (``--head-only``), not a fine-tuned oracle.
    splits : tuple of str
        The outputs it holds, by name (split tags): what ``scores`` reads.
    heldout : str or None
        The name of its held-out training rows' output, or None.
    """
    path: Path
    record: RunRecord
    status: str
    head_only: bool
    splits: tuple[str, ...]
    heldout: str | None

    def scores(self, split: str) -> SplitScores:
        """The oracle's scores of one split, verified (each column's hash and, where run.json
        records it, the file's digest).

        Parameters
        ----------
        split : str
            One of ``splits``, or ``heldout``'s name.

        Returns
        -------
        SplitScores

        Raises
        ------
        RunError
            The run holds no scores of ``split``.
        """
        run_dir = RunDir(self.path)
        if split in self.splits:
            path = run_dir.output(split)
        elif split == self.heldout:
            path = run_dir.heldout_output(split)
        else:
            raise RunError(f"run {self.path} has no scores of {split!r}; it holds "
                           f"{list(self.splits)} (and its held-out rows: {self.heldout!r}). "
                           f"Score a split with `cli.py predict --run {self.path} --split TAG`")
        out = read_outputs(path, digest=run_dir.record().output_digest(path))
        c = out.columns
        return SplitScores(split, c["z"], c["confidence"], c["correct"].astype(bool),
                           c["valid"].astype(bool), c["index"], c["label"], c["pred"],
                           output_paths(out), out.made_on)


def open_run(run_dir: str | Path) -> Run:
    """The run in ``run_dir`` (a ``train-oracle`` output directory).

    Parameters
    ----------
    run_dir : str or Path
        A run directory: complete, or still training (its scores so far).

    Returns
    -------
    Run

    Raises
    ------
    RunError
        ``run_dir`` holds no run.json (not a run directory, or not started).
    """
    run_dir = RunDir(Path(run_dir))
    run = run_dir.require_record()
    held = (run.heldout_output or {}).get("split")
    names = tuple(sorted(p.stem for p in run_dir.outputs()))
    return Run(run_dir.path, run.labels, str(run.status), run.head_only, names, held)
