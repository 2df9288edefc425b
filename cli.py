"""Command line: options -> a frozen config dataclass -> one call into ``pipeline``.

    python cli.py extract --classifier vit            # stage 1 (embedded Fashion-MNIST default)
    torchrun --nproc-per-node 4 cli.py extract --classifier vit --data /imagenet --split train
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from pipeline.precision import PRECISIONS
from pipeline.corruption_params import CORRUPTIONS

# Errors a user can fix: printed as one clear message, exit code 1 (no traceback).
def _user_errors() -> tuple[type[BaseException], ...]:
    from cache.schema import CacheError
    from pipeline.data import BadImageError
    from pipeline.models import ModelError
    from pipeline.sources import DataError
    return CacheError, DataError, ModelError, BadImageError


def _first_line_of_worker_error(err: BaseException) -> str:
    """DataLoader re-raises worker errors with the worker traceback; keep the original message."""
    text = str(err)
    if "Original Traceback" in text:
        last = [l for l in text.splitlines() if l.strip()][-1]
        return last.split(": ", 1)[-1]
    return text


class Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo("interrupted: completed work is kept; re-run the same command to resume",
                       err=True)
            sys.exit(130)
        except _user_errors() as err:
            click.echo(f"error: {_first_line_of_worker_error(err)}", err=True)
            sys.exit(1)


def _json_option(value: str | None, name: str) -> dict:
    if not value:
        return {}
    try:
        out = json.loads(value)
    except json.JSONDecodeError as err:
        raise click.BadParameter(f"not valid JSON ({err}): {value!r}", param_hint=name) from None
    if not isinstance(out, dict):
        raise click.BadParameter(f"expected a JSON object, got {value!r}", param_hint=name)
    return out


def _embedded_data(data: str | None) -> bool:
    """The embedded Fashion-MNIST, or a --data folder holding its four idx files."""
    from pipeline.sources import _has_idx_files, is_embedded
    return is_embedded(data) or _has_idx_files(Path(data))


def default_artifacts(data: str | None) -> Path:
    """artifacts/<dataset name>: per-dataset outputs that never collide between datasets."""
    from pipeline.sources import FMNIST_NAME, is_embedded
    return Path("artifacts") / (FMNIST_NAME if is_embedded(data) else Path(data).resolve().name)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
def cli():
    """Trustworthiness oracles (Luo et al., NeurIPS 2021): extract -> train-oracle -> report."""


@cli.command()
@click.option("--classifier", default="vit", show_default=True,
              help="Preset (vit, resnet) or any timm model name.")
@click.option("--data", default=None, help="Dataset root (ImageNet/ImageFolder layout or the four "
              "Fashion-MNIST idx files). Default: the embedded Fashion-MNIST.")
@click.option("--split", "splits", multiple=True, help="Split folder(s) to extract (repeatable). "
              "Default: every train/val/test split present.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Cache root. Default: artifacts/<dataset>/cache. Each split is written to "
              "<out>/<classifier>/<split>[-<corruption>-<severity>].")
@click.option("--labels", "labels_file", default=None, help="Labels file for a flat val/ folder.")
@click.option("--batch-size", default=256, show_default=True)
@click.option("--workers", default=None, type=click.IntRange(0), help="DataLoader worker "
              "processes per process. Default: the usable cores / local ranks, minus one (0 for "
              "the in-memory Fashion-MNIST without --corruption).")
@click.option("--precision", type=click.Choice(PRECISIONS), default="bf16", show_default=True)
@click.option("--device", default=None, help="cuda, cuda:1, cpu... Default: cuda if available.")
@click.option("--weights", default=None, help="Local weights file instead of the hub download.")
@click.option("--random-init", is_flag=True, help="No pretrained weights (tests, benchmarks).")
@click.option("--model-kwargs", default=None, help='JSON for timm.create_model, e.g. \'{"depth": 2}\'.')
@click.option("--preprocess", type=click.Choice(["model", "paper"]), default="model",
              show_default=True, help="model: the model's timm eval config; paper: the authors' "
              "square resize, mean = std = 0.5.")
@click.option("--features", is_flag=True, help="Also store pooled pre-logit features (fp16).")
@click.option("--flip-view/--no-flip-view", default=None, help="Also store outputs for the "
              "horizontally flipped image, so oracle training can use the target of the view it "
              "shows. Default: on for the embedded Fashion-MNIST (presets.EMBEDDED_EXTRACT, so "
              "the bare command matches the demo's caches), off elsewhere.")
@click.option("--skip-bad", is_flag=True, help="Record undecodable images as invalid rows "
              "instead of stopping.")
@click.option("--shard-size", default=3125, show_default=True, type=click.IntRange(1),
              help="Rows per HDF5 shard, the unit of resume and of the split between torchrun "
              "processes (ImageNet val = 16 equal shards: 1, 2, 4, 8 or 16 GPUs share it evenly).")
@click.option("--compile", "compile_", is_flag=True, help="torch.compile the classifier.")
@click.option("--decode", type=click.Choice(["cpu", "gpu", "mixed"]), default="cpu",
              show_default=True, help="Where JPEGs are decoded: cpu (loader workers), gpu "
              "(batched nvJPEG on the device, resize there too) or mixed (even rows on the device, "
              "odd rows in the workers). Other formats always decode on the CPU.")
@click.option("--corruption", default=None, type=click.Choice(CORRUPTIONS), help="ImageNet-C-"
              "style corruption applied to every image before resizing (pipeline/corruptions.py).")
@click.option("--severity", default=3, show_default=True, type=click.IntRange(1, 5))
@click.option("--seed", default=0, show_default=True, help="Seed for random init and corruptions.")
@click.option("--no-progress", is_flag=True)
def extract(classifier, data, splits, out, labels_file, batch_size, workers, precision, device,
            weights, random_init, model_kwargs, preprocess, features, flip_view, skip_bad,
            shard_size, compile_, decode, corruption, severity, seed, no_progress):
    """Stage 1: run a frozen classifier over dataset split(s) once; cache logits and targets."""
    from cache.manifest import check_cache_root
    from cache.reader import cache_dir_for, split_tag
    from pipeline import dist
    from pipeline.extract import ExtractConfig, extract as run_extract
    from pipeline.sources import check_splits, default_splits

    if weights and random_init:
        raise click.UsageError("--weights and --random-init exclude each other")
    root = out or default_artifacts(data) / "cache"
    check_cache_root(root)
    if flip_view is None:
        from pipeline.presets import EMBEDDED_EXTRACT
        flip_view = _embedded_data(data) and EMBEDDED_EXTRACT["flip_view"]
    kwargs = _json_option(model_kwargs, "--model-kwargs")
    splits = splits or default_splits(data)
    check_splits(data, splits)
    for split in splits:
        tag = split_tag(split, corruption, severity)
        cfg = ExtractConfig(
            classifier=classifier, out=cache_dir_for(root, classifier, tag), data=data,
            split=split, labels_file=labels_file, batch_size=batch_size, workers=workers,
            precision=precision, device=device, weights=weights, random_init=random_init,
            model_kwargs=kwargs, preprocess=preprocess, features=features, flip_view=flip_view,
            skip_bad=skip_bad, shard_size=shard_size, compile=compile_, decode=decode,
            corruption=corruption, severity=severity if corruption else 0, seed=seed,
            progress=not no_progress)
        summary = run_extract(cfg)
        if dist.info().is_main:
            _print_extract_summary(split, summary)
    dist.shutdown(dist.info())


def _print_extract_summary(split: str, s: dict) -> None:
    state = "already complete" if s["already_complete"] else (
        f"{s['computed_rows']} rows in {s['elapsed_s']:.1f}s ({s['img_per_s']} img/s)")
    bad = f", {s['bad_rows']} bad row(s) recorded" if s["bad_rows"] else ""
    click.echo(f"[{split}] {s['rows']} rows, accuracy {100 * s['accuracy']:.2f}%{bad}; "
               f"{state}; cache: {s['out']}")


def _default_workers() -> int:
    import os

    from pipeline import dist
    try:
        from pipeline.data import default_workers
    except ImportError:  # a pipeline.data without it
        return max(1, min(8, (os.cpu_count() or 2) - 1))
    return default_workers(int(os.environ.get("LOCAL_WORLD_SIZE", dist.info().world)))


def _preset_text(name: str) -> str:
    from pipeline import presets
    return ", ".join(f"{k} {v}" for k, v in getattr(presets, name).items() if v is not None)


def _run_stage2(fn, *args):
    """Option misfits -> usage error (exit 2); run-directory problems and NaN -> exit 1."""
    from pipeline.losses import LossOptionError
    from pipeline.runs import RunError
    try:
        return fn(*args)
    except LossOptionError as err:
        raise click.UsageError(str(err)) from None
    except RunError as err:
        raise click.ClickException(str(err)) from None


@cli.command("train-oracle")
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
@click.option("--seed", default=0, show_default=True)
@click.option("--weights", default=None, help="Oracle backbone weights file instead of the hub.")
@click.option("--random-init", is_flag=True, help="Random oracle backbone (tests, benchmarks).")
@click.option("--model-kwargs", default=None, help="JSON for the oracle's timm.create_model.")
@click.option("--preprocess", type=click.Choice(["model", "paper"]), default=None,
              help="Oracle preprocessing. Default: the classifier cache's.")
@click.option("--z", "z_head", type=click.Choice(["hyperplane", "linear"]), default=None,
              help="SS only: signed distance (w.x+b)/(|w|+1e-7) (default) or plain w.x+b.")
@click.option("--gamma", type=float, default=None, help="Focal only. Default 2 (0.5 with "
              "--class-balanced, as the paper's class-balanced runs).")
@click.option("--alpha-pos", type=float, default=None, help="SS only: slope of the correct "
              "class. Default by oracle: ViT 1, ResNet 2.")
@click.option("--alpha-neg", type=float, default=None, help="SS only: slope of the incorrect "
              "class. Default by oracle: ViT 3, ResNet 5.")
@click.option("--class-balanced", is_flag=True, help="ce/focal/ss: Cui et al. effective-number "
              "weights from the training rows' correctness.")
@click.option("--cb-beta", type=float, default=None, help="Class-balanced beta (default 0.999).")
@click.option("--pos-weight", type=float, default=None, help="ce/focal/ss: weight of correct rows.")
@click.option("--neg-weight", type=float, default=None, help="ce/focal/ss: weight of incorrect rows.")
@click.option("--authors-broadcast", "broadcast", is_flag=True, help="ce/focal: reproduce the "
              "authors' shape bug ((B,1) outputs x (B,) labels -> mean over all BxB pairs).")
@click.option("--lr", type=float, default=None, help="Peak LR. Defaults of this and of the "
              "options marked [preset]: the paper's protocol, pipeline/presets.py PAPER_ORACLE "
              f"({_preset_text('PAPER_ORACLE')}); on the embedded Fashion-MNIST EMBEDDED_ORACLE "
              f"({_preset_text('EMBEDDED_ORACLE')}). run.json records the resolved values.")
@click.option("--weight-decay", type=float, default=None, help="[preset]")
@click.option("--momentum", type=float, default=None, help="[preset]")
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
@click.option("--val-fraction", default=0.05, show_default=True, help="Held-out rows carved "
              "from the training split to choose the checkpoint (0: keep the final model).")
@click.option("--val-every", type=click.IntRange(1), default=None, help="[preset] Validate "
              "every N steps (default: 4 times per run) and at the end.")
@click.option("--split-seed", default=0, show_default=True, help="Seed of --train-limit and "
              "the held-out rows (shared by every --seed).")
@click.option("--precision", type=click.Choice(PRECISIONS), default=None, help="[preset]")
@click.option("--channels-last/--no-channels-last", default=True, show_default=True)
@click.option("--compile", "compile_", is_flag=True, help="torch.compile the training step.")
@click.option("--device", default=None, help="cuda, cuda:1, cpu... Default: cuda if available.")
@click.option("--workers", default=None, type=click.IntRange(0), help="DataLoader workers per "
              "process. Default: the usable cores / local ranks, minus one.")
@click.option("--eval-batch-size", default=256, show_default=True)
@click.option("--ckpt-every", default=2000, show_default=True, type=click.IntRange(1))
@click.option("--log-every", default=10, show_default=True, type=click.IntRange(1))
@click.option("--stop-at-step", type=click.IntRange(1), default=None, help="Stop cleanly after "
              "step N (checkpoint written), e.g. to fit a job's time limit; re-run to continue.")
@click.option("--resume", is_flag=True, help="Require a checkpoint to continue from (an "
              "incomplete run is resumed anyway; this refuses to start afresh).")
@click.option("--no-progress", is_flag=True)
def train_oracle(classifier, oracle, loss, data, cache, out, labels_file, train_split, eval_splits,
                 runs_root, seed, weights, random_init, model_kwargs, preprocess, z_head, gamma,
                 alpha_pos, alpha_neg, class_balanced, cb_beta, pos_weight, neg_weight, broadcast, lr,
                 weight_decay, momentum, warmup_steps, cycle_momentum, batch_size, accum_steps,
                 epochs, flip, train_limit, val_fraction, val_every, split_seed, precision,
                 channels_last, compile_, device, workers, eval_batch_size, ckpt_every, log_every,
                 stop_at_step, resume, no_progress):
    """Stage 2: train an oracle on cached classifier targets; score the eval split(s)."""
    from pipeline import dist
    from pipeline.train import TrainConfig, train

    artifacts = default_artifacts(data)
    cfg = TrainConfig(
        classifier=classifier, loss=loss, oracle=oracle, data=data,
        cache=str(cache or artifacts / "cache"), artifacts=str(artifacts),
        out=str(out) if out else None, runs_root=str(runs_root) if runs_root else None,
        labels_file=labels_file, train_split=train_split,
        eval_splits=tuple(eval_splits), seed=seed, weights=weights, random_init=random_init,
        model_kwargs=_json_option(model_kwargs, "--model-kwargs"), preprocess=preprocess,
        z=z_head, gamma=gamma, alpha_pos=alpha_pos, alpha_neg=alpha_neg,
        class_balanced=class_balanced, cb_beta=cb_beta, pos_weight=pos_weight,
        neg_weight=neg_weight, broadcast=broadcast, lr=lr, weight_decay=weight_decay,
        momentum=momentum, warmup_steps=warmup_steps, cycle_momentum=cycle_momentum,
        batch_size=batch_size, accum_steps=accum_steps, epochs=epochs, flip=flip,
        train_limit=train_limit, val_fraction=val_fraction, val_every=val_every,
        split_seed=split_seed, precision=precision, channels_last=channels_last,
        compile=compile_, device=device, workers=_default_workers() if workers is None else workers,
        eval_batch_size=eval_batch_size, ckpt_every=ckpt_every, log_every=log_every,
        stop_at_step=stop_at_step, resume=resume, progress=not no_progress)
    summary = _run_stage2(train, cfg)
    if dist.info().is_main:
        _print_train_summary(summary)
    dist.shutdown(dist.info())


def _print_train_summary(s: dict) -> None:
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


@cli.command()
@click.option("--run", "run_dir", required=True, type=click.Path(path_type=Path, exists=True,
              file_okay=False), help="A finished train-oracle run directory.")
@click.option("--data", default=None, help="Dataset root. Default: the run's training data.")
@click.option("--split", "splits", multiple=True, help="Cache tag(s) to score (repeatable). "
              "Default: the run's evaluation splits.")
@click.option("--cache", type=click.Path(path_type=Path), default=None, help="Cache root of "
              "--data (its classifier cache gives correctness). Default: artifacts/<dataset>/cache.")
@click.option("--labels", "labels_file", default=None, help="Labels file for a flat val/ folder.")
@click.option("--name", default=None, help="Output file stem (outputs/<name>.h5) for one --split. "
              "Default: the split tag (prefixed by the dataset name for other datasets).")
@click.option("--batch-size", default=256, show_default=True)
@click.option("--workers", default=None, type=click.IntRange(0))
@click.option("--precision", type=click.Choice(PRECISIONS), default="bf16", show_default=True)
@click.option("--device", default=None)
@click.option("--no-progress", is_flag=True)
def predict(run_dir, data, splits, cache, labels_file, name, batch_size, workers, precision,
            device, no_progress):
    """Score new data with a trained run's chosen oracle; writes RUN/outputs/<tag>.h5."""
    from pipeline import dist
    from pipeline.predict import PredictConfig, predict as run_predict
    from pipeline.runs import read_run_file

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



