"""``cli.py extract``: options -> ``ExtractConfig`` -> one ``extract`` call per split (the work
below the options: ``splits.py``)."""
from __future__ import annotations

from pathlib import Path

import click

from pipeline.core.commandline import Command, options
from pipeline.core.options import (BATCH_SIZE, CLASSIFIER, DATA, DEVICE, FRACTION, LABELS,
                                   MODEL_KWARGS, NO_PROGRESS, PRECISION, PREPROCESS, RANDOM_INIT,
                                   SEED_OPT, WEIGHTS, WORKERS, Opt, check_device)
from pipeline.data.imagenet_c import CORRUPTIONS


@click.command(cls=Command)
@options(
    CLASSIFIER,
    DATA,
    Opt(("--split", "splits"), multiple=True, group="data", help="Split folder(s) to extract "
        "(repeatable).", default_text="every train/val/test split present"),
    Opt(("--out",), type=click.Path(path_type=Path), group="output", metavar="DIR",
        help="Cache root: each split is written to "
        "<out>/<classifier>/<split>[-<corruption>-<severity>].",
        default_text="artifacts/<name of the --data folder>/cache"),
    LABELS,
    BATCH_SIZE.but(default=256),
    # the in-memory idx images: worker IPC would cost more than the work (run.py)
    WORKERS.but(default_text="the usable cores / local ranks, minus one; 0 on the in-memory "
                "Fashion-MNIST without --corruption"),
    PRECISION.but(default_text="bf16 on the embedded Fashion-MNIST (the demo's published "
                  "caches, presets.EMBEDDED_EXTRACT); elsewhere bf16 on a CUDA device, fp32 on "
                  "the CPU"),
    DEVICE,
    WEIGHTS,
    RANDOM_INIT,
    MODEL_KWARGS,
    PREPROCESS,
    Opt(("--features/--no-features",), group="output", help="Also store pooled pre-logit "
        "features (fp16; with --flip-view those of the flipped view too): what `train-oracle "
        "--head-only` trains on.", default_text="on for the embedded Fashion-MNIST "
        "(presets.EMBEDDED_EXTRACT), off elsewhere"),
    Opt(("--flip-view/--no-flip-view",), group="output", help="Also store outputs for the "
        "horizontally flipped image, so oracle training can use the target of the view it "
        "shows.", default_text="on for the embedded Fashion-MNIST (presets.EMBEDDED_EXTRACT, so "
        "the bare command matches the demo's caches), off elsewhere"),
    Opt(("--skip-bad",), is_flag=True, group="data", help="Record undecodable images as invalid "
        "rows instead of stopping."),
    Opt(("--shard-size",), default=3125, type=click.IntRange(1), group="runtime", hidden=True,
        help="Rows per HDF5 shard, the unit of resume and of the split between torchrun "
        "processes (ImageNet val = 16 equal shards: 1, 2, 4, 8 or 16 GPUs share it evenly)."),
    Opt(("--compile", "compile_"), is_flag=True, group="runtime",
        help="torch.compile the classifier."),
    Opt(("--decode",), type=click.Choice(["cpu", "gpu", "mixed", "hw", "hw-mixed"]),
        default="cpu", group="runtime", help="Where JPEGs are decoded: cpu (loader workers), "
        "gpu (torchvision's batched nvJPEG on the device, resize there too), mixed (even rows on "
        "the device, odd rows in the workers), hw / hw-mixed (as gpu / mixed, but through "
        "nvImageCodec on the GPU's hardware JPEG engines only: A100/H100/H200, pip install "
        "'.[nvimgcodec]'). Other formats always decode on the CPU; the decoder is part of the "
        "cache identity."),
    Opt(("--exif-transpose",), is_flag=True, group="data", help="Turn each image upright as its "
        "EXIF Orientation tag says (PIL's ImageOps.exif_transpose) after decoding. Off by "
        "default, as in torchvision's and timm's loaders, which trained the classifiers: a "
        "photo is read as stored. Recorded in the cache identity (only when on); predict "
        "--images then reads new images the same way. With --decode cpu only; not for idx "
        "arrays (Fashion-MNIST)."),
    Opt(("--corruption",), type=click.Choice(CORRUPTIONS), group="data", default_text="none",
        help="One of ImageNet-C's 19 corruptions, applied to every image before resizing, "
        "seeded per row by --seed (pipeline/data/corruptions.py; docs/DEMO_DATA.md)."),
    Opt(("--severity",), default=3, type=click.IntRange(1, 5), group="data",
        help="Severity of --corruption, as in ImageNet-C."),
    Opt(("--mc-dropout",), type=click.IntRange(2), group="model", default_text="off",
        help="MC-Dropout: also run T >= 2 passes per batch with the classifier's dropout layers "
        "(only them) active and store the mean softmax's max, its entropy and the mutual "
        "information (mcd_* columns, for the report's MC-Dropout rows); the deterministic "
        "outputs are unchanged."),
    Opt(("--mc-dropout-rate",), type=FRACTION, group="model", default_text="the classifier's "
        "own dropout", help="With --mc-dropout: rebuild the classifier with timm's "
        "drop_rate=R (dropout before its head), for a classifier without dropout of its own "
        "(the report then says the rate was applied at test time only)."),
    Opt(("--new-classes",), is_flag=True, group="data", help="With a classifier fitted with "
        "--holdout-classes: cache only the rows of the classes it held out (every prediction "
        "wrong), under the split tag <split>-newclass (e.g. test-newclass). Without it, such a "
        "classifier's caches hold only the rows of its known classes."),
    SEED_OPT.but(help="Seed for random init, corruptions and MC-Dropout's masks."),
    Opt(("--verify",), is_flag=True, group="runtime", help="On a cache already there, re-read "
        "every shard and compare it with the XXH3-128 hash its manifest records (without "
        "--verify: sizes, identity and row ranges only). Damaged shards are recomputed."),
    NO_PROGRESS,
)
def extract(classifier, data, splits, out, labels_file, batch_size, workers, precision, device,
            weights, random_init, model_kwargs, preprocess, features, flip_view, skip_bad,
            shard_size, compile_, decode, exif_transpose, corruption, severity, mc_dropout,
            mc_dropout_rate, new_classes, seed, verify, no_progress):
    """Stage 1: run a frozen classifier over dataset split(s) once; cache logits and targets."""
    # The stage is imported on call: a command loads only its own stage, and `cli.py report`
    # stays free of torch.
    from pipeline.core import dist
    from pipeline.data.newclass import newclass_tag
    from pipeline.extract.splits import extract_split, split_configs

    _refuse_conflicting_options(weights, random_init, mc_dropout, mc_dropout_rate, exif_transpose,
                                decode, device)
    configs = split_configs(
        out, splits, corruption, severity, classifier=classifier, data=data,
        labels_file=labels_file, batch_size=batch_size, workers=workers, precision=precision,
        device=device, weights=weights, random_init=random_init, model_kwargs=model_kwargs,
        preprocess=preprocess, features=features, flip_view=flip_view, skip_bad=skip_bad,
        shard_size=shard_size, compile=compile_, decode=decode, exif_transpose=exif_transpose,
        seed=seed, verify=verify, mc_dropout=mc_dropout or 0, mc_dropout_rate=mc_dropout_rate,
        new_classes=new_classes, progress=not no_progress)
    for cfg in configs:
        summary = extract_split(cfg)
        if dist.info().is_main:
            for note in summary["notes"]:
                click.echo(f"note: {note}", err=True)
            _print_extract_summary(newclass_tag(cfg.split, new_classes), summary)
    dist.shutdown(dist.info())


