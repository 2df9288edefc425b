"""``cli.py demo``: options -> ``DemoConfig`` -> the whole pipeline as printed ``cli.py`` commands."""
from __future__ import annotations

import click

from pipeline.core.losses import LOSSES
from pipeline.core.options import DATA, NO_PROGRESS, args_option, names_option, options
from pipeline.core.presets import DEMO
from pipeline.data.imagenet_c import CORRUPTIONS
from pipeline.data.sources import default_artifacts


@click.command()
@click.option("--seeds", type=click.IntRange(1), default=None, help="Seeds 0..N-1 of every "
              "run. Default: presets.DEMO (1, to stay within ~15 minutes on 2 CPU cores).")
@click.option("--full", is_flag=True, help="The grid of docs/RESULTS.md: 3 seeds of every run, "
              "every fine-tuned <oracle, classifier> pair and every loss of the head scorers "
              "(--seeds 3 --pairs all); runs already trained are skipped.")
@click.option("--pairs", type=click.Choice(["same", "all"]), default=None, help="Fine-tuned "
              "<oracle, classifier> pairs: 'same' (O = C; the default, to stay within ~12 "
              "minutes on 2 CPU cores) or 'all'. Head-only runs cover every pair either way.")
@click.option("--head-seeds", type=click.IntRange(1), default=None, help="At least this many "
              "seeds of ConfidNet's head on the classifier's own features (the small-scale "
              "table). Default: presets.DEMO (3; ~5 s a run on the CPU).")
@options(DATA.but(help="The four Fashion-MNIST idx files, if the embedded copy (Debian package "
                      "dataset-fashion-mnist) is not installed."))
@click.option("--corruption", type=click.Choice(CORRUPTIONS), default=None, help="Shifted "
              "domain (paper Table 3 analogue). Default: presets.DEMO (gaussian_noise).")
@click.option("--severity", type=click.IntRange(1, 5), default=None,
              help="Default: presets.DEMO (5).")
@click.option("--classifiers", callback=names_option(None), default=None,
              help="Comma-separated classifiers. Default: vit,resnet.")
@click.option("--oracles", callback=names_option(None), default=None,
              help="Comma-separated oracle backbones. Default: vit,resnet.")
@click.option("--losses", callback=names_option(tuple(LOSSES)), default=None,
              help=f"Default: {','.join(DEMO['losses'])}.")
@click.option("--broadcast-losses", callback=names_option(DEMO["broadcast_losses"]), default=None,
              help="Losses also trained in the authors' broadcasting variant. Default: "
              f"{','.join(DEMO['broadcast_losses'])}.")
@click.option("--fit-args", callback=args_option, help="Extra options for every "
              "fit-classifier command (quoted), e.g. '--max-samples 2000'.")
@click.option("--extract-args", callback=args_option, help="Extra options for every extract.")
@click.option("--train-args", callback=args_option, help="Extra options for every "
              "train-oracle, e.g. '--train-limit 0' (every row).")
@click.option("--head-args", callback=args_option, help="Extra options for every head-only "
              "train-oracle and the sweep.")
@click.option("--no-head-only", is_flag=True, help="Skip the head-only grid and the alpha sweep "
              "(and the features they read).")
@click.option("--report-args", callback=args_option, help="Extra options for report.")
@click.option("--dry-run", is_flag=True, help="Print the commands and stop.")
@options(NO_PROGRESS.but(help="No progress bars in the steps."))
def demo(seeds, full, pairs, head_seeds, data, corruption, severity, classifiers, oracles, losses, broadcast_losses,
         fit_args, extract_args, train_args, head_args, no_head_only, report_args, dry_run,
         no_progress):
    """The whole pipeline on the embedded Fashion-MNIST through the cli.py commands a user would
    type (each printed before it runs): fit-classifier, extract (with features), train-oracle
    for every <oracle, classifier> pair and loss, fine-tuned and head-only, an alpha sweep,
    report. Re-running skips completed steps."""
    # Imported on call: a command loads only its own stage.
    from pipeline.demo.plan import DemoConfig
    from pipeline.demo.run import DemoError, run

    if full and seeds is not None and seeds != DEMO["full_seeds"]:
        raise click.UsageError(f"--full means --seeds {DEMO['full_seeds']}; give one of them")
    if full and pairs is not None and pairs != DEMO["full_pairs"]:
        raise click.UsageError(f"--full means --pairs {DEMO['full_pairs']}; give one of them")
    pick = lambda value, key: DEMO[key] if value is None else value  # noqa: E731
    cfg = DemoConfig(
        artifacts=default_artifacts(data), data=data,
        seeds=DEMO["full_seeds"] if full else pick(seeds, "seeds"),
        pairs=DEMO["full_pairs"] if full else pick(pairs, "pairs"),
        head_seeds=pick(head_seeds, "head_seeds"),
        scorer_losses=DEMO["losses"] if full else DEMO["scorer_losses"],
        corruption=pick(corruption, "corruption"), severity=pick(severity, "severity"),
        classifiers=pick(classifiers, "classifiers"), oracles=pick(oracles, "oracles"),
        losses=pick(losses, "losses"), broadcast_losses=pick(broadcast_losses, "broadcast_losses"),
        fit_args=fit_args, extract_args=extract_args, train_args=train_args,
        head_args=head_args, head_only=not no_head_only, report_args=report_args,
        progress=not no_progress, dry_run=dry_run)
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
