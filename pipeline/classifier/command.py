"""``cli.py fit-classifier``: options -> ``FitConfig`` -> one ``fit`` call."""
from __future__ import annotations

from pathlib import Path

import click

from pipeline.core.commandline import Command, options, typed_flag
from pipeline.core.options import (BATCH_SIZE, CLASSIFIER, DATA, DEVICE, FRACTION, LABELS,
                                   MODEL_KWARGS, NON_NEGATIVE, NO_PROGRESS, PRECISION, SEED_OPT,
                                   WEIGHTS, WORKERS, FloatRange, Opt, positive)
from pipeline.core.presets import DEFAULT_FIT, EMBEDDED_FIT


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


def _preset(key: str, none: str = "") -> str:
    """A hyperparameter's default as --help shows it: DEFAULT_FIT's, then the embedded presets'
    where they differ (pipeline/core/presets.py)."""
    def show(value):
        if value is None:
            return none
        if isinstance(value, bool):
            return "on" if value else "off"
        return f"{value:g}" if isinstance(value, float) else str(value)

    embedded = {n: p[key] for n, p in EMBEDDED_FIT.items() if p.get(key, DEFAULT_FIT[key])
                != DEFAULT_FIT[key]}
    return show(DEFAULT_FIT[key]) + ("; the embedded " + ", ".join(
        f"{n} {show(v)}" for n, v in embedded.items()) if embedded else "")


