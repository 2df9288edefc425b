"""The held-out validation of an oracle during training: the metrics that choose each head's
best checkpoint (``pipeline.oracle.loop.fit``) and score a sweep's points
(``pipeline.sweep.run``)."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from pipeline.core import metrics as M
from pipeline.core.catalog import log_name


def validation_metrics(z: np.ndarray, correct: np.ndarray, loss: float, tnr_logit: float) -> dict:
    """The held-out validation of an oracle during training (checkpoint choice, sweeps):
    AUPR-Error in the standard definition (errors are the positives, ranked by -score),
    AUPR-Success, AUC, TPR/TNR.  Scored on the head's output z, which ranks exactly like
    sigmoid(z) without float32 saturation ties; TPR at z > 0, TNR at z < ``tnr_logit``.
    Undefined (one class) -> NaN."""
    def safe(fn, *args, **kw):
        try:
            return float(fn(*args, **kw))
        except M.UndefinedMetric:
            return float("nan")

    o = correct.astype(bool)
    r = M.rank(z, o)        # sorted once: each metric reads the one ranking (5x fewer sorts)
    # the keys are the catalog's names as the logs write them (pipeline.core.catalog.log_name)
    return {"rows": int(len(o)), log_name("acc"): float(o.mean()), "loss": loss,
            log_name("aupr_err"): safe(M.aupr_error, r, definition="standard"),
            log_name("aupr_succ"): safe(M.aupr_success, r), log_name("auc"): safe(M.auc, r),
            log_name("tpr"): safe(M.tpr, r, threshold=0.0),
            log_name("tnr"): safe(M.tnr, r, threshold=tnr_logit)}


def metrics_of_heads(z: np.ndarray, correct: np.ndarray, loss: np.ndarray, tnr_logit: float,
                      heads: list[int]) -> list[dict]:
    """``validation_metrics`` of each head in ``heads`` (z: (n, P)), in that order.  A bank's
    heads are scored in threads (the metrics' sorts release the GIL): a 100-head sweep spent
    more time here than in its training steps."""
    one = lambda p: validation_metrics(z[:, p], correct, float(loss[p]), tnr_logit)  # noqa: E731
    if len(heads) < 2:
        return [one(p) for p in heads]
    with ThreadPoolExecutor(min(len(heads), os.cpu_count() or 1)) as pool:
        return list(pool.map(one, heads))
