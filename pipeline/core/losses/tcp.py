"""ConfidNet's TCP loss (Corbière et al. 2019): (p - p_cls(y|x))^2, the target being the
classifier's probability of the true class.  Its TNR counts below 1/K, chance level for a target
that is a class probability (TNR_RULES "chance"); it takes no class weights.
"""
from __future__ import annotations

from pipeline.core.losses.base import Loss
from pipeline.core.losses.registry import register


def tcp(z, p_true):
    """(sigmoid(z) - p_true)^2; ``p_true`` broadcasts against z."""
    return (z.float().sigmoid() - p_true.float()).pow(2)


@register
class TCP(Loss):
    name = "tcp"
    label = "TCP"
    weighted = False
    tnr = "chance"
    needs_p_true = True
    graphable = True

    @classmethod
    def per_sample(cls, z, c_pos, c_neg, p_true, bank):
        return tcp(z, p_true)
