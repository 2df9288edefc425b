"""Post-hoc confidence scores from a classifier's logits (the report's built-in baselines), and
evaluating a score function of one's own like them.

    scores = posthoc_scores(logits)                   # {"mcp": (N,), "entropy": (N,), ...}
    fit = fit_posthoc(heldout_logits, heldout_labels) # temperature, p, REL-U's matrix
    evaluate_posthoc("ts", logits, correct, fit=fit, bootstrap=1000)
    evaluate_posthoc(lambda z: z.max(1) - np.sort(z, 1)[:, -2], logits, correct,
                     probability=False, calibrated=False)

The scores are those of ``pipeline.report.baselines`` (its ``TABLE``: one entry per baseline,
the names used here), computed by its ``baseline_scores`` in float32 chunks, so they equal the
report's for the same logits (the cache's float16 logits, or the same values in float32).  The
fitted ones (temperature scaling, MaxLogit-pNorm, REL-U) need a parameter fitted on held-out rows
by ``fit_posthoc`` (``pipeline.report.calibrate``, the report's fit functions), never on the
evaluated rows.  docs/METRICS.md, "Post-hoc baselines", defines each.  Pure numpy.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
import numpy as np
from numpy.typing import ArrayLike

from pipeline.report.baselines import FITTED, LOGIT_BASELINES, TABLE, baseline_scores
from pipeline.report.calibrate import FitError
from trust_oracles.errors import received
from trust_oracles.evaluation import Evaluation, check_scores, evaluate

__all__ = ["POSTHOC_SCORES", "PosthocFit", "evaluate_posthoc", "fit_posthoc", "posthoc_scores"]

# from the logits alone; MC-Dropout's scores read columns of an MC-Dropout extraction instead
POSTHOC_SCORES = tuple(n for n in LOGIT_BASELINES if not TABLE[n].columns)
"""The names of the built-in post-hoc scores computed from logits: "mcp" (the maximum softmax
probability), "entropy", "maxlogit", "energy", "doctor", and the fitted "ts" (temperature
scaling), "pnorm" (MaxLogit-pNorm) and "relu" (REL-U); docs/METRICS.md defines each."""


@dataclass(frozen=True)
class PosthocFit:
    """The fitted baselines' parameters, as ``fit_posthoc`` returns them.

    Attributes
    ----------
    parameters : dict
        {"ts": the temperature (float), "pnorm": p (an int, or "MSP" when no p beats the MSP),
        "relu": REL-U's (K, K) matrix}; a baseline that could not be fitted is left out.
    undefined : dict of str to str
        Each baseline that could not be fitted, and why.
    records : dict
        Each fit's record as report.json's ``fits`` keeps it (with REL-U's matrix).
    rows : int
        The rows fitted on.
    """
    parameters: dict[str, float | int | str | np.ndarray]
    undefined: dict[str, str] = field(default_factory=dict)
    records: dict[str, dict] = field(default_factory=dict)
    rows: int = 0

    @property
    def temperature(self) -> float | None:
        """Temperature scaling's temperature; None where it could not be fitted."""
        return self.parameters.get("ts")

    @property
    def p(self) -> int | str | None:
        """MaxLogit-pNorm's p ("MSP" when no p beats the MSP); None where it could not be
        fitted."""
        return self.parameters.get("pnorm")


def _check_logits(logits: ArrayLike, what: str = "logits") -> np.ndarray:
    z = np.asarray(logits)
    if z.ndim != 2 or z.shape[0] == 0 or z.shape[1] < 2:
        raise received(what, f"shape {z.shape}", "(N, K) with N >= 1 rows and K >= 2 classes")
    if not (np.issubdtype(z.dtype, np.floating) or np.issubdtype(z.dtype, np.integer)):
        raise received(what, f"dtype {z.dtype}", "real numbers (float16, float32, ...)")
    finite = np.isfinite(z).all(axis=1)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        raise received(what, f"inf/NaN in {len(bad)} row(s), the first at row {bad[0]}",
                        "finite logits")
    return z


def fit_posthoc(logits: ArrayLike, labels: ArrayLike) -> PosthocFit:
    """Fit temperature scaling, MaxLogit-pNorm's p and REL-U's matrix on held-out rows, as the
    report fits them (on the rows ``train-oracle`` held out of the classifier's training split).

    Parameters
    ----------
    logits : array-like, shape (M, K)
        The classifier's logits of held-out rows, never the rows evaluated afterwards.
    labels : array-like of int, shape (M,)
        Their true classes in 0..K-1.

    Returns
    -------
    PosthocFit
        A baseline that cannot be fitted (fewer than 100 rows, or fewer than 10 correct or 10
        incorrect predictions among them) has no parameter and its reason in ``undefined``.
    """
    z = _check_logits(logits)
    y = np.asarray(labels)
    if y.shape != (len(z),) or not np.issubdtype(y.dtype, np.integer):
        raise received("labels", f"shape {y.shape}, dtype {y.dtype}",
                        f"integer classes of shape ({len(z)},), one per row of logits")
    if y.min() < 0 or y.max() >= z.shape[1]:
        raise received("labels", f"values {y.min()}..{y.max()}",
                        f"classes 0..{z.shape[1] - 1} (K = {z.shape[1]} logits a row)")
    params, undefined, records = {}, {}, {}
    for name in FITTED:
        try:
            records[name] = TABLE[name].fitted.fit(z, y, "the fit rows")
        except FitError as err:
            undefined[name] = str(err)
            continue
        params[name] = TABLE[name].fitted.parameter(records[name])
    return PosthocFit(params, undefined, records, len(y))


def posthoc_scores(logits: ArrayLike, *, names: Sequence[str] | None = None,
                   fit: PosthocFit | None = None) -> dict[str, np.ndarray]:
    """The built-in post-hoc scores of ``logits``, higher = more likely correct.

    Parameters
    ----------
    logits : array-like, shape (N, K)
        Finite logits (float16 as a cache stores them, float32, ...); computed in float32.
    names : sequence of str, optional
        Of ``POSTHOC_SCORES``: "mcp", "entropy", "maxlogit", "energy", "doctor" and the fitted
        "ts", "pnorm", "relu".  Default: all those that can be computed (the fitted ones only
        with ``fit``).
    fit : PosthocFit, optional
        From ``fit_posthoc`` on held-out rows; needed by "ts", "pnorm" and "relu".

    Returns
    -------
    dict
        {name: (N,) float32 array}, in ``names`` order.
    """
    z = _check_logits(logits)
    params = dict(fit.parameters) if fit else {}
    if names is None:
        names = tuple(n for n in POSTHOC_SCORES if n not in FITTED or n in params)
    names = tuple(names)
    unknown = [n for n in names if n not in POSTHOC_SCORES]
    if unknown:
        raise received("names", repr(unknown), f"names of {POSTHOC_SCORES}")
    missing = [n for n in names if n in FITTED and n not in params]
    if missing:
        why = "; ".join(f"{n}: {fit.undefined.get(n, 'not fitted')}" for n in missing) if fit \
            else "no fit given"
        raise received(f"the fitted baseline(s) {missing}", why,
                        "their parameters: fit=fit_posthoc(heldout_logits, heldout_labels)")
    return baseline_scores(z, names=names, params=params)


def _as_callable_input(z: np.ndarray) -> np.ndarray:
    # float32, as the built-in scores compute; read-only, so a score function cannot change
    # the caller's array (np.asarray returns it unchanged when it is float32 already)
    out = np.asarray(z, dtype=np.float32).view()
    out.flags.writeable = False
    return out


def evaluate_posthoc(fn: Callable[[np.ndarray], ArrayLike] | str, logits: ArrayLike,
                     correct: ArrayLike, *, fit: PosthocFit | None = None,
                     **kwargs: float | int | bool | str | None) -> Evaluation:
    """Evaluate a score computed from logits, like the report's post-hoc baselines.

    Parameters
    ----------
    fn : callable or str
        ``fn(logits) -> scores``: logits a read-only (N, K) float32 array, scores (N,) finite
        reals, higher = more likely correct.  Or the name of a built-in score
        (``POSTHOC_SCORES``), which also sets ``probability`` and ``calibrated`` as the report
        does for it (MCP: both; negative entropy: neither; ...).
    logits : array-like, shape (N, K)
        The classifier's logits of the evaluated rows.
    correct : array-like, shape (N,)
        bool or 0/1: whether the classifier's prediction (argmax) of the row is right.
    fit : PosthocFit, optional
        For the fitted built-in scores ("ts", "pnorm", "relu").
    **kwargs
        ``evaluate``'s options (``bootstrap``, ``seed``, ``definition``, ``probability``,
        ``calibrated``, ...).  For a function, ``probability`` and ``calibrated`` default to
        True: pass False for a score that is not a probability of being right.

    Returns
    -------
    Evaluation
        As ``evaluate`` returns it.

    Raises
    ------
    InputError (a ValueError)
        Malformed logits or ``correct``, or a function output that is not (N,) finite reals,
        naming the function.
    """
    z = _check_logits(logits)
    if len(z) != len(np.asarray(correct)):
        raise received("logits and correct", f"{len(z)} and {len(np.asarray(correct))} rows",
                        "one row of logits per value of correct")
    if isinstance(fn, str):
        score = posthoc_scores(z, names=(fn,), fit=fit)[fn]
        kwargs.setdefault("probability", TABLE[fn].probability)
        kwargs.setdefault("calibrated", TABLE[fn].calibrated)
        return evaluate(score, correct, **kwargs)
    if not callable(fn):
        raise received("fn", repr(fn), "a function of the logits or a name of "
                        f"{POSTHOC_SCORES}")
    label = f"the output of score function {getattr(fn, '__qualname__', repr(fn))!r}"
    out = np.asarray(fn(_as_callable_input(z)))
    if out.shape != (len(z),):
        raise received(label, f"shape {out.shape}", f"({len(z)},): one score per row of logits")
    score, correct = check_scores(out, correct, label)
    return evaluate(score, correct, **kwargs)
