"""``cli.py fit-classifier``: options -> ``FitConfig`` -> one ``fit`` call."""
from __future__ import annotations

from pathlib import Path

import click

from pipeline.core.options import (BATCH_SIZE, CLASSIFIER, DATA, DEVICE, FRACTION, LABELS,
                                   MODEL_KWARGS, NO_PROGRESS, NON_NEGATIVE, PRECISION, SEED_OPT,
                                   WEIGHTS, WORKERS, FiniteFloatRange, Opt, options, positive)


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


@click.command("fit-classifier")
@options(
    CLASSIFIER.but(help="Embedded preset (vit, resnet: the small models of "
                   "pipeline/core/presets.py) or any timm model name."),
    DATA,
    Opt(("--split",), help="Split to fit on. Default: clf-train on Fashion-MNIST and where "
        "ROOT/clf-train/ exists (images kept apart from the oracles' train), else train, with a "
        "warning: the split train-oracle trains the oracles on by default."),
    Opt(("--out",), type=click.Path(path_type=Path), help="Checkpoint file. Default: "
        "artifacts/<name of the --data folder>/classifiers/<classifier>.pt; the embedded "
        "presets: artifacts/fashion-mnist/classifiers/ (where extract finds them; pass other "
        "files to extract with --weights)."),
    LABELS.but(help="Labels file for a flat split folder."),
    Opt(("--num-classes",), default="auto", show_default=True, callback=_num_classes_option,
        help="Classifier outputs: 'auto' = the dataset's number of classes."),
    MODEL_KWARGS,
    WEIGHTS.but(help="Start from this weights file (the classifier head is re-initialised when "
                "its shape differs)."),
    Opt(("--pretrained",), is_flag=True, help="Start from timm's hub weights."),
    Opt(("--epochs",), type=click.IntRange(1), help="Hyperparameter defaults: "
        "pipeline/core/presets.py (EMBEDDED_FIT for the embedded vit/resnet, DEFAULT_FIT "
        "otherwise)."),
    BATCH_SIZE,
    Opt(("--lr",), type=positive(), help="AdamW peak LR."),
    Opt(("--weight-decay",), type=NON_NEGATIVE),
    Opt(("--warmup-epochs",), type=NON_NEGATIVE),
    Opt(("--pad",), type=click.IntRange(0), help="Random-crop padding (px)."),
    Opt(("--flip/--no-flip",), help="Random horizontal flip."),
    Opt(("--label-smoothing",), type=FRACTION),
    Opt(("--val-fraction",), type=FiniteFloatRange(0, 1, min_open=True, max_open=True),
        help="Seeded share of the split held out and scored."),
    Opt(("--max-samples",), type=click.IntRange(2), help="Fit on a seeded subset of N images of "
        "the split."),
    WORKERS.but(help="DataLoader worker processes. Default: 0 for the embedded vit/resnet "
                "(presets.EMBEDDED_FIT), else the cores minus one, at most 8."),
    PRECISION,
    DEVICE,
    SEED_OPT.but(help="Init, held-out rows, order, augmentation."),
    Opt(("--force",), is_flag=True, help="Retrain even if the checkpoint exists."),
    NO_PROGRESS,
)
def fit_classifier(classifier, data, split, out, labels_file, num_classes, model_kwargs, weights,
                   pretrained, epochs, batch_size, lr, weight_decay, warmup_epochs, pad, flip,
                   label_smoothing, val_fraction, max_samples, workers, precision, device, seed,
                   force, no_progress):
    """Train a base classifier (random init by default) and save a checkpoint extract loads."""
    # The stage is imported on call: a command loads only its own stage, and `cli.py report`
    # stays free of torch.
    from pipeline.classifier.fit import FitConfig, fit

    if weights and pretrained:
        raise click.UsageError("--weights and --pretrained exclude each other")
    hparams = dict(epochs=epochs, batch_size=batch_size, lr=lr, weight_decay=weight_decay,
                   warmup_epochs=warmup_epochs, pad=pad, flip=flip, label_smoothing=label_smoothing,
                   val_fraction=val_fraction, workers=workers, precision=precision)
    cfg = FitConfig(classifier=classifier, data=data, split=split, out=out,
                    labels_file=labels_file, num_classes=num_classes,
                    model_kwargs=model_kwargs, weights=weights,
                    pretrained=pretrained, hparams=hparams, max_samples=max_samples,
                    device=device, seed=seed, force=force, progress=not no_progress)
    result = fit(cfg)
    m = result["meta"]
    if result["skipped"]:
        click.echo(f"{result['out']} exists (held-out accuracy {100 * m['held_out_accuracy']:.2f}%"
                   f", fitted {result['fitted']}): nothing to do; --force retrains")
        for note in result["notes"]:
            click.echo(f"warning: it differs from what this command would fit: {note}", err=True)
        return
    for note in result["notes"]:
        click.echo(f"note: {note}", err=True)
    for warning in result["warnings"]:
        click.echo(f"warning: {warning}", err=True)
    t = result["timing"]
    click.echo(f"fit-classifier {classifier} ({m['model']}, "
               f"{m['hparams']['epochs']} epochs on {m['train_rows']} images of "
               f"{m['dataset']}/{m['split']}, {t['train_s']:.1f}s, {t['img_per_s']:.0f} img/s): "
               f"held-out accuracy {100 * m['held_out_accuracy']:.2f}% on {m['held_out_rows']} "
               f"images; saved {result['out']}")