@click.command("fit-classifier", cls=Command)
@options(
    CLASSIFIER.but(help="Embedded preset (vit, resnet: the small models of "
                   "pipeline/core/presets.py) or any timm model name."),
    DATA,
    Opt(("--split",), group="data", help="Split to fit on: images kept apart from the oracles' "
        "train split; train (what train-oracle trains the oracles on by default) warns.",
        default_text="clf-train on Fashion-MNIST and where ROOT/clf-train/ exists, else train"),
    Opt(("--out-file", "out"), aliases=("--out",), type=click.Path(path_type=Path),
        group="output", metavar="FILE", help="Checkpoint file to write (extract finds the "
        "default one; pass other files to extract with --weights).",
        default_text="artifacts/<name of the --data folder>/classifiers/<classifier>.pt; the "
        "embedded presets: artifacts/fashion-mnist/classifiers/<classifier>.pt"),
    LABELS.but(help="Labels file for a flat split folder."),
    Opt(("--num-classes",), default="auto", callback=_num_classes_option, group="model",
        help="Classifier outputs: 'auto' = the dataset's number of classes."),
    MODEL_KWARGS,
    WEIGHTS.but(help="Start from this weights file (the classifier head is re-initialised when "
                "its shape differs).", default_text="a random initialisation"),
    Opt(("--hub-weights", "pretrained"), aliases=("--pretrained",), is_flag=True,
        group="model", help="Start from timm's hub weights."),
    Opt(("--epochs",), type=click.IntRange(1), group="protocol", help="Training epochs.",
        default_text=_preset("epochs")),
    BATCH_SIZE.but(group="protocol", default_text=_preset("batch_size")),
    Opt(("--lr",), type=positive(), group="protocol", default_text=_preset("lr"),
        help="AdamW peak LR (linear warm-up, then cosine decay)."),
    Opt(("--weight-decay",), type=NON_NEGATIVE, group="protocol", help="AdamW weight decay.",
        default_text=_preset("weight_decay")),
    Opt(("--warmup-epochs",), type=NON_NEGATIVE, group="protocol", help="Linear warm-up of the "
        "LR, in epochs (fractions allowed).", default_text=_preset("warmup_epochs")),
    Opt(("--pad",), type=click.IntRange(0), group="protocol", help="Random-crop padding (px); "
        "0: no random crop.", default_text=_preset("pad")),
    Opt(("--flip/--no-flip",), group="protocol", help="Random horizontal flip.",
        default_text=_preset("flip")),
    Opt(("--label-smoothing",), type=FRACTION, group="protocol", help="Label smoothing of the "
        "cross-entropy.", default_text=_preset("label_smoothing")),
    Opt(("--val-fraction",), type=FloatRange(0, 1, min_open=True, max_open=True),
        group="protocol", help="Seeded share of the split held out and scored.",
        default_text=_preset("val_fraction")),
    Opt(("--max-samples",), type=click.IntRange(2), group="data", help="Fit on a seeded subset "
        "of N images of the split.", default_text="every image"),
    Opt(("--holdout-classes",), group="data", metavar="LIST", help="Classes to leave out of "
        "the fit, comma-separated names or indices of the dataset's classes: the classifier is "
        "fitted and scored on the other classes' rows only, never predicts these, and extract "
        "--new-classes caches their rows as the split <split>-newclass (every prediction wrong).",
        default_text="none"),
    WORKERS.but(help="DataLoader worker processes.", default_text="0 for the embedded "
                "vit/resnet (presets.EMBEDDED_FIT), else the cores minus one, at most 8"),
    PRECISION,
    DEVICE,
    SEED_OPT.but(help="Init, held-out rows, order, augmentation."),
    Opt(("--force",), is_flag=True, group="output", help="Retrain even if the checkpoint "
        "exists."),
    NO_PROGRESS,
)
def fit_classifier(classifier, data, split, out, labels_file, num_classes, model_kwargs, weights,
                   pretrained, epochs, batch_size, lr, weight_decay, warmup_epochs, pad, flip,
                   label_smoothing, val_fraction, max_samples, holdout_classes, workers, precision,
                   device, seed, force, no_progress):
    """Train a base classifier (random init by default) and save a checkpoint extract loads.

    Hyperparameters left out take pipeline/core/presets.py's: EMBEDDED_FIT for the embedded
    vit/resnet, DEFAULT_FIT otherwise (each option's default names both)."""
    # The stage is imported on call: a command loads only its own stage, and `cli.py report`
    # stays free of torch.
    from pipeline.classifier.fit import FitConfig, fit
    from pipeline.data.newclass import parse_holdout

    if weights and pretrained:
        raise click.UsageError(f"--weights and "
                               f"{typed_flag(click.get_current_context(), 'pretrained')} "
                               "exclude each other")
    hparams = dict(epochs=epochs, batch_size=batch_size, lr=lr, weight_decay=weight_decay,
                   warmup_epochs=warmup_epochs, pad=pad, flip=flip, label_smoothing=label_smoothing,
                   val_fraction=val_fraction, workers=workers, precision=precision)
    cfg = FitConfig(classifier=classifier, data=data, split=split, out=out,
                    labels_file=labels_file, num_classes=num_classes,
                    model_kwargs=model_kwargs, weights=weights,
                    pretrained=pretrained, hparams=hparams, max_samples=max_samples,
                    holdout_classes=parse_holdout(holdout_classes),
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
    if m.get("held_out_classes"):
        click.echo(f"classes held out (never predicted; extract --new-classes caches their rows): "
                   f"{', '.join(m['held_out_class_names'])}")


@click.command("import-weights", cls=Command)
@options(
    Opt(("--model",), required=True, group="model", help="timm name of the architecture the "
        "file holds, e.g. tf_efficientnet_lite0."),
    WEIGHTS.but(required=True, default_text=None, help="The weights file to import: a state "
                "dict (torch or safetensors) of that architecture."),
    Opt(("--match",), type=click.Choice(["names", "order"]), default="names", group="model",
        help="Pair the file's tensors with timm's by name, or in order (a port of the same "
        "architecture under other names); every shape is checked either way."),
    Opt(("--input-size",), type=click.IntRange(16), group="data", help="Square input size (px) "
        "the checkpoint's preprocessing records (the whole image: crop 1.0 unless --crop-pct).",
        default_text="the model's own"),
    Opt(("--crop-pct",), type=click.FloatRange(0, 1, min_open=True), group="data",
        help="Centre-crop fraction the preprocessing records.",
        default_text="1 with --input-size, else the model's own"),
    Opt(("--num-classes",), callback=_num_classes_option, group="model", help="Replace the "
        "classifier head with a fresh (seeded, untrained) one of N outputs: an ImageNet backbone "
        "whose features a head-only oracle reads on a dataset of N classes (extract refuses "
        "outputs that do not mean the dataset's classes); its outputs mean nothing until fitted.",
        default_text="the file's head"),
    Opt(("--out-file", "out"), required=True, type=click.Path(path_type=Path), group="output",
        metavar="FILE", help="Project checkpoint to write (give it to any stage's --weights)."),
)
def import_weights(model, weights, match, input_size, crop_pct, num_classes, out):
    """Turn a weights file of a timm architecture, saved by another implementation, into a
    project checkpoint every stage loads with --weights (under any --classifier or --oracle
    name), recording the preprocessing and the source file's sha256."""
    from pipeline.classifier.imported import ImportConfig
    from pipeline.classifier.imported import import_weights as run

    done = run(ImportConfig(model=model, weights=Path(weights), out=out, match=match,
                            input_size=input_size, crop_pct=crop_pct,
                            num_classes=num_classes))
    d = done["data_config"]
    if done["skipped"]:
        click.echo(f"{out} holds this import already (source sha256 {done['sha256'][:12]}): "
                   "nothing to do")
        return
    click.echo(f"import-weights {model}: {done['tensors']} tensors matched by {match}, "
               f"{done['num_classes']} outputs, input {d.input_size[1]}x{d.input_size[2]} "
               f"(crop {d.crop_pct:g}, {d.interpolation}); saved {out} "
               f"(source sha256 {done['sha256'][:12]})")
