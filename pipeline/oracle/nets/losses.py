"""The oracle losses on the heads' scalar outputs z, as training computes them (confidence
p = sigmoid(z) for every loss).

One implementation serves a fine-tuned oracle (one head) and a bank of P head-only heads that
differ only in their loss parameters (a sweep's points): ``HeadLoss`` maps z of shape (B, P) to the
PER-SAMPLE losses (B, P) in float32 through the loss class's ``per_sample``, each column with its
own parameters; the caller takes the mean over the batch (the authors' reduction).  Shapes: ``o``
(B,) {0, 1} trust labels, ``p_true`` (B,) the classifier's softmax probability of the true class.
Which losses exist, their parameters and formulas: ``pipeline.core.losses`` (a module each).

The class weights enter as per-sample coefficients c_pos = w+ o and c_neg = w- (1 - o).  CE and
focal also come in the authors' ``broadcast`` form: the head's (B, 1) output meets labels of
shape (B,), so the loss is averaged over all B x B (output, label) pairs, which equals the
per-sample loss against the batch's MEAN (weighted) label.  ``HeadLoss.broadcast_coefficients``
computes that mean once per global batch, so the variant stays exact under gradient accumulation
and DDP.

A user's own loss FUNCTION (``CustomLoss``, the public API's ``trust_oracles.training``) trains
through the same steps: ``loss(z, correct) -> scalar`` on one head's z (B,), applied to each
column of z (B, P).  The steps call ``batch_mean`` of either kind: (P,) batch means.  A loss
CLASS (a registered ``Loss`` subclass) is a ``HeadLoss`` like the built-in ones, checked once on a
small batch before training (``probe``).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

from pipeline.core.losses import CUSTOM_PREFIX, CustomLossError, Loss, get, is_custom


class HeadLoss:
    """The per-sample losses of P heads of ONE loss form: z (B, P) -> (B, P), float32.  Fine-tuning
    is P = 1; a head-only bank trains a sweep's points together (their parameters may differ)."""

    def __init__(self, heads: Sequence[Loss], device: torch.device | None = None):
        forms = {(type(h), h.broadcast) for h in heads}
        if len(forms) != 1:
            raise ValueError(f"one bank trains one loss form; got "
                             f"{sorted((k.name, b) for k, b in forms)}")
        self.kind, self.broadcast = next(iter(forms))
        self.name = self.kind.name
        vec = lambda values: torch.tensor(values, dtype=torch.float32, device=device)  # noqa: E731
        self.w_pos = vec([h.pos_weight for h in heads])
        self.w_neg = vec([h.neg_weight for h in heads])
        self.bank = self.kind.bank(heads, device)

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
        if coef is None and self.kind.weighted:
            broadcast = self.broadcast if broadcast is None else broadcast
            coef = self.broadcast_coefficients(o, len(o)) if broadcast else self.coefficients(o)
        c_pos, c_neg = coef if coef is not None else (None, None)
        return self.kind.per_sample(z, c_pos, c_neg, p_true[:, None], self.bank)

    def batch_mean(self, z: torch.Tensor, o: torch.Tensor, p_true: torch.Tensor,
                   coef: tuple[torch.Tensor, torch.Tensor] | None = None,
                   broadcast: bool | None = None) -> torch.Tensor:
        """(P,) the mean over the batch of each head's per-sample loss (the authors' reduction)."""
        return self(z, o, p_true, coef, broadcast).mean(0)


