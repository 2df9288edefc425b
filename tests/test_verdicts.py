"""The report's verdicts (pipeline/report/verdicts.py): intervals over classifier fits, seeds and
rows, Holm-corrected within each question, decided on AUGRC; on synthetic runs written as
train-oracle writes them, through `cli.py report`."""
from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest

from bench.synthetic_runs import write_cache, write_run
from oracle_fixtures import run_cli
from pipeline.report.significance import hierarchical, holm, p_value


def study(root, ss_separation: dict[int, float], fits=(0,), ce_separation: float = 0.8,
          n: int = 2000, seeds=(0, 1, 2)):
    """Caches of one classifier architecture (one per fit), SS and CE runs of every seed on each;
    SS's separation of correct from incorrect rows per seed as given (its seed spread)."""
    for fit in fits:
        cache = write_cache(root / "cache" / f"vit-f{fit}" / "test", n=n, seed=10 + fit,
                            weights_seed=fit, model="vit", accuracy=0.8)
        for loss, sep in (("ss", ss_separation), ("ce", dict.fromkeys(seeds, ce_separation))):
            group = hashlib.sha256(f"{fit}{loss}".encode()).hexdigest()[:12]
            for seed in seeds:
                write_run(root / "runs" / f"vit-f{fit}_{loss}_seed{seed}", cache, oracle="vit",
                          classifier=f"vit-f{fit}", loss=loss, seed=seed, group=group,
                          separation=sep[seed] + 0.01 * fit, tag="test")
    return root / "runs", root / "cache"


def report(root, runs, cache) -> dict:
    run_cli(["report", "--runs-root", runs, "--cache", cache, "--out", root / "report",
             "--resamples", 1000, "--no-figures", "--no-trust-score"])
    return json.loads((root / "report" / "report.json").read_text())


def families(doc: dict, question: str) -> list[dict]:
    return [f for f in doc["verdicts"]["families"] if f["question"] == question]


def test_a_seed_spread_that_dominates_is_no_clear_difference(tmp_path):
    """SS's three seeds separate the rows by 0.7, 3.0 and 0.75 (CE: 0.8 each): the row-only
    interval of the seed mean calls SS better; resampling the seeds too, it is not (a draw
    without the one good seed, 8 in 27, is worse than CE)."""
    doc = report(tmp_path, *study(tmp_path, {0: 0.7, 1: 3.0, 2: 0.75}, n=4000))
    [old] = [c for s in doc["splits"] for c in s["comparisons"] if c["other"] == "CE"]
    assert old["metrics"]["aurc"]["verdict"] == "SS better"        # rows only
    [fam] = families(doc, "losses")
    [entry] = fam["comparisons"]
    assert entry["a"].startswith("SS") and entry["b"].startswith("CE")
    assert entry["covers"] == "seeds, rows" and entry["seeds"] == [[3], [3]]
    assert entry["verdict"] == "no clear difference", entry
    low, high = entry["metrics"]["augrc"]["ci"]
    assert low < 0 < high
    assert fam["counts"] == {"better": 0, "no clear difference": 1, "worse": 0}


def test_a_difference_every_seed_shows_stays_better(tmp_path):
    doc = report(tmp_path, *study(tmp_path, {0: 1.9, 1: 2.1, 2: 2.0}))
    [entry] = families(doc, "losses")[0]["comparisons"]
    assert entry["verdict"] == "better" and entry["metrics"]["augrc"]["delta"] < 0
    assert entry["metrics"]["augrc"]["p_holm"] < 0.05 and entry["disagree"] == []
    assert {e["verdict"] for e in families(doc, "reference")[0]["comparisons"]} <= {
        "better", "worse", "no clear difference"}


def test_fits_are_a_level_of_their_own(tmp_path):
    """Two fits of one architecture: one recipe per scorer across both fits, the interval over
    fits, seeds and rows; a recipe missing a fit is refused naming the fits."""
    runs, cache = study(tmp_path, {0: 1.9, 1: 2.1}, fits=(0, 1), seeds=(0, 1))
    doc = report(tmp_path, runs, cache)
    [entry] = families(doc, "losses")[0]["comparisons"]
    assert entry["fits"] == 2 and entry["covers"] == "fits, seeds, rows"
    assert entry["seeds"] == [[2, 2], [2, 2]]
    for path in runs.glob("vit-f1_ce_*"):
        shutil.rmtree(path)
    doc = report(tmp_path, runs, cache)
    [fam] = families(doc, "losses")
    assert fam["comparisons"] == []
    assert "other classifier fits (weights_sha256)" in fam["refused"][0]["why"]


