"""A classifier fitted without some classes (``fit-classifier --holdout-classes``) never predicts
them: the one rule, applied by ``models.build_model`` to every model built from such a checkpoint.

The checkpoint keeps the dataset's class indices (output k is class k, so labels stay the
dataset's) and records the held-out classes in its meta (``HELD_OUT``, ``HELD_OUT_NAMES``).  Their
outputs were never trained towards, yet a plain argmax could still pick one; so the head's rows of
those classes are set to weight 0 and bias ``HELD_OUT_LOGIT``: their logits are that constant for
every image, whatever the features.  Done on the weights, not in a forward hook, so that every
path through the model (extract's features + head, attacks, predict, an oracle started from the
classifier, a copied state dict) sees the same classifier, and ``weights_sha256`` identifies it.
The value is large but FINITE: caches refuse non-finite logits, and softmax entropy and other
logit statistics stay finite (a probability of exactly 0 times a finite log-probability is 0).
"""
from __future__ import annotations

import torch
from torch import nn

from pipeline.core.errors import ModelError

HELD_OUT = "held_out_classes"             # the checkpoint meta's key: sorted class indices
HELD_OUT_NAMES = "held_out_class_names"   # ... and their names, for people reading it
HELD_OUT_LOGIT = -1.0e4                   # exp(-1e4 - max) is 0 in every float format; finite


def held_out_of(obj) -> tuple[int, ...]:
    """The classes a loaded weights file (``_load_file``'s object) holds out: those its
    fit-classifier meta records, else none."""
    meta = obj.get("meta") if isinstance(obj, dict) else None
    return tuple(int(k) for k in (meta or {}).get(HELD_OUT) or ())


def mask_held_out(model: nn.Module, classes: tuple[int, ...]) -> None:
    """Fix the logits of ``classes`` to ``HELD_OUT_LOGIT`` (weights 0, bias the constant), in
    place.  A model whose head was replaced by one of another size (an oracle backbone without
    the classifier's head) keeps it as it is."""
    if not classes:
        return
    head = model.get_classifier() if hasattr(model, "get_classifier") else None
    outputs = getattr(model, "num_classes", 0)
    if not outputs or max(classes) >= outputs:
        return          # not the checkpoint's head (num_classes=0: features only)
    if not isinstance(head, (nn.Linear, nn.Conv2d)) or head.bias is None:
        raise ModelError(f"{type(model).__name__} holds out classes {list(classes)}, but its "
                         f"head ({type(head).__name__}) is not a linear layer with a bias, the "
                         "only kind whose held-out outputs can be fixed: fit another architecture")
    rows = torch.as_tensor(classes, dtype=torch.long)
    with torch.no_grad():
        head.weight[rows] = 0
        head.bias[rows] = HELD_OUT_LOGIT
