"""trust_oracles.evaluation and .posthoc: the numbers equal report.json's for the same rows (every
metric of both definitions, the bootstrap intervals, the paired comparisons, the built-in
baselines with their fits), and malformed inputs are refused saying what was received."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bench.synthetic_runs import write_study
from cache.outputs import read_outputs
from cache.reader import ClassifierCache
from cache.runs import RunDir
from cli import cli
from pipeline.core.catalog import DEFINITIONS, names
from pipeline.report.baselines import TABLE
from trust_oracles.comparison import COMPARED_METRICS, compare
from trust_oracles.evaluation import check_scores, evaluate
from trust_oracles.posthoc import (POSTHOC_SCORES, PosthocFit, evaluate_posthoc, fit_posthoc,
                                   posthoc_scores)

K = 10


def report(root: Path, out: Path, *extra) -> dict:
    args = ["report", root / "runs", "--cache", root / "cache", "--out", out, "--split", "test",
            "--jobs", "1", "--no-figures", "--format", "json", *extra]
    result = CliRunner().invoke(cli, list(map(str, args)), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads((out / "report.json").read_text())


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """One seed per loss (a report row is one run, so its comparisons are of single scores),
    more rows than the bootstrap's 512 groups and levels, two undecodable rows; the report with
    its default bootstrap and with another one."""
    root = tmp_path_factory.mktemp("api_study")
    write_study(root, n=900, k=K, seeds=(0,), losses=("ce", "tcp", "ss"), bad_rows=(3, 10),
                n_train=2000)       # 200 held-out training rows: T, p and REL-U are fitted
    return {"root": root, "default": report(root, root / "r1000"),
            "other": report(root, root / "r200", "--resamples", 200, "--ci-seed", 7)}


def oracle_rows(doc: dict) -> dict[str, tuple[np.ndarray, np.ndarray, dict]]:
    """{loss: (confidence, correct, report.json evaluation)} of the valid rows of each run."""
    out = {}
    for result in doc["evaluations"]:
        if result["kind"] == "oracle":
            cols = read_outputs(Path(result["source"])).columns
            valid = cols["valid"] == 1
            out[result["labels"]["loss"]] = (cols["confidence"][valid],
                                             cols["correct"][valid].astype(bool), result)
    return out


def cache_rows(root: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(logits (N, K) float16, correct (N,), valid (N,)) of every row of the evaluated cache."""
    cols = ClassifierCache.open(root / "cache" / "vit" / "test").load(["logits", "valid",
                                                                       "correct"])
    return cols["logits"], cols["correct"].astype(bool), cols["valid"] == 1


def heldout_fit(root: Path) -> PosthocFit:
    """Fitted on the rows the runs held out of the training cache, as the report fits them."""
    run = next((root / "runs").iterdir())
    rows = np.asarray(RunDir(run).val_split()["val_rows"])
    cols = ClassifierCache.open(root / "cache" / "vit" / "train").load(["logits", "valid",
                                                                        "label"])
    ok = cols["valid"][rows] == 1
    return fit_posthoc(cols["logits"][rows][ok], cols["label"][rows][ok])


def assert_equals_report(ev, result: dict) -> None:
    """Every catalog metric of both definitions, its reason or note, and its interval: ==."""
    assert ev.n == result["valid_rows"] and ev.n_correct == result["class_counts"][0]
    for d in DEFINITIONS:
        got, want = ev[d], result["metrics"][d]
        assert list(got) == list(names(d))
        for name, value in got.items():
            assert value == (result["accuracy"] if name == "acc" else want["values"][name]), \
                (d, name)
            assert asdict(got.interval(name)) == result["ci"][d][name], (d, name)
        assert got.undefined == want["undefined"] and got.notes == want["notes"]


def test_evaluate_equals_the_report_for_every_run(study):
    runs = oracle_rows(study["default"])
    assert set(runs) == {"ce", "tcp", "ss"}
    for loss, (conf, correct, result) in runs.items():
        threshold = 1 / K if loss == "tcp" else 0.5     # the paper's TNR threshold of TCP: 1/K
        assert result["tnr_threshold"]["paper"] == threshold
        ev = evaluate(conf, correct, tnr_threshold=threshold, bootstrap=1000)
        assert_equals_report(ev, result)
    # another bootstrap: the report's --resamples / --ci-seed are evaluate's bootstrap / seed
    conf, correct, result = oracle_rows(study["other"])["ss"]
    assert_equals_report(evaluate(conf, correct, bootstrap=200, seed=7), result)
    assert evaluate(conf, correct, bootstrap=200, seed=8).standard.interval("auc") != \
        evaluate(conf, correct, bootstrap=200, seed=7).standard.interval("auc")


