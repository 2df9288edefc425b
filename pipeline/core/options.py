"""Command-line options, each declared once: ``Opt`` (one option's flags, type, default, help,
help group, old names) and the bundles the commands share (``--data``, ``--device``,
``--precision``, ...), plus ``Command`` (--help by group, old names noted) and click helpers.
Torch-free, since `cli.py report` imports them.

    @click.command(cls=Command)
    @options(DATA, DEVICE, PRECISION, WORKERS.but(help=...))    # click options, in this order

A command whose default differs from the bundle's says so (``Opt.but``: its ``default_text`` or
help); one that adds to the shared help appends its text (``Opt.more``).  tests/test_options.py
holds every command registered in cli.py to that, and to one vocabulary (docs/CLI.md).
"""
from __future__ import annotations

import json
import math
import os
import re
import shlex
import textwrap
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import click

from cache.errors import TrustOraclesError
from pipeline.core.precision import PRECISIONS, PRECISION_RULE

# The headings of --help, in this order (as timm's train.py groups its argparse options).  An
# option without a group (-h/--help) goes under "Other options".
GROUPS = {"data": "Data options", "model": "Model options", "protocol": "Protocol options",
          "runtime": "Runtime options", "output": "Output options"}
OTHER = "Other options"


@dataclass(frozen=True)
class Opt:
    """One option: click's declarations (flags, then the parameter name where it differs) and
    keyword arguments.  ``base``: the shared option this one was derived from by ``but``.

    ``group``: its heading in --help (a key of GROUPS).  ``default_text``: the default shown
    where the value is chosen at run time (None on the command line), e.g. "from the preset
    (embedded: 0.01; paper: 1e-05)".  ``hidden``: an advanced option, left out of --help
    (docs/CLI.md lists it).  ``aliases``: old names, still accepted but not shown; using one
    prints a one-line note naming ``flag``."""
    decls: tuple[str, ...]
    help: str = ""
    default: Any = None
    type: Any = None
    is_flag: bool = False
    multiple: bool = False
    required: bool = False
    show_default: bool = True
    callback: Callable | None = None
    group: str | None = None
    default_text: str | None = None
    hidden: bool = False
    aliases: tuple[str, ...] = ()
    metavar: str | None = None
    base: Opt | None = field(default=None, compare=False, repr=False)

    @property
    def flag(self) -> str:
        """The option as typed (``--flip`` for ``--flip/--no-flip``)."""
        return self.decls[0].split("/")[0]

    @property
    def name(self) -> str:
        """click's parameter name."""
        if len(self.decls) > 1 and not self.decls[-1].startswith("-"):
            return self.decls[-1]
        return self.flag.lstrip("-").replace("-", "_")

    def but(self, **changes) -> "Opt":
        """This option with another default, help, ... (a command that must differ says so).
        Remembers the option it came from, so that a test can tie every command to the bundles."""
        return replace(self, base=self.base or self, **changes)

    def more(self, text: str) -> "Opt":
        """This option with ``text`` after its help: what one command adds to the shared text."""
        return self.but(help=f"{self.help} {text}")

    def click_option(self):
        default = False if self.is_flag and self.default is None else self.default
        kwargs = {"help": self.help, "default": default, "hidden": self.hidden,
                  # a string makes click show a default even where the value is None
                  # (DeclaredOption.get_help_extra writes it without click's parentheses)
                  "show_default": self.default_text or self.show_default}
        if self.type is not None:
            kwargs["type"] = self.type
        for key in ("is_flag", "multiple", "required", "metavar", "callback"):
            if getattr(self, key):
                kwargs[key] = getattr(self, key)
        if self.required and default is None:
            # click >= 8.3 takes an explicit default=None as a value given: the option would
            # never be missing
            del kwargs["default"]
        decls = self.decls
        if self.aliases:
            # The old names come FIRST in click's declarations: code that read an option's first
            # flag (``param.opts[0]``) before the rename still finds it; ``flag`` is the one shown
            # (help, messages), and the parameter is named explicitly.
            assert not any("/" in d for d in (*decls, *self.aliases)), "alias of a --x/--no-x pair"
            decls = (*self.aliases, *(d for d in decls if d.startswith("-")), self.name)
        return click.option(*decls, cls=DeclaredOption, opt=self, **kwargs)


