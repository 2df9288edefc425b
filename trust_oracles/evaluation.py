"""Trust metrics of a confidence score: every metric of the report, with bootstrap intervals
(paired comparisons of two scores: ``trust_oracles.comparison``).

    ev = evaluate(score, correct, bootstrap=1000)
    ev.standard["aurc"], ev.paper["fpr95"], ev.standard.interval("auc").low

The numbers come from the functions ``cli.py report`` uses (``pipeline.report.scoring``,
``bootstrap``, ``compare``), so for the same rows in the same order they equal report.json's:
the values of both definitions, the intervals (the same resamples for the same ``bootstrap`` and
``seed``; the report's defaults are 1000 and 0) and the paired differences.  Metric names are the
catalog's (``pipeline.core.catalog.CATALOG``; docs/METRICS.md defines each); values are fractions
in [0, 1], not the report's percentages.  Pure numpy: no torch is loaded.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
from numpy.typing import ArrayLike

from pipeline.core.catalog import DEFINITIONS, names
from pipeline.core.metrics import rank
from pipeline.report.bootstrap import BootstrapSpec, Resamples
from pipeline.report.scoring import intervals, score_metrics
from trust_oracles.errors import received

__all__ = ["DEFAULT_RESAMPLES", "Evaluation", "Interval", "MetricSet", "check_scores", "evaluate"]

DEFAULT_RESAMPLES = BootstrapSpec().resamples        # the report's --resamples default
STANDARD_TNR_THRESHOLD = 0.5     # the standard definition's TNR threshold, whatever the score


@dataclass(frozen=True)
class Interval:
    """A percentile bootstrap interval of one metric.

    Attributes
    ----------
    low, high : float or None
        Its bounds; None: no interval, and ``undefined`` says why (the metric is undefined, a
        class it needs has < 2 rows, > 5% of the resamples drew too few of a class, the paper's
        grid FPR-95%-TPR has none).
    resamples : int
        The resamples that entered it.
    undefined : str or None
    note : str or None
        How many resamples were left out, if any.
    """
    low: float | None
    high: float | None
    resamples: int
    undefined: str | None = None
    note: str | None = None

    @property
    def defined(self) -> bool:
        """Whether there is an interval (``undefined`` is None)."""
        return self.undefined is None


@dataclass(frozen=True)
class MetricSet(Mapping):
    """Every metric of one definition: a mapping {catalog name: value or None}, catalog order.

    None exactly when the rows leave the metric undefined (one class only, TPR/TNR of an
    unbounded score, ECE of a non-probability); ``undefined[name]`` says why.  ``notes[name]``: a
    caveat (the paper's FPR-95%-TPR fallback, a working point moved by ties).

    Attributes
    ----------
    definition : str
        "paper" or "standard".
    data : dict of str to float or None
        The values, what ``ms[name]`` reads.
    undefined, notes : dict of str to str
        Why a metric is undefined; a caveat of its value.
    intervals : dict of str to Interval, or None
        None without a bootstrap.
    """
    definition: str
    data: dict[str, float | None]
    undefined: dict[str, str]
    notes: dict[str, str]
    intervals: dict[str, Interval] | None = None

    def __getitem__(self, name: str) -> float | None:
        if name not in self.data:
            raise KeyError(f"{name!r} is not a metric of the {self.definition} definition; its "
                           f"metrics are {list(self.data)}")
        return self.data[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def interval(self, name: str) -> Interval:
        """The bootstrap interval of one metric.

        Parameters
        ----------
        name : str
            A catalog name of this definition (KeyError otherwise).

        Returns
        -------
        Interval

        Raises
        ------
        ValueError
            The evaluation had no bootstrap.
        """
        self[name]      # an unknown name: the KeyError that lists the metrics
        if self.intervals is None:
            raise ValueError("no intervals: evaluate(..., bootstrap=RESAMPLES) computes them")
        return self.intervals[name]


@dataclass(frozen=True)
class Evaluation:
    """What ``evaluate`` returns.  ``ev["paper"]`` or ``ev.paper`` (likewise ``standard``): that
    definition's ``MetricSet``.

    Attributes
    ----------
    definitions : dict of str to MetricSet
    n, n_correct : int
        Rows, and correct ones among them.
    tnr_threshold : float
        The paper definition's TNR threshold.
    resamples : int or None
        Of the bootstrap (None: no intervals).
    seed : int
    confidence_level : float
    """
    definitions: dict[str, MetricSet]
    n: int
    n_correct: int
    tnr_threshold: float
    resamples: int | None = None
    seed: int = 0
    confidence_level: float = 0.95

    def __getitem__(self, definition: str) -> MetricSet:
        if definition not in self.definitions:
            raise KeyError(f"definition {definition!r} was not computed; this evaluation has "
                           f"{list(self.definitions)} (evaluate(..., definition='both'))")
        return self.definitions[definition]

    @property
    def paper(self) -> MetricSet:
        """The paper's definitions of the metrics (docs/METRICS.md)."""
        return self["paper"]

    @property
    def standard(self) -> MetricSet:
        """The standard definitions of the metrics (docs/METRICS.md)."""
        return self["standard"]


def _one_dimensional(values, what: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        fix = "pass it flattened (.ravel())" if arr.ndim == 2 and 1 in arr.shape else ""
        raise received(what, f"shape {arr.shape}", "a 1-D array of shape (N,)", fix)
    if not (arr.dtype == np.bool_ or np.issubdtype(arr.dtype, np.integer)
            or np.issubdtype(arr.dtype, np.floating)):
        raise received(what, f"dtype {arr.dtype}", "real numbers (bool, int or float)")
    return arr


def check_scores(score: ArrayLike, correct: ArrayLike, name: str = "score") -> tuple[np.ndarray, np.ndarray]:
    """The one input check of ``evaluate``, ``compare`` and ``evaluate_posthoc``.

    Parameters
    ----------
    score : array-like, shape (N,)
        Finite reals.  float32 and float64 are kept (thresholds are compared in the score's own
        precision, as the report does with its float32 confidences); other dtypes -> float64.
    correct : array-like, shape (N,)
        bool, or numbers all 0 or 1.
    name : str
        What ``score`` is called in the error messages.

    Returns
    -------
    score, correct : (N,) float32 or float64 array, (N,) bool array

    Raises
    ------
    InputError (a ValueError)
        Saying what was received and what is expected: not 1-D, unequal lengths, no rows, not
        real numbers, NaN or inf (the first row named), ``correct`` not 0/1.
    """
    s, c = _one_dimensional(score, name), _one_dimensional(correct, "correct")
    if len(s) != len(c):
        raise received(f"{name} and correct", f"lengths {len(s)} and {len(c)}",
                        "one value of each per row (the same length)")
    if len(s) == 0:
        raise received(name, "an empty array", "at least one row")
    if s.dtype not in (np.float32, np.float64):
        s = s.astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(s))
    if len(bad):
        raise received(name, f"{len(bad)} non-finite value(s), the first ({s[bad[0]]}) at row "
                        f"{bad[0]}", "finite numbers")
    if c.dtype != np.bool_:
        off = np.flatnonzero((c != 0) & (c != 1))
        if len(off):
            raise received("correct", f"{c[off[0]].item()!r} at row {off[0]}",
                            "booleans or 0/1")
        c = c.astype(bool)
    return s, c


def _check_options(definition, resamples, seed, confidence_level, tnr_threshold) -> None:
    def integer(x):
        return isinstance(x, Integral) and not isinstance(x, bool)
    if definition not in ("both", *DEFINITIONS):
        raise received("definition", repr(definition), f"one of {('both', *DEFINITIONS)}")
    if resamples is not None and not (integer(resamples) and resamples >= 1):
        raise received("bootstrap resamples", repr(resamples), "None (no intervals) or an "
                        f"integer >= 1 (the report uses {DEFAULT_RESAMPLES})")
    if not (integer(seed) and seed >= 0):
        raise received("seed", repr(seed), "an integer >= 0")
    if not (isinstance(confidence_level, Real) and 0 < confidence_level < 1):
        raise received("confidence_level", repr(confidence_level), "a number in (0, 1)")
    if not (isinstance(tnr_threshold, Real) and np.isfinite(tnr_threshold)):
        raise received("tnr_threshold", repr(tnr_threshold), "a finite number (0.5, or 1/K)")


def _summary(score, correct, tnr_threshold, probability, calibrated, resamples, seed,
             confidence_level) -> tuple[dict, Resamples | None, dict | None]:
    """(metrics, per-resample values, intervals) of both definitions, by the two functions the
    report's ``score_summary`` calls (its ``rates``, ``probability`` = ``probability``,
    ``calibrated`` here)."""
    thresholds = {"paper": float(tnr_threshold), "standard": STANDARD_TNR_THRESHOLD}
    metrics, _ = score_metrics(rank(score, correct), score, correct, thresholds, probability,
                               calibrated)
    for d in DEFINITIONS:     # the catalog's names, in its order ("acc" as the report's "ci")
        m = metrics[d]
        m["values"] = {n: float(correct.mean()) if n == "acc" else m["values"][n]
                       for n in names(d)}
    if resamples is None:
        return metrics, None, None
    # percent as the report's; 100 * 0.95 is exactly its 95.0
    boot, ci = intervals(score, correct, metrics, thresholds, calibrated,
                         BootstrapSpec(int(resamples), int(seed)), 100.0 * confidence_level)
    return metrics, boot, ci


def evaluate(score: ArrayLike, correct: ArrayLike, *, definition: str = "both", tnr_threshold: float = 0.5,
             probability: bool = True, calibrated: bool = True, bootstrap: int | None = None,
             seed: int = 0, confidence_level: float = 0.95) -> Evaluation:
    """Every metric of the catalog for one score, as ``cli.py report`` computes it.

    Parameters
    ----------
    score : array-like, shape (N,)
        Confidence that each prediction is right, higher = more trusted (finite reals).
    correct : array-like, shape (N,)
        bool or 0/1: whether the classifier's prediction of the row is right.
    definition : {"both", "paper", "standard"}
        The metric definitions returned (docs/METRICS.md sets them side by side).
    tnr_threshold : float
        The paper definition's TNR threshold: 0.5, or 1/K for a TCP oracle (K classes), as the
        report uses.  The standard definition always uses 0.5.
    probability : bool
        The score is a probability, with its natural threshold at 0.5: TPR and TNR apply.  False
        reports them undefined, as the report does for unbounded baselines.
    calibrated : bool
        The score estimates P(correct): ECE applies (else undefined; also outside [0, 1]).
    bootstrap : int or None
        Resamples of the percentile bootstrap intervals over the rows; None: no intervals.
    seed : int
        The resamples depend on (seed, N) only: equal ``bootstrap`` and ``seed`` give the
        report's resamples for the same rows in the same (global-index) order.
    confidence_level : float
        Of the intervals, in (0, 1).

    Returns
    -------
    Evaluation
        ``ev[definition][name]``: the value (None, the reason in ``undefined``, where the rows
        leave it undefined: one class only); ``ev[definition].interval(name)``: its interval.

    Raises
    ------
    InputError (a ValueError)
        Malformed inputs (``check_scores``) or options.
    """
    _check_options(definition, bootstrap, seed, confidence_level, tnr_threshold)
    score, correct = check_scores(score, correct)
    metrics, _, ci = _summary(score, correct, tnr_threshold, probability, calibrated, bootstrap,
                              seed, confidence_level)
    sets = {d: MetricSet(d, metrics[d]["values"], dict(metrics[d]["undefined"]),
                         dict(metrics[d]["notes"]), None if ci is None else
                         {n: Interval(**ci[d][n]) for n in metrics[d]["values"]})
            for d in (DEFINITIONS if definition == "both" else (definition,))}
    return Evaluation(sets, len(correct), int(correct.sum()), float(tnr_threshold),
                      None if bootstrap is None else int(bootstrap), int(seed),
                      float(confidence_level))
