"""A loss of your own for an oracle: what it is called with, what it returns, the name a run
records for it.

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
from typing import Callable

import torch

from pipeline.core.losses import CustomLossError
from pipeline.oracle.nets.losses import CUSTOM_PREFIX
from trust_oracles.errors import received

__all__ = ["CustomLossError", "LossFn", "custom_loss_name"]

# loss(z (B,) float32, correct (B,) float32 0/1) -> 0-dim tensor, the batch mean (module docstring)
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def custom_loss_name(loss: LossFn, name: str | None = None) -> str:
    """The name a run records for ``loss``: ``custom:<name>``, or ``custom:<module>.<qualname>`` of
    a function (of its class, for an ``nn.Module`` or another callable object).

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
