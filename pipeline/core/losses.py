"""The oracle losses described without torch: the one place that says which losses exist, which
options each takes (with their ranges and defaults), their variants, labels and TNR thresholds.

    spec = LOSSES["ss"]                 # label "SS", parameters alpha_pos/alpha_neg, hyperplane head
    cfg = resolve_loss("ss", given, alphas=(1.0, 3.0), counts=(n_neg, n_pos))   # -> LossConfig
    tnr_threshold("tcp", num_classes=10)   # 0.1: TCP's target is p(true class), chance is 1/K

``pipeline.oracle.nets.losses`` computes them (torch); train-oracle's options, ``sweep``, ``report``
(row order, the paper's TNR threshold) and ``demo`` (the grid) read them from here.  Adding a loss
means a ``Loss`` entry here, its formula in ``pipeline/oracle/nets/losses.py`` and, for a new
parameter, a ``Param`` here and a field of ``pipeline/oracle/settings/config.py``'s TrainConfig
(docs/ARCHITECTURE.md).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

FOCAL_GAMMA = 2.0         # the authors' focal loss: gamma = 2, no alpha
CB_FOCAL_GAMMA = 0.5      # paper App. (class-balanced losses, following Cui et al. 2019)
CB_BETA = 0.999
HEADS = ("hyperplane", "linear")
HEAD_ARCHS = ("linear", "confidnet")     # pipeline.oracle.nets.heads builds them


class LossOptionError(ValueError):
    """A loss option that does not apply to the chosen loss, or an invalid value."""


class CustomLossError(ValueError):
    """A user's loss returned something other than one finite, differentiable number."""


@dataclass(frozen=True)
class Param:
    """A numeric loss option: its flag, range, symbol (sweep tables) and help text."""
    flag: str
    minimum: float                 # > minimum (open) or >= minimum (closed)
    open_min: bool = True
    below_one: bool = False        # also < 1 (a beta)
    symbol: str = ""
    help: str = ""
    recorded: bool = True          # its resolved value (default filled in) goes into run.json's
    #                                config and the group hash (not the class weights: their
    #                                class-balanced values are the loss's, run.json "loss")

    def check(self, value: float) -> None:
        ok = math.isfinite(value) and (value > self.minimum if self.open_min else
                                       value >= self.minimum)
        if ok and self.below_one and not value < 1:
            ok = False
        if not ok:
            raise LossOptionError(f"{self.flag} {value}: {self.expected()}")

    def expected(self) -> str:
        if self.below_one:
            return "expected 0 < beta < 1"
        return ("expected a positive finite number" if self.open_min and self.minimum == 0
                else f"expected a finite number >= {self.minimum:g}")


# Numeric loss options, in the order a sweep visits them (the paper: alpha- first, then alpha+).
PARAMS = {
    "alpha_neg": Param("--alpha-neg", 0.0, symbol="α⁻", help="SS only: slope of the incorrect "
                       "class. Default by oracle: ViT 3, ResNet 5; other backbones: an "
                       "attention model's name the ViT's, else the ResNet's "
                       "(presets.ss_slopes, with a note)."),
    "alpha_pos": Param("--alpha-pos", 0.0, symbol="α⁺", help="SS only: slope of the correct "
                       "class. Default by oracle: ViT 1, ResNet 2; other backbones as for "
                       "--alpha-neg."),
    "gamma": Param("--gamma", 0.0, open_min=False, symbol="γ", help="Focal only. Default 2 (0.5 "
                   "with --class-balanced, as the paper's class-balanced runs)."),
    "pos_weight": Param("--pos-weight", 0.0, symbol="w⁺", help="ce/focal/ss: weight of correct "
                        "rows.", recorded=False),
    "neg_weight": Param("--neg-weight", 0.0, symbol="w⁻", help="ce/focal/ss: weight of "
                        "incorrect rows.", recorded=False),
    "cb_beta": Param("--cb-beta", 0.0, below_one=True, symbol="CB β",
                     help="Class-balanced beta (default 0.999)."),
}
WEIGHTS = ("pos_weight", "neg_weight")


@dataclass(frozen=True)
class Loss:
    """One loss: display label, its own numeric parameters, whether it takes class weights
    (naive or class-balanced) and the authors' broadcasting variant, the head it trains by
    default, and whether its TNR counts below 1/K (TCP: its target is p(true class))."""
    label: str
    params: tuple[str, ...] = ()
    weighted: bool = True
    broadcast: bool = False
    head: str = "linear"
    chance_tnr: bool = False


# Table order: CE, focal, TCP, SS (report rows, demo grid, --loss choices).
LOSSES = {
    "ce": Loss("CE", broadcast=True),
    "focal": Loss("Focal", ("gamma",), broadcast=True),
    "tcp": Loss("TCP", weighted=False, chance_tnr=True),
    "ss": Loss("SS", ("alpha_pos", "alpha_neg"), head="hyperplane"),
}
FLAGS = {"broadcast": "--authors-broadcast", "z": "--ss-distance", "class_balanced": "--class-balanced"}


