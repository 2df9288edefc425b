"""``cli.py train-oracle`` and ``cli.py predict``: options -> ``TrainConfig`` / ``PredictConfig`` ->
one call.  train-oracle's options are the fields of ``pipeline.oracle.config.TrainConfig``."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from pipeline.core.options import (BATCH_SIZE, DATA, DEVICE, LABELS, NO_PROGRESS, PRECISION,
                                   WORKERS, Opt, options, output_name_option)
from pipeline.data.sources import default_artifacts
from pipeline.oracle.config import FINE_TUNE_ONLY, config_from_params, option_of, train_options


def _run_stage2(fn, *args):
    """Option misfits -> usage error (exit 2); run-directory problems and NaN -> exit 1."""
    # torch-bearing modules: imported on call (see train_oracle)
    from cache.runs import RunError
    from pipeline.core.losses import LossOptionError
    try:
        return fn(*args)
    except LossOptionError as err:
        raise click.UsageError(str(err)) from None
    except RunError as err:
        raise click.ClickException(str(err)) from None


@click.command("train-oracle")
@options(*train_options())
@click.pass_context
def train_oracle(ctx, **params):
    """Stage 2: train an oracle on cached classifier targets; score the eval split(s)."""
    # The stage is imported on call: a command loads only its own stage, and `cli.py report`
    # stays free of torch.
    from pipeline.core import dist
    from pipeline.oracle.headonly import train_head_only
    from pipeline.oracle.train import train

    cfg = config_from_params(params)
    check_head_only_options(ctx)
    if cfg.head_only:
        summary = _run_stage2(lambda c: train_head_only([c])[0], cfg)
    else:
        summary = _run_stage2(train, cfg)
    if dist.info().is_main:
        _print_train_summary(summary)
    dist.shutdown(dist.info())


def check_head_only_options(ctx: click.Context) -> None:
    """--head-only with an option of the fine-tuned loop (or --features-cache without it): a
    usage error naming the option, instead of silently ignoring it."""
    given = {p.name for p in ctx.command.params
             if ctx.get_parameter_source(p.name) == click.core.ParameterSource.COMMANDLINE}
    if not ctx.params.get("head_only"):
        if option_of("features_cache").name in given:
            raise click.UsageError("--features-cache applies to --head-only training only")
        return
    wrong = [option_of(f).flag for f in FINE_TUNE_ONLY if option_of(f).name in given]
    if wrong:
        raise click.UsageError(f"{', '.join(wrong)} {'does' if len(wrong) == 1 else 'do'} not "
                               "apply to --head-only (the head trains in float32 on cached "
                               "features, in one process, without a DataLoader or mid-run "
                               "checkpoints; a re-run retrains an incomplete run)")


def _print_train_summary(s: dict) -> None:
    if s["status"] == "failed":
        raise click.ClickException(f"training failed: {s.get('error')} ({s['run_dir']})")
    if s["status"] in ("stopped", "interrupted"):
        click.echo(f"{s['status']} after step {s['step']} of {s['total_steps']} (checkpoint "
                   f"written); re-run the same command to continue: {s['run_dir']}")
        if s["status"] == "interrupted":
            sys.exit(130)
        return
    state = "already complete" if s.get("already_complete") else (
        f"trained {s['total_steps']} steps" + (f" (resumed at step {s['resumed_at']})"
                                               if s.get("resumed_at") else ""))
    best = s["best"]
    chosen = (f"best held-out AUPR-Error {best['val_aupr_error']:.4f} at step {best['step']}"
              if best.get("val_aupr_error") is not None else f"final model (step {best['step']})")
    click.echo(f"{state}; {chosen}; run: {s['run_dir']}")
    for o in s["outputs"]:
        _print_output(o)


def _print_output(o: dict) -> None:
    if o.get("already_complete"):
        click.echo(f"  [{o['split']}] outputs already written: {o['path']}")
        return
    click.echo(f"  [{o['split']}] {o['rows']} rows, classifier accuracy {100 * o['accuracy']:.2f}%"
               f", mean confidence correct {o['mean_confidence_correct']:.3f} / incorrect "
               f"{o['mean_confidence_incorrect']:.3f}: {o['path']}")
    t = o.get("inference") or {}
    if t.get("model_ms_per_img") is not None:
        click.echo(f"  [{o['split']}] oracle inference {t['model_ms_per_img']:.4f} ms/img "
                   f"(forward only, {t['device']}, batch {t['batch_size']}, {t['precision']}"
                   f"{', incl. warm-up: one batch only' if t.get('includes_warmup') else ''})")


@click.command()
@options(
    Opt(("--run", "run_dir"), type=click.Path(path_type=Path, exists=True, file_okay=False),
        help="A finished train-oracle run directory."),
    DATA.but(help="Dataset root. Default: the run's training data."),
    Opt(("--split", "splits"), multiple=True, help="Cache tag(s) to score (repeatable). "
        "Default: the run's evaluation splits."),
    Opt(("--cache",), type=click.Path(path_type=Path), help="Cache root of --data (its "
        "classifier cache gives correctness). Default: artifacts/<dataset>/cache."),
    LABELS,
    Opt(("--name",), callback=output_name_option, help="Output file stem (outputs/<name>.h5) for "
        "one --split. Default: the split tag (prefixed by the dataset name for other datasets)."),
    BATCH_SIZE.but(default=256),
    WORKERS,
    PRECISION.but(help="Autocast of the forward passes: bf16, fp16 or fp32. Default: the "
                  "precision the run was trained with (a head-only run: its features')."),
    DEVICE,
    NO_PROGRESS,
)
def predict(run_dir, data, splits, cache, labels_file, name, batch_size, workers, precision,
            device, no_progress):
    """Score new data with a trained run's chosen oracle; writes RUN/outputs/<tag>.h5."""
    # The stage is imported on call: a command loads only its own stage, and `cli.py report`
    # stays free of torch.
    from cache.runs import RunDir
    from pipeline.core import dist
    from pipeline.data.images import default_workers
    from pipeline.oracle.predict import PredictConfig, predict as run_predict

    config = _run_stage2(lambda: RunDir(run_dir).read()["run"]["config"])
    same = data is None or data == config["data"]
    data = config["data"] if data is None else data
    cfg = PredictConfig(
        run=run_dir, data=data,
        cache=cache or (Path(config["cache"]) if same else default_artifacts(data) / "cache"),
        splits=tuple(splits) or tuple(config["eval_splits"]), labels_file=labels_file,
        name=name, batch_size=batch_size,
        workers=default_workers(dist.local_world()) if workers is None else workers,
        precision=precision, device=device, progress=not no_progress)
    results = _run_stage2(run_predict, cfg)
    if dist.info().is_main:
        for o in results:
            _print_output(o)
    dist.shutdown(dist.info())
