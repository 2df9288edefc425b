"""``cli.py sweep``: train one oracle per point of a loss-parameter grid, choose on held-out rows.

stages (``grid.plan_stages``) -> per stage: its points as ordinary train-oracle runs under
``<sweep dir>/runs`` (head-only: one bank of heads in one pass; ``--fine-tune``: one resumable run
after the other) -> each run's chosen checkpoint's HELD-OUT validation metrics (log.jsonl) ->
the best point by the criterion -> next stage -> table, figures, the train-oracle command.

Complete points are never trained again (their run directories say so), so an interrupted sweep
resumes where it stopped, and a sweep over more values trains only the new ones.  The evaluation
split's metrics are shown beside each point for information; they never take part in the choice.
"""
from __future__ import annotations

import hashlib
import json
import math
import shlex
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from cache.manifest import write_json_atomic
from cache.outputs import read_outputs
from cache.reader import slug
from cache.runlog import finite
from cache.runs import RunDir, RunError
from pipeline.core.losses import Context, get, loss_params, tnr_logit, tnr_rule
from pipeline.core.presets import ss_slopes
from pipeline.oracle.finetune.train import train
from pipeline.oracle.headonly.features import FeatureMemo
from pipeline.oracle.headonly.train import train_head_only
from pipeline.oracle.loop.validation import validation_metrics
from pipeline.oracle.settings.config import TrainConfig
from pipeline.sweep.grid import FLAGS, SweepError, choose, plan_stages, stage_points
from pipeline.sweep.report import write_all


@dataclass(frozen=True)
class SweepConfig:
    base: TrainConfig                       # the train-oracle options every point shares
    train_args: tuple[str, ...]             # those options as typed (for the printed command)
    swept: dict                             # option -> values
    fixed: dict = field(default_factory=dict)    # values before any stage chose (paper: alpha+)
    mode: str = "paper"                     # paper | grid
    criterion: str = "tpr-tnr"
    fine_tune: bool = False
    out: Path | None = None
    figures: bool = True


def default_fixed(base: TrainConfig) -> dict:
    """The slopes of a loss whose defaults follow the oracle (SS's) before any stage chose: the
    oracle family's presets (paper §5; for other backbones train-oracle's rule,
    presets.ss_slopes)."""
    kind = get(base.loss)
    if not kind.slopes_by_oracle:
        return {}
    alphas, _ = ss_slopes(base.oracle or base.classifier)
    return kind.defaults(Context(slopes=alphas))


def sweep_dir(cfg: SweepConfig) -> Path:
    if cfg.out:
        return Path(cfg.out)
    b = cfg.base
    key = hashlib.sha256(json.dumps([cfg.train_args, cfg.fine_tune]).encode()).hexdigest()[:8]
    kind = "fine-tune" if cfg.fine_tune else "head-only"
    return (Path(b.artifacts) / "sweeps" / f"{slug(b.oracle or b.classifier)}-{slug(b.classifier)}"
            f"_{b.loss}_{kind}_seed{b.seed}_{key}")


def point_config(cfg: SweepConfig, values: dict, root: Path) -> TrainConfig:
    extra = {"class_balanced": True} if "cb_beta" in values else {}
    own = {k: v for k, v in values.items() if k in loss_params()}
    weights = {k: v for k, v in values.items() if k not in own}
    return replace(cfg.base, loss_params={**cfg.base.loss_params, **own}, **weights, **extra,
                   head_only=not cfg.fine_tune, out=None,
                   runs_root=str(root / "runs"))


def train_points(cfg: SweepConfig, points: list[dict], root: Path, echo,
                 memo: FeatureMemo) -> list[dict]:
    """Train (or skip, when complete) every point; returns one summary per point."""
    cfgs = [point_config(cfg, p, root) for p in points]
    if not cfg.fine_tune:
        return train_head_only(cfgs, memo)
    out = []
    for i, c in enumerate(cfgs, 1):
        try:
            out.append(train(c, memo.splits))
        except RunError as err:        # e.g. a diverged point: recorded, the sweep goes on
            out.append({"status": "failed", "error": str(err), "run_dir": None})
        state = "already complete" if out[-1].get("already_complete") else out[-1]["status"]
        echo(f"  point {i}/{len(cfgs)}: {_values_text(points[i - 1])}: {state}")
    return out


