"""Share a trained oracle: a finished run's chosen oracle written as a folder in the Hugging Face
Hub's model layout (``cli.py export`` calls ``export_oracle``), read back by ``load_oracle``.

    export_oracle("runs/vit-vit_ss_seed0_0123abcd4567", "shared/vit-ss")   # model.safetensors,
    oracle = load_oracle("shared/vit-ss", weights="vit.pth")               # config.json, README.md
    oracle = load_oracle("hf-hub:org/vit-ss")           # pip install 'trust-oracles[hub]'

The folder's files and checks are ``cache.export``'s; the models' ``pipeline.oracle.deploy.
exported``'s.  The model card's metrics are the run's own outputs evaluated as ``evaluate``
evaluates them (bootstrap intervals), or a report's rows of the run (``report=``), and its front
matter names the weights they belong to.
"""
from __future__ import annotations

import json
from pathlib import Path

from cache.export import WEIGHTS, card_front_matter, check_target, write_export
from cache.runcache import training_cache
from cache.runs import RunError
from pipeline.oracle.deploy import exported
from pipeline.oracle.deploy.rebuild import complete_run
from pipeline.oracle.deploy.threshold import given_threshold, pick_threshold
from pipeline.oracle.settings.config import LOSS_OPTIONS
from trust_oracles.evaluation import evaluate
from trust_oracles.runs import open_run

__all__ = ["export_oracle"]

CARD_METRICS = ("acc", "auc", "aupr_err", "fpr95", "aurc", "augrc")   # the card's table columns


def export_oracle(run_dir: str | Path, out: str | Path, *, threshold: float | None = None,
                  target: tuple[str, float] = ("tpr", 0.95), report: str | Path | None = None,
                  resamples: int = 1000, force: bool = False) -> Path:
    """Write a finished run's chosen oracle to the folder ``out`` (Hugging Face Hub layout).

    Parameters
    ----------
    run_dir : str or Path
        A complete ``train-oracle`` run directory (its training cache where it recorded it).
    out : str or Path
        The folder to write: new or empty (see ``force``); written whole or not at all.
    threshold : float, optional
        The decision threshold, as given; default: ``target``'s on the run's held-out rows.
    target : (kind, value), default ("tpr", 0.95)
        As ``predict --target``.
    report : str or Path, optional
        A ``cli.py report`` report.json: the card shows its rows of this run instead of the
        run's outputs evaluated here.
    resamples : int, default 1000
        Bootstrap resamples of the card's intervals (0: none).
    force : bool, default False
        Replace a non-empty ``out`` (only once the new folder is complete).

    Returns
    -------
    Path
        ``out``.

    Raises
    ------
    RunError
        The run is not finished, or its held-out rows cannot give ``target``.
    ExportError
        ``out`` is a file, or a non-empty folder without ``force``.
    """
    run_dir, out = Path(run_dir), Path(out)
    run = complete_run(run_dir)
    check_target(out, force)            # before the models are loaded: seconds, not minutes
    choice = (given_threshold(run_dir, run, float(threshold)) if threshold is not None
              else pick_threshold(run_dir, run, *target))
    choice.pop("on", None)      # the run's file paths mean nothing where the folder is used
    cache = training_cache(run_dir, run)
    module, oracle = exported.oracle_record(run_dir, run)
    oracle["made_on"] = run.made_on
    labels = run.labels
    config = {"oracle": oracle, "threshold": choice,
              "classifier": exported.classifier_record(cache),
              "loss": {"name": labels.loss, "label": labels.loss_label,
                       "variant": labels.variant, "tnr": labels.tnr,
                       "params": {k: run.config[k] for k in ("loss_params", *LOSS_OPTIONS)
                                  if k in run.config}},
              "training_data": {"dataset": labels.dataset,
                                "dataset_fingerprint": cache.identity["dataset_fingerprint"],
                                "split": cache.identity.get("split"), "rows": dict(run.rows)},
              # the run record every oracle output file carries (predict --split of the folder)
              "run": {"name": run_dir.name, "group": labels.group, "seed": labels.seed,
                      "record": dict(run.raw["run"])},
              "metrics": (_report_metrics(Path(report), run_dir) if report else
                          _run_metrics(run_dir, resamples))}
    return write_export(out, lambda path: exported.save_oracle(module, path), config,
                        lambda sha: card(config, sha), force)


