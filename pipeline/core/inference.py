"""The one way a model is made ready to score: every place that scores goes through here.

A timm model built for scoring must not be in training mode: BatchNorm would normalise each batch
by its own statistics (an image's score would depend on which images share its batch) and update
its running statistics on every call, and dropout would fire.  ``for_inference`` is what every
loader returns (classifiers, oracle backbones, trained oracles); ``scoring`` is for a model that
is being trained and is scored in between (validation), restoring its mode afterwards.
MC-Dropout is the one deliberate exception: ``pipeline.extract.mcdropout`` switches its dropout
sites (and only those) back to training mode, inside ``torch.inference_mode``.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn


def for_inference(model: nn.Module) -> nn.Module:
    """``model`` in eval mode with no parameter requiring a gradient (in place; returned).

    A forward pass then uses BatchNorm's running statistics, applies no dropout, updates no
    buffer and builds no autograd graph, in any caller's context (a notebook included)."""
    model.eval()
    model.requires_grad_(False)
    return model


def for_training(model: nn.Module) -> nn.Module:
    """``model`` in training mode with every parameter trainable (in place; returned)."""
    model.train()
    model.requires_grad_(True)
    return model


@contextmanager
def scoring(model: nn.Module) -> Iterator[nn.Module]:
    """Score a model that may be in training: eval mode and ``torch.inference_mode`` inside the
    block, the model's own mode restored after it (a validation pass in the middle of training)."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield model
    finally:
        model.train(was_training)
