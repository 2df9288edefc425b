"""Cross-entropy (CE) on the oracle's confidence p = sigmoid(z): -w+ o log p - w- (1 - o) log(1 - p).

log p and log(1 - p) are logsigmoid(z) and logsigmoid(-z); the authors' code computes
log(sigmoid(z) + 1e-7), which differs only when |z| > ~16.  ``broadcast`` is the authors' form
(``pipeline.oracle.nets.losses``: every output meets the batch's mean weighted label).
"""
from __future__ import annotations

from pipeline.core.losses.base import Loss, logsigmoid
from pipeline.core.losses.registry import register


def cross_entropy(z, c_pos, c_neg):
    """-c_pos log p - c_neg log(1 - p); with c_pos = w+ o, c_neg = w- (1 - o) this is weighted BCE."""
    z = z.float()
    return -c_pos * logsigmoid(z) - c_neg * logsigmoid(-z)


@register
class CrossEntropy(Loss):
    name = "ce"
    label = "CE"
    broadcastable = True
    tnr = "half"
    graphable = True

    @classmethod
    def per_sample(cls, z, c_pos, c_neg, p_true, bank):
        return cross_entropy(z, c_pos, c_neg)
