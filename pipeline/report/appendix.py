"""The paper's appendix analyses, from what the stages recorded: the ImageNet-C table (every
shifted split, one block per corruption and severity), gradient magnitudes (run.json's
``grad_norm``, as the planner read it) and inference time (the cache manifest's
``summary.inference``, the oracle's timing file read through ``cache.runs.RunDir``).  Plain
dicts in, markdown lines out; no torch.  Nothing is read leniently: a missing timing file is
normal (head-only outputs have none), a damaged one is refused naming it."""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Mapping

import numpy as np

from cache.manifest import load_manifest
from cache.runfile import RunFile
from cache.runs import RunDir
from cache.schema import CacheError
from pipeline.report import tables as T
from pipeline.report.aggregate import counted, training_key

_NAME = re.compile(r"^[a-z][a-z_]*$")
APPENDIX_METRICS = tuple(c.metric for c in T.COLUMNS["paper"])   # the paper Table 1 columns


def corruption_of(identity: dict, root: str = "") -> tuple[str, int] | None:
    """(corruption, severity) of a classifier cache, None for a clean split.  Three sources:
    ``extract --corruption`` (identity corruption "name:severity:seedN"), an ImageNet-C-layout
    tree read as ``--split <corruption>/<severity>`` (downloaded, or written by cli.py corrupt),
    and one read as ``--data .../<corruption> --split <severity>`` (the data root's name)."""
    tag = identity.get("corruption") or "none"
    if tag != "none":
        name, severity = tag.split(":")[:2]
        return name, int(severity)
    parts = str(identity.get("split", "")).split("/")
    if len(parts) >= 2 and _NAME.match(parts[-2]) and parts[-1] in "12345" and parts[-1]:
        return parts[-2], int(parts[-1])
    name = Path(root).name if root else ""
    if parts[-1] and parts[-1] in "12345" and _NAME.match(name):
        return name, int(parts[-1])
    return None


def collect(results: list[dict], run_records: Mapping[str, RunFile]) -> dict:
    """{'shifts': {split: [corruption, severity]}, 'gradients': [...], 'inference': [...]} for
    report.json (one entry per shifted split / counted run / <O,C> and split).  ``run_records``: {run
    directory: its run.json as the planner read it}."""
    manifests = _Manifests()
    results = counted(results)     # a repeated seed once, as in every other table
    shifts = {}
    for r in results:
        if r["split"] not in shifts:
            manifest = manifests[r["cache"]]
            shifts[r["split"]] = corruption_of(manifest.get("identity", {}), manifest.get("root", ""))
    grads, runs = [], {}
    for r in results:
        if r["kind"] == "oracle" and r["run_dir"]:
            runs.setdefault(r["run_dir"], r)
    # one trained oracle per seed of a group, wherever it was evaluated (copies: this count must
    # not mark the evaluations of the main tables as repeats)
    for r in counted([dict(r) for r in runs.values()], key=training_key):
        found = run_records.get(r["run_dir"])
        g = (found.grad_norm if found else None) or {}
        if g.get("mean") is not None:
            grads.append({"run_dir": r["run_dir"], "labels": r["labels"], **g})
    timing = defaultdict(lambda: {"oracle": [], "classifier": None})
    for r in results:
        if r["kind"] != "oracle":
            continue
        lab = r["labels"]
        entry = timing[(lab["oracle"], lab["classifier"], r["split"])]
        oracle = oracle_timing(r["run_dir"], r["source"])
        if oracle.get("model_ms_per_img") is not None:
            entry["oracle"].append(oracle)
        manifest = manifests[r["cache"]]
        entry["classifier"] = entry["classifier"] or (manifest.get("summary") or {}).get("inference")
    inference = [{"oracle": o, "classifier": c, "split": s, "oracle_timing": v["oracle"],
                  "classifier_timing": v["classifier"]} for (o, c, s), v in timing.items()
                 if v["oracle"] or (v["classifier"] or {}).get("model_ms_per_img") is not None]
    return {"shifts": {k: list(v) for k, v in shifts.items() if v}, "gradients": grads,
            "inference": inference}


class _Manifests(dict):
    """Classifier cache manifests by path, each read once (every result names its cache; the
    planner has already opened each one, so a failure here is a real change under our feet)."""

    def __missing__(self, path: str) -> dict:
        self[path] = load_manifest(Path(path))
        return self[path]


def oracle_timing(run_dir: str, output: str) -> dict:
    """The oracle's inference time on ``output``, {} where none was measured (head-only scores
    write none).  A damaged timing file is refused naming it: skipping it would make the
    appendix's table look complete when it is not."""
    try:
        timing = RunDir(Path(run_dir)).read_timing(Path(output))
    except CacheError as err:
        raise CacheError(f"run {run_dir}, the oracle's inference time on {Path(output).name} "
                         f"(report appendix): {err}") from None
    if timing is not None and not isinstance(timing, dict):
        raise CacheError(f"run {run_dir}: inference timing {RunDir.timing_path(Path(output))} "
                         f"holds a JSON {type(timing).__name__}, not an object; delete it and "
                         "re-run")
    return timing or {}


