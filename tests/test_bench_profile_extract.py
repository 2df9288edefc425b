"""bench/profile_extract.py's CPU smoke run: every part of the breakdown, with positive numbers."""
from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT, make_imagenet_tree


def positive_numbers(part) -> list[float]:
    if isinstance(part, dict):
        return [x for v in part.values() for x in positive_numbers(v)]
    if isinstance(part, list):
        return [x for v in part for x in positive_numbers(v)]
    return [part] if isinstance(part, (int, float)) and not isinstance(part, bool) else []


def test_cpu_smoke_run_writes_every_part(tmp_path):
    from pipeline.data.labels import imagenet_synsets

    data = make_imagenet_tree(tmp_path / "jpegs", list(imagenet_synsets()[:3]), per_class=32,
                              splits=("val",))   # 96 rows: 3 batches of 32, 2 of them steady
    out = tmp_path / "profile.json"
    proc = subprocess.run([sys.executable, "bench/profile_extract.py", "--data", str(data),
                           "--device", "cpu", "--models", "resnet10t", "--rows", "256",
                           "--batch-size", "32", "--workers", "2", "--seconds", "0.3",
                           "--per-image", "64", "--two-procs", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verdict resnet10t: bound:" in proc.stdout
    report = json.loads(out.read_text())
    assert {"device", "date", "command", "torch", "cpu_count"} <= set(report)
    assert report["rows"] == 96 and report["cpu_count"] > 0
    res = report["models"]["resnet10t"]
    for part in ("per_image", "loader", "model_alone", "extract", "two_procs"):
        assert positive_numbers(res[part]) and all(x > 0 for x in positive_numbers(res[part])), \
            (part, res[part])
    per = res["per_image"]
    assert {"read_stamped", "decode", "resize_crop", "getitem", "collate_shared"} <= set(per)
    split = res["extract"]["fraction"]
    assert {"loader_wait", "forward", "h2d_copy_normalize", "hdf5_write_shard",
            "other_python"} <= set(split)
    assert 0.98 < sum(split.values()) < 1.02    # the parts and the rest make up the wall time
    assert res["verdict"]["bound"] in res["verdict"]["ceilings_img_per_s"]
