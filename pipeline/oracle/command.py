"""``cli.py train-oracle`` and ``cli.py predict``: options -> ``TrainConfig`` / ``PredictConfig`` ->
one call."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from pipeline.core.options import (BATCH, FRACTION, NON_NEGATIVE, SEED, device_option,
                                   json_option, output_name_option, positive, preset_text)
from pipeline.core.precision import PRECISIONS
from pipeline.data.sources import default_artifacts


def _default_workers() -> int:
    """DataLoader workers per process: the usable cores / local ranks, minus one."""
    from pipeline.core import dist  # torch: imported on call (see train_oracle)
    from pipeline.data.images import default_workers
    return default_workers(int(os.environ.get("LOCAL_WORLD_SIZE", dist.info().world)))


def _run_stage2(fn, *args):
    """Option misfits -> usage error (exit 2); run-directory problems and NaN -> exit 1."""
    # torch-bearing modules: imported on call (see train_oracle)
    from pipeline.oracle.losses import LossOptionError
    from pipeline.oracle.runs import RunError
    try:
        return fn(*args)
    except LossOptionError as err:
        raise click.UsageError(str(err)) from None
    except RunError as err:
        raise click.ClickException(str(err)) from None


@click.command("train-oracle")
@click.option("--classifier", default="vit", show_default=True, help="The classifier whose "
              "cache holds the targets: preset (vit, resnet) or timm name, as given to extract.")
@click.option("--oracle", default=None, help="Oracle backbone: preset or timm name. Default: "
              "the classifier's name (on Fashion-MNIST vit/resnet = the fitted small models).")
@click.option("--loss", type=click.Choice(["ce", "focal", "tcp", "ss"]), default="ss",
              show_default=True)
@click.option("--data", default=None, help="Dataset root, as given to extract. Default: the "
              "embedded Fashion-MNIST.")
@click.option("--cache", type=click.Path(path_type=Path), default=None,
              help="Cache root given to extract. Default: artifacts/<dataset>/cache.")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Run directory. "
              "Default: artifacts/<dataset>/runs/<oracle>-<classifier>_<loss>[_<variant>]"
              "_seed<N>_<group>; a complete run there is skipped, an incomplete one resumed.")
@click.option("--runs-root", type=click.Path(path_type=Path), default=None, help="Parent of "
              "the default run directory (e.g. one root per preprocessing, for `report "
              "--runs-root`). Default: artifacts/<dataset>/runs.")
@click.option("--labels", "labels_file", default=None, help="Labels file for a flat val/ folder.")
@click.option("--train-split", default="train", show_default=True, help="Cache tag to train on.")
@click.option("--eval-split", "eval_splits", multiple=True, help="Extra cache tag(s) to score "
              "after training (repeatable), e.g. test-defocus_blur-5. The dataset's test "
              "(embedded) / val split is always scored.")
@click.option("--seed", default=0, show_default=True, type=SEED)
@click.option("--weights", default=None, help="Oracle backbone weights file instead of the hub.")
@click.option("--random-init", is_flag=True, help="Random oracle backbone (tests, benchmarks).")
@click.option("--model-kwargs", default=None, help="JSON for the oracle's timm.create_model.")
@click.option("--preprocess", type=click.Choice(["model", "paper"]), default=None,
              help="Oracle preprocessing. Default: the classifier cache's.")
@click.option("--z", "z_head", type=click.Choice(["hyperplane", "linear"]), default=None,
              help="SS only: signed distance (w.x+b)/(|w|+1e-7) (default) or plain w.x+b.")
@click.option("--gamma", type=NON_NEGATIVE, default=None, help="Focal only. Default 2 (0.5 with "
              "--class-balanced, as the paper's class-balanced runs).")
@click.option("--alpha-pos", type=positive(), default=None, help="SS only: slope of the correct "
              "class. Default by oracle: ViT 1, ResNet 2.")
@click.option("--alpha-neg", type=positive(), default=None, help="SS only: slope of the incorrect "
              "class. Default by oracle: ViT 3, ResNet 5.")
@click.option("--class-balanced", is_flag=True, help="ce/focal/ss: Cui et al. effective-number "
              "weights from the training rows' correctness.")
@click.option("--cb-beta", type=positive(max_open_one=True), default=None,
              help="Class-balanced beta (default 0.999).")
@click.option("--pos-weight", type=positive(), default=None,
              help="ce/focal/ss: weight of correct rows.")
@click.option("--neg-weight", type=positive(), default=None,
              help="ce/focal/ss: weight of incorrect rows.")
@click.option("--authors-broadcast", "broadcast", is_flag=True, help="ce/focal: reproduce the "
              "authors' shape bug ((B,1) outputs x (B,) labels -> mean over all BxB pairs).")
@click.option("--lr", type=positive(), default=None, help="Peak LR. Defaults of this and of the "
              "options marked [preset]: the paper's protocol, pipeline/core/presets.py PAPER_ORACLE "
              f"({preset_text('PAPER_ORACLE')}); on the embedded Fashion-MNIST EMBEDDED_ORACLE "
              f"({preset_text('EMBEDDED_ORACLE')}). run.json records the resolved values.")
@click.option("--weight-decay", type=NON_NEGATIVE, default=None, help="[preset]")
@click.option("--momentum", type=FRACTION, default=None, help="[preset] SGD momentum, "
              "0 <= m < 1.")
@click.option("--warmup-steps", type=click.IntRange(0), default=None, help="[preset] OneCycle "
              "warm-up (capped at 30%% of short runs).")
@click.option("--cycle-momentum", is_flag=True, help="OneCycleLR's momentum cycling 0.85-0.95, "
              "which overrode --momentum in the authors' runs (REFERENCE.md).")
@click.option("--batch-size", type=click.IntRange(1), default=None,
              help="[preset] Global batch (all GPUs).")
@click.option("--accum-steps", default=1, show_default=True, type=click.IntRange(1),
              help="Micro-batches per optimizer step and GPU (same global batch).")
@click.option("--epochs", default=None, type=click.IntRange(1), help="[preset]")
@click.option("--flip/--no-flip", default=True, show_default=True, help="Random horizontal flip.")
@click.option("--train-limit", type=click.IntRange(0), default=None, help="[preset] Use a "
              "seeded subset of N training rows; 0 = every row.")
@click.option("--val-fraction", default=0.05, show_default=True, type=FRACTION,
              help="Held-out rows carved "
              "from the training split to choose the checkpoint (0: keep the final model).")
@click.option("--val-every", type=click.IntRange(1), default=None, help="[preset] Validate "
              "every N steps (default: 4 times per run) and at the end.")
@click.option("--split-seed", default=0, show_default=True, type=SEED,
              help="Seed of --train-limit and "
              "the held-out rows (shared by every --seed).")
@click.option("--precision", type=click.Choice(PRECISIONS), default=None, help="[preset]")
@click.option("--channels-last/--no-channels-last", default=True, show_default=True)
@click.option("--compile", "compile_", is_flag=True, help="torch.compile the training step.")
@click.option("--cuda-graph", type=click.Choice(["auto", "on", "off"]), default="auto",
              show_default=True, help="Capture the whole training step (optimizer and "
              "schedule included) in one CUDA graph: auto = where possible (one CUDA process, "
              "no --accum-steps, bf16/fp32; with or without --compile), else eager with a note; "
              "on = refuse "
              "where impossible. run.json's step_path says which ran.")
@click.option("--device", default=None, callback=device_option,
              help="cuda, cuda:1, cpu... Default: cuda if available.")
@click.option("--workers", default=None, type=click.IntRange(0), help="DataLoader workers per "
              "process. Default: the usable cores / local ranks, minus one.")
@click.option("--eval-batch-size", default=256, show_default=True, type=BATCH)
@click.option("--ckpt-every", default=2000, show_default=True, type=click.IntRange(1))
@click.option("--log-every", default=10, show_default=True, type=click.IntRange(1))
@click.option("--stop-at-step", type=click.IntRange(1), default=None, help="Stop cleanly after "
              "step N (checkpoint written), e.g. to fit a job's time limit; re-run to continue.")
@click.option("--resume", is_flag=True, help="Require a checkpoint to continue from (an "
              "incomplete run is resumed anyway; this refuses to start afresh).")
@click.option("--head-only", is_flag=True, help="Freeze the oracle backbone and train its head "
              "on cached features: `extract --features --flip-view` of the ORACLE's model on the "
              "same splits (seconds per run). Writes an ordinary run directory.")
@click.option("--features-cache", type=click.Path(path_type=Path), default=None, help="--head-only:"
              " cache root holding the oracle's feature caches. Default: --cache.")
@click.option("--no-progress", is_flag=True)
@click.pass_context
def train_oracle(ctx, classifier, oracle, loss, data, cache, out, labels_file, train_split, eval_splits,
                 runs_root, seed, weights, random_init, model_kwargs, preprocess, z_head, gamma,
                 alpha_pos, alpha_neg, class_balanced, cb_beta, pos_weight, neg_weight, broadcast, lr,
                 weight_decay, momentum, warmup_steps, cycle_momentum, batch_size, accum_steps,
                 epochs, flip, train_limit, val_fraction, val_every, split_seed, precision,
                 channels_last, compile_, cuda_graph, device, workers, eval_batch_size, ckpt_every,
                 log_every, stop_at_step, resume, head_only, features_cache, no_progress):
    """Stage 2: train an oracle on cached classifier targets; score the eval split(s)."""
    # The stage is imported on call: a command loads only its own stage, and `cli.py report`
    # stays free of torch.
    from pipeline.core import dist
    from pipeline.oracle.train import train

    cfg = config_from_params(ctx.params)
    check_head_only_options(ctx)
    if head_only:
        from pipeline.oracle.headonly import train_head_only
        summary = _run_stage2(lambda c: train_head_only([c])[0], cfg)
    else:
        summary = _run_stage2(train, cfg)
    if dist.info().is_main:
        _print_train_summary(summary)
    dist.shutdown(dist.info())


def config_from_params(params: dict):
    """train-oracle's parsed options -> TrainConfig (also used by ``cli.py sweep``)."""
    from pipeline.oracle.train import TrainConfig

    p = dict(params)
    artifacts = default_artifacts(p["data"])
    same = ("classifier", "loss", "oracle", "data", "labels_file", "train_split", "seed", "weights",
            "random_init", "preprocess", "gamma", "alpha_pos", "alpha_neg", "class_balanced",
            "cb_beta", "pos_weight", "neg_weight", "broadcast", "lr", "weight_decay", "momentum",
            "warmup_steps", "cycle_momentum", "batch_size", "accum_steps", "epochs", "flip",
            "train_limit", "val_fraction", "val_every", "split_seed", "precision",
            "channels_last", "cuda_graph", "device", "eval_batch_size", "ckpt_every", "log_every",
            "stop_at_step", "resume", "head_only")
    path = lambda key: str(p[key]) if p[key] else None  # noqa: E731
    cfg = TrainConfig(
        **{k: p[k] for k in same}, cache=str(p["cache"] or artifacts / "cache"),
        artifacts=str(artifacts), out=path("out"), runs_root=path("runs_root"),
        eval_splits=tuple(p["eval_splits"]),
        model_kwargs=json_option(p["model_kwargs"], "--model-kwargs"), z=p["z_head"],
        compile=p["compile_"], workers=_default_workers() if p["workers"] is None else p["workers"],
        progress=not p["no_progress"], features_cache=path("features_cache"))
    return cfg


