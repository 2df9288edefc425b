"""run.json, typed: what every reader of a run directory takes from it.

    run = RunDir(path).record()          # RunFile (CacheError when missing or damaged)
    run.labels.loss, run.status          # "ss", "complete"
    run.output_digest("test")            # the size and hash recorded for outputs/test.h5

``RunFile`` names the keys that code reads (docs/DATA_CONTRACT.md, Stage 2); ``raw`` keeps the
file as read, so a writer that rewrites run.json (``pipeline.oracle.loop.outputs``) keeps what
this type does not name.  A copied run directory without run.json reads as ``RunFile.empty()``
(no labels, no status).  Torch-free.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from cache.errors import TrustOraclesError
from cache.schema import CacheError


class RunError(TrustOraclesError, RuntimeError):
    """A run directory holds another run, a run cannot resume, or training failed (NaN/inf)."""


@dataclass(frozen=True)
class RunLabels:
    """run.json's ``run`` record: what was trained (also each output file's ``run`` attribute).

    Attributes
    ----------
    oracle, oracle_model : str
        The oracle's backbone as given (a preset or timm name) and the model built.
    classifier : str
        The classifier whose correctness it learned.
    loss : str
        ce, focal, tcp, ss, or ``custom:<name>``; ``loss_label`` its name in tables.
    variant : str
        e.g. "head-only", "broadcast+head-only" ("" for the paper's recipe).
    seed : int
    group : str
        12 hex digits: everything but the seed (the seeds of one recipe share it).
    dataset : str
    num_classes : int
    config : mapping
        The resolved training settings.
    tnr : str or None
        The loss's TNR rule.
    """
    oracle: str
    oracle_model: str
    classifier: str
    loss: str                     # ce, focal, tcp, ss, or custom:<name>
    variant: str                  # e.g. "head-only", "broadcast+head-only"
    loss_label: str
    seed: int
    group: str                    # 12 hex digits: everything but the seed
    dataset: str
    num_classes: int
    config: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    tnr: str | None = None        # the loss's TNR rule; None in runs written before it was recorded

    @classmethod
    def from_json(cls, record: Mapping[str, Any], where: str = "run.json") -> "RunLabels":
        """Read from run.json's ``run`` record.

        Parameters
        ----------
        record : mapping
            The record as stored.
        where : str
            The file named in the error.

        Returns
        -------
        RunLabels

        Raises
        ------
        CacheError
            The record lacks a field.
        """
        missing = [f.name for f in fields(cls) if f.name not in record and f.name != "tnr"]
        if missing:
            raise CacheError(f"{where}: the run record lacks {missing}; it was not written by "
                             "train-oracle (or is damaged): delete the run directory to retrain")
        return cls(**{f.name: record[f.name] for f in fields(cls) if f.name in record})


def _frozen(value: Mapping | None) -> Mapping:
    return MappingProxyType(dict(value or {}))


@dataclass(frozen=True)
class RunFile:
    """One run.json.  ``labels`` is None only for a copied run directory without run.json.

    ``outputs``: {output name: file path}; ``output_files``: {output name: {bytes, xxh3_128}};
    ``heldout_output``: the held-out rows' output ({split, bytes, xxh3_128}) or None;
    ``train_cache`` / ``feature_caches``: the caches the run trained on (``train_cache``: absolute
    since it was recorded with ``train_cache_from_run``, the path relative to the run directory, and
    ``train_cache_given``, as typed; ``cache.runcache`` finds it); ``oracle_build``: how
    to rebuild the network (None before training finished); ``grad_norm``: the run mean of the
    per-sample head-input gradient norm (the appendix's gradient magnitudes); ``classifier_identity``: the identity of the
    classifier whose correctness it learned; ``step``: the last step trained; ``step_path``: how
    a step ran (eager, CUDA graph) and why; ``made_on``: the device and precision its stored
    scores were made on (``cache.outputs.MadeOn``' record; None before it was recorded)."""
    labels: RunLabels | None
    status: str | None
    head_only: bool
    train_cache: str | None
    train_cache_from_run: str | None
    train_cache_given: str | None
    train_fingerprint: str | None
    feature_caches: Mapping[str, Any]
    heldout_output: Mapping[str, Any] | None
    outputs: Mapping[str, str]
    output_files: Mapping[str, Mapping[str, Any]]
    best: Mapping[str, Any] | None
    rows: Mapping[str, int]
    oracle_build: Mapping[str, Any] | None
    grad_norm: Mapping[str, Any] | None
    classifier_identity: Mapping[str, Any] | None
    step: int
    step_path: Mapping[str, Any]
    made_on: Mapping[str, Any] | None
    error: str
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, payload: Mapping[str, Any], where: str = "run.json") -> "RunFile":
        if not isinstance(payload, Mapping):
            raise CacheError(f"{where} is not a JSON object; delete the run directory to retrain")
        record = payload.get("run")
        return cls(labels=RunLabels.from_json(record, where) if record is not None else None,
                   status=payload.get("status"), head_only=bool(payload.get("head_only")),
                   train_cache=payload.get("train_cache"),
                   train_cache_from_run=payload.get("train_cache_from_run"),
                   train_cache_given=payload.get("train_cache_given"),
                   train_fingerprint=payload.get("train_fingerprint"),
                   feature_caches=_frozen(payload.get("feature_caches")),
                   heldout_output=payload.get("heldout_output") or None,
                   outputs=_frozen(payload.get("outputs")),
                   output_files=_frozen(payload.get("output_files")),
                   best=payload.get("best") or None, rows=_frozen(payload.get("rows")),
                   oracle_build=payload.get("oracle_build"),
                   grad_norm=payload.get("grad_norm"),
                   classifier_identity=payload.get("classifier_identity"),
                   step=int(payload.get("step") or 0),
                   step_path=_frozen(payload.get("step_path")),
                   made_on=payload.get("made_on"),
                   error=payload.get("error") or "",
                   raw=_frozen(payload))

    @classmethod
    def empty(cls) -> "RunFile":
        """A run directory that holds only outputs (a copied run)."""
        return cls.from_json({})

    @property
    def config(self) -> Mapping[str, Any]:
        """The resolved train-oracle config the run recorded ({} without labels)."""
        return self.labels.config if self.labels else {}

    @property
    def complete(self) -> bool:
        return self.status == "complete"

    def require_complete(self, run_dir: str | Path) -> "RunFile":
        """This record, if the run finished; a run still training, stopped or failed is refused
        (``RunError``)."""
        if not self.complete:
            raise RunError(f"run {run_dir} is not complete (status {self.status!r}); finish "
                           "training first (re-run the same train-oracle command)")
        return self

    def output_digest(self, output: str | Path) -> dict | None:
        """The size and XXH3-128 hash recorded for the output file named ``output`` (a path or
        its stem; None: not recorded)."""
        found = self.output_files.get(Path(output).stem)
        return dict(found) if found is not None else None
