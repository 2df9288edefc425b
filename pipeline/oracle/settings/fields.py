"""How a TrainConfig field is declared: ``setting`` (its default, option and part of the run),
the option of a numeric loss parameter (``pipeline.core.losses``' ``Param``), and a protocol
default as --help shows it.  Torch-free.
"""
from __future__ import annotations

import re
from dataclasses import MISSING, Field, field, replace
from typing import Any

from pipeline.core.losses import Param, all_params
from pipeline.core.options import NON_NEGATIVE, Opt, positive
from pipeline.core.presets import EMBEDDED_ORACLE, PAPER_ORACLE


def preset_default(key: str, none: str) -> str:
    """A protocol option's default as --help shows it: what the preset resolves it to on the
    embedded Fashion-MNIST (EMBEDDED_ORACLE) and on any other data (PAPER_ORACLE, the paper's
    protocol); ``none``: the words for a preset value None."""
    def show(value):
        return none if value is None else f"{value:g}" if isinstance(value, float) else str(value)

    embedded, paper = show(EMBEDDED_ORACLE[key]), show(PAPER_ORACLE[key])
    if embedded == paper:
        return f"from the preset ({paper})"
    return f"from the preset (embedded: {embedded}; paper: {paper})"


def setting(default: Any = None, opt: Opt | None = None, part: str = "run", *, factory=None,
            fine_tune_only: bool = False, head_only: bool = False, bank_free: bool = False,
            loss: bool = False, invert: bool = False, later: bool = False) -> Field:
    """A TrainConfig field: its default, the option that sets it (``invert``: a --no-X flag),
    and where it belongs (module docstring).  ``head_only``: it applies to --head-only runs
    only; ``later``: added after runs existed, so at its default it stays out of the group hash
    (those runs keep their group and run directory)."""
    if (opt is not None and not invert and not opt.is_flag and not opt.multiple and
            opt.default is None and opt.default_text is None and default is not None):
        # the option shows the field's one default; one left at None is chosen at run time
        # (and says so in its default_text), so a shared bundle option (--seed) stays the
        # bundle's own object
        opt = replace(opt, default=default)
    meta = {"opt": opt, "part": part, "fine_tune_only": fine_tune_only, "head_only": head_only,
            "bank_free": bank_free, "loss": loss, "invert": invert, "later": later}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _param_type(p: Param):
    return positive(max_open_one=True) if p.below_one else positive() if p.open_min else NON_NEGATIVE


def _help_without_default(text: str) -> str:
    """A Param's help less the default it states in words: --help shows the default instead."""
    return re.sub(r" \(default [^)]*\)", "", text).split(" Default")[0]


def param_option(p: Param) -> Opt:
    """The option of a numeric loss parameter (``pipeline.core.losses``: the losses' own ones
    and the class weights), value None when not given: the loss fills its default."""
    return Opt((p.flag,), type=_param_type(p), group="protocol", help=_help_without_default(p.help),
               default_text=p.default_text or f"{p.default:g}")


def loss_param(name: str) -> Field:
    """A class-weight option of every weighted loss (``WEIGHT_PARAMS``) as a TrainConfig field."""
    return setting(None, param_option(all_params()[name]), loss=True, bank_free=True)


def field_default(f: Field) -> Any:
    """A dataclass field's default (its factory's value for a mutable one)."""
    return f.default_factory() if f.default is MISSING else f.default