@cli.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=str))
@click.option("--runs-root", default=None, help="Directory searched (recursively) for run "
              "directories. Default, when no RUN_DIR/--cache is given: artifacts/fashion-mnist/runs.")
@click.option("--metrics", type=click.Choice(["paper", "standard", "both"]), default="both",
              show_default=True, help="paper: the authors' definitions; standard: exact FPR95, "
              "negated AUPR-Error, AURC/E-AURC/AUGRC; both: every table twice (docs/METRICS.md).")
@click.option("--format", "formats", multiple=True, type=click.Choice(["md", "csv", "latex", "json"]),
              help="Output format(s) (repeatable). Default: all four.")
@click.option("--out", default=None, help="Report directory. Default: artifacts/<dataset>/report.")
@click.option("--cache", "caches", multiple=True, help="Classifier cache directory or cache root "
              "(repeatable): post-hoc baseline rows (MCP, entropy, max logit, energy, DOCTOR) and "
              "where to find caches that moved since the runs were trained.")
@click.option("--split", "splits", multiple=True, help="Only these split tags (repeatable).")
@click.option("--jobs", default=0, show_default=True, type=click.IntRange(0),
              help="Parallel worker processes (0: one per CPU core, at most one per file).")
@click.option("--no-figures", is_flag=True, help="Skip the PNG figures.")
def report(paths, runs_root, metrics, formats, out, caches, splits, jobs, no_figures):
    """Stage 3: tables (paper Table 1 / A4), figures and post-hoc baselines from run directories
    (RUN_DIR ... or a directory of runs) and classifier caches; no model is loaded."""
    from pipeline.report import FORMATS, ReportConfig, report as run_report

    cfg = ReportConfig(paths=tuple(paths), runs_root=runs_root, caches=tuple(caches),
                       metrics=metrics, formats=tuple(formats) or FORMATS, out=out,
                       splits=tuple(splits), jobs=jobs, figures=not no_figures)
    s = run_report(cfg)
    for skipped in s["skipped"]:
        click.echo(f"skipped {skipped['run_dir']}: {skipped['reason']}", err=True)
    click.echo(f"report: {s['outputs']} output file(s) from {s['runs']} run(s), {s['caches']} "
               f"classifier cache(s), {s['groups']} table row(s) over split(s) "
               f"{', '.join(s['splits'])} in {s['elapsed_s']:.1f}s")
    for path in s["files"]:
        click.echo(f"  wrote {path}")


