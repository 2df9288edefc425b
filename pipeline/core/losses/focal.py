"""Focal loss (Lin et al. 2017) as the authors use it: no alpha,
-w+ o (1 - p)^gamma log p - w- (1 - o) p^gamma log(1 - p).

gamma defaults to 2 (the authors'), 0.5 with --class-balanced (paper App., after Cui et al.
2019).  The exponent stays a Python float per head: torch computes x ** 2 and x ** 0.5 exactly
for a scalar exponent and through pow() for a tensor one, so every head of a bank computes what
it would compute alone.
"""
from __future__ import annotations

from pipeline.core.losses.base import Context, Loss, Param, logsigmoid
from pipeline.core.losses.registry import register

FOCAL_GAMMA = 2.0         # the authors' focal loss: gamma = 2, no alpha
CB_FOCAL_GAMMA = 0.5      # paper App. (class-balanced losses, following Cui et al. 2019)


def focal(z, c_pos, c_neg, gamma=FOCAL_GAMMA):
    """-c_pos (1 - p)^gamma log p - c_neg p^gamma log(1 - p); ``gamma``: one float, or one per
    column of z (B, P)."""
    z = z.float()
    p = z.sigmoid()
    return (-c_pos * _pow(1 - p, gamma) * logsigmoid(z)
            - c_neg * _pow(p, gamma) * logsigmoid(-z))


def _pow(x, exponent):
    """x ** exponent with a Python-float exponent per column (module docstring)."""
    if isinstance(exponent, (int, float)):
        return x.pow(exponent)
    if all(e == exponent[0] for e in exponent):
        return x.pow(exponent[0])
    return _stack([x[:, p].pow(e) for p, e in enumerate(exponent)])


def _stack(columns):
    import torch    # torch on first use only (base module docstring)
    return torch.stack(columns, dim=1)


@register
class Focal(Loss):
    name = "focal"
    label = "Focal"
    params = (Param("gamma", open_min=False, symbol="γ", help="Focal only.",
                    default_text=f"{FOCAL_GAMMA:g} ({CB_FOCAL_GAMMA:g} with --class-balanced, as "
                                 "the paper's class-balanced runs)"),)
    broadcastable = True
    tnr = "half"
    graphable = True

    @classmethod
    def defaults(cls, ctx: Context) -> dict[str, float]:
        return {"gamma": CB_FOCAL_GAMMA if ctx.class_balanced else FOCAL_GAMMA}

    @classmethod
    def bank(cls, heads, device=None):
        return {"gamma": [h.values["gamma"] for h in heads]}

    @classmethod
    def per_sample(cls, z, c_pos, c_neg, p_true, bank):
        return focal(z, c_pos, c_neg, bank["gamma"])
