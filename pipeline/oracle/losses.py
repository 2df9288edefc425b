"""Oracle losses on the head's scalar output z (confidence p = sigmoid(z) for every loss).

All loss functions return the PER-SAMPLE loss, shape (B,), in float32; the caller takes the mean
over the batch (the authors' reduction).  Shapes: ``z`` (B,) float, ``o`` (B,) {0, 1} trust
labels, ``p_true`` (B,) the classifier's softmax probability of the true class.

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
  the batch's MEAN (weighted) label.  ``broadcast_coefficients`` computes that mean once per
  global batch, so the variant stays exact under gradient accumulation and DDP.

Numerics: log p and log(1 - p) are computed as logsigmoid(z) and logsigmoid(-z); the authors'
code uses log(sigmoid(z) + 1e-7), which differs only when |z| > ~16.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

LOSSES = ("ce", "focal", "tcp", "ss")
LOSS_NAMES = {"ce": "CE", "focal": "Focal", "tcp": "TCP", "ss": "SS"}
FOCAL_GAMMA = 2.0         # the authors' focal loss: gamma = 2, no alpha
CB_FOCAL_GAMMA = 0.5      # paper App. (class-balanced losses, following Cui et al. 2019)
CB_BETA = 0.999


class LossOptionError(ValueError):
    """A loss option that does not apply to the chosen loss, or an invalid value."""


@dataclass(frozen=True)
class LossConfig:
    """A fully resolved loss: which one, its parameters, and its class weights."""
    name: str
    gamma: float | None = None          # focal
    alpha_pos: float | None = None      # ss
    alpha_neg: float | None = None      # ss
    pos_weight: float = 1.0             # weight of o = 1 rows (naive or class-balanced)
    neg_weight: float = 1.0             # weight of o = 0 rows
    broadcast: bool = False             # ce/focal: the authors' B x B broadcasting
    class_balanced: bool = False
    cb_beta: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


# ----------------------------------------------------------------------------- the losses --
def cross_entropy(z: torch.Tensor, c_pos: torch.Tensor, c_neg: torch.Tensor) -> torch.Tensor:
    """-c_pos log p - c_neg log(1 - p); with c_pos = w+ o, c_neg = w- (1 - o) this is weighted BCE."""
    z = z.float()
    return -c_pos * F.logsigmoid(z) - c_neg * F.logsigmoid(-z)


def focal(z: torch.Tensor, c_pos: torch.Tensor, c_neg: torch.Tensor,
          gamma: float = FOCAL_GAMMA) -> torch.Tensor:
    """-c_pos (1 - p)^gamma log p - c_neg p^gamma log(1 - p)   (no alpha, as the authors)."""
    z = z.float()
    p = torch.sigmoid(z)
    return (-c_pos * (1 - p).pow(gamma) * F.logsigmoid(z)
            - c_neg * p.pow(gamma) * F.logsigmoid(-z))


def tcp(z: torch.Tensor, p_true: torch.Tensor) -> torch.Tensor:
    """ConfidNet's TCP loss: (p - p_cls(y|x))^2, the target being the true class's probability."""
    return (torch.sigmoid(z.float()) - p_true.float()).pow(2)


def steep_slope(z: torch.Tensor, c_pos: torch.Tensor, c_neg: torch.Tensor,
                alpha_pos: float, alpha_neg: float) -> torch.Tensor:
    """SS loss in the authors' sign convention (module docstring); c_pos = w+ o, c_neg = w- (1-o)."""
    z = z.float()
    s = z / (1 + z.abs())
    pos = torch.exp(-alpha_pos * s) - math.exp(-alpha_pos)
    neg = torch.exp(alpha_neg * s) - math.exp(-alpha_neg)
    return c_pos * pos + c_neg * neg


