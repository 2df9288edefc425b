"""A loss of your own for an oracle: a function, or a class like the built-in losses'.

A CLASS (``Loss`` subclass, the built-in losses' way: its parameters, defaults, TNR rule and
formula vectorised over a bank of heads; ``pipeline.core.losses.base``) is registered under its
name and trains like a built-in loss, graphed where it declares ``graphable``:

    class Hinge(Loss):
        name, label, tnr = "hinge", "Hinge", "half"
        params = (Param("margin", default=1.0, help="Hinge only: the margin."),)
        @classmethod
        def per_sample(cls, z, c_pos, c_neg, p_true, bank):  # z (B, P) -> (B, P)
            sign = c_pos - c_neg                              # +w+ right, -w- wrong
            return torch.relu(bank["margin"] - sign * z)

    trust_oracles.training.train(settings(loss="hinge", margin=2), loss=Hinge)
    trust_oracles.training.train_head(features, correct, loss=Hinge(values={"margin": 2}))

A module that registers it (``@register``) before ``cli.py`` builds its options makes it a
--loss choice; ``register`` refuses a second class under a taken name and a class that lacks a
name, label, TNR rule or ``per_sample``, and every class is tried on a small batch before
training (its shape, finiteness and gradient).

A FUNCTION is the quickest way; what it is called with, what it returns, the name a run records
for it:

    def squared_hinge(z, correct):                    # z (B,) float32, correct (B,) 0./1.
        sign = 2 * correct - 1                        # +1 right, -1 wrong
        return torch.relu(1 - sign * z).pow(2).mean() # a 0-dim tensor: the batch mean

    trust_oracles.training.train(settings, loss=squared_hinge)   # a run: fine-tuned or head-only
    trust_oracles.training.train_head(features, correct, loss=squared_hinge)

``LossFn``: ``loss(z, correct) -> Tensor``.  ``z`` is a (B,) float32 tensor, one head's outputs
on a batch (the oracle's confidence is sigmoid(z)); ``correct`` is (B,) float32, 1.0 where the
classifier is right and 0.0 where it is wrong; the result is a 0-dim floating-point tensor, the
mean over the batch, differentiable in z.  A head-only bank of P heads calls it once per head
(column of z).  It trains through the same loop as the built-in losses, eagerly (never inside a
CUDA graph, which would replay one call's kernels and freeze whatever it does in Python); an
``nn.Module`` is moved to the training device and its parameters are not trained.  Every value
returned is checked: a tensor, 0-dim, floating point, with a gradient, and finite on the first
training batch; otherwise ``CustomLossError`` names the loss.  A non-finite value later is the
loop's divergence (``TrainingDiverged``), as for a built-in loss.

The name (``custom_loss_name``) is ``custom:<module>.<qualname>``, or ``custom:<name>`` given:
run.json's loss, part of the run's group and folder, so runs of differently named losses never
share a directory or resume each other.  The name is all a run knows of the loss: a run found
complete or resumed under the same name is taken as trained by the same function, so give
another name when the code or the parameters change (two instances of one ``nn.Module`` class
with different parameters share its class's name: name them).
"""
from __future__ import annotations

from functools import partial
from types import BuiltinFunctionType, FunctionType, MethodType
from typing import Any, Callable

import torch

from pipeline.core.losses import (CUSTOM_PREFIX, WEIGHT_PARAMS, CustomLossError, Loss, Param,
                                  register)
from trust_oracles.errors import received

__all__ = ["CustomLossError", "Loss", "LossFn", "Param", "custom_loss_name", "register"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""A loss of your own as a function: ``loss(z, correct) -> scalar``, ``z`` the oracle's output
(B,) float32 and ``correct`` (B,) float32 0./1., returning the batch mean as a 0-dim tensor."""


def custom_loss_name(loss: LossFn, name: str | None = None) -> str:
    """The name a run records for ``loss``: ``custom:<name>``, or ``custom:<module>.<qualname>`` of
    a function (of its class, for an ``nn.Module`` or another callable object).

    Parameters
    ----------
    loss : LossFn
        A function or a callable object ``loss(z, correct) -> scalar``.
    name : str, optional
        The name to record instead of the qualified one.

    Returns
    -------
    str
        ``custom:<name>``: run.json's loss, the run's group and folder name.

    Raises
    ------
    InputError
        ``loss`` is not callable, or has no telling name (a lambda, a function defined inside
        another, a ``functools.partial``) and no ``name`` is given.
    """
    if not callable(loss) or isinstance(loss, str):
        raise received("loss", type(loss).__name__, "a callable loss(z, correct) -> scalar")
    if name is not None:
        if not isinstance(name, str) or not name.strip() or not name.isprintable():
            raise received("loss_name", repr(name), "a non-empty printable string")
        return CUSTOM_PREFIX + name.strip()
    qualified, telling = qualified_name(loss)
    if not telling:
        raise received("loss", f"{qualified} (no name that tells it apart from another)",
                       "a module-level function or class", "Or name it: loss_name='...' (the "
                       "name identifies the run)")
    return CUSTOM_PREFIX + qualified


def qualified_name(loss: LossFn) -> tuple[str, bool]:
    """(<module>.<qualname> of a function, or of an object's class; whether it tells the loss
    apart: not a lambda, a local function or a functools.partial)."""
    plain = isinstance(loss, (FunctionType, MethodType, BuiltinFunctionType))
    target = loss if plain else type(loss)
    qual = getattr(target, "__qualname__", type(loss).__name__)
    telling = "<" not in qual and not isinstance(loss, partial)
    return f"{getattr(target, '__module__', None) or '?'}.{qual}", telling


def loss_class_options(loss: Any) -> tuple[str, dict] | None:
    """A ``Loss`` subclass (registered here) -> (its name, no options); an instance -> (its
    class's name, its values and class weights as options); anything else -> None (a function).

    Raises
    ------
    CustomLossError
        The class lacks a name, label, TNR rule or ``per_sample``, or another class holds its
        name.
    """
    if isinstance(loss, type) and issubclass(loss, Loss):
        return register(loss).name, {}
    if isinstance(loss, Loss):
        options = {**loss.values, "broadcast": loss.broadcast or None,
                   "class_balanced": loss.class_balanced or None}
        if loss.class_balanced:
            options["cb_beta"] = loss.cb_beta
        else:
            options.update({p.name: getattr(loss, p.name) for p in WEIGHT_PARAMS[:2]
                            if getattr(loss, p.name) != 1.0})
        return register(type(loss)).name, {k: v for k, v in options.items() if v is not None}
    return None
