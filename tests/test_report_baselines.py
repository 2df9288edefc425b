"""The post-hoc baselines are one table (pipeline/report/baselines.py): every list the report
keeps of them (evaluation order, worker split, display order, labels, TPR/TNR and ECE, fitted
parameters, report.md's fits table) comes from it, and no other report module names a baseline."""
from __future__ import annotations

import ast
import math

import numpy as np

from bench.synthetic_runs import write_cache
from conftest import ROOT
from pipeline.core.losses import names
from pipeline.report import aggregate as run, baselines as B, markdown
from pipeline.report.calibrate import fit_pnorm, fit_relu, fit_temperature
from pipeline.report.heldout import FitTask, fit_heldout


def test_the_table_gives_every_list():
    assert B.BASELINES == tuple(B.TABLE)
    assert B.FITTED == tuple(n for n, b in B.TABLE.items() if b.fitted)
    assert B.BASELINE_LABELS == {n: b.label for n, b in B.TABLE.items()}
    assert B.PROBABILITY_SCORES == tuple(n for n, b in B.TABLE.items() if b.probability)
    assert B.CALIBRATED_SCORES == tuple(n for n, b in B.TABLE.items() if b.calibrated)
    assert sorted(B.DISPLAY_ORDER.values()) == list(range(len(B.TABLE)))
    # each baseline from logits in exactly one worker task, each task in the table's order;
    # those from features (TrustScore) in their own task (report/trustscore.py)
    split = [n for group in B.WORKER_SPLIT for n in group]
    assert sorted(split) == sorted(B.LOGIT_BASELINES)
    assert B.LOGIT_BASELINES == tuple(n for n in B.BASELINES if B.TABLE[n].score)
    assert [n for n in B.BASELINES if n not in B.LOGIT_BASELINES] == [B.TRUST_SCORE]
    for group in B.WORKER_SPLIT:
        assert list(group) == [n for n in B.BASELINES if n in group]
    assert B.REFERENCE in B.TABLE


def test_the_orders_report_json_has_always_had():
    """report.json lists the baseline rows in evaluation order and the tables in display order;
    both are part of the output format (a baseline added later may go anywhere in them)."""
    def kept(names):
        return [n for n in names if n in OLD]
    OLD = ("mcp", "entropy", "maxlogit", "energy", "doctor", "ts", "pnorm")
    assert kept(B.BASELINES) == list(OLD)
    assert [kept(g) for g in B.WORKER_SPLIT] == [["mcp", "entropy", "doctor", "ts"],
                                                 ["maxlogit", "energy", "pnorm"]]
    assert kept(sorted(B.DISPLAY_ORDER, key=B.DISPLAY_ORDER.get)) == \
        ["mcp", "ts", "entropy", "maxlogit", "pnorm", "energy", "doctor"]
    assert B.TABLE["ts"].fitted.fit is fit_temperature and B.TABLE["ts"].fitted.key == "temperature"
    assert B.TABLE["pnorm"].fitted.fit is fit_pnorm and B.TABLE["pnorm"].fitted.key == "p"
    assert list(run.LOSS_ORDER) == list(names())


def test_no_other_report_module_names_a_baseline():
    names = set(B.BASELINES)
    found = []
    for path in sorted((ROOT / "pipeline" / "report").glob("*.py")):
        if path.name == "baselines.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.name}:{node.lineno} {node.value!r}")
    assert not found, "baseline names outside baselines.py:\n" + "\n".join(found)


def test_fit_heldout_fits_what_the_table_says(tmp_path):
    cache = write_cache(tmp_path / "train", n=600, k=5, seed=3, split="train", accuracy=0.7)
    task = FitTask(str(cache), tuple(range(0, 600, 2)), ("run",))
    record = fit_heldout(task)
    assert [k for k in record if k in B.TABLE] == list(B.FITTED)
    for name in B.FITTED:
        assert B.TABLE[name].fitted.parameter(record[name]) is not None
    only = fit_heldout(task, (B.FITTED[-1],))
    assert all(only[n] is None for n in B.FITTED[:-1]) and only[B.FITTED[-1]] is not None


