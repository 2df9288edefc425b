"""Training oracles from Python: the runs ``cli.py train-oracle`` trains, with its losses or
your own, and (re-exported) a head on features held in memory.

    cfg = settings(data="/imagenet", classifier="vit", loss="ce", head_only=True)
    result = train(cfg)                        # = train-oracle --data /imagenet ... --head-only
    result.run_dir, result.val_aupr_error, result.outputs["val"]
    result = train(cfg, loss=squared_hinge)    # the same run with your loss (trust_oracles.losses)
    oracle = train_head(features, correct)     # trust_oracles.heads: no cache, no run directory

``settings`` is the command line's option handling in Python: each option converted and checked
by its own value type (``Opt.convert``, as click's parser does for train-oracle), the others at
their defaults, the head-only refusals, then ``config_from_params``
(``pipeline.oracle.settings.config``, which the command calls too); the
dataset's preset fills the protocol options left None when the run is prepared, as on the
command line.  ``train`` calls what the command calls (``pipeline.oracle.finetune.train.train``
or ``pipeline.oracle.headonly.train.train_head_only``), so a run trained here is the command's:
the same directory, run.json, notes and warnings, outputs; a run found complete is not trained
again, an incomplete fine-tuned one resumes.  A loss of your own (``loss=``) trains through the
same loop, recorded as ``custom:<module>.<qualname>`` (``trust_oracles.losses``).
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

from cache.runs import RunDir
from pipeline.core.catalog import BEST_KEY
from pipeline.core.losses import LossOptionError, loss_params, names
from pipeline.core.values import OptionValueError
from pipeline.oracle.finetune.train import train as train_finetuned
from pipeline.oracle.headonly.train import train_head_only
from pipeline.oracle.loop.state import TrainingDiverged
from pipeline.oracle.settings.config import TrainConfig
from pipeline.oracle.settings.fields import param_option
from pipeline.oracle.settings.given import (SettingsError, check_given, config_from_params,
                                            default_params)
from pipeline.oracle.settings.record import config_from_record
from trust_oracles.errors import InputError, received
from trust_oracles.heads import HeadOracle, train_head
from trust_oracles.runs import RunRecord
from trust_oracles.losses import (CustomLossError, Loss, LossFn, custom_loss_name,
                                  loss_class_options)

__all__ = ["CustomLossError", "HeadOracle", "LossFn", "LossOptionError", "RunRecord", "RunResult",
           "TrainConfig", "TrainingDiverged", "custom_loss_name", "settings", "train",
           "train_head"]

def _options() -> dict:
    """settings()' keywords -> (invert, option): the TrainConfig fields with an option, and the
    registered losses' own parameters (``loss_params`` by name)."""
    out = {f.name: (f.metadata["invert"], f.metadata["opt"]) for f in fields(TrainConfig)
           if f.metadata["opt"] is not None}
    return {**out, **{name: (False, param_option(p)) for name, p in loss_params().items()}}


# --------------------------------------------------------------------------- settings --
def settings(**options: str | int | float | bool | os.PathLike | Sequence[str]
             | Mapping[str, object] | None) -> TrainConfig:
    """The ``TrainConfig`` that ``cli.py train-oracle`` builds from the same options.

    Parameters
    ----------
    **options
        ``TrainConfig`` fields by name, e.g. ``data="/imagenet"``, ``loss="ce"``, ``epochs=2``,
        ``head_only=True``, ``model_kwargs={"depth": 2}``, ``progress=False``; a registered
        loss's own parameters by name (``gamma=0.5``, ``alpha_neg=4``).  Each is converted
        and checked as its command-line option is; the rest take the command line's defaults
        (``cache``: <artifacts of data>/cache; protocol options left None are filled by the
        dataset's preset when the run is prepared, as on the command line).

    Returns
    -------
    TrainConfig
        Frozen; ``dataclasses.replace`` derives others.

    Raises
    ------
    InputError
        An unknown option, a value its option refuses, or options that do not go together
        (the command line's usage errors, with its message).
    """
    known, params = _options(), default_params()
    for key, value in options.items():
        if key not in known:
            raise received("settings()", f"option {key!r}", f"one of {', '.join(known)}")
        if key == "loss" and callable(value):
            raise received("settings(loss=...)", "a function", f"a registered loss {names()}",
                           "Pass your own loss to train(settings, loss=fn)")
        invert, opt = known[key]
        try:
            params[opt.name] = opt.convert(not value if invert else value)
        except OptionValueError as err:
            raise InputError(f"settings({key}={value!r}): {err}") from None
    try:
        check_given(bool(params["head_only"]), {known[k][1].name for k in options})
        return config_from_params(params)
    except SettingsError as err:
        raise InputError(str(err)) from None