def test_one_seed_one_fit_says_the_interval_covers_rows_only(tmp_path):
    doc = report(tmp_path, *study(tmp_path, {0: 2.0}, seeds=(0,)))
    [entry] = families(doc, "losses")[0]["comparisons"]
    assert entry["covers"] == "rows" and "covers the test rows only" in entry["note"]
    md = (tmp_path / "report" / "report.md").read_text()
    assert "### Verdicts" in md and "where `covers` is rows only" in md


def test_holm_adjusts_step_down():
    """Holm (1979): sorted p_(i) times (m - i + 1), made monotone; None stays out of the family."""
    got = holm([0.01, 0.04, 0.03, None, 0.005])
    want = [0.03, 0.06, 0.06, None, 0.02]
    assert got[3] is None
    np.testing.assert_allclose([g for g in got if g is not None],
                               [w for w in want if w is not None])
    assert holm([0.5, 0.9]) == [1.0, 1.0]


def test_the_hierarchical_replicates_resample_each_level():
    """Seeds of one side that are identical leave only the rows' spread; seeds that differ widen
    the replicates; a single fit never moves."""
    rng = np.random.default_rng(0)
    rows = rng.normal(0, 0.01, 4000)
    same = {"f": np.tile(rows, (3, 1))}
    spread = {"f": np.stack([rows + d for d in (-0.2, 0.0, 0.3)])}
    zero = {"f": np.zeros((3, 4000))}
    narrow = hierarchical(same, zero, np.random.default_rng(1))
    wide = hierarchical(spread, zero, np.random.default_rng(1))
    assert narrow.std() == pytest.approx(0.01, rel=0.1)
    assert wide.std() > 5 * narrow.std()
    assert p_value(np.full(99, 0.3)) == pytest.approx(0.02)
    assert p_value(np.r_[-np.ones(50), np.ones(50)]) == 1.0


def test_the_best_learned_scorer_is_chosen_on_held_out_rows(tmp_path):
    """Two real runs (fine-tuned CE, head-only SS) with held-out rows: the scorer named is the one
    with the lower AUGRC on its held-out rows, whatever the evaluated split says."""
    from cache.outputs import read_outputs
    from cache.runs import RunDir
    from pipeline.core.metrics import augrc
    from test_run_loads import trained

    _, cache, fine, head = trained(tmp_path)
    out = tmp_path / "rep"
    run_cli(["report", fine, head, "--cache", cache, "--out", out, "--resamples", 200,
             "--no-figures", "--no-trust-score"])
    doc = json.loads((out / "report.json").read_text())
    [fam] = families(doc, "reference")
    held = {}
    for run in (fine, head):
        record = RunDir(run).record()
        cols = read_outputs(RunDir(run).heldout_output(record.heldout_output["split"])).columns
        ok = cols["valid"] == 1
        held[record.labels.loss_label] = augrc(cols["confidence"][ok], cols["correct"][ok])
    best = min(held, key=held.get)
    assert fam["selected"]["scorer"].startswith(best)
    assert fam["selected"]["heldout_augrc"] == pytest.approx(held[best])
    assert "chosen on held-out rows" in (out / "report.md").read_text()


def test_compare_takes_seeds_and_fits():
    """to.compare on (S, N) arrays resamples the seeds as the report's verdicts do; on lists,
    one entry per classifier fit, the fits too; one run a side is the paired row bootstrap."""
    import trust_oracles as to

    rng = np.random.default_rng(0)
    correct = rng.random(3000) < 0.8

    def seeds(separations, n=3000, c=correct):
        return np.stack([s * (2 * c - 1.0) + rng.normal(size=n) for s in separations])

    ss, ce = seeds([0.7, 3.0, 0.75]), seeds([0.8, 0.8, 0.8])
    both = to.compare(ss, ce, correct, resamples=500)["augrc"]
    assert both.covers == "seeds, rows" and both.favours is None and both.p > 0.05
    one = to.compare(ss[1], ce[0], correct, resamples=500)["augrc"]
    assert one.covers == "rows" and one.favours == "a" and one.p < 0.01
    other = rng.random(2000) < 0.7
    fits = to.compare([ss, seeds([2.9, 3.1], 2000, other)], [ce, seeds([0.8, 0.8], 2000, other)],
                      [correct, other], resamples=300)
    assert fits["augrc"].covers == "fits, seeds, rows" and fits.n == 5000
    with pytest.raises(to.InputError, match="one per classifier fit"):
        to.compare([ss, ss], [ce], [correct, correct])
    with pytest.raises(to.InputError, match=r"\(N,\) for one run or \(S, N\)"):
        to.compare(ss[None], ce, correct)
