"""A head-only oracle trained on features held in memory: no classifier cache, no run directory.

    oracle = train_head(features, correct, loss="ss")   # (N, D) float, (N,) bool
    oracle.score(new_features)                          # (M,) confidence sigmoid(z)
    oracle.log[-1], oracle.best_step, oracle.val_aupr_error

The head trains through the head-only runs' own code (``pipeline.oracle.headonly.arrays``: the
bank of heads, its session, the one loop, the held-out choice of the step kept) on a feature
table built from the arrays; the log stays in memory.  Given the same features, labels and
settings it is the head of ``train-oracle --head-only --no-flip`` (the rows carved by
``split_seed`` as a run carves a split's valid rows).  A loss of your own: ``trust_oracles.losses``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from numpy.typing import ArrayLike

import numpy as np
import torch

from pipeline.core.losses import (CUSTOM_PREFIX, HEAD_ARCHS, HEADS, Context, FunctionLoss, Loss,
                                  all_params, check_options, get)
from pipeline.core.options import check_device
from pipeline.core.presets import EMBEDDED_ORACLE, PAPER_LOSS, SS_ALPHAS
from pipeline.oracle.headonly.arrays import HeadSettings, split_rows, train_on_arrays
from pipeline.oracle.loop.state import TrainingDiverged
from trust_oracles.errors import received
from trust_oracles.losses import LossFn, custom_loss_name, loss_class_options, qualified_name

__all__ = ["HeadOracle", "train_head"]


@dataclass(frozen=True, eq=False)
class HeadOracle:
    """A head-only oracle trained by ``train_head``: z = head(features), confidence = sigmoid(z).

    Attributes
    ----------
    head : torch.nn.Module
        The head, on the CPU, in eval mode.
    in_features : int
        D, the features' dimension it reads.
    loss : str
        The loss's name (``custom:<name>`` for a function of your own).
    best_step : int
        The step kept (the last without held-out rows).
    val_aupr_error : float or None
        Its held-out AUPR-Error (None without held-out rows).
    total_steps : int
        Steps trained.
    train_rows, val_rows : ndarray of int
        The positions of the rows trained on and held out.
    log : tuple of dict
        The entries a run's log.jsonl would hold: per step ``{"step", "loss"}``, validations
        ``{"step", "val": {...}}``.
    """
    head: torch.nn.Module
    in_features: int
    loss: str
    best_step: int
    val_aupr_error: float | None
    total_steps: int
    train_rows: np.ndarray
    val_rows: np.ndarray
    log: tuple[dict, ...]

    @torch.no_grad()
    def z(self, features: ArrayLike | torch.Tensor, chunk: int = 65536) -> np.ndarray:
        """The head's outputs (logits of "the classifier is right").

        Parameters
        ----------
        features : array-like or Tensor, shape (N, D)
            Finite features, D = ``in_features``.
        chunk : int
            Rows per forward pass.

        Returns
        -------
        ndarray, shape (N,), float32
        """
        x = _features(features, self.in_features)
        parts = [self.head(x[i:i + chunk]) for i in range(0, len(x), chunk)]
        return torch.cat(parts).numpy() if parts else np.zeros(0, np.float32)

    def score(self, features: ArrayLike | torch.Tensor) -> np.ndarray:
        """The confidence that the classifier is right, sigmoid(z).

        Parameters
        ----------
        features : array-like or Tensor, shape (N, D)
            Finite features, D = ``in_features``.

        Returns
        -------
        ndarray, shape (N,), float32
        """
        return torch.sigmoid(torch.from_numpy(self.z(features))).numpy()


def train_head(features: ArrayLike | torch.Tensor, correct: ArrayLike, *,
               loss: str | type[Loss] | Loss | LossFn = PAPER_LOSS,
               loss_options: Mapping[str, float | int | bool | str] | None = None,
               p_true: ArrayLike | torch.Tensor | None = None,
               head: str | None = None, arch: str = "linear",
               epochs: int = EMBEDDED_ORACLE["epochs"],
               batch_size: int = EMBEDDED_ORACLE["batch_size"], lr: float = EMBEDDED_ORACLE["lr"],
               momentum: float = EMBEDDED_ORACLE["momentum"],
               weight_decay: float = EMBEDDED_ORACLE["weight_decay"],
               warmup_steps: int = EMBEDDED_ORACLE["warmup_steps"], cycle_momentum: bool = False,
               seed: int = 0, val_fraction: float = 0.05, split_seed: int = 0,
               log_every: int = 10, device: str | None = None) -> HeadOracle:
    """A head-only oracle trained on features in memory, through the head-only runs' bank and
    loop (``pipeline.oracle.headonly.arrays``): no cache, no run directory, nothing written.
    The same features, labels and settings as a ``--head-only --no-flip`` run give its head.

    Parameters
    ----------
    features : array-like (N, D)
        Float features (numpy or torch), finite; trained in float32.
    correct : array-like (N,)
        Bool (or 0/1): the classifier is right on row i.
    loss : {"ss", "ce", "focal", "tcp"}, a Loss subclass or instance, or LossFn
        A registered loss by name (``loss_options``: its options by name, e.g.
        ``{"alpha_pos": 2, "alpha_neg": 5}``; SS's slopes default to the paper's ViT values
        1 and 3), your own loss class (registered under its name) or function
        (``trust_oracles.losses``).
    p_true : array-like (N,), optional
        The classifier's probability of the true class: TCP's target (needed by a loss that
        reads it, ``Loss.needs_p_true``).
    head : {"linear", "hyperplane"}, optional
        Default: the loss's (SS: hyperplane; the others and your own: linear).
    arch : {"linear", "confidnet"}
    epochs, batch_size, lr, momentum, weight_decay, warmup_steps, cycle_momentum
        SGD with train-oracle's OneCycle schedule; defaults: ``presets.EMBEDDED_ORACLE``.
    seed, split_seed : int
        The head's initialisation and the row order; which rows are held out.
    val_fraction : float
        Held-out rows that choose the step kept (0: the final head).
    device : str, optional
        Where it trains; default cuda if available, else cpu.  The head returned is on the CPU.

    Returns
    -------
    HeadOracle
        The trained head, on the CPU, and its training's record.

    Raises
    ------
    InputError, LossOptionError, CustomLossError, TrainingDiverged
    """
    x, o, pt = _arrays(features, correct, p_true, loss)
    _check_settings(head, arch, epochs, batch_size, lr, val_fraction)
    train_rows, val_rows = split_rows(len(o), val_fraction, split_seed)
    counts = _check_rows(o[train_rows], batch_size, epochs)
    cfg, fn = _loss_config(loss, loss_options or {}, counts)
    hyperplane = (head or cfg.head_of(None)) == "hyperplane"
    s = HeadSettings(cfg, hyperplane, arch, lr, momentum, weight_decay, warmup_steps,
                     cycle_momentum, batch_size, epochs, seed, log_every=log_every)
    dev = check_device(device)
    out = train_on_arrays(x.to(dev), torch.from_numpy(o).to(dev), pt.to(dev), train_rows,
                          val_rows, s, fn)
    return _oracle(out, x.shape[1], cfg.name)


def _oracle(out, dim: int, loss: str) -> HeadOracle:
    """The trained head as a HeadOracle; a diverged one refused."""
    h = out.state.heads[0]
    if h.diverged_at is not None:
        raise TrainingDiverged(f"the loss ({loss}) became {h.diverged_value} at step "
                               f"{h.diverged_at} of {out.total_steps}: lower lr")
    return HeadOracle(out.head, dim, loss, out.best_step, out.val_aupr_error,
                      out.total_steps, out.train_rows, out.val_rows, tuple(out.log))


def _features(features: Any, dim: int | None) -> torch.Tensor:
    """(N, D) finite float32 features on the CPU (D = ``dim`` when given)."""
    if isinstance(features, torch.Tensor):       # bfloat16 has no numpy type: float32 first
        t = features.detach().cpu()
        a = (t.float() if t.is_floating_point() else t).numpy()
    else:
        a = np.asarray(features)
    if a.ndim != 2 or a.dtype.kind not in "fiu":
        raise received("features", f"{a.dtype} of shape {a.shape}", "(N, D) floats")
    x = torch.from_numpy(np.ascontiguousarray(a))
    if dim is not None and x.shape[1] != dim:
        raise received("features", f"{x.shape[1]} columns", f"{dim}, as the head was trained")
    x = x.float()
    bad = torch.nonzero(~torch.isfinite(x).all(dim=1)).flatten()
    if len(bad):
        raise received("features", f"a non-finite value in row {int(bad[0])}", "finite values")
    return x


def _vector(values: Any, n: int, what: str) -> np.ndarray:
    v = np.asarray(values.detach().cpu() if isinstance(values, torch.Tensor) else values)
    if v.shape != (n,):
        raise received(what, f"shape {v.shape}", f"({n},), one per row of features")
    return v


def _arrays(features: Any, correct: Any, p_true: Any,
            loss: Any) -> tuple[torch.Tensor, np.ndarray, torch.Tensor]:
    """Features (N, D) float32, trust labels (N,) float32 0/1, TCP's targets (N,) float32."""
    x = _features(features, None)
    o = _vector(correct, len(x), "correct")
    if o.dtype != bool and not np.isin(o, (0, 1)).all():
        raise received("correct", f"values other than 0 and 1 ({o.dtype})", "bool or 0/1")
    if p_true is None:
        kind = get(loss) if isinstance(loss, str) else loss if isinstance(loss, type) else type(loss)
        if getattr(kind, "needs_p_true", False):
            raise received("p_true", "None", f"(N,) probabilities of the true class, the target "
                           f"of loss {kind.name!r}")
        return x, o.astype(np.float32), torch.zeros(len(x))
    pt = _vector(p_true, len(x), "p_true").astype(np.float32)
    if not (np.isfinite(pt) & (pt >= 0) & (pt <= 1)).all():
        raise received("p_true", "values outside [0, 1]", "probabilities")
    return x, o.astype(np.float32), torch.from_numpy(pt)