def _num_classes_option(ctx, param, value):
    if value in (None, "auto"):
        return None
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 2:
        raise click.BadParameter(f"expected 'auto' or an integer >= 2, got {value!r}")
    return n


@cli.command("fit-classifier")
@click.option("--classifier", default="vit", show_default=True, help="Embedded preset (vit, "
              "resnet: the small models of pipeline/presets.py) or any timm model name.")
@click.option("--data", default=None, help="Dataset root (ImageFolder layout or the four "
              "Fashion-MNIST idx files). Default: the embedded Fashion-MNIST.")
@click.option("--split", default=None, help="Split to fit on. Default: clf-train on Fashion-MNIST "
              "(disjoint from the oracles' train), else train.")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Checkpoint file. "
              "Default: artifacts/<dataset>/classifiers/<classifier>.pt (where extract finds the "
              "embedded presets; pass other files to extract with --weights).")
@click.option("--labels", "labels_file", default=None, help="Labels file for a flat split folder.")
@click.option("--num-classes", default="auto", show_default=True, callback=_num_classes_option,
              help="Classifier outputs: 'auto' = the dataset's number of classes.")
@click.option("--model-kwargs", default=None, help='JSON for timm.create_model, e.g. \'{"depth": 2}\'.')
@click.option("--weights", default=None, help="Start from this weights file (the classifier head "
              "is re-initialised when its shape differs).")
