"""The losses by name: ``register`` checks a ``Loss`` subclass's declarations and adds it; the
command line's --loss choices, the report's row order and the sweep's options read them here.

    @register
    class Hinge(Loss): ...            # name, label, tnr, params, per_sample (base.Loss)
    get("ss").resolve(given, ctx, counts)
"""
from __future__ import annotations

import math
from typing import Mapping

from pipeline.core.losses.base import (CUSTOM_PREFIX, HEADS, TNR_RULES, WEIGHT_PARAMS,
                                       CustomLossError, Loss, LossOptionError, Param)

_LOSSES: dict[str, type[Loss]] = {}          # in registration order: the tables' row order
# The options that apply to some losses only, besides each loss's own parameters.
FLAGS = {"broadcast": "--authors-broadcast", "z": "--ss-distance",
         "class_balanced": "--class-balanced"}


def register(cls: type[Loss]) -> type[Loss]:
    """Add a loss (a class decorator).  Refused, naming the missing piece: not a ``Loss``
    subclass, no name/label, a name taken by another class, a TNR rule not in ``TNR_RULES``, no
    ``per_sample``, a head not in ``HEADS``, a parameter that is not a ``Param`` or that clashes
    with another loss's or the class weights' declaration of the same name."""
    what = getattr(cls, "__qualname__", repr(cls))
    if not (isinstance(cls, type) and issubclass(cls, Loss)) or cls is Loss:
        raise CustomLossError(f"{what}: a loss is a subclass of pipeline.core.losses.Loss")
    for attr in ("name", "label"):
        if not isinstance(getattr(cls, attr), str) or not getattr(cls, attr).strip():
            raise CustomLossError(f"loss class {what} declares no {attr} (a non-empty string)")
    if cls.name.startswith(CUSTOM_PREFIX) or cls.name != cls.name.strip():
        raise CustomLossError(f"loss class {what}: name {cls.name!r} must not start with "
                              f"{CUSTOM_PREFIX!r} (a loss function's) nor carry spaces at its ends")
    if cls.name in _LOSSES and _LOSSES[cls.name] is not cls:
        raise CustomLossError(f"loss name {cls.name!r} is taken by "
                              f"{_LOSSES[cls.name].__module__}.{_LOSSES[cls.name].__qualname__}; "
                              f"{what} needs another name")
    if cls.tnr not in TNR_RULES:
        raise CustomLossError(f"loss {cls.name!r} declares no TNR rule: set tnr to one of "
                              f"{sorted(TNR_RULES)} ({'; '.join(f'{k}: {v}' for k, v in TNR_RULES.items())})")
    if cls.per_sample.__func__ is Loss.per_sample.__func__:
        raise CustomLossError(f"loss {cls.name!r} has no formula: implement per_sample(z, c_pos, "
                              "c_neg, p_true, bank) -> (B, P) per-sample losses")
    if cls.head not in HEADS:
        raise CustomLossError(f"loss {cls.name!r}: head {cls.head!r}, expected one of {HEADS}")
    _check_params(cls)
    _LOSSES[cls.name] = cls
    return cls


def _check_params(cls: type[Loss]) -> None:
    declared = {p.name: p for p in WEIGHT_PARAMS}
    for other in _LOSSES.values():
        if other is not cls:
            declared.update({p.name: p for p in other.params})
    for p in cls.params:
        if not isinstance(p, Param):
            raise CustomLossError(f"loss {cls.name!r}: parameter {p!r} is not a Param")
        if p.name in FLAGS or (p.name in declared and declared[p.name] != p):
            raise CustomLossError(f"loss {cls.name!r}: parameter {p.name!r} clashes with another "
                                  "declaration of that name (same name, same Param, or rename it)")


def get(name: str) -> type[Loss]:
    """The loss registered as ``name``."""
    if name not in _LOSSES:
        raise LossOptionError(f"--loss {name!r}: expected one of {names()}")
    return _LOSSES[name]