def _check_settings(head: str | None, arch: str, epochs: int, batch_size: int, lr: float,
                    val_fraction: float) -> None:
    if head not in (None, *HEADS):
        raise received("head", repr(head), f"one of {HEADS}")
    if arch not in HEAD_ARCHS:
        raise received("arch", repr(arch), f"one of {HEAD_ARCHS}")
    for name, value in (("epochs", epochs), ("batch_size", batch_size)):
        if not isinstance(value, int) or value < 1:
            raise received(name, repr(value), "a positive integer")
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise received("lr", repr(lr), "a positive finite number")
    if not 0 <= val_fraction < 1:
        raise received("val_fraction", repr(val_fraction), "0 <= fraction < 1")


def _check_rows(o_train: np.ndarray, batch_size: int, epochs: int) -> tuple[int, int]:
    """(incorrect, correct) training rows; refuses one kind only, or fewer than 3 steps."""
    n, n_pos = len(o_train), int(o_train.sum())
    if n_pos in (0, n):
        kind = "correct" if n_pos else "incorrect"
        raise received("correct", f"only {kind} rows among the {n} training rows",
                       "both kinds: there is nothing to tell apart otherwise")
    steps = epochs * (n // batch_size)
    if steps < 3:
        raise received("epochs and batch_size", f"{steps} optimizer step(s) ({n} training rows, "
                       f"batch {batch_size}, {epochs} epoch(s))", "at least 3 (the OneCycle "
                       "schedule)", "Raise epochs or lower batch_size")
    return n - n_pos, n_pos


def _loss_config(loss: str | type[Loss] | Loss | LossFn, options: Mapping[str, Any],
                 counts: tuple[int, int]) -> tuple[Loss, LossFn | None]:
    """The resolved loss (a function's: named, no options) and the user's function, if any."""
    if isinstance(loss, Loss) and options:
        raise received("loss_options", f"{sorted(options)}", "none with a loss instance (its "
                       "values are its options)")
    named = loss_class_options(loss) if not isinstance(loss, str) else (loss, {})
    if named is None:
        if options:
            raise received("loss_options", f"{sorted(options)}", "none with your own loss (it "
                           "is called with z and correct only)")
        custom_loss_name(loss, "x")       # refuses what is not callable
        # no run records it: a lambda's name serves
        return FunctionLoss(function_name=CUSTOM_PREFIX + qualified_name(loss)[0]), loss
    name, options = named[0], {**named[1], **options}
    known = {*all_params(), "class_balanced", "broadcast"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise received("loss_options", f"{unknown}", f"options of the losses: {', '.join(sorted(known))} "
                       "(head= sets the head)")
    check_options(name, options)
    return get(name).resolve(options, Context(SS_ALPHAS["vit"]), counts), None
