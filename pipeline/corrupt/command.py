"""``cli.py corrupt``: options -> ``CorruptConfig`` -> ``corrupt_split``."""
from __future__ import annotations

from pathlib import Path

import click

from pipeline.core.commandline import Command, options
from pipeline.core.options import DATA, LABELS, NO_PROGRESS, SEED_OPT, WORKERS, Opt
from pipeline.data.imagenet_c import CORRUPTIONS, SEVERITIES


@click.command(cls=Command)
@options(
    DATA,
    Opt(("--split",), required=True, group="data", help="The split to corrupt, e.g. val "
        "(ImageNet) or test."),
    Opt(("--out",), required=True, type=click.Path(path_type=Path), group="output",
        metavar="DIR", help="Output root: <out>/<corruption>/<severity>/<class>/<file>, "
        "ImageNet-C's layout."),
    Opt(("--corruption", "corruptions"), multiple=True, required=True, group="protocol",
        type=click.Choice(("all", *CORRUPTIONS)), help="Repeatable; 'all' = ImageNet-C's 19."),
    Opt(("--severity", "severities"), multiple=True, type=click.IntRange(1, 5),
        group="protocol", help="Repeatable.", default_text="1 to 5"),
    Opt(("--protocol",), type=click.Choice(["imagenet-c", "native"]), group="protocol",
        help="imagenet-c: resize 256, centre-crop 224, corrupt, JPEG quality 85 (ImageNet-C's "
        "own pipeline); native: corrupt at the image's size, lossless PNG (the pixels extract "
        "--corruption computes).",
        default_text="imagenet-c for ImageNet (wnid class folders), native otherwise"),
    Opt(("--image-format", "fmt"), aliases=("--format",), type=click.Choice(["jpeg", "png"]),
        group="output", help="The corrupted images' file format.",
        default_text="jpeg for --protocol imagenet-c, png for native"),
    SEED_OPT.but(help="Row i is corrupted with the seed (seed, i), as in extract."),
    LABELS,
    WORKERS,
    NO_PROGRESS,
)
def corrupt(data, split, out, corruptions, severities, protocol, fmt, seed, labels_file, workers,
            no_progress):
    """Write ImageNet-C-layout folders of a split (for users without the ImageNet-C download)."""
    from pipeline.corrupt.run import CorruptConfig, corrupt_split
    from pipeline.data.sources import list_split

    names = CORRUPTIONS if "all" in corruptions else tuple(dict.fromkeys(corruptions))
    if protocol is None:
        protocol = "imagenet-c" if list_split(data, split, labels_file).dataset == "imagenet" \
            else "native"
    cfg = CorruptConfig(out=out, data=data, split=split, corruptions=names,
                        severities=tuple(sorted(set(severities))) or SEVERITIES, seed=seed,
                        protocol=protocol, format=fmt or ("jpeg" if protocol == "imagenet-c" else "png"),
                        labels_file=labels_file, workers=workers, progress=not no_progress)
    s = corrupt_split(cfg)
    click.echo(f"{s['rows']} rows x {len(s['splits'])} corruption/severity pair(s): "
               f"{s['files_written']} file(s) written, {s['files_total'] - s['files_written']} "
               f"already present; protocol {protocol}, {cfg.format}; {out}")
    click.echo(f"score them with: cli.py extract --data {out} --split {s['splits'][0]} [...]")