def markdown(doc: dict) -> list[str]:
    appendix = doc.get("appendix") or {}
    return (imagenet_c_table(doc) + gradient_table(appendix.get("gradients", []))
            + inference_table(appendix.get("inference", [])))


def imagenet_c_table(doc: dict) -> list[str]:
    """Paper Table A (ImageNet-C): a block per corruption and severity, oracle rows."""
    definition = "standard" if doc["metrics"] == "standard" else "paper"
    cols = {c.metric: c for c in T.COLUMNS[definition]}
    shifts = (doc.get("appendix") or {}).get("shifts", {})
    blocks = sorted(((tuple(shifts[s["split"]]), s) for s in doc["splits"] if s["split"] in shifts),
                    key=lambda b: (*b[0], b[1]["split"]))
    if not blocks:
        return []
    heads = ["Corruption", "Severity", "split", "⟨O,C⟩", "Loss"] + \
        [cols[m].header for m in APPENDIX_METRICS] + ["n"]
    lines = ["", "## Shifted splits (paper appendix ImageNet-C layout)", "",
             f"One block per corruption and severity; oracle rows; {definition} definitions "
             f"({T.DEFINITION_TEXT[definition].split(':')[0]}). The paper's table: defocus, "
             "glass, motion and zoom blur at severity 5, ⟨ViT, ViT⟩.", "",
             "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for (name, severity), split in blocks:
        previous = None
        for row in (r for r in split["rows"] if r["kind"] == "oracle"):
            cells = [T.cell_text(row["agg"][definition][m], cols[m].unit, metric=m)
                     for m in APPENDIX_METRICS]
            lead = [name, str(severity), f"`{split['split']}`"] if previous is None else ["", "", ""]
            oc = row["oc"] if row["oc"] != previous else ""
            previous = row["oc"]
            lines.append("| " + " | ".join([*lead, oc, row["display_loss"], *cells,
                                            str(row["n"])]) + " |")
    return lines


def gradient_table(gradients: list[dict]) -> list[str]:
    if not gradients:
        return []
    groups = defaultdict(list)
    for g in gradients:
        lab = g["labels"]
        groups[(f"⟨{lab['oracle']}, {lab['classifier']}⟩", lab["loss_label"], lab["group"])].append(g)
    lines = ["", "## Gradient magnitudes (paper appendix 'Analysis of Gradients')", "",
             "Mean over training samples of ‖∂L/∂x_out,i‖₂, x_out the oracle backbone's pooled "
             "output, L the optimizer step's loss (mean over the global batch); mean ± std over "
             "runs. × batch = the same for the per-sample loss. The paper, ⟨ViT, ViT⟩ at batch "
             "40: CE 0.0068, focal 0.0041, TCP 0.0039, SS 0.0149.", "",
             "| ⟨O,C⟩ | Loss | ‖∂L/∂x_out‖ | × batch | batch | n |", "|---|---|---|---|---|---|"]
    for (oc, loss, _), members in groups.items():
        batches = sorted({m.get("global_batch") for m in members if m.get("global_batch")})
        means = np.array([m["mean"] for m in members])
        scaled = np.array([m["mean"] * (m.get("global_batch") or np.nan) for m in members])
        lines.append(f"| {oc} | {loss} | {_pm(means, 4)} | {_pm(scaled, 3)} | "
                     f"{', '.join(map(str, batches)) or '?'} | {len(members)} |")
    return lines


def inference_table(inference: list[dict]) -> list[str]:
    if not inference:
        return []
    lines = ["", "## Inference time (paper appendix: oracle 1.53 vs classifier 1.64 ms/img)", "",
             "Forward passes only (uint8 batch to the device, normalisation, model; per image "
             "and view; data loading and the first batch excluded), as extract and predict "
             "measured them; figures from different devices or batch sizes are not comparable.",
             "",
             "| ⟨O,C⟩ | split | classifier ms/img | oracle ms/img | classifier device, batch, "
             "precision | oracle device, batch, precision |", "|---|---|---|---|---|---|"]
    for e in inference:
        c, orc = e["classifier_timing"] or {}, e["oracle_timing"]
        oracle_ms = np.array([o["model_ms_per_img"] for o in orc])
        lines.append(f"| ⟨{e['oracle']}, {e['classifier']}⟩ | `{e['split']}` | "
                     f"{_fmt(c.get('model_ms_per_img'))} | {_pm(oracle_ms, 4) if len(orc) else 'n/a'} | "
                     f"{_setting(c)} | {_setting(orc[0]) if orc else 'n/a'} |")
    return lines


def _setting(t: dict) -> str:
    if not t:
        return "n/a"
    warm = " (incl. warm-up)" if t.get("includes_warmup") else ""
    return f"{t.get('device')}, {t.get('batch_size')}, {t.get('precision')}{warm}"


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:.4f}"


def _pm(values: np.ndarray, digits: int) -> str:
    values = values[np.isfinite(values)]
    if not len(values):
        return "n/a"
    text = f"{values.mean():.{digits}f}"
    return text + (f" ± {values.std(ddof=1):.{digits}f}" if len(values) > 1 else "")