class DeclaredOption(click.Option):
    """A click option declared by an ``Opt``, which it keeps: parsing is click's own; --help
    shows its group, the default it resolves to and none of its old names, and an error names
    the option as it was typed."""

    def __init__(self, *args, opt: Opt, **kwargs):
        super().__init__(*args, **kwargs)
        self.opt = opt
        self.group = opt.group

    @contextmanager
    def _without_aliases(self):
        opts = self.opts
        self.opts = [o for o in opts if o not in self.opt.aliases]
        try:
            yield
        finally:
            self.opts = opts

    def get_help_record(self, ctx):
        with self._without_aliases():
            return super().get_help_record(ctx)

    def get_help_extra(self, ctx):
        extra = super().get_help_extra(ctx)
        if self.opt.default_text:
            extra["default"] = self.opt.default_text
        return extra

    def get_error_hint(self, ctx):
        typed = ctx.meta.get(TYPED, {}).get((ctx.command.name, self.name)) if ctx else None
        if typed:
            return f"'{typed}'"
        with self._without_aliases():
            return super().get_error_hint(ctx)


TYPED = "pipeline.options.typed"      # ctx.meta: {(command, parameter): the old name given}
NOTED = "pipeline.options.noted"      # ctx.meta: the old names already noted in this run


def typed_flag(ctx: click.Context, name: str) -> str:
    """The flag parameter ``name`` was given as on this command line (an old name, if used), for
    the messages a command writes itself."""
    param = next(p for p in ctx.command.params if p.name == name)
    shown = param.opt.flag if isinstance(param, DeclaredOption) else param.opts[0]
    return ctx.meta.get(TYPED, {}).get((ctx.command.name, name), shown)