def probe(kind: type[Loss], heads: Sequence[Loss], device: torch.device | None = None) -> None:
    """Check a loss class on a small batch before training: per_sample must return finite
    floating-point (B, P) losses with a gradient in z; otherwise refused, naming what it
    returned (a few small ops, outside any CUDA graph: no random numbers are drawn)."""
    z = torch.linspace(-3, 3, 8, device=device)[:, None].repeat(1, len(heads)).requires_grad_()
    o = (torch.arange(8, device=device) % 2).float()
    p_true = torch.linspace(0.05, 0.95, 8, device=device)
    try:
        out = HeadLoss(heads, device)(z, o, p_true, broadcast=False)
    except Exception as err:   # a user's code: name the loss, keep the cause
        raise CustomLossError(f"loss {kind.name!r} failed on a batch of 8 rows: "
                              f"{type(err).__name__}: {err}") from err
    where = (f"loss {kind.name!r}: per_sample(z, c_pos, c_neg, p_true, bank) with z of shape "
             f"{tuple(z.shape)}")
    if not isinstance(out, torch.Tensor):
        raise CustomLossError(f"{where} returned a {type(out).__name__}, not a torch.Tensor")
    if tuple(out.shape) != tuple(z.shape):
        raise CustomLossError(f"{where} returned shape {tuple(out.shape)}: expected "
                              f"{tuple(z.shape)}, one loss per row and head (no reduction)")
    if not out.is_floating_point() or not out.requires_grad:
        raise CustomLossError(f"{where} returned a {out.dtype} tensor"
                              f"{'' if out.requires_grad else ' without a gradient in z'}: "
                              "expected floating-point losses computed from z by torch ops")
    if not bool(torch.isfinite(out).all()):
        raise CustomLossError(f"{where} returned non-finite losses for z in [-3, 3]: expected "
                              "finite numbers")


# ------------------------------------------------------------------ a user's own loss --
# Why a custom loss never runs inside a CUDA graph: a graph replays the kernels of one call, so
# whatever the loss decides in Python (a counter, a schedule, a branch on a value) would freeze.
CUSTOM_EAGER = ("a custom loss runs eagerly (a graph would replay the kernels of one call and "
                "freeze whatever the loss does in Python)")


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


def make_loss(heads: Sequence[Loss], device: torch.device | None = None,
              custom: Callable | None = None) -> HeadLoss | CustomLoss:
    """The loss of a bank's heads: ``HeadLoss`` of ``heads`` (checked by ``probe``), or
    ``custom`` (a user's function, named by the heads' ``custom:...`` loss name) for every head."""
    if custom is None:
        probe(type(heads[0]), heads, device)
        return HeadLoss(heads, device)
    names = {h.name for h in heads}
    if len(names) != 1 or not is_custom(next(iter(names))):
        raise ValueError(f"a custom loss function trains runs named {CUSTOM_PREFIX}...; got "
                         f"{sorted(names)}")
    return CustomLoss(custom, next(iter(names)), device)


def eager_loss(name: str, fn: Callable | None) -> bool:
    """Whether the loss a run names must train eagerly (``eager_only``), before it is built."""
    return fn is not None or is_custom(name) or not get(name).graphable


def eager_only(loss: HeadLoss | CustomLoss) -> bool:
    """A loss a CUDA graph must not capture: a user's function, or a class not declared
    ``graphable`` (CUSTOM_EAGER says why)."""
    return isinstance(loss, CustomLoss) or not loss.kind.graphable


# ---------------------------------------------------------------- one head, as (B,) arrays --
def coefficients(loss: Loss, o: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample (c_pos, c_neg) = (w+ o, w- (1 - o)) of one loss, each (B,)."""
    c_pos, c_neg = HeadLoss([loss], o.device).coefficients(o)
    return c_pos[:, 0], c_neg[:, 0]


def broadcast_coefficients(loss: Loss, o_global: torch.Tensor,
                           n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``HeadLoss.broadcast_coefficients`` of one loss, each (n,)."""
    c_pos, c_neg = HeadLoss([loss], o_global.device).broadcast_coefficients(o_global, n)
    return c_pos[:, 0], c_neg[:, 0]


def per_sample_loss(loss: Loss, z: torch.Tensor, o: torch.Tensor, p_true: torch.Tensor,
                    coef: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """One head's per-sample loss (B,): ``HeadLoss`` with P = 1, per sample unless ``coef`` (each
    (B,): ``broadcast_coefficients``) says otherwise."""
    if coef is not None:
        coef = (coef[0][:, None], coef[1][:, None])
    return HeadLoss([loss], z.device)(z[:, None], o, p_true, coef, broadcast=False)[:, 0]
