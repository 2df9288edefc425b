"""Command-line options, each declared once: ``Opt`` (one option's flags, type, default, help) and
the bundles the commands share (``--data``, ``--device``, ``--precision``, ...), plus click helpers.
Torch-free, since `cli.py report` imports them.

    @options(DATA, DEVICE, PRECISION, WORKERS.but(help=...))    # click options, in this order

A command whose default differs from the bundle's says so in its help (``Opt.but``); one that
adds to the shared help appends its text (``Opt.more``).  tests/test_options.py holds every
command registered in cli.py to that.
"""
from __future__ import annotations

import json
import math
import os
import re
import shlex
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import click

from pipeline.core import presets
from pipeline.core.precision import PRECISIONS, PRECISION_RULE


@dataclass(frozen=True)
class Opt:
    """One option: click's declarations (flags, then the parameter name where it differs) and
    keyword arguments.  ``base``: the shared option this one was derived from by ``but``."""
    decls: tuple[str, ...]
    help: str = ""
    default: Any = None
    type: Any = None
    is_flag: bool = False
    multiple: bool = False
    required: bool = False
    show_default: bool = False
    callback: Callable | None = None
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
        kwargs = {"help": self.help, "default": default, "show_default": self.show_default}
        if self.type is not None:
            kwargs["type"] = self.type
        for key in ("is_flag", "multiple", "required"):
            if getattr(self, key):
                kwargs[key] = True
        if self.callback is not None:
            kwargs["callback"] = self.callback
        return click.option(*self.decls, cls=DeclaredOption, opt=self, **kwargs)


class DeclaredOption(click.Option):
    """A click option declared by an ``Opt``, which it keeps: --help and parsing are click's own;
    the ``Opt`` says where the option was declared."""

    def __init__(self, *args, opt: Opt, **kwargs):
        super().__init__(*args, **kwargs)
        self.opt = opt


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


def preset_text(name: str) -> str:
    """A preset dict of pipeline/core/presets.py as help text: "lr 0.01, momentum 0.9, ..."."""
    return ", ".join(f"{k} {v}" for k, v in getattr(presets, name).items() if v is not None)


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


class DeviceError(ValueError):
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
DATA = Opt(("--data",), help="Dataset root: an ImageNet/ImageFolder tree or the four "
           "Fashion-MNIST idx files, the same root in every stage. Default: the embedded "
           "Fashion-MNIST.")
LABELS = Opt(("--labels", "labels_file"), help="Labels file for a flat val/ folder.")
CLASSIFIER = Opt(("--classifier",), default="vit", show_default=True, help="The classifier: a "
                 "preset (vit, resnet) or any timm model name, the same name in every stage.")
DEVICE = Opt(("--device",), callback=device_option,
             help="cuda, cuda:1, cpu... Default: cuda if available.")
PRECISION = Opt(("--precision",), type=click.Choice(PRECISIONS), help=PRECISION_RULE)
def usable_cores() -> int:
    """The cores this process may run on (its affinity mask: a container's or taskset's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


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


WORKERS = Opt(("--workers",), type=WorkerCount(), help="DataLoader worker processes per "
              "process, at most the usable cores. Default: the usable cores / local ranks, "
              "minus one.")
BATCH_SIZE = Opt(("--batch-size",), type=BATCH, show_default=True, help="Images per batch.")
WEIGHTS = Opt(("--weights",), help="Local weights file instead of the hub download.")
RANDOM_INIT = Opt(("--random-init",), is_flag=True, help="No pretrained weights: a seeded "
                  "random initialisation (tests, benchmarks).")
MODEL_KWARGS = Opt(("--model-kwargs",), callback=json_callback,
                   help='JSON for timm.create_model, e.g. \'{"depth": 2}\'.')
PREPROCESS = Opt(("--preprocess",), type=click.Choice(["model", "paper"]), default="model",
                 show_default=True, help="model: the model's timm eval config; paper: the "
                 "authors' square resize, mean = std = 0.5.")
SEED_OPT = Opt(("--seed",), type=SEED, default=0, show_default=True)
NO_PROGRESS = Opt(("--no-progress",), is_flag=True, help="No progress bars.")
# Every shared option: a command declares one of these flags through its bundle, nowhere else
BUNDLES = (DATA, LABELS, CLASSIFIER, DEVICE, PRECISION, WORKERS, BATCH_SIZE, WEIGHTS, RANDOM_INIT,
           MODEL_KWARGS, PREPROCESS, SEED_OPT, NO_PROGRESS)
