"""Command line: the click group of the pipeline's commands and the shared error handling.

Each command lives beside its stage (``pipeline/<stage>/command.py``): options -> the stage's
frozen config -> one call.  ``export`` is here: a thin caller of the Python API
(``trust_oracles.export``), which sits above every stage, so no stage's command may import it.
Every command's options, by --help group: docs/CLI.md (written by docs/make_cli_md.py from these
commands).

    python cli.py extract --classifier vit            # stage 1 (embedded Fashion-MNIST default)
    torchrun --nproc-per-node 4 cli.py extract --classifier vit --data /imagenet --split train
"""
from __future__ import annotations

import os
import sys
import warnings

import click

# The base of every error a user can fix: printed as one line (no traceback), exit code its
# class's exit_code.  Its module imports nothing, so `--help` and `report` load no torch for it.
from cache.errors import TrustOraclesError
from pipeline.attack.command import attack
from pipeline.classifier.command import fit_classifier, import_weights
from pipeline.corrupt.command import corrupt
from pipeline.data.errors import worker_message
from pipeline.demo.command import demo
from pipeline.extract.command import extract
from pipeline.core.commandline import Command, options
from pipeline.core.options import FloatRange, Opt
from pipeline.oracle.command import predict, target_option, train_oracle
from pipeline.report.command import report
from pipeline.sweep.command import sweep


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """Notes the user should see (an unverified cache) as one line, other warnings as usual."""
    from cache.reader import UnverifiedCacheWarning
    if issubclass(category, UnverifiedCacheWarning):
        click.echo(f"note: {message}", err=True)
    else:
        _SHOW_WARNING(message, category, filename, lineno, file, line)


_SHOW_WARNING = warnings.showwarning


class Group(click.Group):
    def invoke(self, ctx):
        warnings.showwarning = _show_warning
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo("interrupted: completed work is kept; re-run the same command to resume",
                       err=True)
            sys.exit(130)
        except click.UsageError:
            raise       # exit 2 with click's usage text: the options themselves do not fit
        except click.ClickException as err:   # a stage's run error (exit 1): one line, as below
            _leave(err, err.format_message(), err.exit_code)
        except TrustOraclesError as err:
            _leave(err, worker_message(err), err.exit_code)


def _leave(err: BaseException, message: str, code: int) -> None:
    """Print the error's one line and exit with ``code``.  Under torchrun, an error every process
    raised alike (``pipeline.core.dist.EveryRankError``) is printed only by rank 0, and each
    process destroys its process group before exiting."""
    every_rank = getattr(err, "quiet_off_rank0", False)
    if not (every_rank and os.environ.get("RANK", "0") != "0"):
        click.echo(f"error: {message}", err=True)
    if every_rank and "pipeline.core.dist" in sys.modules:   # imported only by a torch stage
        sys.modules["pipeline.core.dist"].close_after(err)
    sys.exit(code)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
def cli():
    """Trustworthiness oracles (Luo et al., NeurIPS 2021): extract -> train-oracle -> report."""


@click.command("export", cls=Command)
@click.argument("run_dir", metavar="RUN", type=click.Path(path_type=str, exists=True,
                                                          file_okay=False))
@options(
    Opt(("--out",), type=click.Path(path_type=str), required=True, group="output",
        metavar="DIR", show_default=False, help="The folder to write (Hugging Face Hub layout: "
        "model.safetensors, config.json, README.md); new or empty."),
    Opt(("--threshold",), type=FloatRange(0, 1), group="protocol", help="The decision "
        "threshold the exported oracle carries, as given.", default_text="--target's"),
    Opt(("--target",), callback=target_option, group="protocol", help="Pick the threshold on "
        "the run's held-out rows: tpr=T or risk=R (as predict --target).",
        default_text="tpr=0.95"),
    Opt(("--report",), type=click.Path(path_type=str, dir_okay=False, exists=True),
        group="data", help="A report.json of `cli.py report`: the model card shows its rows of "
        "this run.", default_text="the run's own outputs, evaluated with bootstrap intervals"),
    Opt(("--resamples",), default=1000, type=click.IntRange(0), group="protocol",
        help="Bootstrap resamples of the model card's intervals (0: none)."),
    Opt(("--force",), is_flag=True, group="output", help="Replace a non-empty --out folder "
        "(once the new one is complete)."),
)
def export(run_dir, out, threshold, target, report, resamples, force):
    """Share a finished run's chosen oracle as a folder in the Hugging Face Hub's layout, for
    `trust_oracles.load_oracle(DIR)` and `cli.py predict --run DIR`."""
    if threshold is not None and target is not None:
        raise click.UsageError("--threshold and --target both set the trust threshold: give one")
    from trust_oracles.export import export_oracle      # the API, loaded only by this command
    path = export_oracle(run_dir, out, threshold=threshold, target=target or ("tpr", 0.95),
                         report=report, resamples=resamples, force=force)
    click.echo(f"exported {run_dir} to {path} (model.safetensors, config.json, README.md)")


for command in (extract, train_oracle, predict, sweep, report, fit_classifier, import_weights,
                attack, corrupt, demo, export):
    cli.add_command(command)


def main() -> None:
    cli()  # click names the program after argv[0]: cli.py or trust-oracles


if __name__ == "__main__":
    main()