@click.option("--pretrained", is_flag=True, help="Start from timm's hub weights.")
@click.option("--epochs", type=click.IntRange(1), default=None,
              help="Hyperparameter defaults: pipeline/presets.py (EMBEDDED_FIT for the embedded "
              "vit/resnet, DEFAULT_FIT otherwise).")
@click.option("--batch-size", type=click.IntRange(1), default=None)
@click.option("--lr", type=click.FloatRange(0, min_open=True), default=None, help="AdamW peak LR.")
@click.option("--weight-decay", type=click.FloatRange(0), default=None)
@click.option("--warmup-epochs", type=click.FloatRange(0), default=None)
@click.option("--pad", type=click.IntRange(0), default=None, help="Random-crop padding (px).")
@click.option("--flip/--no-flip", default=None, help="Random horizontal flip.")
@click.option("--label-smoothing", type=click.FloatRange(0, 1, max_open=True), default=None)
@click.option("--val-fraction", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              default=None, help="Seeded share of the split held out and scored.")
@click.option("--max-samples", type=click.IntRange(2), default=None,
              help="Fit on a seeded subset of N images of the split.")
@click.option("--workers", type=click.IntRange(0), default=None, help="DataLoader workers.")
@click.option("--precision", type=click.Choice(PRECISIONS), default=None,
              help="Default: bf16 on CUDA, fp32 on CPU.")
