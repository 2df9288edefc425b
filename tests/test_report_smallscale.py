"""The paper's small-scale table (pipeline/report/smallscale.py): the paper's rows and columns, our
rows picked from the split by what they are (baseline key, ConfidNet head on O = C, loss), the
paper's printed numbers beside them, n/a with a reason where the report has no such row."""
from __future__ import annotations

from pipeline.report import smallscale
from pipeline.core.catalog import CATALOG
from pipeline.report.tables import build_tables, markdown_table

HEADERS = ["Acc ↑", "FPR-95%-TPR ↓", "AUPR-Error ↑ (−p)", "AUPR-Success ↑", "AUC ↑", "TPR", "TNR ↑"]


def _row(kind, oracle, clf, loss, variant, auc):
    agg = {d: {m: {"mean": auc if m == "auc" else 0.5, "std": 0.01, "ci": None,
                   "undefined": None, "notes": []} for m in CATALOG}
           for d in ("paper", "standard", "working_points")}
    return {"kind": kind, "oracle": oracle, "classifier": clf, "loss": loss, "variant": variant,
            "loss_label": loss, "group": "g", "n": 3, "oc": f"⟨{oracle}, {clf}⟩",
            "display_loss": loss, "agg": agg}


def _split(rows):
    return {"split": "test", "rows": rows, "comparisons": [], "figures": {}}


def test_small_scale_table_has_the_papers_rows_and_columns():
    rows = [_row("baseline", "post-hoc", "vit", "mcp", "", 0.91),
            _row("baseline", "post-hoc", "vit", "trustscore", "", 0.87),
            _row("oracle", "vit", "vit", "tcp", "confidnet+head-only", 0.89),
            _row("oracle", "vit", "vit", "ss", "confidnet+head-only", 0.90),
            # not the table's: stacked inputs, another oracle, the linear head
            _row("oracle", "vit", "vit", "ss", "confidnet+stacked+head-only", 0.95),
            _row("oracle", "resnet", "vit", "ss", "confidnet+head-only", 0.96),
            _row("oracle", "vit", "vit", "tcp", "head-only", 0.97)]
    tables = {t["id"]: t for t in build_tables(_split(rows), "both")}
    table = tables["small_scale_standard"]
    assert [c[2] for c in table["columns"]] == HEADERS
    ours = [r for r in table["rows"] if r["oc"] == "classifier vit"]
    assert [r["loss"] for r in ours] == ["MCP", "MC-Dropout", "TrustScore",
                                         "TCP (ConfidNet head)", "SS (ConfidNet head)"]
    auc = [c[1] for c in table["columns"]].index("auc")
    assert [r["cells"][auc]["mean"] for r in ours] == [0.91, None, 0.87, 0.89, 0.90]
    assert ours[1]["cells"][auc]["undefined"].startswith("no such row")
    paper = [r for r in table["rows"] if r["kind"] == "paper"]
    assert [(r["oc"], r["loss"]) for r in paper][:6] == [("paper, MNIST", n) for n in (
        "MCP", "MC-Dropout", "TrustScore", "TCP", "TCP†", "SS")]
    assert len(paper) == 12
    cifar_ss = paper[-1]["cells"]
    assert [c["mean"] for c in cifar_ss] == [v / 100 for v in
                                            (92.19, 44.69, 50.28, 99.26, 92.22, 98.46, 28.04)]
    mnist_mcd = paper[1]["cells"]
    assert mnist_mcd[5]["mean"] is None and mnist_mcd[5]["undefined"] == smallscale.NOT_REPORTED
    text = markdown_table(table)
    assert "| paper, CIFAR-10 | MCP | 92.19 | 47.50 | 45.36 | 99.19 | 91.53 | 99.64 | 6.66 | – |" in text
    assert "small_scale_paper" in tables


def test_no_small_scale_table_without_a_confidnet_head_run():
    rows = [_row("baseline", "post-hoc", "vit", "mcp", "", 0.91),
            _row("oracle", "vit", "vit", "ss", "head-only", 0.90)]
    assert not any(t["id"].startswith("small_scale") for t in build_tables(_split(rows), "both"))
