"""One set of metric names: the catalog's, with the keys training's validation records have always
written (log.jsonl, run.json, the sweep's files) mapped from it in one place (catalog.log_name).
The names every output holds are pinned here, so taking them from the catalog changed none."""
from __future__ import annotations

import numpy as np

from pipeline.core.catalog import BEST_KEY, CATALOG, CHECKPOINT_METRIC, log_name

LOGGED = {"acc": "accuracy", "aupr_err": "aupr_error", "aupr_succ": "aupr_success", "auc": "auc",
          "tpr": "tpr", "tnr": "tnr"}


def test_the_logged_keys_are_those_the_outputs_always_held():
    assert {n: m.log_name for n, m in CATALOG.items() if m.log_name} == LOGGED
    assert {n: log_name(n) for n in LOGGED} == LOGGED
    assert CHECKPOINT_METRIC == "aupr_err" and BEST_KEY == "val_aupr_error"


def test_validation_writes_every_logged_metric_under_its_catalog_key():
    from pipeline.oracle.loop.validation import validation_metrics

    z = np.linspace(-2, 2, 40)
    correct = np.arange(40) % 3 != 0
    got = validation_metrics(z, correct, 0.5, 0.0)
    assert set(got) == {"rows", "loss", *LOGGED.values()}
    assert got[log_name("acc")] == correct.mean()


def test_validation_ranks_once_and_gives_each_metrics_own_value():
    """validation_metrics sorts the scores once for all its metrics: each value equals the
    metric's own function on the raw arrays, ties and one-class splits (NaN) included."""
    import math

    from pipeline.core import metrics as M
    from pipeline.oracle.loop.validation import validation_metrics

    def own(fn, z, o, **kw):
        try:
            return fn(z, o, **kw)
        except M.UndefinedMetric:
            return math.nan

    rng = np.random.default_rng(0)
    for n, share in ((5_000, 0.7), (60, 0.5), (9, 0.0), (9, 1.0)):
        z = np.round(rng.standard_normal(n), 1).astype(np.float32)     # many ties
        o = rng.random(n) < share
        got = validation_metrics(z, o, 0.5, -0.3)
        want = {"aupr_err": own(M.aupr_error, z, o, definition="standard"),
                "aupr_succ": own(M.aupr_success, z, o), "auc": own(M.auc, z, o),
                "tpr": own(M.tpr, z, o, threshold=0.0), "tnr": own(M.tnr, z, o, threshold=-0.3)}
        for name, value in want.items():
            assert got[log_name(name)] == value or math.isnan(got[log_name(name)]) and \
                math.isnan(value), (n, share, name)


def test_sweep_criteria_and_table_read_the_logged_keys():
    from pipeline.sweep.grid import CRITERIA, score_of
    from pipeline.sweep.report import table_rows

    assert list(CRITERIA) == ["tpr-tnr", "aupr-error", "auc", "aupr-success"]   # --criterion
    val = {"tpr": 0.9, "tnr": 0.3, "aupr_error": 0.4, "auc": 0.8, "aupr_success": 0.95,
           "accuracy": 0.7, "rows": 10, "loss": 1.0}
    assert [score_of(val, c) for c in CRITERIA] == [0.6, 0.4, 0.8, 0.95]
    point = {"stage": 1, "values": {"alpha_neg": 2.0}, "status": "trained", "val": val,
             "eval": {"tpr": 0.8, "tnr": 0.2, "auc": 0.7, "split": "test"},
             "mean_train_loss": 0.1, "chosen_in_stage": True, "run_dir": "/r/x"}
    head, rows = table_rows({"swept": {"alpha_neg": [2.0]}, "criterion": "auc",
                             "points": [point]})
    assert head[3:] == ["val auc", "val TPR", "val TNR", "val AUPR-Err", "val AUC",
                        "mean train loss", "eval test TPR (not used)", "eval test TNR (not used)",
                        "eval test AUC (not used)", "chosen", "run"]
    assert rows[0][3:] == [0.8, 0.9, 0.3, 0.4, 0.8, 0.1, 0.8, 0.2, 0.7, "*", "x"]


def test_report_columns_spelled_from_the_catalog_are_the_ones_report_json_held():
    from pipeline.report import smallscale, tables

    assert tables.PAIRED_COLUMNS == [("standard", "auc", "ΔAUC", "%"),
                                     ("standard", "aurc", "ΔAURC ×10³", "e3")]
    assert tables.VERSUS_COLUMNS == tables.PAIRED_COLUMNS + [("standard", "augrc",
                                                             "ΔAUGRC ×10³", "e3")]
    assert smallscale.METRICS == ("acc", "fpr95", "aupr_err", "aupr_succ", "auc", "tpr", "tnr")