# train-oracle options that only the fine-tuned loop uses: refused by name with --head-only.
FINE_TUNE_ONLY = ("accum_steps", "precision", "channels_last", "compile_", "cuda_graph",
                  "workers", "eval_batch_size", "ckpt_every", "stop_at_step", "resume")


def check_head_only_options(ctx: click.Context) -> None:
    """--head-only with an option of the fine-tuned loop (or --features-cache without it): a
    usage error naming the option, instead of silently ignoring it."""
    given = {p.name: p for p in ctx.command.params
             if ctx.get_parameter_source(p.name) == click.core.ParameterSource.COMMANDLINE}
    if not ctx.params.get("head_only"):
        if "features_cache" in given:
            raise click.UsageError("--features-cache applies to --head-only training only")
        return
    wrong = [given[n].opts[0] for n in FINE_TUNE_ONLY if n in given]
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
@click.option("--run", "run_dir", required=True, type=click.Path(path_type=Path, exists=True,
              file_okay=False), help="A finished train-oracle run directory.")
@click.option("--data", default=None, help="Dataset root. Default: the run's training data.")
@click.option("--split", "splits", multiple=True, help="Cache tag(s) to score (repeatable). "
              "Default: the run's evaluation splits.")
@click.option("--cache", type=click.Path(path_type=Path), default=None, help="Cache root of "
              "--data (its classifier cache gives correctness). Default: artifacts/<dataset>/cache.")
