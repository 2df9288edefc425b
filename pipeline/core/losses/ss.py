"""Steep slope (SS), the paper's loss (Luo et al. 2021, section 3), with s = z / (1 + |z|):

    l = o * (exp(-a_pos * s) - exp(-a_pos)) + (1 - o) * (exp(a_neg * s) - exp(-a_neg))

This is the sign convention of the authors' code (``oracle_loss_steepslope``) and of the paper's
text: correct predictions (o = 1) slide down towards z -> +inf, incorrect ones towards z -> -inf,
minimum 0, maximum max(e^a_pos - e^-a_pos, e^a_neg - e^-a_neg).  The paper's PRINTED Eq. (loss_ss)
has exp(+a_pos s) and exp(-a_neg s) instead: minimising it would push correct predictions to
z -> -inf, contradicting its own text and the released code, so the printed form is not offered.

z is the head's signed distance to its hyperplane (the authors'), or the plain w.x + b
(--ss-distance linear).  The slopes default by oracle backbone (``presets.ss_slopes``): the run
passes them in ``Context.slopes``.  exp(-a) is computed in float64 first (as ``math.exp``), then
rounded once to float32 per head.
"""
from __future__ import annotations

import math
from typing import Sequence

from pipeline.core.losses.base import Context, Loss, Param
from pipeline.core.losses.registry import register


def steep_slope(z, c_pos, c_neg, alpha_pos, alpha_neg, shift_pos=None, shift_neg=None):
    """SS loss in the authors' sign convention; c_pos = w+ o, c_neg = w- (1-o).  ``alpha_*``:
    floats, or (P,) tensors for z (B, P) with ``shift_*`` = their exp(-alpha)."""
    z = z.float()
    s = z / (1 + z.abs())
    pos = (-alpha_pos * s).exp() - (math.exp(-alpha_pos) if shift_pos is None else shift_pos)
    neg = (alpha_neg * s).exp() - (math.exp(-alpha_neg) if shift_neg is None else shift_neg)
    return c_pos * pos + c_neg * neg


def steep_slope_max(alpha_pos: float, alpha_neg: float) -> float:
    """Upper end of SS's range [0, max(e^a+ - e^-a+, e^a- - e^-a-)] (unit weights)."""
    return max(math.exp(alpha_pos) - math.exp(-alpha_pos), math.exp(alpha_neg) - math.exp(-alpha_neg))


@register
class SteepSlope(Loss):
    name = "ss"
    label = "SS"
    # in the order a sweep visits them: the paper's ablation sweeps alpha- first, then alpha+
    params = (Param("alpha_neg", symbol="α⁻", help="SS only: slope of the incorrect class.",
                    default_text="by oracle: ViT 3, ResNet 5; other backbones: an attention "
                                 "model's name the ViT's, else the ResNet's (presets.ss_slopes, "
                                 "with a note)"),
              Param("alpha_pos", symbol="α⁺", help="SS only: slope of the correct class.",
                    default_text="by oracle: ViT 1, ResNet 2; other backbones as for "
                                 "--alpha-neg"))
    head = "hyperplane"
    tnr = "half"
    graphable = True
    slopes_by_oracle = True

    @classmethod
    def defaults(cls, ctx: Context) -> dict[str, float]:
        return {"alpha_pos": ctx.slopes[0], "alpha_neg": ctx.slopes[1]}

    def tags(self, z_head: str | None, slopes: tuple[float, float] | None = None) -> list[str]:
        """Slopes other than the oracle's defaults (a sweep's choice) lead the tags: aP-N."""
        tags = super().tags(z_head, slopes)
        if slopes is not None and (self.alpha_pos, self.alpha_neg) != tuple(slopes):
            tags.insert(0, f"a{self.alpha_pos:g}-{self.alpha_neg:g}")
        return tags

    def display(self, tags: Sequence[str]) -> str:
        slopes = f"a{self.alpha_pos:g}-{self.alpha_neg:g}"
        shown = [f"α+ {self.alpha_pos:g}, α− {self.alpha_neg:g}" if t == slopes else t
                 for t in tags]
        return super().display(shown)

    @classmethod
    def bank(cls, heads, device=None):
        import torch     # torch on first use only (base module docstring)
        vec = lambda values: torch.tensor(values, dtype=torch.float32, device=device)  # noqa: E731
        a_pos = [h.values["alpha_pos"] for h in heads]
        a_neg = [h.values["alpha_neg"] for h in heads]
        return {"a_pos": vec(a_pos), "a_neg": vec(a_neg),
                "shift_pos": vec([math.exp(-a) for a in a_pos]),
                "shift_neg": vec([math.exp(-a) for a in a_neg])}

    @classmethod
    def per_sample(cls, z, c_pos, c_neg, p_true, bank):
        return steep_slope(z, c_pos, c_neg, bank["a_pos"], bank["a_neg"], bank["shift_pos"],
                           bank["shift_neg"])
