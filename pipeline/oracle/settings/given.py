"""Options given by name -> a TrainConfig: the command line's parsed options and the Python
API's keywords through the same conversion (``Opt.convert``), defaults and refusals.

    cfg = config_from_params(ctx.params)        # train-oracle, sweep
    params = default_params(); params.update(...); check_given(head_only, given)   # the API
"""
from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any, Mapping

from cache.errors import TrustOraclesError
from pipeline.core.losses import loss_params
from pipeline.data.sources import default_artifacts
from pipeline.oracle.settings.config import (FINE_TUNE_ONLY, HEAD_ONLY, TrainConfig, option_of,
                                             train_options)
from pipeline.oracle.settings.fields import field_default


class SettingsError(TrustOraclesError, ValueError):
    """Options that do not go together (the command line's usage error, exit 2; the API's
    InputError)."""
    exit_code = 2


def config_from_params(params: Mapping[str, Any]) -> TrainConfig:
    """train-oracle's converted options by parameter name (click's ``ctx.params``, or the API's
    ``default_params`` updated) -> TrainConfig (also ``cli.py sweep``).  Paths become strings;
    the cache root defaults to artifacts/<dataset>/cache."""
    values = {"loss_params": {name: params[name] for name in loss_params()
                              if params.get(name) is not None}}
    for f in fields(TrainConfig):
        opt = f.metadata["opt"]
        if opt is None:
            continue
        value = params[opt.name]
        if f.metadata["invert"]:
            value = not value
        elif isinstance(value, Path):
            value = str(value)
        elif opt.multiple:
            value = tuple(value)
        values[f.name] = value
    if values["hub_weights"] and (values["weights"] or values["random_init"]):
        raise SettingsError("--hub-weights excludes --weights and --random-init (each says "
                               "where the oracle's starting weights come from)")
    artifacts = default_artifacts(values["data"])
    values["cache"] = values["cache"] or str(artifacts / "cache")
    return TrainConfig(**values, artifacts=str(artifacts))


def default_params() -> dict[str, Any]:
    """Every train-oracle option at the value it takes when not given (as click parses it)."""
    out = {}
    for opt in train_options():
        if opt.is_flag:
            out[opt.name] = bool(opt.default)
        elif opt.multiple:
            out[opt.name] = tuple(opt.default or ())
        elif opt.default is None:
            out[opt.name] = opt.type.missing() if hasattr(opt.type, "missing") else None
        else:
            out[opt.name] = opt.convert(opt.default)
    return out


def check_given(head_only: bool, given: set[str]) -> None:
    """--head-only with an option of the fine-tuned loop (or --features-cache or a head-only
    option without it): refused, naming the option, instead of silently ignoring it.
    ``given``: the parameter names set explicitly."""
    if not head_only:
        if option_of("features_cache").name in given:
            raise SettingsError("--features-cache applies to --head-only training only")
        wrong = [option_of(f).flag for f in HEAD_ONLY if option_of(f).name in given]
        if wrong:
            verb = "applies" if len(wrong) == 1 else "apply"
            raise SettingsError(f"{' and '.join(wrong)} {verb} to --head-only runs only (the "
                                "head trained on the oracle's cached features): add --head-only")
        return
    wrong = [option_of(f).flag for f in FINE_TUNE_ONLY if option_of(f).name in given]
    if wrong:
        raise SettingsError(f"{', '.join(wrong)} {'does' if len(wrong) == 1 else 'do'} not "
                            "apply to --head-only (the head trains in float32 on cached "
                            "features, in one process, without a DataLoader or mid-run "
                            "checkpoints; a re-run retrains an incomplete run)")


def head_only_misfits(cfg: TrainConfig) -> list[str]:
    """Fine-tune-only settings a head-only config sets (their flags): refused by the API as by
    the command line."""
    return [f.metadata["opt"].flag for f in fields(TrainConfig)
            if f.metadata["fine_tune_only"] and getattr(cfg, f.name) != field_default(f)]


def head_only_settings(cfg: TrainConfig) -> list[str]:
    """The flags of the head-only settings a config sets off their default (refused by
    fine-tuned runs: they choose the head trained on cached features)."""
    return [option_of(n).flag for n in HEAD_ONLY if getattr(cfg, n) != field_default(
        TrainConfig.__dataclass_fields__[n])]
