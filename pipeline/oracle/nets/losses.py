"""Oracle losses on the heads' scalar outputs z (confidence p = sigmoid(z) for every loss).

One implementation serves a fine-tuned oracle (one head) and a bank of P head-only heads that
differ only in their loss parameters (a sweep's points): ``HeadLoss`` maps z of shape (B, P) to the
PER-SAMPLE losses (B, P) in float32, each column with its own parameters; the caller takes the mean
over the batch (the authors' reduction).  Shapes: ``o`` (B,) {0, 1} trust labels, ``p_true`` (B,)
the classifier's softmax probability of the true class.  Which losses exist, their options and
defaults: ``pipeline.core.losses``.

Steep slope (SS), with s = z / (1 + |z|):

    l = o * (exp(-a_pos * s) - exp(-a_pos)) + (1 - o) * (exp(a_neg * s) - exp(-a_neg))

This is the sign convention of the authors' code (``oracle_loss_steepslope``) and of the paper's
text: correct predictions (o = 1) slide down towards z -> +inf, incorrect ones towards z -> -inf,
minimum 0, maximum max(e^a_pos - e^-a_pos, e^a_neg - e^-a_neg).  The paper's PRINTED Eq. (loss_ss)
has exp(+a_pos s) and exp(-a_neg s) instead: minimising it would push correct predictions to
z -> -inf, contradicting its own text and the released code, so the printed form is not offered.

CE and focal come in two forms:
* per-sample (default): each output is compared with its own label;
* ``broadcast`` — the authors' code: the head's (B, 1) output meets labels of shape (B,), so the
  loss is averaged over all B x B (output, label) pairs, which equals the per-sample loss against
  the batch's MEAN (weighted) label.  ``HeadLoss.broadcast_coefficients`` computes that mean once
  per global batch, so the variant stays exact under gradient accumulation and DDP.

Numerics: log p and log(1 - p) are computed as logsigmoid(z) and logsigmoid(-z); the authors'
code uses log(sigmoid(z) + 1e-7), which differs only when |z| > ~16.  Per-head parameters enter
as float32 (P,) tensors, rounded once from the Python values (exp(-a) in float64 first, as
``math.exp``); focal's exponent stays a Python float per head, since torch computes x ** 2 and
x ** 0.5 exactly for a scalar exponent and through pow() for a tensor one, so every head computes
what it would compute alone, in a bank or fine-tuned.

A user's own loss (``CustomLoss``, the public API's ``trust_oracles.training``) trains through the
same steps: ``loss(z, correct) -> scalar`` on one head's z (B,), applied to each column of z
(B, P).  The steps call ``batch_mean`` of either kind: (P,) batch means.  For the built-in losses
that is ``HeadLoss(...).mean(0)``, the very ops the steps ran before, so their numbers do not
change.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.core.losses import LOSSES, CustomLossError, LossConfig, LossOptionError


def cross_entropy(z: torch.Tensor, c_pos: torch.Tensor, c_neg: torch.Tensor) -> torch.Tensor:
    """-c_pos log p - c_neg log(1 - p); with c_pos = w+ o, c_neg = w- (1 - o) this is weighted BCE."""
    z = z.float()
    return -c_pos * F.logsigmoid(z) - c_neg * F.logsigmoid(-z)


def focal(z: torch.Tensor, c_pos: torch.Tensor, c_neg: torch.Tensor,
          gamma: float | Sequence[float] = 2.0) -> torch.Tensor:
    """-c_pos (1 - p)^gamma log p - c_neg p^gamma log(1 - p)   (no alpha, as the authors).
    ``gamma``: one float, or one per column of z (B, P)."""
    z = z.float()
    p = torch.sigmoid(z)
    return (-c_pos * _pow(1 - p, gamma) * F.logsigmoid(z)
            - c_neg * _pow(p, gamma) * F.logsigmoid(-z))


def _pow(x: torch.Tensor, exponent: float | Sequence[float]) -> torch.Tensor:
    """x ** exponent with a Python-float exponent per column (see the module docstring)."""
    if isinstance(exponent, (int, float)):
        return x.pow(exponent)
    if all(e == exponent[0] for e in exponent):
        return x.pow(exponent[0])
    return torch.stack([x[:, p].pow(e) for p, e in enumerate(exponent)], dim=1)


def tcp(z: torch.Tensor, p_true: torch.Tensor) -> torch.Tensor:
    """ConfidNet's TCP loss: (p - p_cls(y|x))^2, the target being the true class's probability."""
    return (torch.sigmoid(z.float()) - p_true.float()).pow(2)


def steep_slope(z: torch.Tensor, c_pos: torch.Tensor, c_neg: torch.Tensor,
                alpha_pos, alpha_neg, shift_pos=None, shift_neg=None) -> torch.Tensor:
    """SS loss in the authors' sign convention (module docstring); c_pos = w+ o, c_neg = w- (1-o).
    ``alpha_*``: floats, or (P,) tensors for z (B, P) with ``shift_*`` = their exp(-alpha)."""
    z = z.float()
    s = z / (1 + z.abs())
    pos = torch.exp(-alpha_pos * s) - (math.exp(-alpha_pos) if shift_pos is None else shift_pos)
    neg = torch.exp(alpha_neg * s) - (math.exp(-alpha_neg) if shift_neg is None else shift_neg)
    return c_pos * pos + c_neg * neg


def steep_slope_max(alpha_pos: float, alpha_neg: float) -> float:
    """Upper end of SS's range [0, max(e^a+ - e^-a+, e^a- - e^-a-)] (unit weights)."""
    return max(math.exp(alpha_pos) - math.exp(-alpha_pos), math.exp(alpha_neg) - math.exp(-alpha_neg))