@click.option("--device", default=None, help="cuda, cuda:1, cpu... Default: cuda if available.")
@click.option("--seed", default=0, show_default=True, help="Init, held-out rows, order, augmentation.")
@click.option("--force", is_flag=True, help="Retrain even if the checkpoint exists.")
@click.option("--no-progress", is_flag=True)
def fit_classifier(classifier, data, split, out, labels_file, num_classes, model_kwargs, weights,
                   pretrained, epochs, batch_size, lr, weight_decay, warmup_epochs, pad, flip,
                   label_smoothing, val_fraction, max_samples, workers, precision, device, seed,
                   force, no_progress):
    """Train a base classifier (random init by default) and save a checkpoint extract loads."""
    from pipeline.fit_classifier import FitConfig, fit

    if weights and pretrained:
        raise click.UsageError("--weights and --pretrained exclude each other")
    hparams = dict(epochs=epochs, batch_size=batch_size, lr=lr, weight_decay=weight_decay,
                   warmup_epochs=warmup_epochs, pad=pad, flip=flip, label_smoothing=label_smoothing,
                   val_fraction=val_fraction, workers=workers, precision=precision)
    cfg = FitConfig(classifier=classifier, data=data, split=split, out=out,
                    labels_file=labels_file, num_classes=num_classes,
                    model_kwargs=_json_option(model_kwargs, "--model-kwargs"), weights=weights,
                    pretrained=pretrained, hparams=hparams, max_samples=max_samples,
                    device=device, seed=seed, force=force, progress=not no_progress)
    result = fit(cfg)
    m = result["meta"]
    if result["skipped"]:
        click.echo(f"{result['out']} exists (held-out accuracy {100 * m['held_out_accuracy']:.2f}%"
                   f", fitted {m.get('created', '?')}): nothing to do; --force retrains")
        for note in result["notes"]:
            click.echo(f"warning: it differs from what this command would fit: {note}", err=True)
        return
    for note in result["notes"]:
        click.echo(f"note: {note}", err=True)
    click.echo(f"fit-classifier {classifier} ({m['model']}, "
               f"{m['hparams']['epochs']} epochs on {m['train_rows']} images of "
               f"{m['dataset']}/{m['split']}, {m['train_s']:.1f}s, {m['img_per_s']:.0f} img/s): "
               f"held-out accuracy {100 * m['held_out_accuracy']:.2f}% on {m['held_out_rows']} "
               f"images; saved {result['out']}")