def flag(name: str) -> str:
    return PARAMS[name].flag if name in PARAMS else FLAGS.get(name, "--" + name.replace("_", "-"))


def option_losses(name: str) -> tuple[str, ...]:
    """The losses an option applies to (parameters, weights, --ss-distance, --authors-broadcast)."""
    if name in ("class_balanced", "cb_beta", *WEIGHTS):
        return tuple(n for n, l in LOSSES.items() if l.weighted)
    if name == "broadcast":
        return tuple(n for n, l in LOSSES.items() if l.broadcast)
    if name == "z":
        return tuple(n for n, l in LOSSES.items() if l.head == "hyperplane")
    return tuple(n for n, l in LOSSES.items() if name in l.params)


# The options that apply to some losses only, in the order misfits are reported: each loss's own
# parameters, the hyperplane head's --ss-distance, the class weights, the broadcasting variant.
RESTRICTED = (*(n for n in PARAMS if any(n in l.params for l in LOSSES.values())), "z",
              "class_balanced", *WEIGHTS, "broadcast")


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


def check_loss_options(loss: str, given: dict) -> None:
    """Refuse options that do not apply to ``loss`` (``given``: option -> value, None = unset)."""
    if loss not in LOSSES:
        raise LossOptionError(f"--loss {loss!r}: expected one of {tuple(LOSSES)}")
    for name in RESTRICTED:
        value = given.get(name)
        if value is None or value is False:
            continue
        allowed = option_losses(name)
        if loss not in allowed:
            raise LossOptionError(f"{flag(name)} does not apply to --loss {loss} (it applies to "
                                  f"--loss {'/'.join(allowed)})")
    if given.get("cb_beta") is not None and not given.get("class_balanced"):
        raise LossOptionError("--cb-beta needs --class-balanced")
    naive = any(given.get(w) is not None for w in WEIGHTS)
    if naive and given.get("class_balanced"):
        raise LossOptionError("--class-balanced and --pos-weight/--neg-weight are exclusive: "
                              "class-balanced weights are computed from the training split")
    for name, param in PARAMS.items():
        if given.get(name) is not None:
            param.check(given[name])
    if given.get("z") is not None and given["z"] not in HEADS:
        raise LossOptionError(f"--ss-distance {given['z']!r}: expected one of {HEADS}")


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


def head_of(loss: str, z: str | None) -> str:
    """The head a run trains: ``--ss-distance`` for a loss with a hyperplane head, else linear."""
    return (z or LOSSES[loss].head) if LOSSES[loss].head == "hyperplane" else "linear"


def variant_tags(cfg: LossConfig, z_head: str | None,
                 slopes: tuple[float, float] | None = None) -> list[str]:
    """Short tags of non-default loss forms (DATA_CONTRACT.md): broadcast, linear-z, cb, wP-N,
    aP-N (SS slopes other than ``slopes``, the oracle's defaults: a sweep's choice)."""
    tags = []
    if slopes is not None and cfg.alpha_pos is not None and \
            (cfg.alpha_pos, cfg.alpha_neg) != tuple(slopes):
        tags.append(f"a{cfg.alpha_pos:g}-{cfg.alpha_neg:g}")
    if cfg.broadcast:
        tags.append("broadcast")
    if LOSSES[cfg.name].head == "hyperplane" and z_head == "linear":
        tags.append("linear-z")
    if cfg.class_balanced:
        tags.append("cb")
    elif (cfg.pos_weight, cfg.neg_weight) != (1.0, 1.0):
        tags.append(f"w{cfg.pos_weight:g}-{cfg.neg_weight:g}")
    return tags


def loss_label(cfg: LossConfig, tags: list[str]) -> str:
    """Display name: CE, Focal, TCP, SS, "CE (broadcast)", "SS (linear z)", "CE (CB)", ..."""
    shown = {"broadcast": "broadcast", "linear-z": "linear z", "cb": "CB",
             "confidnet": "ConfidNet"}
    parts = [shown.get(t, t) for t in tags]
    if cfg.alpha_pos is not None:
        slopes = f"a{cfg.alpha_pos:g}-{cfg.alpha_neg:g}"
        parts = [f"α+ {cfg.alpha_pos:g}, α− {cfg.alpha_neg:g}" if p == slopes else p
                 for p in parts]
    return LOSSES[cfg.name].label + (f" ({', '.join(parts)})" if parts else "")


def tnr_threshold(loss: str, num_classes: int) -> float:
    """The confidence below which the paper's TNR counts a row as rejected: 1/K for a loss whose
    target is the true class's probability (TCP: chance level), else 0.5."""
    return 1.0 / num_classes if LOSSES.get(loss, Loss("")).chance_tnr else 0.5


def tnr_logit(loss: str, num_classes: int) -> float:
    """``tnr_threshold`` on the head's output z (confidence = sigmoid(z)): logit(1/K) for TCP,
    0 otherwise."""
    if not LOSSES.get(loss, Loss("")).chance_tnr or num_classes <= 1:
        return 0.0
    p = 1 / num_classes
    return math.log(p / (1 - p))