def steep_slope_max(alpha_pos: float, alpha_neg: float) -> float:
    """Upper end of SS's range [0, max(e^a+ - e^-a+, e^a- - e^-a-)] (unit weights)."""
    return max(math.exp(alpha_pos) - math.exp(-alpha_pos), math.exp(alpha_neg) - math.exp(-alpha_neg))


# --------------------------------------------------------------------- weights and targets --
def class_balanced_weights(n_neg: int, n_pos: int, beta: float = CB_BETA) -> tuple[float, float]:
    """Cui et al. (2019) effective-number weights (w_neg, w_pos), normalised to sum to 2.

    w_c = (1 - beta) / (1 - beta^n_c) for the two classes {incorrect, correct}; n_c counted on the
    training rows' cached correctness.
    """
    if n_neg <= 0 or n_pos <= 0:
        raise LossOptionError(f"class-balanced weights need both classes; got {n_neg} incorrect "
                              f"and {n_pos} correct training rows")
    if not 0.0 < beta < 1.0:
        raise LossOptionError(f"--cb-beta {beta}: expected 0 < beta < 1")
    raw = [(1.0 - beta) / (1.0 - beta ** n) for n in (n_neg, n_pos)]
    total = sum(raw)
    return 2.0 * raw[0] / total, 2.0 * raw[1] / total