def test_builtin_baselines_and_their_fits_equal_the_report(study):
    root, doc = study["root"], study["default"]
    logits, correct, valid = cache_rows(root)
    fit = heldout_fit(root)
    record = doc["fits"][str((root / "cache" / "vit" / "test").resolve())]
    assert fit.temperature == record["ts"]["temperature"] and fit.p == record["pnorm"]["p"]
    assert fit.records["relu"]["gini"] == record["relu"]["gini"] and not fit.undefined
    baselines = {r["labels"]["loss"]: r for r in doc["evaluations"] if r["kind"] == "baseline"}
    assert set(baselines) == set(POSTHOC_SCORES)
    # as the report: the scores of every row of the cache, then its valid rows evaluated
    scores = posthoc_scores(logits, fit=fit)
    for name in POSTHOC_SCORES:
        flags = {"probability": TABLE[name].probability, "calibrated": TABLE[name].calibrated}
        assert scores[name].dtype == np.float32
        assert_equals_report(evaluate(scores[name][valid], correct[valid], bootstrap=1000,
                                      **flags), baselines[name])
        # the valid rows' logits alone: evaluate_posthoc sets the flags as the report does
        ev = evaluate_posthoc(name, logits[valid], correct[valid], fit=fit)
        want = {"acc": baselines[name]["accuracy"], **baselines[name]["metrics"]["paper"]["values"]}
        if name != "relu":
            assert dict(ev.paper) == want
        else:   # REL-U's float32 matrix product (BLAS) blocks by the number of rows: with two
            # rows fewer one score moves by an ulp, and the moment-based KL and d_B with it
            assert all(ev.paper[k] == (v if v is None else pytest.approx(v, rel=1e-8, abs=0))
                       for k, v in want.items())


def test_compare_equals_the_reports_paired_comparisons(study):
    root, doc = study["root"], study["default"]
    runs = oracle_rows(doc)
    logits, correct, valid = cache_rows(root)
    fit = heldout_fit(root)
    baselines = {k: v[valid] for k, v in posthoc_scores(logits, fit=fit).items()}
    correct = correct[valid]
    by_label = {r["labels"]["loss_label"]: runs[loss][0] for loss, (_, _, r) in runs.items()}
    by_label["MCP"] = baselines["mcp"]
    split = doc["splits"][0]
    checked = []
    # SS against the other losses and MCP; every learned row against the post-hoc baselines
    for entry in split["comparisons"]:
        checked.append(_check(entry, by_label[entry["ss"]], by_label[entry["other"]], correct,
                              "SS"))
    for entry in split["versus_baselines"]:
        checked.append(_check(entry, by_label[entry["learned"]], baselines[entry["other_key"]],
                              correct, "learned"))
        assert not entry["strongest"] or entry["other_key"] in ("mcp", "ts", "pnorm", "relu")
    assert len(split["comparisons"]) == 3 and len(split["versus_baselines"]) == 3 * 4
    assert any(e["strongest"] for e in split["versus_baselines"])
    # the other bootstrap
    entry = next(e for e in study["other"]["splits"][0]["comparisons"] if e["other"] == "MCP")
    _check(entry, by_label["SS"], baselines["mcp"], correct, "SS", resamples=200, seed=7)


def _check(entry: dict, a: np.ndarray, b: np.ndarray, correct: np.ndarray, subject: str,
           **bootstrap) -> dict:
    result = compare(a, b, correct, metrics=tuple(entry["metrics"]), **bootstrap)
    for name, want in entry["metrics"].items():
        got = result[name]
        assert got.delta == want["delta"] and asdict(got.interval) == want["ci"], name
        assert got.higher_is_better == want["higher_is_better"]
        verdict = {"a": f"{subject} better", "b": f"{subject} worse"}.get(
            got.favours, "no clear difference")
        assert verdict == want["verdict"] and got.excludes_zero == (got.favours is not None)
    return entry


def case(n=400, seed=0, accuracy=0.8):
    rng = np.random.default_rng(seed)
    correct = rng.random(n) < accuracy
    return (1 / (1 + np.exp(-(rng.normal(size=n) + 1.5 * correct)))).astype(np.float32), correct


