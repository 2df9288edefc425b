"""The post-hoc baselines: confidence scores computed from a classifier's logits alone (no oracle,
no training), described in ONE table (``TABLE``) that every other part of the report iterates.

Every score is "higher = more likely correct", so the trust metrics apply unchanged:

* ``mcp``      max softmax probability (Hendrycks & Gimpel, ICLR 2017)
* ``entropy``  negative entropy of the softmax, sum_k p_k log p_k
* ``maxlogit`` the largest logit (Hendrycks et al. 2022)
* ``energy``   negative free energy, T * logsumexp(logits / T) with T = 1 (Liu et al. 2020)
* ``doctor``   DOCTOR (Granese et al., NeurIPS 2021), the D_alpha form: g(x) = sum_k p_k^2 and the
  detector D_alpha(x) = (1 - g(x)) / g(x) flags an error when large.  D_alpha is a decreasing
  function of g, so we report g itself (in [1/K, 1]) as the confidence: every ranking metric is
  identical and TPR/TNR at 0.5 mean D_alpha < 1 / > 1.  Temperature T = 1 and NO input
  perturbation (epsilon = 0): the perturbation needs gradients through the model, and the report
  stage has no model in memory.
* ``ts``       temperature-scaled MSP (Guo et al., ICML 2017): MSP of logits / T
* ``pnorm``    MaxLogit-pNorm (Cattelan & Silva, UAI 2024): max_k (z_k - mean z) / ||z - mean z||_p
* ``mcd_msp`` / ``mcd_entropy``  MC-Dropout (Gal & Ghahramani, ICML 2016): the max and the negative
  entropy of the mean softmax over T dropout passes, read from the cache's ``mcd_*`` columns
  (``extract --mc-dropout T``); rows only for caches that have them.  They score the
  DETERMINISTIC prediction's correctness (the cache's ``correct``), as every row here does.
  T and p are fitted on held-out rows of the classifier's training cache (``calibrate.py``, on
  the rows ``heldout.py`` chooses), never on the evaluated split; they arrive here as
  ``params = {name: value}``.
* ``relu``     REL-U (Dadalto et al. 2023): -p^T D p, D the C x C matrix fitted in closed form on
  the same held-out rows (calibrate.fit_relu); negated, as REL-U is an uncertainty.
* ``trustscore`` TrustScore (Jiang et al., NeurIPS 2018): not from the logits but from the
  classifier's cached features (``source="features"``): its own worker task, trustscore.py.

A table entry says the display label and order, how the score is computed from a ``Chunk``,
whether it is a probability (TPR/TNR at 0.5) and calibrated (ECE), its fitted parameter (``Fit``:
the fit function of calibrate.py and which entry of its result is the parameter) and which of the
two worker tasks computes it on small-class datasets.  Adding a baseline is an entry here (and,
for a fitted one, its fit function in calibrate.py).  The table's order is the evaluation order
(report.json lists the rows in it); ``order`` is the order of the rows in the tables.

Logits arrive as float16 (N, K) from the classifier cache; they are processed in float32 chunks of
about 8M values, so a 1.28M x 1000 split never needs a full float32 copy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from pipeline.core.logits import Softmax, pnorm
from pipeline.report.calibrate import fit_pnorm, fit_relu, fit_temperature

CHUNK_ELEMENTS = 8_388_608   # logits per float32 chunk (32 MB): 8,192 rows at K = 1,000


class Chunk:
    """One chunk of logits (m, K) and of the cache columns the scores read (``columns``); its
    softmax passes (``pipeline.core.logits.Softmax``) are computed on first use and kept, so one
    exp pass serves every score of a temperature."""

    def __init__(self, logits: np.ndarray, columns: dict[str, np.ndarray] | None = None):
        self.logits = logits
        self.columns = columns or {}
        self._softmax: dict[float, Softmax] = {}

    def softmax(self, temperature: float = 1.0) -> Softmax:
        if temperature not in self._softmax:
            self._softmax[temperature] = Softmax.of(self.logits, temperature)
        return self._softmax[temperature]

    def msp(self, temperature: float = 1.0) -> np.ndarray:
        return self.softmax(temperature).msp()


def _pnorm(c: Chunk, p) -> np.ndarray:
    return c.msp() if p == "MSP" else pnorm(c.logits, p)


def _relu(c: Chunk, matrix: np.ndarray) -> np.ndarray:
    p = c.softmax().probs()
    return -np.einsum("ij,ij->i", p @ matrix.astype(np.float32), p)


@dataclass(frozen=True)
class Fit:
    """A baseline's parameter: ``fit(logits, labels, what)`` (calibrate.py) returns a record
    (report.json ``fits``) whose entry ``key`` is the parameter, or raises FitError."""
    fit: Callable[..., dict]
    key: str                 # "temperature", "p"
    symbol: str              # its column in report.md's fits table
    method: str              # what is fitted, in a sentence
    how: str                 # how it is chosen (report.md)
    fmt: str = "{}"          # how report.md prints it
    shown: str = ""          # the record's entry report.md prints, when not ``key`` (a matrix)

    def parameter(self, record: dict | None) -> Any:
        return (record or {}).get(self.key)

    def display(self, record: dict) -> str:
        return self.fmt.format(record[self.shown or self.key])


def public(record: dict | None) -> dict | None:
    """A fit record without its arrays (REL-U's matrix): what report.json keeps of it."""
    if record is None:
        return None
    return {k: v for k, v in record.items() if not isinstance(v, np.ndarray)}


def _mc_rate(identity: dict) -> str:
    """An MC-Dropout row's label says how its rate came about (the cache's ``mc_dropout``)."""
    mc = identity.get("mc_dropout") or {}
    rate = mc.get("rate_option")
    if rate is None:
        return ""
    return f" (rate {rate:g}" + (" at test time only)" if mc.get("test_time_only") else ")")


def baseline_label(name: str, identity: dict) -> str:
    """The row label of baseline ``name`` on a cache of this identity."""
    b = TABLE[name]
    return b.label + (b.suffix(identity) if b.suffix else "")


@dataclass(frozen=True)
class Baseline:
    label: str                                  # display label (table rows)
    order: int                                  # display order among the baselines
    score: Callable[[Chunk, Any], np.ndarray] | None   # (chunk, fitted parameter or None) -> (m,)
    probability: bool = False                   # in [0, 1]: TPR/TNR at 0.5 apply
    calibrated: bool = False                    # estimates P(correct): ECE applies
    fitted: Fit | None = None
    worker: int = 0           # which of the two worker tasks computes it (<= 32 classes)
    prose: str = ""           # its name in sentences, when not the label
    columns: tuple[str, ...] = ()   # cache columns it reads besides the logits: a cache without
    #                                 them has no row of it (no error)
    suffix: Callable[[dict], str] | None = None   # cache identity -> what its label adds
    source: str = "logits"    # "features": not from logits (TrustScore, trustscore.py)


# Evaluation order (report.json); ``order`` is the display order.
TABLE = {
    "mcp": Baseline("MCP", 0, lambda c, _: c.msp(), probability=True, calibrated=True),
    "entropy": Baseline("Neg. entropy", 2, lambda c, _: c.softmax().neg_entropy()),
    "maxlogit": Baseline("Max logit", 3, lambda c, _: c.logits.max(axis=1).astype(np.float32),
                         worker=1),
    "energy": Baseline("Energy", 5, lambda c, _: c.softmax().energy(), worker=1),
    "doctor": Baseline("DOCTOR (D_alpha)", 6, lambda c, _: c.softmax().sum_squares(),
                       probability=True),
    "ts": Baseline("MSP (temp. scaled)", 1, lambda c, t: c.msp(t), probability=True,
                   calibrated=True, prose="temperature-scaled MSP",
                   fitted=Fit(fit_temperature, "temperature", "T", "temperature scaling",
                              "Temperature T (NLL)", "{:.4f}")),
    "pnorm": Baseline("MaxLogit-pNorm", 4, _pnorm, worker=1,
                      fitted=Fit(fit_pnorm, "p", "p", "MaxLogit-pNorm", "p (AURC, MSP fallback)")),
    "relu": Baseline("REL-U", 7, _relu, worker=1,
                     fitted=Fit(fit_relu, "matrix", "λ (REL-U)", "REL-U's matrix",
                                "REL-U's matrix (closed form, λ)", shown="lambda")),
    "trustscore": Baseline("TrustScore", 8, None, source="features"),
    # a probability, but of the mean softmax's own argmax being right, not of the deterministic
    # prediction the rows score: TPR/TNR at 0.5, no ECE
    "mcd_msp": Baseline("MC-Dropout MSP", 9, lambda c, _: c.columns["mcd_msp"], probability=True,
                        worker=1, columns=("mcd_msp",), suffix=_mc_rate),
    "mcd_entropy": Baseline("MC-Dropout entropy", 10, lambda c, _: -c.columns["mcd_entropy"],
                            columns=("mcd_entropy",), suffix=_mc_rate,
                            prose="MC-Dropout negative predictive entropy"),
}
BASELINES = tuple(TABLE)
LOGIT_BASELINES = tuple(n for n, b in TABLE.items() if b.source == "logits")
TRUST_SCORE = next(n for n, b in TABLE.items() if b.source == "features")
FITTED = tuple(n for n, b in TABLE.items() if b.fitted)
BASELINE_LABELS = {n: b.label for n, b in TABLE.items()}
DISPLAY_ORDER = {n: b.order for n, b in TABLE.items()}
PROBABILITY_SCORES = tuple(n for n, b in TABLE.items() if b.probability)
CALIBRATED_SCORES = tuple(n for n, b in TABLE.items() if b.calibrated)
# Small-class datasets: the baselines split over two worker tasks (report/run.py says why).
WORKER_SPLIT = tuple(g for g in (tuple(n for n in LOGIT_BASELINES if TABLE[n].worker == w)
                                 for w in (0, 1)) if g)
REFERENCE = "mcp"         # the baseline the SS rows are compared with (report/compare.py)
# "Does anything learned beat the softmax?": the baselines every learned scorer is compared with
# (report/compare.py ``versus_baselines``; those a report has), and the post-hoc rows of the
# paper's small-scale table (report/smallscale.py), by their labels there
VERSUS = ("mcp", "ts", "pnorm", "relu", "trustscore", "mcd_msp")
SMALL_SCALE = {"MCP": "mcp", "MC-Dropout": "mcd_msp", "TrustScore": "trustscore"}


def fit_methods() -> str:
    """'temperature scaling, MaxLogit-pNorm and REL-U's matrix': what the fitted baselines fit."""
    return and_join([TABLE[n].fitted.method for n in FITTED])


def and_join(words: list[str]) -> str:
    """'a, b and c'."""
    return " and ".join([", ".join(words[:-1]), words[-1]] if len(words) > 1 else words)


def available(names: tuple[str, ...], cache_columns: list[str]) -> tuple[str, ...]:
    """``names`` less those reading a column the cache does not have."""
    return tuple(n for n in names if set(TABLE[n].columns) <= set(cache_columns))


def baseline_scores(logits: np.ndarray, chunk_rows: int | None = None,
                    names: tuple[str, ...] | None = None, params: dict | None = None,
                    columns: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Scores ``names`` for ``logits`` (N, K) and the cache ``columns`` some read -> {name: (N,)};
    the fitted ones need their parameter in ``params`` ({name: value}, e.g. {"ts": T, "pnorm":
    p}).  Default: every score that can be computed (the fitted ones only with their parameter,
    the column ones only with their columns)."""
    params, columns = params or {}, columns or {}
    if names is None:
        names = tuple(n for n in available(LOGIT_BASELINES, list(columns))
                      if n not in FITTED or params.get(n) is not None)
    logits = np.asarray(logits)
    if logits.ndim != 2 or logits.shape[1] < 2:
        raise ValueError(f"expected logits of shape (N, K) with K >= 2, got {logits.shape}")
    unknown = sorted(set(names) - set(LOGIT_BASELINES))
    if unknown:
        raise ValueError(f"unknown baseline(s) {unknown}; from logits: {LOGIT_BASELINES}")
    missing = [n for n in names if n in FITTED and params.get(n) is None]
    if missing:
        raise ValueError(f"baseline(s) {missing} need their fitted parameter")
    missing = [n for n in names if n not in available((n,), list(columns))]
    if missing:
        raise ValueError(f"baseline(s) {missing} need their cache columns")
    out = {name: np.empty(len(logits), np.float32) for name in names}
    chunk_rows = chunk_rows or max(1024, CHUNK_ELEMENTS // logits.shape[1])
    for start in range(0, len(logits), chunk_rows):
        chunk = logits[start:start + chunk_rows]
        finite = np.isfinite(chunk).all(axis=1)
        if not finite.all():
            row = start + int(np.flatnonzero(~finite)[0])
            raise ValueError(f"logits hold inf/NaN ({int((~finite).sum())} row(s) in rows "
                             f"{start}..{start + len(chunk) - 1}, first at row {row})")
        shared = Chunk(chunk, {c: v[start:start + len(chunk)] for c, v in columns.items()})
        for name in names:
            out[name][start:start + len(chunk)] = TABLE[name].score(shared, params.get(name))
    return out