def test_fits_section_layout():
    """report.md's fits table, one column per fitted parameter (the layout before the table)."""
    fits = {"/c/test": {"train_cache": "/c/train", "rows": 1000,
                        "ts": {"temperature": 0.96434}, "pnorm": {"p": "MSP"},
                        "relu": {"lambda": 0.5, "gini": False}},
            "/c/shift": {"train_cache": "/c/train", "rows": 12, "ts": None, "pnorm": {"p": 3},
                         "relu": None, "undefined": {"ts": "too few rows", "relu": "too few"}},
            "/c/adv": {"reason": "no held-out rows", "ts": None, "pnorm": None, "relu": None}}
    assert markdown._fits_section(fits) == [
        "## Fitted post-hoc baselines", "",
        "Temperature T (NLL), p (AURC, MSP fallback) and REL-U's matrix (closed form, λ) fitted "
        "on held-out rows of the classifier's training cache, never on the evaluated split:", "",
        "| evaluated cache | training cache | held-out rows | T | p | λ (REL-U) |",
        "|---|---|---|---|---|---|",
        "| `/c/test` | `/c/train` | 1000 | 0.9643 | MSP | 0.5 |",
        "| `/c/shift` | `/c/train` | 12 | n/a: too few rows | 3 | n/a: too few |",
        "| `/c/adv` | — | — | not fitted: no held-out rows | | |", ""]


def test_scores_of_a_subset_equal_those_of_all():
    """One exp pass is shared between the scores of a chunk: computing a subset (a worker's
    share) gives the same bits as computing every score."""
    rng = np.random.default_rng(1)
    logits = (rng.normal(size=(2500, 6)) * 3).astype(np.float16)
    params = {"ts": 1.3, "pnorm": "MSP", "relu": fit_relu(logits, rng.integers(0, 6, 2500))["matrix"]}
    # the cache columns some scores read (MC-Dropout's)
    cols = {c: rng.random(2500).astype(np.float32) for b in B.TABLE.values() for c in b.columns}
    every = B.baseline_scores(logits, chunk_rows=700, params=params, columns=cols)
    for group in B.WORKER_SPLIT:
        part = B.baseline_scores(logits, chunk_rows=700, names=group, params=params,
                                 columns=cols)
        for name in group:
            assert np.array_equal(part[name], every[name]), name
    assert np.array_equal(every["pnorm"], every["mcp"])      # p = MSP falls back to MCP


def direct_relu(logits, labels, lbd=0.5):
    """arXiv 2306.01710's closed form, entry by entry: D_jk = -(1 - lambda) mean over correct
    rows of p_j p_k + lambda mean over incorrect rows of p_j p_k for j != k, 0 on the diagonal,
    negative entries 0 (Gini's ones off the diagonal if none is left), D / ||D||_F."""
    z = logits.astype(np.float64)
    p = [[math.exp(v - max(row)) / sum(math.exp(u - max(row)) for u in row) for v in row]
         for row in z]
    right = [r for r, y in zip(p, labels) if max(range(len(r)), key=r.__getitem__) == y]
    wrong = [r for r, y in zip(p, labels) if max(range(len(r)), key=r.__getitem__) != y]
    k = z.shape[1]
    d = np.zeros((k, k))
    for j in range(k):
        for i in range(k):
            if i != j:
                d[j, i] = max(0.0, -(1 - lbd) * sum(r[j] * r[i] for r in right) / len(right)
                              + lbd * sum(r[j] * r[i] for r in wrong) / len(wrong))
    if not (d > 0).any():
        d = 1.0 - np.eye(k)
    d /= math.sqrt((d * d).sum())
    scores = [-sum(r[j] * d[j, i] * r[i] for j in range(k) for i in range(k)) for r in p]
    return d, np.array(scores)


def test_relu_matrix_and_scores_equal_the_closed_form(monkeypatch):
    from pipeline.report import calibrate
    rng = np.random.default_rng(5)
    logits = (rng.normal(size=(300, 4)) * 2).astype(np.float16)
    labels = rng.integers(0, 4, 300)
    record = fit_relu(logits, labels)
    want_d, want_scores = direct_relu(logits, labels)
    np.testing.assert_allclose(record["matrix"], want_d, rtol=1e-12, atol=1e-15)
    monkeypatch.setattr(calibrate, "CHUNK", 64)          # the sums accumulated over chunks
    np.testing.assert_allclose(fit_relu(logits, labels)["matrix"], want_d, rtol=1e-12, atol=1e-15)
    assert record["lambda"] == 0.5 and not record["gini"]
    got = B.baseline_scores(logits, names=("relu",), params={"relu": record["matrix"]})["relu"]
    np.testing.assert_allclose(got, want_scores, rtol=1e-5, atol=1e-7)    # float32 chunks
    gini = fit_relu(logits, labels, lbd=0.0)       # -mean p p^T only: nothing positive left
    assert gini["gini"]
    np.testing.assert_allclose(gini["matrix"], direct_relu(logits, labels, 0.0)[0], rtol=1e-12)