def test_compare_defaults_and_directions():
    score, correct = case()
    noisy = score + np.random.default_rng(1).normal(0, 0.5, len(score)).astype(np.float32)
    result = compare(score, noisy, correct)
    assert tuple(result) == COMPARED_METRICS == ("auc", "aurc", "augrc")
    assert [result[m].higher_is_better for m in result] == [True, False, False]
    assert all(d.favours == "a" and d.excludes_zero for d in result.values())
    swapped = compare(noisy, score, correct)
    assert all(d.favours == "b" for d in swapped.values())
    assert swapped["auc"].delta == -result["auc"].delta
    same = compare(score, score, correct, metrics=("auc", "tpr"))
    assert same["auc"].delta == 0 and same["auc"].favours is None
    assert same["auc"].excludes_zero is False and same["tpr"].higher_is_better is None
    paper = compare(score, noisy, correct, metrics=("fpr95",), definition="paper")
    assert paper["fpr95"].delta is not None and paper["fpr95"].excludes_zero is None
    assert "grid FPR-95%-TPR" in paper["fpr95"].interval.undefined


def test_one_class_leaves_the_reports_metrics_undefined():
    score, _ = case(50)
    undefined = {"paper": {True: {"fpr95", "aupr_err", "aupr_succ", "auc", "tnr", "kl",
                                  "bhattacharyya"},
                           False: {"fpr95", "aupr_err", "aupr_succ", "auc", "tpr", "kl",
                                   "bhattacharyya"}}}
    for label, why in ((True, "no incorrect predictions"), (False, "no correct predictions")):
        ev = evaluate(score, np.full(50, label), bootstrap=50)
        assert set(ev.paper.undefined) == undefined["paper"][label]
        assert all(ev.paper[n] is None and not ev.paper.interval(n).defined
                   for n in ev.paper.undefined)
        assert why in ev.paper.undefined["auc"]
        assert ev.standard["aurc"] == (0.0 if label else 1.0)


def test_definition_subsets_and_access():
    score, correct = case()
    paper = evaluate(score, correct, definition="paper")
    assert list(paper.definitions) == ["paper"]
    with pytest.raises(KeyError, match="'standard' was not computed"):
        paper.standard
    with pytest.raises(KeyError, match="not a metric of the paper definition"):
        paper.paper["aurc"]
    with pytest.raises(ValueError, match="bootstrap=RESAMPLES"):
        paper.paper.interval("auc")
    both = evaluate(score, correct)
    assert both.paper == paper.paper and both.standard["risk@cov95"] is not None
    unbounded = evaluate(score * 10 - 3, correct, probability=False, calibrated=False)
    assert unbounded.standard["tpr"] is None and "natural threshold" in \
        unbounded.standard.undefined["tpr"]
    assert unbounded.standard["ece"] is None and unbounded.standard["auc"] == both.standard["auc"]
    narrow = evaluate(score, correct, bootstrap=300, confidence_level=0.5).standard.interval("auc")
    wide = evaluate(score, correct, bootstrap=300).standard.interval("auc")
    assert wide.low < narrow.low < narrow.high < wide.high


BAD_INPUTS = [
    (np.zeros((4, 1)), np.ones(4), r"score: got shape \(4, 1\); expected a 1-D array.*ravel"),
    (np.zeros(4), np.ones(3), "score and correct: got lengths 4 and 3"),
    (np.zeros(0), np.ones(0, bool), "score: got an empty array; expected at least one row"),
    (np.array(["a", "b"]), np.ones(2), "score: got dtype <U1; expected real numbers"),
    (np.array([1j, 2j]), np.ones(2), "score: got dtype complex128; expected real numbers"),
    (np.array([0.1, np.nan, np.inf]), np.ones(3), r"2 non-finite value\(s\), the first \(nan\) "
                                                  "at row 1; expected finite numbers"),
    (np.zeros(3), np.array([0, 1, 2]), "correct: got 2 at row 2; expected booleans"),
    (np.zeros(3), np.array([0.0, np.nan, 1.0]), "correct: got nan at row 1"),
    (0.5, True, r"score: got shape \(\); expected a 1-D array"),
]


@pytest.mark.parametrize("score, correct, message", BAD_INPUTS)
def test_malformed_inputs_say_what_was_received(score, correct, message):
    with pytest.raises(ValueError, match=message):
        evaluate(score, correct)