def collect(summary: dict, values: dict, eval_tag: str) -> dict:
    """A point's row: its values, held-out validation metrics at the chosen checkpoint, mean
    training loss, and (for information only) the evaluation split's metrics."""
    row = {"values": values, "status": summary["status"], "run_dir": summary.get("run_dir"),
           "already_complete": bool(summary.get("already_complete")), "val": None,
           "eval": None, "mean_train_loss": math.nan}
    if summary["status"] != "complete":
        row["error"] = summary.get("error")
        return row
    run_dir = RunDir(summary["run_dir"])
    run = run_dir.record()
    entries = run_dir.log_entries()
    losses = [e["loss"] for e in entries if "loss" in e and e["loss"] is not None]
    row["mean_train_loss"] = float(np.mean(losses)) if losses else math.nan
    best = (run.best or {}).get("step")
    vals = [e["val"] for e in entries if "val" in e and e["step"] == best]
    row["val"] = vals[-1] if vals else None
    row["best_step"] = best
    path = run.outputs.get(eval_tag)
    if path and Path(path).exists():
        cols = read_outputs(Path(path)).columns
        ok = cols["valid"] == 1
        row["eval"] = validation_metrics(cols["z"][ok], cols["correct"][ok], math.nan,
                                         tnr_logit(tnr_rule(run.labels.loss, run.labels.tnr),
                                                   run.labels.num_classes))
        row["eval"]["split"] = eval_tag
    return row


def run_sweep(cfg: SweepConfig, echo=print) -> dict:
    """Run every stage; returns the summary also written to ``<sweep dir>/sweep.json``."""
    if cfg.base.val_fraction <= 0:
        raise SweepError("a sweep chooses on held-out validation rows: --val-fraction must be > 0")
    root = sweep_dir(cfg)
    stages = plan_stages(cfg.base.loss, cfg.swept, cfg.mode)
    chosen = dict(cfg.fixed)
    t0 = time.perf_counter()
    memo = FeatureMemo()      # every stage's features and listings, dropped with the sweep
    try:
        return _run_stages(cfg, root, stages, chosen, memo, echo, t0)
    finally:
        memo.clear()


def _run_stages(cfg: SweepConfig, root: Path, stages: list, chosen: dict, memo: FeatureMemo,
                echo, t0: float) -> dict:
    rows, record = [], []
    for s, options in enumerate(stages, 1):
        points = stage_points(options, cfg.swept, chosen)
        held = _values_text({k: v for k, v in chosen.items() if k not in options})
        echo(f"stage {s}/{len(stages)}: {', '.join(FLAGS[o] for o in options)} over "
             f"{len(points)} point(s) at {held or 'the defaults'}")
        summaries = train_points(cfg, points, root, echo, memo)
        eval_tag = _eval_tag(summaries)
        stage_rows = [{**collect(sm, p, eval_tag), "stage": s} for sm, p in zip(summaries, points)]
        best = choose(stage_rows, cfg.criterion)
        if best is None:
            raise SweepError(f"stage {s}: no point has a defined validation {cfg.criterion} "
                             "(all diverged, or the held-out rows hold one class only)")
        chosen.update({o: best["values"][o] for o in options})
        best["chosen_in_stage"] = True
        rows.extend(stage_rows)
        record.append({"stage": s, "options": options, "chosen": {o: chosen[o] for o in options},
                       "points": len(points)})
        echo(f"  chosen on held-out rows ({cfg.criterion}): {_values_text(best['values'])}")
    summary = {"sweep_dir": str(root), "mode": cfg.mode, "criterion": cfg.criterion,
               "fine_tune": cfg.fine_tune, "fixed": cfg.fixed,
               "swept": {k: list(v) for k, v in cfg.swept.items()}, "stages": record,
               "chosen": {k: chosen[k] for k in cfg.swept}, "points": rows,
               "train_args": list(cfg.train_args), "command": final_command(cfg, chosen),
               "elapsed_s": round(time.perf_counter() - t0, 2),
               "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    summary["files"] = write_all(root, summary, figures=cfg.figures)
    write_json_atomic(root / "sweep.json", finite(summary))
    return summary


def final_command(cfg: SweepConfig, chosen: dict) -> str:
    """train-oracle with the sweep's options and the chosen values (swept options only)."""
    extra = []
    for k in cfg.swept:
        if k == "cb_beta":
            extra.append("--class-balanced")
        extra += [FLAGS[k], f"{chosen[k]:g}"]
    return shlex.join(["python", "cli.py", "train-oracle", *cfg.train_args, *extra])


def _eval_tag(summaries: list[dict]) -> str:
    for sm in summaries:
        if sm.get("run_dir") and sm["status"] == "complete":
            return RunDir(sm["run_dir"]).record().config["eval_splits"][0]
    return ""


def _values_text(values: dict) -> str:
    return ", ".join(f"{FLAGS[k]} {v:g}" for k, v in values.items())