def _refuse_conflicting_options(weights, random_init, mc_dropout, mc_dropout_rate, exif_transpose,
                                decode, device) -> None:
    """Options that exclude each other, or ask for what this machine lacks (a usage error)."""
    if weights and random_init:
        raise click.UsageError("--weights and --random-init exclude each other")
    if mc_dropout_rate is not None and not mc_dropout:
        raise click.UsageError("--mc-dropout-rate sets the rate of --mc-dropout T's passes: give "
                               "--mc-dropout T (e.g. 10) too, or leave it out")
    if exif_transpose and decode != "cpu":   # the device decoders give pixels as stored
        raise click.UsageError("--exif-transpose turns images upright on the CPU after decoding; "
                               f"--decode {decode} does not: use --decode cpu")
    if decode.startswith("hw"):
        # asked for explicitly: refused (not switched to another decoder) where not installed
        from pipeline.data.errors import DataError
        from pipeline.data.hwdecode import load_nvimgcodec
        try:
            load_nvimgcodec()
        except DataError as err:
            raise click.UsageError(str(err)) from None
    if decode != "cpu" and check_device(device).type != "cuda":
        # the Python API still runs the device decoder on the CPU (tests); the CLI never records
        # a cache as gpu-decoded when no GPU decoded it
        raise click.UsageError(f"--decode {decode} decodes JPEGs on a CUDA device; this run's "
                               f"device is {check_device(device)}: use --decode cpu")


def _print_extract_summary(split: str, s: dict) -> None:
    state = "already complete" if s["already_complete"] else (
        f"{s['computed_rows']} rows in {s['elapsed_s']:.1f}s ({s['img_per_s']} img/s)")
    bad = f", {s['bad_rows']} bad row(s) recorded" if s["bad_rows"] else ""
    click.echo(f"[{split}] {s['rows']} rows, accuracy {100 * s['accuracy']:.2f}%{bad}; "
               f"{state}; cache: {s['out']}")
    t = s.get("inference") or {}
    if not s["already_complete"] and t.get("model_ms_per_img") is not None:
        click.echo(f"[{split}] classifier inference {t['model_ms_per_img']:.4f} ms/img per view "
                   f"(forward only, {t['device']}, batch {t['batch_size']}, {t['precision']}"
                   f"{', incl. warm-up: one batch only' if t.get('includes_warmup') else ''})")