@click.option("--labels", "labels_file", default=None, help="Labels file for a flat val/ folder.")
@click.option("--name", default=None, callback=output_name_option,
              help="Output file stem (outputs/<name>.h5) for one --split. "
              "Default: the split tag (prefixed by the dataset name for other datasets).")
@click.option("--batch-size", default=256, show_default=True, type=BATCH)
@click.option("--workers", default=None, type=click.IntRange(0))
@click.option("--precision", type=click.Choice(PRECISIONS), default="bf16", show_default=True)
@click.option("--device", default=None, callback=device_option,
              help="cuda, cuda:1, cpu... Default: cuda if available.")
@click.option("--no-progress", is_flag=True)
def predict(run_dir, data, splits, cache, labels_file, name, batch_size, workers, precision,
            device, no_progress):
    """Score new data with a trained run's chosen oracle; writes RUN/outputs/<tag>.h5."""
    # The stage is imported on call: a command loads only its own stage, and `cli.py report`
    # stays free of torch.
    from pipeline.core import dist
    from pipeline.oracle.predict import PredictConfig, predict as run_predict
    from pipeline.oracle.runs import read_run_file

    config = read_run_file(run_dir)["run"]["config"]
    same = data is None or data == config["data"]
    data = config["data"] if data is None else data
    cfg = PredictConfig(
        run=run_dir, data=data,
        cache=cache or (Path(config["cache"]) if same else default_artifacts(data) / "cache"),
        splits=tuple(splits) or tuple(config["eval_splits"]), labels_file=labels_file,
        name=name, batch_size=batch_size, workers=_default_workers() if workers is None else workers,
        precision=precision, device=device, progress=not no_progress)
    results = _run_stage2(run_predict, cfg)
    if dist.info().is_main:
        for o in results:
            _print_output(o)
    dist.shutdown(dist.info())