class HeadLoss:
    """The per-sample losses of P heads of ONE loss form: z (B, P) -> (B, P), float32.  Fine-tuning
    is P = 1; a head-only bank trains a sweep's points together (their parameters may differ)."""

    def __init__(self, cfgs: Sequence[LossConfig], device: torch.device | None = None):
        forms = {(c.name, c.broadcast) for c in cfgs}
        if len(forms) != 1:
            raise ValueError(f"one bank trains one loss form; got {sorted(forms)}")
        self.name, self.broadcast = next(iter(forms))
        if self.name not in LOSSES:
            raise LossOptionError(f"--loss {self.name!r}: expected one of {tuple(LOSSES)}")
        vec = lambda values: torch.tensor(values, dtype=torch.float32, device=device)  # noqa: E731
        self.w_pos = vec([c.pos_weight for c in cfgs])
        self.w_neg = vec([c.neg_weight for c in cfgs])
        self.gamma = [c.gamma for c in cfgs]
        if self.name == "ss":
            self.a_pos, self.a_neg = vec([c.alpha_pos for c in cfgs]), vec([c.alpha_neg for c in cfgs])
            self.shift_pos = vec([math.exp(-c.alpha_pos) for c in cfgs])
            self.shift_neg = vec([math.exp(-c.alpha_neg) for c in cfgs])

    def coefficients(self, o: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sample (c_pos, c_neg) = (w+ o, w- (1 - o)), each (B, P)."""
        o = o.float()[:, None]
        return o * self.w_pos, (1 - o) * self.w_neg

    def broadcast_coefficients(self, o_global: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The authors' broadcasting: every output meets the GLOBAL batch's mean weighted labels.

        mean_{i,j} l(z_i, o_j) = mean_i [-a_pos log p_i - a_neg log(1 - p_i)] with
        a_pos = mean_j w+ o_j and a_neg = mean_j w- (1 - o_j)  (same for focal's factors).
        ``o_global``: labels of the whole optimizer-step batch; ``n``: rows of the local batch.
        """
        c_pos, c_neg = self.coefficients(o_global)
        return c_pos.mean(0).expand(n, -1), c_neg.mean(0).expand(n, -1)

    def __call__(self, z: torch.Tensor, o: torch.Tensor, p_true: torch.Tensor,
                 coef: tuple[torch.Tensor, torch.Tensor] | None = None,
                 broadcast: bool | None = None) -> torch.Tensor:
        """``coef`` overrides the per-sample coefficients (a micro-batch of a broadcast step);
        ``broadcast=False`` evaluates the per-sample form of a broadcast loss (validation)."""
        if self.name == "tcp":
            return tcp(z, p_true[:, None])
        if coef is None:
            broadcast = self.broadcast if broadcast is None else broadcast
            coef = self.broadcast_coefficients(o, len(o)) if broadcast else self.coefficients(o)
        c_pos, c_neg = coef
        if self.name == "ce":
            return cross_entropy(z, c_pos, c_neg)
        if self.name == "focal":
            return focal(z, c_pos, c_neg, self.gamma)
        return steep_slope(z, c_pos, c_neg, self.a_pos, self.a_neg, self.shift_pos, self.shift_neg)

    def batch_mean(self, z: torch.Tensor, o: torch.Tensor, p_true: torch.Tensor,
                   coef: tuple[torch.Tensor, torch.Tensor] | None = None,
                   broadcast: bool | None = None) -> torch.Tensor:
        """(P,) the mean over the batch of each head's per-sample loss (the authors' reduction)."""
        return self(z, o, p_true, coef, broadcast).mean(0)


# ------------------------------------------------------------------ a user's own loss --
CUSTOM_PREFIX = "custom:"     # a run's loss name: custom:<module>.<qualname> (or the name given)
# Why a custom loss never runs inside a CUDA graph: a graph replays the kernels of one call, so
# whatever the loss decides in Python (a counter, a schedule, a branch on a value) would freeze.
CUSTOM_EAGER = ("a custom loss runs eagerly (a graph would replay the kernels of one call and "
                "freeze whatever the loss does in Python)")


def is_custom(name: str) -> bool:
    return name.startswith(CUSTOM_PREFIX)


class CustomLoss:
    """A user's loss in the place of ``HeadLoss``: ``fn(z, correct) -> loss``, with ``z`` (B,)
    float32 one head's outputs, ``correct`` (B,) float32 the trust labels (1 = the classifier is
    right) and ``loss`` a 0-dim tensor, the mean over the batch.  A bank's z (B, P) is scored
    column by column (P calls).  Every result is checked (a tensor, 0-dim, floating point, with a
    gradient when z has one); the first training call's value must also be finite, the one host
    sync this adds (later non-finite values are the loop's divergence).  An ``nn.Module`` is moved
    to ``device`` (its parameters are not trained)."""

    broadcast = False            # the authors' broadcasting is a form of the built-in CE/focal

    def __init__(self, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], name: str,
                 device: torch.device | None = None):
        if not callable(fn):
            raise CustomLossError(f"loss {name}: {type(fn).__name__} is not callable")
        if isinstance(fn, nn.Module) and device is not None:
            fn.to(device)
        self.fn, self.name, self.checked = fn, name, False

    def batch_mean(self, z: torch.Tensor, o: torch.Tensor, p_true: torch.Tensor,
                   coef=None, broadcast: bool | None = None) -> torch.Tensor:
        """(P,) each column's loss (``p_true``, ``coef``, ``broadcast``: the built-in forms')."""
        o = o.float()
        return torch.stack([self._one(z[:, p].float(), o) for p in range(z.shape[1])])

    def _one(self, z: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        out = self.fn(z, o)
        if not isinstance(out, torch.Tensor):
            self._refuse(z, f"returned a {type(out).__name__}, not a torch.Tensor: compute it "
                         "with torch operations on z")
        if out.dim() != 0:
            self._refuse(z, f"returned shape {tuple(out.shape)}: expected a scalar (0-dim) "
                         "tensor, the mean over the batch (e.g. per_row.mean())")
        if not out.is_floating_point():
            self._refuse(z, f"returned a {out.dtype} tensor: expected floating point")
        if z.requires_grad and not out.requires_grad:
            self._refuse(z, "returned a value without a gradient with respect to z (computed "
                         "outside torch's autograd: .item(), numpy, detach or no_grad?)")
        if z.requires_grad and not self.checked:
            self.checked = True
            if not torch.isfinite(out):
                self._refuse(z, f"returned {out.item()} on the first training batch "
                             f"({int(o.sum())} correct and {int(len(o) - o.sum())} incorrect "
                             "rows): expected a finite number")
        return out

    def _refuse(self, z: torch.Tensor, what: str) -> None:
        raise CustomLossError(f"custom loss {self.name} (called as loss(z, correct) with z and "
                              f"correct of shape ({len(z)},)) {what}")


def make_loss(cfgs: Sequence[LossConfig], device: torch.device | None = None,
              custom: Callable | None = None) -> HeadLoss | CustomLoss:
    """The loss of a bank's heads: ``HeadLoss`` of ``cfgs``, or ``custom`` (a user's function,
    named by the configs' ``custom:...`` loss name) for every head."""
    if custom is None:
        return HeadLoss(cfgs, device)
    names = {c.name for c in cfgs}
    if len(names) != 1 or not is_custom(next(iter(names))):
        raise ValueError(f"a custom loss function trains runs named {CUSTOM_PREFIX}...; got "
                         f"{sorted(names)}")
    return CustomLoss(custom, next(iter(names)), device)


# ---------------------------------------------------------------- one head, as (B,) arrays --
def coefficients(cfg: LossConfig, o: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample (c_pos, c_neg) = (w+ o, w- (1 - o)) of one loss, each (B,)."""
    c_pos, c_neg = HeadLoss([cfg], o.device).coefficients(o)
    return c_pos[:, 0], c_neg[:, 0]


def broadcast_coefficients(cfg: LossConfig, o_global: torch.Tensor,
                           n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``HeadLoss.broadcast_coefficients`` of one loss, each (n,)."""
    c_pos, c_neg = HeadLoss([cfg], o_global.device).broadcast_coefficients(o_global, n)
    return c_pos[:, 0], c_neg[:, 0]


def per_sample_loss(cfg: LossConfig, z: torch.Tensor, o: torch.Tensor, p_true: torch.Tensor,
                    coef: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """One head's per-sample loss (B,): ``HeadLoss`` with P = 1, per sample unless ``coef`` (each
    (B,): ``broadcast_coefficients``) says otherwise."""
    if coef is not None:
        coef = (coef[0][:, None], coef[1][:, None])
    return HeadLoss([cfg], z.device)(z[:, None], o, p_true, coef, broadcast=False)[:, 0]
