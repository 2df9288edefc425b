"""Which points a sweep trains: the paper's coordinate protocol or a full grid, and the choice.

Paper protocol (default, paper §5 "Ablation Study"): α⁻ over its values with α⁺ fixed, then α⁺
over its values at the chosen α⁻, then each further swept option in turn at the values chosen so
far.  ``grid``: every combination at once (one stage).  A point is a dict option -> value, the
options being the numeric loss options of ``pipeline.core.losses.all_params`` (in that order).
"""
from __future__ import annotations

import itertools
import math

from cache.errors import TrustOraclesError
from pipeline.core.catalog import CHECKPOINT_METRIC, log_name
from pipeline.core.losses import all_params, loss_params, option_losses

# Numeric loss options a sweep may vary -> the losses they apply to.  cb_beta implies
# --class-balanced.
PARAMS = all_params()
SWEEPABLE = {name: option_losses(name) for name in PARAMS}
FLAGS = {name: p.flag for name, p in PARAMS.items()}
# The paper's Fig. 4 range around its ViT / ResNet choices (alpha+ 1 / 2, alpha- 3 / 5).
DEFAULT_VALUES = {"alpha_neg": (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0),
                  "alpha_pos": (0.5, 1.0, 2.0, 3.0, 4.0)}


def _logged(metric: str):
    """A point's validation value of a catalog ``metric``, read under its log.jsonl key."""
    key = log_name(metric)
    return lambda m: m[key]


_TPR, _TNR = _logged("tpr"), _logged("tnr")
# Criteria on the held-out validation rows (--criterion, in this order); every one is "higher is
# better".
CRITERIA = {
    "tpr-tnr": lambda m: (_TPR(m) + _TNR(m)) / 2,   # the paper's "trade-off between TPR and TNR"
    "aupr-error": _logged(CHECKPOINT_METRIC),        # the checkpoint choice's metric (standard)
    "auc": _logged("auc"),
    "aupr-success": _logged("aupr_succ"),
}


class SweepError(TrustOraclesError, ValueError):
    """A sweep that cannot be run as asked (option, value or protocol)."""


def parse_values(text: str, name: str) -> tuple[float, ...]:
    """'1,2,3' -> (1.0, 2.0, 3.0) for the loss option ``name`` (``PARAMS``): numbers in its
    range, duplicates dropped, order kept."""
    flag = PARAMS[name].flag
    try:
        values = tuple(dict.fromkeys(float(v) for v in text.split(",") if v.strip()))
    except ValueError:
        raise SweepError(f"{flag} {text!r}: expected comma-separated numbers, e.g. 1,2,3") from None
    if not values:
        raise SweepError(f"{flag} {text!r}: expected comma-separated numbers, e.g. 1,2,3")
    for v in values:
        try:
            PARAMS[name].check(v)
        except ValueError:
            raise SweepError(f"{flag} {text!r}: {PARAMS[name].expected()}") from None
    return values


def plan_stages(loss: str, swept: dict[str, tuple[float, ...]], mode: str) -> list[list[str]]:
    """The options of each stage, in order: [["alpha_neg"], ["alpha_pos"], ...] or one stage
    holding every option (grid).  Refuses options that do not apply to ``loss``."""
    for name in swept:
        if loss not in SWEEPABLE[name]:
            raise SweepError(f"{FLAGS[name]} does not apply to --loss {loss} (it applies to "
                             f"--loss {'/'.join(SWEEPABLE[name])})")
    if not swept:
        raise SweepError(f"nothing to sweep for --loss {loss}: give value lists, e.g. "
                         + _example(loss))
    order = [k for k in SWEEPABLE if k in swept]
    return [order] if mode == "grid" else [[k] for k in order]


def _example(loss: str) -> str:
    """A value list of the loss's first own parameter (or of the class weight)."""
    own = [n for n, losses in SWEEPABLE.items() if loss in losses]
    name = own[0] if own and own[0] in loss_params() else "neg_weight"
    return f"{FLAGS[name]} " + ("0.5,1,2,5" if name != "neg_weight" else "1,2,5")


def stage_points(options: list[str], swept: dict[str, tuple[float, ...]],
                 chosen: dict[str, float]) -> list[dict[str, float]]:
    """The points of one stage: every combination of its options' values, the other options at
    ``chosen`` (the fixed values and earlier stages' choices)."""
    combos = itertools.product(*(swept[k] for k in options))
    return [{**chosen, **dict(zip(options, combo))} for combo in combos]


def score_of(val: dict | None, criterion: str) -> float:
    """A point's validation ``criterion``; NaN where undefined (run files write a metric that
    one class among the held-out rows leaves undefined as null)."""
    if not val:
        return math.nan
    return float(CRITERIA[criterion]({k: math.nan if v is None else v for k, v in val.items()}))


def choose(points: list[dict], criterion: str) -> dict | None:
    """The point with the highest validation criterion (NaN never chosen; the first on ties).
    ``points``: dicts with ``val`` = the chosen checkpoint's held-out metrics."""
    best, best_score = None, -math.inf
    for p in points:
        s = score_of(p.get("val"), criterion)
        if math.isfinite(s) and s > best_score:
            best, best_score = p, s
    return best