def coefficients(cfg: LossConfig, o: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample (c_pos, c_neg) = (w+ o, w- (1 - o))."""
    o = o.float()
    return cfg.pos_weight * o, cfg.neg_weight * (1 - o)


def broadcast_coefficients(cfg: LossConfig, o_global: torch.Tensor,
                           n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The authors' broadcasting: every output meets the GLOBAL batch's mean weighted labels.

    mean_{i,j} l(z_i, o_j) = mean_i [-a_pos log p_i - a_neg log(1 - p_i)] with
    a_pos = mean_j w+ o_j and a_neg = mean_j w- (1 - o_j)  (same for focal's factors).
    ``o_global``: labels of the whole optimizer-step batch; ``n``: rows of the local micro-batch.
    """
    c_pos, c_neg = coefficients(cfg, o_global)
    return c_pos.mean().expand(n), c_neg.mean().expand(n)


def per_sample_loss(cfg: LossConfig, z: torch.Tensor, o: torch.Tensor, p_true: torch.Tensor,
                    coef: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Dispatch on ``cfg.name``; ``coef`` overrides the per-sample (c_pos, c_neg) (broadcast)."""
    if cfg.name == "tcp":
        return tcp(z, p_true)
    c_pos, c_neg = coef if coef is not None else coefficients(cfg, o)
    if cfg.name == "ce":
        return cross_entropy(z, c_pos, c_neg)
    if cfg.name == "focal":
        return focal(z, c_pos, c_neg, cfg.gamma)
    if cfg.name == "ss":
        return steep_slope(z, c_pos, c_neg, cfg.alpha_pos, cfg.alpha_neg)
    raise LossOptionError(f"--loss {cfg.name!r}: expected one of {LOSSES}")


# ----------------------------------------------------------- options, variants and labels --
# Which loss each optional setting applies to; anything else is refused instead of ignored.
OPTION_LOSSES = {
    "gamma": ("focal",), "alpha_pos": ("ss",), "alpha_neg": ("ss",), "z": ("ss",),
    "class_balanced": ("ce", "focal", "ss"), "pos_weight": ("ce", "focal", "ss"),
    "neg_weight": ("ce", "focal", "ss"), "broadcast": ("ce", "focal"),
}
Z_HEADS = ("hyperplane", "linear")


FLAGS = {"broadcast": "--authors-broadcast"}


def _flag(name: str) -> str:
    return FLAGS.get(name, "--" + name.replace("_", "-"))


def check_loss_options(loss: str, given: dict) -> None:
    """Refuse options that do not apply to ``loss`` (``given``: option -> value, None = unset)."""
    if loss not in LOSSES:
        raise LossOptionError(f"--loss {loss!r}: expected one of {LOSSES}")
    for name, allowed in OPTION_LOSSES.items():
        value = given.get(name)
        if value is None or value is False:
            continue
        if loss not in allowed:
            raise LossOptionError(f"{_flag(name)} does not apply to --loss {loss} (it applies to "
                                  f"--loss {'/'.join(allowed)})")
    if given.get("cb_beta") is not None and not given.get("class_balanced"):
        raise LossOptionError("--cb-beta needs --class-balanced")
    naive = given.get("pos_weight") is not None or given.get("neg_weight") is not None
    if naive and given.get("class_balanced"):
        raise LossOptionError("--class-balanced and --pos-weight/--neg-weight are exclusive: "
                              "class-balanced weights are computed from the training split")
    for name in ("pos_weight", "neg_weight", "alpha_pos", "alpha_neg"):
        v = given.get(name)
        if v is not None and not (math.isfinite(v) and v > 0):
            raise LossOptionError(f"{_flag(name)} {v}: expected a positive finite number")
    if given.get("gamma") is not None and not (math.isfinite(given["gamma"]) and given["gamma"] >= 0):
        raise LossOptionError(f"--gamma {given['gamma']}: expected a finite number >= 0")
    if given.get("z") is not None and given["z"] not in Z_HEADS:
        raise LossOptionError(f"--z {given['z']!r}: expected one of {Z_HEADS}")


def resolve_loss(loss: str, given: dict, alphas: tuple[float, float],
                 counts: tuple[int, int] | None) -> LossConfig:
    """Fill defaults: gamma 2 (0.5 when class-balanced, paper App.), alphas by oracle family
    (``alphas`` = (a_pos, a_neg)), class-balanced weights from ``counts`` = (n_neg, n_pos)."""
    check_loss_options(loss, given)
    cb = bool(given.get("class_balanced"))
    gamma = alpha_pos = alpha_neg = beta = None
    if loss == "focal":
        gamma = given.get("gamma")
        gamma = (CB_FOCAL_GAMMA if cb else FOCAL_GAMMA) if gamma is None else float(gamma)
    if loss == "ss":
        alpha_pos = float(given.get("alpha_pos") or alphas[0])
        alpha_neg = float(given.get("alpha_neg") or alphas[1])
    w_pos = float(given.get("pos_weight") or 1.0)
    w_neg = float(given.get("neg_weight") or 1.0)
    if cb:
        beta = float(given.get("cb_beta") or CB_BETA)
        if counts is None:
            raise LossOptionError("--class-balanced needs the training split's class counts")
        w_neg, w_pos = class_balanced_weights(counts[0], counts[1], beta)
    return LossConfig(loss, gamma, alpha_pos, alpha_neg, w_pos, w_neg,
                      bool(given.get("broadcast")), cb, beta)


def variant_tags(cfg: LossConfig, z_head: str | None) -> list[str]:
    """Short tags of non-default loss forms (DATA_CONTRACT.md): broadcast, linear-z, cb, wP-N."""
    tags = []
    if cfg.broadcast:
        tags.append("broadcast")
    if cfg.name == "ss" and z_head == "linear":
        tags.append("linear-z")
    if cfg.class_balanced:
        tags.append("cb")
    elif (cfg.pos_weight, cfg.neg_weight) != (1.0, 1.0):
        tags.append(f"w{cfg.pos_weight:g}-{cfg.neg_weight:g}")
    return tags


def loss_label(cfg: LossConfig, tags: list[str]) -> str:
    """Display name: CE, Focal, TCP, SS, "CE (broadcast)", "SS (linear z)", "CE (CB)", ..."""
    shown = {"broadcast": "broadcast", "linear-z": "linear z", "cb": "CB"}
    parts = [shown.get(t, t) for t in tags]
    return LOSS_NAMES[cfg.name] + (f" ({', '.join(parts)})" if parts else "")