@pytest.mark.parametrize("option, message", [
    ({"definition": "fd-shifts"}, "definition: got 'fd-shifts'; expected one of"),
    ({"bootstrap": 0}, "bootstrap resamples: got 0"), ({"bootstrap": True}, "got True"),
    ({"seed": -1}, "seed: got -1; expected an integer >= 0"),
    ({"confidence_level": 95}, r"confidence_level: got 95; expected a number in \(0, 1\)"),
    ({"tnr_threshold": float("nan")}, "tnr_threshold: got nan")])
def test_malformed_options_say_what_was_received(option, message):
    score, correct = case(20)
    with pytest.raises(ValueError, match=message):
        evaluate(score, correct, **option)


def test_compare_checks_its_inputs():
    score, correct = case(20)
    with pytest.raises(ValueError, match="score_b and correct: got lengths 19 and 20"):
        compare(score, score[1:], correct)
    with pytest.raises(ValueError, match="metrics: got 'auc'; expected a non-empty sequence"):
        compare(score, score, correct, metrics="auc")
    with pytest.raises(ValueError, match="names of the paper definition"):
        compare(score, score, correct, metrics=("aurc",), definition="paper")


def test_input_dtypes_are_kept_or_converted():
    s, c = check_scores(np.array([1, 2, 3]), np.array([1.0, 0.0, 1.0]))
    assert s.dtype == np.float64 and c.dtype == np.bool_
    s32 = np.array([0.2, 0.7], np.float32)
    assert check_scores(s32, [True, False])[0] is s32      # float32 kept: the report's precision


def test_evaluate_posthoc_with_a_function():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(300, 5)).astype(np.float16)
    correct = rng.random(300) < 0.7
    seen = []

    def margin(z):
        seen.append((z.dtype, z.flags.writeable))
        top2 = np.sort(z, axis=1)[:, -2:]
        return top2[:, 1] - top2[:, 0]

    ev = evaluate_posthoc(margin, logits, correct, probability=False, calibrated=False)
    assert seen == [(np.float32, False)]
    assert ev.standard == evaluate(margin(logits.astype(np.float32)), correct,
                                   probability=False, calibrated=False).standard
    with pytest.raises(ValueError, match=r"score function 'test_evaluate_posthoc_with_a_function"
                                         r".<locals>.<lambda>'.*shape \(300, 1\); expected "
                                         r"\(300,\)"):
        evaluate_posthoc(lambda z: z[:, :1], logits, correct)
    with pytest.raises(ValueError, match="score function '.*nan_score': got 137 non-finite"):
        def nan_score(z):
            return np.where(z[:, 0] > 0, np.nan, 1.0)
        evaluate_posthoc(nan_score, logits, correct)
    with pytest.raises(ValueError, match="read-only"):
        evaluate_posthoc(lambda z: z.__setitem__(0, 0), logits, correct)
    with pytest.raises(ValueError, match="logits and correct: got 300 and 299 rows"):
        evaluate_posthoc(margin, logits, correct[1:])
    with pytest.raises(ValueError, match=r"logits: got inf/NaN in 1 row\(s\), the first at row 4"):
        evaluate_posthoc(margin, np.where(np.arange(300)[:, None] == 4, np.inf, logits), correct)


def test_posthoc_scores_and_fit_refusals():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(50, 4)).astype(np.float32)
    assert tuple(posthoc_scores(logits)) == ("mcp", "entropy", "maxlogit", "energy", "doctor")
    with pytest.raises(ValueError, match=r"\['ts'\]: got no fit given.*fit_posthoc"):
        posthoc_scores(logits, names=("ts",))
    with pytest.raises(ValueError, match="names: got \\['mcd_msp'\\]"):
        posthoc_scores(logits, names=("mcd_msp",))
    few = fit_posthoc(logits, rng.integers(0, 4, 50))      # under the report's 100 rows
    assert few.parameters == {} and set(few.undefined) == {"ts", "pnorm", "relu"}
    assert "50 held-out row(s)" in few.undefined["ts"]
    with pytest.raises(ValueError, match=r"\['pnorm'\]: got pnorm: the fit rows: 50"):
        posthoc_scores(logits, names=("pnorm",), fit=few)
    with pytest.raises(ValueError, match="labels: got values 0..4; expected classes 0..3"):
        fit_posthoc(logits, np.arange(50) % 5)
    with pytest.raises(ValueError, match=r"logits: got shape \(50,\); expected \(N, K\)"):
        posthoc_scores(logits[:, 0])