def names() -> tuple[str, ...]:
    """Registered losses, in table order."""
    return tuple(_LOSSES)


def loss_params() -> dict[str, Param]:
    """The losses' own numeric parameters, each once, in registration order."""
    out: dict[str, Param] = {}
    for cls in _LOSSES.values():
        out.update({p.name: p for p in cls.params if p.name not in out})
    return out


def all_params() -> dict[str, Param]:
    """Every numeric loss option: the losses' own parameters, then the class weights."""
    return {**loss_params(), **{p.name: p for p in WEIGHT_PARAMS}}


def flag(name: str) -> str:
    params = all_params()
    return params[name].flag if name in params else FLAGS.get(name, "--" + name.replace("_", "-"))


def option_losses(name: str) -> tuple[str, ...]:
    """The losses an option applies to (parameters, class weights, --ss-distance,
    --authors-broadcast)."""
    if name in ("class_balanced", *(p.name for p in WEIGHT_PARAMS)):
        return tuple(n for n, c in _LOSSES.items() if c.weighted)
    if name == "broadcast":
        return tuple(n for n, c in _LOSSES.items() if c.broadcastable)
    if name == "z":
        return tuple(n for n, c in _LOSSES.items() if c.head == "hyperplane")
    return tuple(n for n, c in _LOSSES.items() if name in {p.name for p in c.params})


def check_options(loss: str, given: Mapping) -> None:
    """Refuse options that do not apply to ``loss`` (``given``: option -> value, None = unset),
    in the order: its own parameters, --ss-distance, the class weights, --authors-broadcast."""
    cls = get(loss)
    order = (*loss_params(), "z", "class_balanced", "pos_weight", "neg_weight", "broadcast")
    for name in order:
        value = given.get(name)
        if value is None or value is False:
            continue
        allowed = option_losses(name)
        if loss not in allowed:
            raise LossOptionError(f"{flag(name)} does not apply to --loss {loss} (it applies to "
                                  f"--loss {'/'.join(allowed) or 'none'})")
    unknown = sorted(set(given) - {*order, "cb_beta"})
    if unknown:
        raise LossOptionError(f"loss option(s) {unknown}: expected among {list(order)}")
    if given.get("cb_beta") is not None and not given.get("class_balanced"):
        raise LossOptionError("--cb-beta needs --class-balanced")
    naive = any(given.get(p.name) is not None for p in WEIGHT_PARAMS[:2])
    if naive and given.get("class_balanced"):
        raise LossOptionError("--class-balanced and --pos-weight/--neg-weight are exclusive: "
                              "class-balanced weights are computed from the training split")
    for param in (*cls.params, *WEIGHT_PARAMS):
        if given.get(param.name) is not None:
            param.check(given[param.name])
    if given.get("z") is not None and given["z"] not in HEADS:
        raise LossOptionError(f"--ss-distance {given['z']!r}: expected one of {HEADS}")


def tnr_rule(name: str, recorded: str | None = None) -> str:
    """A run's TNR rule (TNR_RULES): as its run record gives it, else its registered loss's; a
    loss function's (custom:...) is "half".  A run of a loss class this process has not
    registered, written before runs recorded the rule, is refused."""
    if recorded is not None:
        return recorded
    if name.startswith(CUSTOM_PREFIX):
        return "half"
    if name not in _LOSSES:
        raise LossOptionError(f"loss {name!r} is not registered and its run records no TNR rule: "
                              "import the module that registers it first")
    return _LOSSES[name].tnr


def tnr_threshold(rule: str, num_classes: int) -> float:
    """The confidence below which the paper's TNR counts a row as rejected under ``rule``."""
    return 1.0 / num_classes if rule == "chance" else 0.5


def tnr_logit(rule: str, num_classes: int) -> float:
    """``tnr_threshold`` on the head's output z (confidence = sigmoid(z))."""
    if rule != "chance" or num_classes <= 1:
        return 0.0
    p = 1 / num_classes
    return math.log(p / (1 - p))