def _run_metrics(run_dir: Path, resamples: int) -> dict:
    """Each evaluated split's metrics (standard definition) with percentile bootstrap intervals."""
    run = open_run(run_dir)
    out = {"source": "the run's own outputs (outputs/<split>.h5), evaluated by "
                     "trust_oracles.evaluate", "resamples": resamples or None, "splits": {}}
    for split in run.splits:
        s = run.scores(split)
        ev = evaluate(s.confidence[s.valid], s.correct[s.valid], definition="standard",
                      bootstrap=resamples or None)
        m = ev.standard
        out["splits"][split] = {"rows": ev.n, "correct": ev.n_correct, "metrics": {
            name: {"value": m[name], **({"low": m.interval(name).low,
                                         "high": m.interval(name).high} if resamples else {})}
            for name in CARD_METRICS}}
    return out


def _report_metrics(report: Path, run_dir: Path) -> dict:
    """The rows of ``report`` (report.json) that evaluate this run, in ``_run_metrics``' shape:
    the standard definition's values and the report's own intervals."""
    try:
        doc = json.loads(report.read_text())
    except (OSError, ValueError) as err:
        raise RunError(f"--report {report} is not a readable report.json ({err}); pass the "
                       "report.json `cli.py report` wrote") from None
    mine = [e for e in doc.get("evaluations", []) if e.get("kind") == "oracle"
            and e.get("run_dir") and Path(e["run_dir"]).resolve() == run_dir.resolve()]
    if not mine:
        raise RunError(f"--report {report} evaluates no output of run {run_dir}; pass the "
                       "report of a `cli.py report` run over this run, or leave --report out")
    splits = {}
    for e in mine:
        values = {"acc": e.get("accuracy"), **e["metrics"]["standard"]["values"]}
        ci = (e.get("ci") or {}).get("standard", {})
        splits[e["split"]] = {"rows": e.get("valid_rows"), "metrics": {
            n: {"value": values.get(n), **({"low": ci[n]["low"], "high": ci[n]["high"]}
                                           if n in ci else {})} for n in CARD_METRICS}}
    return {"source": f"report {report.name} ({doc.get('schema')}; {doc.get('bootstrap')})",
            "splits": splits}


def card(config: dict, weights_sha256: str) -> str:
    """README.md: front matter (the Hub's metadata, the weights hash), then the model card."""
    clf, data, loss = config["classifier"], config["training_data"], config["loss"]
    head = card_front_matter(weights_sha256, {"library_name": "trust-oracles",
                                              "tags": ["trust-oracle", "failure-prediction"]})
    lines = [f"# Trust oracle: {loss['label']} on {clf['identity']['model']}", "",
             "## Intended use", "",
             f"Predicts whether the frozen classifier `{clf['identity']['model']}` (weights "
             f"sha256 `{clf['identity']['weights_sha256']}`) is right on an image: confidence "
             f"= sigmoid(z); trusted when confidence >= {config['threshold']['threshold']:.6g} "
             f"(chosen by {config['threshold']['chosen_by']}). Load it with "
             "`trust_oracles.load_oracle(DIR)` or `cli.py predict --run DIR --images FOLDER "
             "--out-file FILE`; any other classifier is refused.", "",
             "## Training data", "",
             f"Dataset `{data['dataset']}`, split `{data['split']}`, fingerprint "
             f"`{data['dataset_fingerprint']}`; rows {json.dumps(data['rows'])}.", "",
             "## Metrics", "", f"Source: {config['metrics']['source']}. These metrics belong "
             f"to the weights `{WEIGHTS}` with sha256 `{weights_sha256}`.", ""]
    lines += _metric_table(config["metrics"])
    lines += ["", "## Limitations", "",
              "Valid only for the classifier named above, on images like its training data; "
              "scores on another device or precision differ in their last digits "
              "(docs/METRICS.md). The threshold was chosen on held-out training rows, not on "
              "the deployment's images. See config.json for every setting.", ""]
    return head + "\n" + "\n".join(lines)


def _metric_table(metrics: dict) -> list[str]:
    rows = ["| split | rows | " + " | ".join(CARD_METRICS) + " |",
            "|---|---|" + "---|" * len(CARD_METRICS)]
    for split, got in metrics["splits"].items():
        cells = []
        for name in CARD_METRICS:
            m = got["metrics"][name]
            cell = "n/a" if m["value"] is None else f"{m['value']:.4f}"
            if m.get("low") is not None:
                cell += f" [{m['low']:.4f}, {m['high']:.4f}]"
            cells.append(cell)
        rows.append(f"| {split} | {got['rows']} | " + " | ".join(cells) + " |")
    return rows