# ------------------------------------------------------------------------ train a run --
@dataclass(frozen=True)
class RunResult:
    """A run trained (or found complete) by ``train``: its directory and run.json's main fields.

    Attributes
    ----------
    run_dir : Path
    status : str
        ``complete``, or ``stopped``/``interrupted`` (``stop_at_step`` or a signal: the same call
        continues it).
    run : RunRecord
        What was trained.
    settings : TrainConfig
        The resolved config run.json records.
    head_only : bool
    step, total_steps : int
        The last step trained, of how many.
    resumed_at : int
        The step this call started from (0: from scratch).
    already_complete : bool
        The run was found complete: nothing trained.
    best_step : int or None
        The step kept.
    val_aupr_error : float or None
        The kept step's held-out AUPR-Error (None: the final model, no held-out rows).
    outputs : dict of str to Path
        Each evaluated split's tag -> its scores file (``outputs/<tag>.h5``).
    heldout_output : Path or None
        The held-out training rows' scores (None without held-out rows).
    train_rows, val_rows : int
        Rows trained on and held out.
    step_path : str
        How a step ran: eager or cuda_graph.
    """
    run_dir: Path
    status: str
    run: RunRecord
    settings: TrainConfig
    head_only: bool
    step: int
    total_steps: int
    resumed_at: int
    already_complete: bool
    best_step: int | None
    val_aupr_error: float | None  # the chosen step's held-out AUPR-Error (None: the final model)
    outputs: dict[str, Path]
    heldout_output: Path | None
    train_rows: int
    val_rows: int
    step_path: str                # eager or cuda_graph


def train(settings: TrainConfig, *, loss: type[Loss] | Loss | LossFn | None = None,
          loss_name: str | None = None) -> RunResult:
    """Train (or resume, or find complete) the run ``settings`` describe, as ``cli.py
    train-oracle`` does: fine-tuned, or head-only with ``settings.head_only``.

    Parameters
    ----------
    settings : TrainConfig
        From ``settings(...)`` (the command line's defaults), or built directly.
    loss : Loss subclass or instance, or LossFn, optional
        Your own loss instead of ``settings.loss`` (``trust_oracles.losses``).  A class is
        registered under its name and trained as ``settings.loss = its name`` (its options from
        ``settings``); an instance also sets its values and class weights.  A function: loss
        options of the registered losses (gamma, alpha_pos, ...) are refused with it, ``z``
        chooses its head (linear by default).
    loss_name : str, optional
        The name a function's run records (``custom:<loss_name>``); default
        ``custom_loss_name(loss)``.

    Returns
    -------
    RunResult

    Raises
    ------
    CustomLossError
        ``loss`` returned something other than a finite scalar tensor with a gradient.
    LossOptionError, RunError, CacheError, ModelError
        As the command line (its messages).
    TrainingDiverged
        The loss became NaN or infinite (a ``RunError``).
    """
    cfg, named = settings, loss_class_options(loss)
    if named is not None:
        if loss_name is not None:
            raise received("loss_name", repr(loss_name), "none with a loss class (its name is "
                           "the run's)")
        cfg = _with_loss(cfg, *named)
        loss = None
    elif loss is not None:
        cfg = replace(cfg, loss=custom_loss_name(loss, loss_name))
    elif loss_name is not None:
        raise received("loss_name", repr(loss_name), "a name for loss=fn, which is not given")
    if cfg.head_only:
        summary = train_head_only([cfg], loss_fn=loss)[0]
    else:
        summary = train_finetuned(cfg, loss_fn=loss)
    if summary["status"] == "failed":
        raise TrainingDiverged(f"{summary['error']} (run {summary['run_dir']})")
    return _result(summary)


def _with_loss(cfg: TrainConfig, name: str, options: dict) -> TrainConfig:
    """``cfg`` training the registered loss ``name`` with an instance's ``options``."""
    own = {k: v for k, v in options.items() if k in loss_params()}
    rest = {k: v for k, v in options.items() if k not in own}
    return replace(cfg, loss=name, loss_params={**cfg.loss_params, **own}, **rest)


def _result(summary: dict) -> RunResult:
    run_dir = Path(summary["run_dir"])
    run = RunDir(run_dir).record()
    best = run.best or {}
    held = run.heldout_output
    return RunResult(
        run_dir, run.status, run.labels, config_from_record(run.config), run.head_only, run.step,
        int(summary["total_steps"]), int(summary.get("resumed_at", 0)),
        bool(summary.get("already_complete")), best.get("step"), best.get(BEST_KEY),
        {tag: Path(p) for tag, p in run.outputs.items()},
        RunDir(run_dir).heldout_output(held["split"]) if held else None,
        int(run.rows.get("train", 0)), int(run.rows.get("val", 0)),
        run.step_path.get("mode", "eager"))