def _names_option(choices: tuple[str, ...] | None):
    """Comma-separated names (e.g. vit,resnet); '' = none; checked against ``choices``."""
    def parse(ctx, param, value):
        if value is None:
            return None
        names = tuple(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
        bad = [n for n in names if choices and n not in choices]
        if bad:
            raise click.BadParameter(f"{bad[0]!r} is not one of {', '.join(choices)}")
        return names
    return parse


def _args_option(ctx, param, value):
    import shlex
    return tuple(shlex.split(value)) if value else ()


@cli.command()
@click.option("--seeds", type=click.IntRange(1), default=None, help="Seeds 0..N-1 of every "
              "run. Default: presets.DEMO (1, to stay within ~15 minutes on 2 CPU cores).")
@click.option("--full", is_flag=True, help="The paper's 3-seed grid (same as --seeds 3); seeds "
              "already trained are skipped.")
@click.option("--data", default=None, help="The four Fashion-MNIST idx files, if the embedded "
              "copy (Debian package dataset-fashion-mnist) is not installed.")
@click.option("--corruption", type=click.Choice(CORRUPTIONS), default=None, help="Shifted "
              "domain (paper Table 3 analogue). Default: presets.DEMO (gaussian_noise).")
@click.option("--severity", type=click.IntRange(1, 5), default=None,
              help="Default: presets.DEMO (5).")
@click.option("--classifiers", callback=_names_option(None), default=None,
              help="Comma-separated classifiers. Default: vit,resnet.")
@click.option("--oracles", callback=_names_option(None), default=None,
              help="Comma-separated oracle backbones. Default: vit,resnet.")
@click.option("--losses", callback=_names_option(("ce", "focal", "tcp", "ss")), default=None,
              help="Default: ce,focal,tcp,ss.")
@click.option("--broadcast-losses", callback=_names_option(("ce", "focal")), default=None,
              help="Losses also trained in the authors' broadcasting variant. Default: ce,focal.")
@click.option("--fit-args", callback=_args_option, help="Extra options for every "
              "fit-classifier command (quoted), e.g. '--max-samples 2000'.")
@click.option("--extract-args", callback=_args_option, help="Extra options for every extract.")
@click.option("--train-args", callback=_args_option, help="Extra options for every "
              "train-oracle, e.g. '--train-limit 0' (every row).")
@click.option("--report-args", callback=_args_option, help="Extra options for report.")
@click.option("--dry-run", is_flag=True, help="Print the commands and stop.")
@click.option("--no-progress", is_flag=True, help="No progress bars in the steps.")
def demo(seeds, full, data, corruption, severity, classifiers, oracles, losses, broadcast_losses,
         fit_args, extract_args, train_args, report_args, dry_run, no_progress):
    """The whole pipeline on the embedded Fashion-MNIST through the cli.py commands a user would
    type (each printed before it runs): fit-classifier, extract, train-oracle for every
    <oracle, classifier> pair and loss, report. Re-running skips completed steps."""
    from pipeline.demo import DemoConfig, DemoError, run
    from pipeline.presets import DEMO

    if full and seeds is not None and seeds != DEMO["full_seeds"]:
        raise click.UsageError(f"--full means --seeds {DEMO['full_seeds']}; give one of them")
    pick = lambda value, key: DEMO[key] if value is None else value  # noqa: E731
    cfg = DemoConfig(
        artifacts=default_artifacts(data), data=data,
        seeds=DEMO["full_seeds"] if full else pick(seeds, "seeds"),
        corruption=pick(corruption, "corruption"), severity=pick(severity, "severity"),
        classifiers=pick(classifiers, "classifiers"), oracles=pick(oracles, "oracles"),
        losses=pick(losses, "losses"), broadcast_losses=pick(broadcast_losses, "broadcast_losses"),
        fit_args=fit_args, extract_args=extract_args, train_args=train_args,
        report_args=report_args, progress=not no_progress, dry_run=dry_run)
    if not cfg.classifiers or not cfg.oracles:
        raise click.UsageError("--classifiers and --oracles need at least one name each")
    try:
        s = run(cfg, echo=click.echo)
    except DemoError as err:
        raise click.ClickException(str(err)) from None
    if dry_run:
        return
    r = s["report"]
    click.echo(f"\ndemo finished: {s['steps']} commands in {s['seconds'] / 60:.1f} min ("
               + ", ".join(f"{k} {v:.0f}s" for k, v in s["by_stage"].items())
               + f"); log {s['log']}")
    click.echo(f"report: {r['markdown']} (splits {', '.join(r['splits'])}; figures in "
               f"{r['dir']}/figures)\n")
    click.echo(r["main_table"])


def main() -> None:
    cli()  # click names the program after argv[0]: cli.py or trust-oracles


if __name__ == "__main__":
    main()
