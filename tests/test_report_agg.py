"""Seed aggregation: identical per-seed values (every run's accuracy on one classifier cache)
have a standard deviation of exactly 0, so tables print the accuracy without a spurious ± 0.00
(numpy's mean of three copies of 0.352 is not 0.352, and its std is 6.8e-17)."""
from __future__ import annotations

import numpy as np

from pipeline.report.aggregate import _agg
from pipeline.report.tables import cell_text


def test_identical_seed_values_have_exactly_zero_std():
    members = [{"run_dir": f"runs/r{i}"} for i in range(3)]
    assert np.std([0.352] * 3, ddof=1) > 0                 # the rounding noise this guards against
    cell = _agg([(0.352, None, None)] * 3, members)
    assert cell.std == 0.0 and cell_text(cell.to_json(), "%", metric="acc") == "35.20"
    varied = _agg([(0.35, None, None), (0.36, None, None), (0.352, None, None)], members)
    assert varied.std > 0 and "±" in cell_text(varied.to_json(), "%", metric="acc")
    assert _agg([(0.352, None, None)], members[:1]).std is None
