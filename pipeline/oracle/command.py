"""``cli.py train-oracle`` and ``cli.py predict``: options -> ``TrainConfig`` / ``PredictConfig`` ->
one call.  train-oracle's options are the fields of
``pipeline.oracle.settings.config.TrainConfig``."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from pipeline.core.catalog import BEST_KEY
from pipeline.core.commandline import Command, options, output_name_option, typed_flag
from pipeline.core.options import (BATCH_SIZE, DATA, DEVICE, LABELS, NO_PROGRESS, PRECISION,
                                   WEIGHTS, WORKERS, FloatRange, Opt)
from pipeline.data.sources import default_artifacts
from pipeline.oracle.settings.config import train_options
from pipeline.oracle.settings.given import SettingsError, check_given, config_from_params


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
        raised = click.ClickException(str(err))
        raised.quiet_off_rank0 = getattr(err, "quiet_off_rank0", False)   # cli.py: one message
        raise raised from None


@click.command("train-oracle", cls=Command)
@options(*train_options())
@click.pass_context
def train_oracle(ctx, **params):
    """Stage 2: train an oracle on cached classifier targets; score the eval split(s).

    A default "from the preset" is pipeline/core/presets.py's: EMBEDDED_ORACLE on the embedded
    Fashion-MNIST ("embedded"), PAPER_ORACLE, the paper's protocol, on any other data ("paper");
    run.json records the resolved values."""
    # The stage is imported on call: a command loads only its own stage, and `cli.py report`
    # stays free of torch.
    from pipeline.core import dist
    from pipeline.oracle.finetune.train import train
    from pipeline.oracle.headonly.train import train_head_only

    cfg = config_of(params)
    check_head_only_options(ctx)
    if cfg.head_only:
        summary = _run_stage2(lambda c: train_head_only([c])[0], cfg)
    else:
        summary = _run_stage2(train, cfg)
    if dist.info().is_main:
        _print_train_summary(summary)
    dist.shutdown(dist.info())


def check_head_only_options(ctx: click.Context) -> None:
    """The options given on this command line against --head-only (``check_given``): a usage
    error naming the option, instead of silently ignoring it."""
    given = {p.name for p in ctx.command.params
             if ctx.get_parameter_source(p.name) == click.core.ParameterSource.COMMANDLINE}
    try:
        check_given(bool(ctx.params.get("head_only")), given)
    except SettingsError as err:
        raise click.UsageError(str(err)) from None


def config_of(params: dict):
    """``config_from_params``, its refusals as usage errors."""
    try:
        return config_from_params(params)
    except SettingsError as err:
        raise click.UsageError(str(err)) from None


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
    chosen = (f"best held-out AUPR-Error {best[BEST_KEY]:.4f} at step {best['step']}"
              if best.get(BEST_KEY) is not None else f"final model (step {best['step']})")
    click.echo(f"{state}; {chosen}; run: {s['run_dir']}")
    for o in s["outputs"]:
        _print_output(o)


def _mean(value: float) -> str:
    """A mean confidence; n/a where the split has no such row (a test-newclass split: every
    prediction wrong, none correct)."""
    return "n/a (no such row)" if value != value else f"{value:.3f}"


def _print_output(o: dict) -> None:
    if o.get("already_complete"):
        click.echo(f"  [{o['split']}] outputs already written: {o['path']}")
        return
    click.echo(f"  [{o['split']}] {o['rows']} rows, classifier accuracy {100 * o['accuracy']:.2f}%"
               f", mean confidence correct {_mean(o['mean_confidence_correct'])} / incorrect "
               f"{_mean(o['mean_confidence_incorrect'])}: {o['path']}")
    t = o.get("inference") or {}
    if t.get("model_ms_per_img") is not None:
        click.echo(f"  [{o['split']}] oracle inference {t['model_ms_per_img']:.4f} ms/img "
                   f"(forward only, {t['device']}, batch {t['batch_size']}, {t['precision']}"
                   f"{', incl. warm-up: one batch only' if t.get('includes_warmup') else ''})")


def target_option(ctx, param, value):
    """``--target tpr=0.95`` -> ("tpr", 0.95); a malformed target is a usage error (exit 2)."""
    from pipeline.oracle.deploy.threshold import parse_target
    if value is None:
        return None
    try:
        return parse_target(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


def run_option(ctx, param, value):
    """--run: a directory that exists (click's own check and message), or an ``hf-hub:`` id
    (resolved when the command runs)."""
    if value is None or value.startswith("hf-hub:"):
        return value
    return click.Path(path_type=Path, exists=True, file_okay=False).convert(value, param, ctx)


# predict's options that belong to one of its two modes: labelled splits or new images
SPLIT_ONLY = ("data", "splits", "cache", "labels_file")
IMAGES_ONLY = ("out", "threshold", "target", "skip_bad")


@click.command(cls=Command)
@options(
    Opt(("--run", "run_dir"), callback=run_option, required=True, group="data",
        show_default=False, metavar="DIRECTORY",
        help="A finished train-oracle run directory, a folder `cli.py export` wrote, or "
        "hf-hub:org/name (an exported oracle in the local Hugging Face cache, downloaded where "
        "the hub is reachable)."),
    DATA.but(help="Dataset root.", default_text="the run's training data"),
    Opt(("--split", "splits"), multiple=True, group="data", help="Cache tag(s) to score "
        "(repeatable).", default_text="the run's evaluation splits"),
    Opt(("--cache",), type=click.Path(path_type=Path), group="data", help="Cache root of "
        "--data (its classifier cache gives correctness).", default_text="the run's; with "
        "another --data, artifacts/<dataset>/cache"),
    LABELS,
    Opt(("--images",), group="data", help="New, unlabelled images instead of a labelled split: "
        "a folder (subfolders searched), a quoted glob ('shots/**/*.jpg') or one file. Runs the "
        "classifier and the oracle on each file and writes one row per image: path, pred, "
        "class_name, msp, confidence, trust, error (RUN/predictions/<name>.csv, or --out-file).",
        default_text="none: labelled splits"),
    Opt(("--out-file", "out"), aliases=("--out",), type=click.Path(path_type=Path,
        dir_okay=False), group="output", metavar="FILE", help="With --images: the table to "
        "write; its extension picks the format: .csv, .jsonl (JSON lines) or .parquet (needs "
        "pyarrow). The threshold and how it was chosen go to <stem>.meta.json beside it. With "
        "an exported oracle's --split: its output file (.h5).",
        default_text="RUN/predictions/<--out-name>.csv"),
    WEIGHTS.but(help="With --images: the classifier's weights file. In both modes: a head-only "
                "run's backbone weights where they are not where the run recorded them (e.g. "
                "moved). Either way checked against the recorded weights hashes.",
                default_text="the files the cache and the run recorded"),
    Opt(("--threshold",), type=FloatRange(0, 1), group="protocol", help="With --images: "
        "trust a row when the oracle's confidence is >= this.", default_text="--target's"),
    Opt(("--target",), callback=target_option, group="protocol", help="With --images: pick the "
        "threshold on the run's held-out rows: tpr=T (trust >= T of the classifier's correct "
        "answers) or risk=R (at most R wrong answers among the trusted).",
        default_text="tpr=0.95"),
    Opt(("--skip-bad",), is_flag=True, group="data", help="With --images: list undecodable "
        "files in the table (column error) instead of stopping at the first."),
    Opt(("--out-name", "name"), aliases=("--name",), callback=output_name_option,
        group="output", help="Output file stem: outputs/<name>.h5 in the run, for one --split; "
        "with --images, predictions/<name>.csv.", default_text="the split tag (prefixed by the "
        "dataset name for other datasets); with --images, the images' folder name"),
    BATCH_SIZE.but(default=256),
    WORKERS,
    PRECISION.but(help="Autocast of the forward passes: bf16, fp16 or fp32.",
                  default_text="the precision the run was trained with (a head-only run: its "
                  "features'; with --images, the classifier runs in its cache's precision)"),
    DEVICE,
    NO_PROGRESS,
)
@click.pass_context
def predict(ctx, run_dir, images, name, weights, batch_size, workers, precision, device,
            no_progress, **mode):
    """Score new data with a trained run's chosen oracle: labelled splits (RUN/outputs/<tag>.h5)
    or, with --images, new unlabelled images (RUN/predictions/<name>.csv)."""
    # The stage is imported on call: a command loads only its own stage, and `cli.py report`
    # stays free of torch.
    from pipeline.core import dist
    from pipeline.data.loader import default_workers

    from pipeline.oracle.deploy.exported import is_exported
    exported = is_exported(run_dir)
    _check_predict_mode(ctx, images is not None, exported)
    workers = default_workers(dist.local_world()) if workers is None else workers
    common = dict(batch_size=batch_size, workers=workers, precision=precision, device=device,
                  progress=not no_progress)
    if images is not None:
        from pipeline.oracle.deploy.images import DeployConfig, predict_images
        cfg = DeployConfig(run=run_dir, images=images, name=name, weights=weights,
                           **{k: mode[k] for k in IMAGES_ONLY}, **common)
        _print_predictions(_run_stage2(predict_images, cfg))
        return
    if exported:
        results = _predict_exported(run_dir, name, mode["out"], {**common, "weights": weights},
                                    **{k: mode[k] for k in SPLIT_ONLY})
    else:
        results = _predict_splits(run_dir, name, {**common, "weights": weights},
                                  **{k: mode[k] for k in SPLIT_ONLY})
    if dist.info().is_main:
        for o in results:
            _print_output(o)
    dist.shutdown(dist.info())


def _check_predict_mode(ctx: click.Context, images: bool, exported: bool = False) -> None:
    """An option of the other mode is a usage error naming it (never silently ignored); an
    exported oracle's split is written to --out-file (its folder is not written into)."""
    given = {p.name: p for p in ctx.command.params
             if ctx.get_parameter_source(p.name) == click.core.ParameterSource.COMMANDLINE}
    wrong = [typed_flag(ctx, n) for n in (SPLIT_ONLY if images else IMAGES_ONLY) if n in given
             and not (exported and n == "out")]
    if wrong:
        raise click.UsageError(f"{', '.join(wrong)} {'does' if len(wrong) == 1 else 'do'} not "
                               + ("apply to --images (unlabelled images are scored without a "
                                  "cache)" if images else "apply without --images"))
    if "name" in given and "out" in given:
        name, out = typed_flag(ctx, "name"), typed_flag(ctx, "out")
        raise click.UsageError(f"{name} and {out} both name the predictions table: give one "
                               f"({name}: RUN/predictions/<name>.csv; {out}: any file)")
    if "threshold" in given and "target" in given:
        raise click.UsageError("--threshold and --target both set the trust threshold: give one "
                               "(--threshold X as is, or --target to pick it on held-out rows)")


def _predict_splits(run_dir, name, common, data, splits, cache, labels_file) -> list[dict]:
    from cache.runs import RunDir
    from pipeline.oracle.deploy.predict import PredictConfig
    from pipeline.oracle.deploy.predict import predict as run_predict

    config = _run_stage2(lambda: RunDir(run_dir).record().config)
    same = data is None or data == config["data"]
    data = config["data"] if data is None else data
    cfg = PredictConfig(
        run=run_dir, data=data,
        cache=cache or (Path(config["cache"]) if same else default_artifacts(data) / "cache"),
        splits=tuple(splits) or tuple(config["eval_splits"]), labels_file=labels_file,
        name=name, **common)
    return _run_stage2(run_predict, cfg)


def _predict_exported(run_dir, name, out, common, data, splits, cache, labels_file) -> list[dict]:
    """An exported oracle over one labelled split: --cache (and --data) name it, as the folder
    keeps no run's data; the output file goes to --out-file."""
    from pipeline.oracle.deploy.exported import predict_split
    from pipeline.oracle.deploy.predict import PredictConfig

    cfg = PredictConfig(run=run_dir, data=data, cache=cache, splits=tuple(splits),
                        labels_file=labels_file, name=name, out=out, **common)
    return _run_stage2(predict_split, cfg)


def _print_predictions(s: dict) -> None:
    trust = s["trust"]
    how = (f"--target {trust['chosen_by']} on {trust['reached']['rows']} held-out rows"
           if trust["chosen_by"] != "--threshold" else "--threshold")
    got = trust.get("reached") or {}
    if got:
        how += (f" (there: TPR {_num(got['tpr'])}, FPR {_num(got['fpr'])}, coverage "
                f"{_num(got['coverage'])}, selective risk {_num(got['risk'])})")
    click.echo(f"threshold {trust['threshold']:.6g} on the oracle's confidence, from {how}")
    click.echo(f"{s['rows']} image(s), {s['trusted']} trusted, "
               f"{s['rows'] - s['trusted'] - len(s['undecodable'])} not trusted"
               + (f", {len(s['undecodable'])} undecodable (listed in the table)"
                  if s["undecodable"] else ""))
    for path in s["undecodable"][:5]:
        click.echo(f"  undecodable: {path}")
    click.echo(f"predictions: {s['table']} (threshold and how it was chosen: {s['meta']})")


def _num(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"
