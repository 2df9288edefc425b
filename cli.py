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
from pipeline.corruptions import CORRUPTIONS

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
@click.option("--workers", default=8, show_default=True, help="DataLoader worker processes.")
@click.option("--precision", type=click.Choice(PRECISIONS), default="bf16", show_default=True)
@click.option("--device", default=None, help="cuda, cuda:1, cpu... Default: cuda if available.")
@click.option("--weights", default=None, help="Local weights file instead of the hub download.")
@click.option("--random-init", is_flag=True, help="No pretrained weights (tests, benchmarks).")
@click.option("--model-kwargs", default=None, help='JSON for timm.create_model, e.g. \'{"depth": 2}\'.')
@click.option("--preprocess", type=click.Choice(["model", "paper"]), default="model",
              show_default=True, help="model: the model's timm eval config; paper: the authors' "
              "square resize, mean = std = 0.5.")
@click.option("--features", is_flag=True, help="Also store pooled pre-logit features (fp16).")
@click.option("--flip-view", is_flag=True, help="Also store outputs for the horizontally flipped "
              "image, so oracle training can use the target of the view it shows.")
@click.option("--skip-bad", is_flag=True, help="Record undecodable images as invalid rows "
              "instead of stopping.")
@click.option("--shard-size", default=10_000, show_default=True, help="Rows per HDF5 shard.")
@click.option("--compile", "compile_", is_flag=True, help="torch.compile the classifier.")
@click.option("--corruption", default=None, type=click.Choice(CORRUPTIONS), help="ImageNet-C-"
              "style corruption applied to every image before resizing (pipeline/corruptions.py).")
@click.option("--severity", default=3, show_default=True, type=click.IntRange(1, 5))
@click.option("--seed", default=0, show_default=True, help="Seed for random init and corruptions.")
@click.option("--no-progress", is_flag=True)
def extract(classifier, data, splits, out, labels_file, batch_size, workers, precision, device,
            weights, random_init, model_kwargs, preprocess, features, flip_view, skip_bad,
            shard_size, compile_, corruption, severity, seed, no_progress):
    """Stage 1: run a frozen classifier over dataset split(s) once; cache logits and targets."""
    from cache.reader import cache_dir_for, split_tag
    from pipeline import dist
    from pipeline.extract import ExtractConfig, extract as run_extract
    from pipeline.sources import default_splits

    root = out or default_artifacts(data) / "cache"
    kwargs = _json_option(model_kwargs, "--model-kwargs")
    for split in splits or default_splits(data):
        tag = split_tag(split, corruption, severity)
        cfg = ExtractConfig(
            classifier=classifier, out=cache_dir_for(root, classifier, tag), data=data,
            split=split, labels_file=labels_file, batch_size=batch_size, workers=workers,
            precision=precision, device=device, weights=weights, random_init=random_init,
            model_kwargs=kwargs, preprocess=preprocess, features=features, flip_view=flip_view,
            skip_bad=skip_bad, shard_size=shard_size, compile=compile_, corruption=corruption,
            severity=severity if corruption else 0, seed=seed, progress=not no_progress)
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


def main() -> None:
    cli(prog_name="cli.py")


if __name__ == "__main__":
    main()
