"""``cli.py attack``: options -> ``AttackConfig`` -> one ``attack`` call."""
from __future__ import annotations

from pathlib import Path

import click

from pipeline.core.commandline import Command, options
from pipeline.core.options import (BATCH_SIZE, CLASSIFIER, DATA, DEVICE, LABELS, MODEL_KWARGS,
                                   NO_PROGRESS, PRECISION, PREPROCESS, RANDOM_INIT, SEED_OPT,
                                   WEIGHTS, WORKERS, Opt)
from pipeline.data.sources import check_splits, default_artifacts, is_embedded

# pipeline/attack/methods.py ATTACKS (torch-free here)
ATTACK_NAMES = ("pgd_linf", "pgd_l2", "recoloradv")


@click.command(cls=Command)
@options(
    CLASSIFIER,
    DATA,
    Opt(("--split",), group="data", help="Split to attack.",
        default_text="test (embedded), else val"),
    Opt(("--out",), type=click.Path(path_type=Path), group="output", metavar="DIR",
        help="Data root the attacked split is written into (ImageFolder layout; may be --data "
        "itself, so train-oracle --eval-split finds it).",
        default_text="artifacts/<name of the --data folder>/adversarial"),
    Opt(("--out-split", "name"), aliases=("--name",), group="output", help="The attacked "
        "split's folder under --out, i.e. its --split for extract/predict.",
        default_text="<split>-<attack>-<classifier>"),
    LABELS,
    Opt(("--attack", "attack_name"), type=click.Choice(ATTACK_NAMES), default="pgd_linf",
        group="protocol", help="torchattacks PGD under the L-inf or L2 norm, or ReColorAdv "
        "(the paper's Table 2 attack; the authors' package: pip install '.[recoloradv]'), on "
        "[0, 1] pixels of the classifier's resized/cropped input; RGB only for recoloradv."),
    Opt(("--eps",), group="protocol", help="Perturbation budget: in [0, 1] pixel units for PGD, "
        "e.g. 8/255; for recoloradv the L-inf bound of its colour map in CIELUV.",
        default_text="pgd_linf 8/255, pgd_l2 1.0 (torchattacks'), recoloradv 0.06 (the "
        "authors')"),
    Opt(("--step-size", "alpha"), group="protocol", help="PGD step size (alpha); recoloradv: "
        "Adam's learning rate.", default_text="pgd_linf 2/255, pgd_l2 0.2, recoloradv 0.001"),
    Opt(("--steps",), type=click.IntRange(1), group="protocol", help="Iterations; recoloradv "
        "stops early after min(100, steps) (the authors').",
        default_text="10 (torchattacks'); recoloradv 300 (the authors')"),
    Opt(("--random-start/--no-random-start",), group="protocol", help="Start from a uniform "
        "random point in the eps-ball (Madry et al.).",
        default_text="on for PGD, off for recoloradv (the authors')"),
    Opt(("--max-samples",), type=click.IntRange(1), group="data", help="Attack a seeded subset "
        "of N rows of the split (demos, quick checks).", default_text="every row"),
    BATCH_SIZE.but(default=64, help="Rows per attack batch (the backward pass keeps activations: "
                   "smaller than extract's)."),
    WORKERS.but(default_text="the usable cores / local ranks, minus one; 0 on the in-memory "
                "Fashion-MNIST"),
    PRECISION.more("It also covers the attack's backward passes and the logged outputs; give "
                   "extract the same to reproduce them."),
    DEVICE,
    WEIGHTS,
    RANDOM_INIT,
    MODEL_KWARGS,
    PREPROCESS.more("The classifier is attacked (and its PNGs stored) under this resize/crop "
                    "and normalisation, as in extract."),
    Opt(("--shard-size",), default=625, type=click.IntRange(1), group="runtime", hidden=True,
        help="Rows per shard: the unit of resume and of the split between torchrun processes "
        "(ImageNet val = 80 shards)."),
    SEED_OPT.but(help="Random start, --max-samples subset."),
    NO_PROGRESS,
)
def attack(classifier, data, split, out, name, labels_file, attack_name, eps, alpha, steps,
           random_start, max_samples, batch_size, workers, precision, device, weights,
           random_init, model_kwargs, preprocess, shard_size, seed, no_progress):
    """Attack a split against the frozen classifier; write it as an ImageFolder split of PNGs
    (extract, train-oracle --eval-split and predict read it like any other split)."""
    # The stage is imported on call (torch stays out of commands that do not need it).
    from pipeline.attack.methods import AttackError, resolve_params
    from pipeline.attack.run import AttackConfig, attack as run_attack
    from pipeline.core import dist

    if weights and random_init:
        raise click.UsageError("--weights and --random-init exclude each other")
    try:
        resolve_params(attack_name, eps, alpha, steps, random_start)
    except AttackError as err:
        raise click.UsageError(str(err)) from None
    split = split or ("test" if is_embedded(data) else "val")
    check_splits(data, (split,))
    cfg = AttackConfig(
        classifier=classifier, data=data, split=split, labels_file=labels_file,
        out=out or default_artifacts(data) / "adversarial",
        name=name or f"{split}-{attack_name}-{classifier}", attack=attack_name, eps=eps,
        alpha=alpha, steps=steps, random_start=random_start, max_samples=max_samples,
        batch_size=batch_size, workers=workers, precision=precision, device=device,
        weights=weights, random_init=random_init,
        model_kwargs=model_kwargs, preprocess=preprocess,
        shard_size=shard_size, seed=seed, progress=not no_progress)
    try:
        s = run_attack(cfg)
    except AttackError as err:
        raise click.ClickException(str(err)) from None
    if dist.info().is_main:
        print_summary(s)
    dist.shutdown(dist.info())
    if s["stored_accuracy"] == 0 and dist.info().is_main:
        # such a split has no correct prediction for an oracle to tell from the wrong ones:
        # every ranking metric is undefined or trivial there (the report marks it unranked)
        click.echo(f"warning: the attack left the classifier no correct prediction on the stored "
                   f"images of {s['out']} (accuracy 0.00%): an oracle has nothing to rank there. "
                   "To compare oracles on it, lower --eps (1/255 is one grey level of the "
                   "stored PNG) or --steps and write the split anew (another --out-split)",
                   err=True)


def print_summary(s: dict) -> None:
    state = "already complete" if s["already_complete"] else \
        f"{s['computed_rows']} rows attacked in {s['elapsed_s']:.1f}s ({s['img_per_s']} img/s)"
    pct = lambda v: f"{100 * v:.2f}%"  # noqa: E731
    click.echo(f"[{s['out']}] {s['rows']} rows; classifier accuracy clean {pct(s['clean_accuracy'])}"
               f", on the stored uint8 PNGs {pct(s['stored_accuracy'])} (unquantised attack "
               f"{pct(s['unquantised_accuracy'])}); attack success on correctly classified rows "
               f"{pct(s['unquantised_success'])} unquantised, {pct(s['stored_success'])} stored; "
               f"max change {s['linf_max_levels']} grey levels; {state}")
