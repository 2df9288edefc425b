"""What every oracle loss is: the ``Loss`` base class, its numeric ``Param``, its class weights.

A loss is a subclass that declares, as class attributes, its name, its label, its parameters,
whether it takes class weights and the authors' broadcasting form, the head it trains and its TNR
rule, and implements ``per_sample``: the per-sample losses of a bank of P heads, z (B, P) ->
(B, P) float32, each column with its own parameters.  An instance is a resolved loss: its
parameters' values and its class weights (what run.json records as ``loss``).

Torch-free at import: ``report`` reads the declarations (labels, TNR rules, order) without torch;
the formulas receive tensors and call their methods (``logsigmoid`` below loads torch's functional
namespace on first use).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Mapping, Sequence

from cache.errors import TrustOraclesError

HEADS = ("hyperplane", "linear")
HEAD_ARCHS = ("linear", "confidnet")     # pipeline.oracle.nets.heads builds them
TNR_RULES = {"half": "TNR counts a row rejected below confidence 0.5",
             "chance": "TNR counts a row rejected below confidence 1/K (chance level): for a "
                       "loss whose target is the true class's probability"}
CB_BETA = 0.999
CUSTOM_PREFIX = "custom:"     # a user's loss function: custom:<module>.<qualname> (or its name)


class LossOptionError(TrustOraclesError, ValueError):
    """A loss option that does not apply to the chosen loss, or an invalid value (the command
    line's usage error: exit 2)."""
    exit_code = 2


class CustomLossError(TrustOraclesError, ValueError):
    """A user's loss that lacks what training needs, or returned something other than finite,
    differentiable losses of the expected shape."""


@dataclass(frozen=True)
class Param:
    """A numeric loss option: its name (the flag is --<name with dashes>), range, symbol (sweep
    tables), help and default (None: the loss's ``defaults`` chooses it from the run)."""
    name: str
    minimum: float = 0.0           # > minimum (open) or >= minimum (closed)
    open_min: bool = True
    below_one: bool = False        # also < 1 (a beta)
    symbol: str = ""
    help: str = ""
    default: float | None = None
    default_text: str = ""         # --help's [default: ...] when ``default`` is None
    recorded: bool = True          # its resolved value goes into run.json's config and the group
    #                                hash (the class weights' resolved values are the loss's)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def check(self, value: float) -> None:
        ok = isinstance(value, (int, float)) and math.isfinite(value) and (
            value > self.minimum if self.open_min else value >= self.minimum)
        if ok and self.below_one and not value < 1:
            ok = False
        if not ok:
            raise LossOptionError(f"{self.flag} {value}: {self.expected()}")

    def expected(self) -> str:
        if self.below_one:
            return "expected 0 < beta < 1"
        return ("expected a positive finite number" if self.open_min and self.minimum == 0
                else f"expected a finite number >= {self.minimum:g}")


# The class weights every weighted loss takes (Loss.weighted), naive or class-balanced.
WEIGHT_PARAMS = (
    Param("pos_weight", symbol="w⁺", help="ce/focal/ss: weight of correct rows.", default=1.0,
          recorded=False),
    Param("neg_weight", symbol="w⁻", help="ce/focal/ss: weight of incorrect rows.", default=1.0,
          recorded=False),
    Param("cb_beta", below_one=True, symbol="CB β", help="Class-balanced beta (default 0.999).",
          default=CB_BETA),
)


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


@dataclass(frozen=True)
class Context:
    """What a loss's defaults may depend on: SS's slopes for the oracle (a_pos, a_neg), whether
    the run is class-balanced (``resolve`` sets it from the options)."""
    slopes: tuple[float, float] = (1.0, 3.0)
    class_balanced: bool = False


@dataclass(frozen=True)
class Loss:
    """A resolved loss (module docstring).  ``values``: its own parameters by name;
    ``pos_weight``/``neg_weight``: the class weights (naive or class-balanced)."""
    name: ClassVar[str] = ""
    label: ClassVar[str] = ""                 # table label: CE, Focal, TCP, SS
    params: ClassVar[tuple[Param, ...]] = ()
    weighted: ClassVar[bool] = True           # takes class weights
    broadcastable: ClassVar[bool] = False     # has the authors' broadcasting form
    head: ClassVar[str] = "linear"            # "hyperplane": --ss-distance chooses the head
    tnr: ClassVar[str] = ""                   # a key of TNR_RULES
    needs_p_true: ClassVar[bool] = False      # reads the classifier's p(true class)
    graphable: ClassVar[bool] = False         # per_sample is pure tensor ops (CUDA-graph safe)
    slopes_by_oracle: ClassVar[bool] = False  # defaults read Context.slopes (a note names them)

    values: Mapping[str, float] = field(default_factory=dict)
    pos_weight: float = 1.0
    neg_weight: float = 1.0
    broadcast: bool = False
    class_balanced: bool = False
    cb_beta: float | None = None

    def __getattr__(self, key: str) -> Any:     # loss.alpha_pos: one of its own parameters
        values = self.__dict__.get("values", {})
        if key in values:
            return values[key]
        raise AttributeError(f"{type(self).__name__} has no attribute or parameter {key!r}")

    # ---------------------------------------------------------------- declarations, resolved --
    @classmethod
    def defaults(cls, ctx: Context) -> dict[str, float]:
        """Each parameter's default for a run (``Param.default``; a loss overrides this where
        the default depends on the run, e.g. the oracle's slopes)."""
        return {p.name: p.default for p in cls.params}

    @classmethod
    def resolve(cls, given: Mapping[str, Any], ctx: Context,
                counts: tuple[int, int] | None) -> "Loss":
        """The loss of a run: ``given`` (option -> value, None = unset) checked and its defaults
        filled; class-balanced weights from ``counts`` = (n_neg, n_pos) training rows.  The
        options' fit to this loss is ``registry.check_options``'."""
        ctx = replace(ctx, class_balanced=bool(given.get("class_balanced")))
        defaults = cls.defaults(ctx)
        values = {p.name: float(defaults[p.name] if given.get(p.name) is None else given[p.name])
                  for p in cls.params}
        w_pos = float(given.get("pos_weight") or 1.0)
        w_neg = float(given.get("neg_weight") or 1.0)
        beta = None
        if ctx.class_balanced:
            beta = float(given.get("cb_beta") or CB_BETA)
            if counts is None:
                raise LossOptionError("--class-balanced needs the training split's class counts")
            w_neg, w_pos = class_balanced_weights(counts[0], counts[1], beta)
        return cls(values, w_pos, w_neg, bool(given.get("broadcast")), ctx.class_balanced, beta)

    def record(self) -> dict:
        """run.json's ``loss``: name, own parameters, class weights, the TNR threshold rule."""
        return {"name": self.name, **self.values, "pos_weight": self.pos_weight,
                "neg_weight": self.neg_weight, "broadcast": self.broadcast,
                "class_balanced": self.class_balanced, "cb_beta": self.cb_beta, "tnr": self.tnr}

    # ------------------------------------------------------------------- what a run shows --
    def head_of(self, z: str | None) -> str:
        """The head a run trains: ``--ss-distance`` for a loss with a hyperplane head."""
        return (z or self.head) if self.head == "hyperplane" else "linear"

    def tags(self, z_head: str | None, slopes: tuple[float, float] | None = None) -> list[str]:
        """Short tags of non-default forms (DATA_CONTRACT.md): broadcast, linear-z, cb, wP-N."""
        tags = []
        if self.broadcast:
            tags.append("broadcast")
        if self.head == "hyperplane" and z_head == "linear":
            tags.append("linear-z")
        if self.class_balanced:
            tags.append("cb")
        elif (self.pos_weight, self.neg_weight) != (1.0, 1.0):
            tags.append(f"w{self.pos_weight:g}-{self.neg_weight:g}")
        return tags

    def display(self, tags: Sequence[str]) -> str:
        """Display name: the label, then its tags in words: "CE (broadcast)", "SS (linear z)"."""
        shown = {"broadcast": "broadcast", "linear-z": "linear z", "cb": "CB",
                 "confidnet": "ConfidNet"}
        parts = [shown.get(t, t) for t in tags]
        return self.label + (f" ({', '.join(parts)})" if parts else "")

    # ------------------------------------------------------------------------ the formula --
    @classmethod
    def bank(cls, heads: Sequence["Loss"], device: Any = None) -> dict[str, Any]:
        """What ``per_sample`` reads for a bank of heads of this loss: each parameter as a
        float32 (P,) tensor on ``device`` (a loss overrides this for other forms)."""
        import torch     # torch on first use only: the report imports the declarations
        return {p.name: torch.tensor([h.values[p.name] for h in heads], dtype=torch.float32,
                                     device=device) for p in cls.params}

    @classmethod
    def per_sample(cls, z: Any, c_pos: Any, c_neg: Any, p_true: Any,
                   bank: Mapping[str, Any]) -> Any:
        """z (B, P) float32 -> (B, P) float32 per-sample losses.  ``c_pos`` = w+ o and ``c_neg``
        = w- (1 - o), each (B, P) (the broadcast form's are the batch means); ``p_true`` (B, 1)
        the classifier's probability of the true class; ``bank``: ``bank(heads)``."""
        raise NotImplementedError


@dataclass(frozen=True)
class FunctionLoss(Loss):
    """The resolved loss of a run trained with a user's loss FUNCTION (``custom:<name>``): no
    parameters, no class weights, TNR at 0.5; its function is computed by
    ``pipeline.oracle.nets.losses.CustomLoss``."""
    function_name: str = CUSTOM_PREFIX
    name = property(lambda self: self.function_name)     # type: ignore[assignment]
    label = property(lambda self: self.function_name)    # type: ignore[assignment]
    weighted = False
    tnr = "half"


def is_custom(name: str) -> bool:
    """Whether a run's loss name is a user's function's (custom:...)."""
    return name.startswith(CUSTOM_PREFIX)


def logsigmoid(z: Any) -> Any:
    """log(sigmoid(z)) without overflow (torch's functional, loaded on first use)."""
    import torch.nn.functional as F
    return F.logsigmoid(z)