class Command(click.Command):
    """A click command whose --help lists its options under GROUPS' headings (each option's
    ``group``), and which notes each old name it is given (one line on stderr).

    A small subclass rather than the click-option-group package: the groups are one attribute of
    the options every command already declares through ``Opt``, the parsing stays click's own,
    and the project takes no dependency for ~40 lines.  ``passes_on``: [(heading, flags)] of
    another command's options this one passes on (sweep -> train-oracle), listed after its own."""

    def __init__(self, *args, passes_on: tuple[str, list[tuple[str, str]]] | None = None,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.passes_on = passes_on

    def parse_args(self, ctx, args):
        note_old_names(self, ctx, args)
        return super().parse_args(ctx, args)

    def grouped_params(self, ctx) -> dict[str, list[click.Parameter]]:
        """{heading: its options} in GROUPS' order, then OTHER; hidden options left out."""
        out = {title: [] for title in (*GROUPS.values(), OTHER)}
        for param in self.get_params(ctx):
            if isinstance(param, click.Option) and not param.hidden:
                out[GROUPS.get(getattr(param, "group", None), OTHER)].append(param)
        return {title: params for title, params in out.items() if params}

    def format_options(self, ctx, formatter):
        for title, params in self.grouped_params(ctx).items():
            with formatter.section(title):
                formatter.write_dl([p.get_help_record(ctx) for p in params])
        if self.passes_on:
            title, rows = self.passes_on
            with formatter.section(title):      # write_dl would break flags at their hyphens
                key_width = max(len(key) for key, _ in rows) + 2
                indent = " " * formatter.current_indent
                for key, text in rows:
                    lines = textwrap.wrap(text, max(formatter.width - len(indent) - key_width,
                                                    20), break_on_hyphens=False,
                                          break_long_words=False)
                    formatter.write(f"{indent}{key:<{key_width}}{lines[0]}\n")
                    for line in lines[1:]:
                        formatter.write(f"{indent}{'':<{key_width}}{line}\n")


def note_old_names(command: click.Command, ctx: click.Context, args: list[str]) -> None:
    """Record which options ``args`` gives by an old name (for error messages) and note each once
    per run on stderr: ``note: --train-limit is now --max-samples (the old name still works)``."""
    old = {alias: p for p in command.params if isinstance(p, DeclaredOption)
           for alias in p.opt.aliases}
    if not old:
        return
    typed = ctx.meta.setdefault(TYPED, {})
    # one note per run: a command that parses another's options (sweep) shares the run's record
    noted = (click.get_current_context(silent=True) or ctx).meta.setdefault(NOTED, set())
    for arg in args:
        if not isinstance(arg, str):      # a caller's Path or number: a value, never a flag
            continue
        if arg == "--":
            break
        flag = arg.split("=", 1)[0]
        if flag not in old:
            continue
        param = old[flag]
        typed[(command.name, param.name)] = flag
        if (command.name, flag) not in noted:
            noted.add((command.name, flag))
            click.echo(f"note: {command.name} {flag} is now {param.opt.flag} (the old name "
                       "still works)", err=True)


def options(*opts: Opt):
    """Decorator: the click options of ``opts``, listed in that order by --help."""
    def apply(fn):
        for opt in reversed(opts):
            fn = opt.click_option()(fn)
        return fn
    return apply


def json_option(value: str | None, name: str) -> dict:
    """A JSON-object option (e.g. --model-kwargs) -> dict; a usage error naming ``name`` otherwise."""
    if not value:
        return {}
    try:
        out = json.loads(value)
    except json.JSONDecodeError as err:
        raise click.BadParameter(f"not valid JSON ({err}): {value!r}", param_hint=name) from None
    if not isinstance(out, dict):
        raise click.BadParameter(f"expected a JSON object, got {value!r}", param_hint=name)
    return out


def names_option(choices: tuple[str, ...] | None):
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


def args_option(ctx, param, value):
    """A quoted string of extra command-line options -> a tuple of arguments."""
    return tuple(shlex.split(value)) if value else ()


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange that also refuses nan and inf (every comparison with nan is False, so
    FloatRange lets ``--lr nan`` through)."""

    def convert(self, value, param, ctx):
        out = super().convert(value, param, ctx)
        if not math.isfinite(out):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return out


def positive(max_open_one: bool = False) -> FiniteFloatRange:
    """> 0 (learning rates, loss weights and slopes), or in (0, 1) with ``max_open_one``."""
    return FiniteFloatRange(0, 1 if max_open_one else None, min_open=True, max_open=max_open_one)


NON_NEGATIVE = FiniteFloatRange(0)                          # weight decay, focal gamma
FRACTION = FiniteFloatRange(0, 1, max_open=True)            # momentum, held-out share: [0, 1)
SEED = click.IntRange(0)                                    # numpy refuses negative seeds
BATCH = click.IntRange(1)


class DeviceError(TrustOraclesError, ValueError):
    """``--device`` names no device, or one this machine does not have."""


def check_device(device_arg: str | None):
    """The torch.device ``--device`` names (default: cuda if available, else cpu), checked before
    any work: a device string torch parses, of a kind this project runs on, present on this
    machine.  (Here rather than in dist.py so that the option callback below needs no
    function-level project import; torch is imported on call: `cli.py report` stays free of it.)"""
    import os

    import torch

    if not device_arg:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device_arg)
    except (RuntimeError, ValueError):
        raise DeviceError(f"{device_arg!r} is not a device: expected cpu, cuda or cuda:N "
                          "(N = GPU index)") from None
    if device.type not in ("cpu", "cuda"):
        raise DeviceError(f"{device_arg!r}: this project runs on cpu or cuda[:N], not on "
                          f"{device.type}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"{device_arg!r}: no CUDA GPU is usable here (torch "
                              f"{torch.__version__}, CUDA build {torch.version.cuda or 'none'}); "
                              "use --device cpu")
        count = torch.cuda.device_count()
        single = int(os.environ.get("WORLD_SIZE", "1")) == 1   # torchrun maps to LOCAL_RANK
        if device.index is not None and device.index >= count and single:
            raise DeviceError(f"{device_arg!r}: this machine has {count} GPU(s), cuda:0 to "
                              f"cuda:{count - 1}")
    return device


def device_option(ctx, param, value):
    """--device checked at parse time, before any work (``check_device``)."""
    if value is None:
        return None
    try:
        check_device(value)
    except DeviceError as err:
        raise click.BadParameter(str(err), ctx, param) from None
    return value


_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


def check_output_name(name: str) -> str | None:
    """Why ``name`` cannot be a file stem inside a run's outputs/ folder (None: it can): letters,
    digits, '.', '_' and '-', not starting with '.', so it never leaves the folder."""
    if not _NAME.fullmatch(name):
        return (f"{name!r} is not a plain file name: use letters, digits, '.', '_' and '-' (no "
                "path separators, no leading '.'); the file is written as outputs/<name>.h5 in "
                "the run directory")
    return None


def output_name_option(ctx, param, value):
    if value is not None and check_output_name(value):
        raise click.BadParameter(check_output_name(value), ctx, param)
    return value


def json_callback(ctx, param, value):
    """A JSON-object option -> dict ({} when not given); a usage error naming the option."""
    return json_option(value, param.opts[0])


# ------------------------------------------------------------------ options shared by commands --
DATA = Opt(("--data",), group="data", default_text="the embedded Fashion-MNIST",
           help="Dataset root: an ImageNet/ImageFolder tree or the four Fashion-MNIST idx "
           "files, the same root in every stage.")
LABELS = Opt(("--labels", "labels_file"), group="data", help="Labels file for a flat val/ "
             "folder.", default_text="one found in the data root (the ILSVRC2012 devkit's, "
             "Kaggle's, <split>.txt), else the bundled ImageNet val labels")
CLASSIFIER = Opt(("--classifier",), default="vit", group="model", help="The classifier: a "
                 "preset (vit, resnet) or any timm model name, the same name in every stage.")
DEVICE = Opt(("--device",), callback=device_option, group="runtime",
             default_text="cuda if available, else cpu", help="cuda, cuda:1, cpu...")
PRECISION = Opt(("--precision",), type=click.Choice(PRECISIONS), help=PRECISION_RULE,
                group="runtime", default_text="bf16 on a CUDA device, fp32 on the CPU")
def usable_cpus() -> set[int]:
    """The CPUs this process may run on (its affinity mask: a container's or taskset's share);
    empty where the platform has no affinity (macOS)."""
    try:
        return os.sched_getaffinity(0)
    except AttributeError:
        return set()


def usable_cores() -> int:
    """How many cores this process may run on (``usable_cpus``; macOS: every core)."""
    return len(usable_cpus()) or os.cpu_count() or 1


class WorkerCount(click.IntRange):
    """0 .. the usable cores: more loader workers than cores only adds processes competing for
    them (and their prefetched batches' memory), never speed."""

    def __init__(self):
        super().__init__(0)

    def convert(self, value, param, ctx):
        n = super().convert(value, param, ctx)
        cores = usable_cores()
        if n > cores:
            self.fail(f"{n} workers, but this process may use {cores} core(s): give at most "
                      f"--workers {cores} (or leave it out: the usable cores / local ranks, "
                      "minus one)", param, ctx)
        return n


WORKERS = Opt(("--workers",), type=WorkerCount(), group="runtime", help="DataLoader worker "
              "processes per process, at most the usable cores.",
              default_text="the usable cores / local ranks, minus one")
BATCH_SIZE = Opt(("--batch-size",), type=BATCH, group="runtime", help="Images per batch.")
WEIGHTS = Opt(("--weights",), group="model", default_text="the hub's weights",
              help="Local weights file instead of the hub download.")
# hidden: a test and benchmark knob (docs/CLI.md, "Advanced options")
RANDOM_INIT = Opt(("--random-init",), is_flag=True, group="model", hidden=True,
                  help="No pretrained weights: a seeded random initialisation (tests, "
                  "benchmarks).")
MODEL_KWARGS = Opt(("--model-kwargs",), callback=json_callback, group="model",
                   default_text="none: the preset's or timm's own",
                   help='JSON for timm.create_model, e.g. \'{"depth": 2}\'.')
PREPROCESS = Opt(("--preprocess",), type=click.Choice(["model", "paper"]), default="model",
                 group="data", help="model: the model's timm eval config; paper: the "
                 "authors' square resize, mean = std = 0.5.")
SEED_OPT = Opt(("--seed",), type=SEED, default=0, group="protocol",
               help="Seed of the command's random choices.")
NO_PROGRESS = Opt(("--no-progress",), is_flag=True, group="runtime", help="No progress bars.")
# Every shared option: a command declares one of these flags through its bundle, nowhere else
BUNDLES = (DATA, LABELS, CLASSIFIER, DEVICE, PRECISION, WORKERS, BATCH_SIZE, WEIGHTS, RANDOM_INIT,
           MODEL_KWARGS, PREPROCESS, SEED_OPT, NO_PROGRESS)
