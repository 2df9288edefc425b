"""The command layer's click plumbing: ``Opt`` declarations (``pipeline.core.options``) as click
options (``options``), --help by group with old names noted (``Command``), and the callbacks of
options parsed as text.  Only command modules import this (and click).

    @click.command(cls=Command)
    @options(DATA, DEVICE, PRECISION, WORKERS.but(help=...))    # click options, in this order
"""
from __future__ import annotations

import math
import shlex
import textwrap
from contextlib import contextmanager
from pathlib import Path

import click

from pipeline.core.options import GROUPS, OTHER, Opt, check_output_name
from pipeline.core.values import (Choice, FloatRange, IntRange, OptionValueError, PathValue, Value,
                                  Workers)


def click_option(opt: Opt):
    """The click option of ``opt``: its value type as click's (``click_type``), or parsed as
    text and converted by a callback (``converted``)."""
    default = False if opt.is_flag and opt.default is None else opt.default
    kwargs = {"help": opt.help, "default": default, "hidden": opt.hidden,
              # a string makes click show a default even where the value is None
              # (DeclaredOption.get_help_extra writes it without click's parentheses)
              "show_default": opt.default_text or opt.show_default}
    if opt.type is not None and not getattr(opt.type, "as_text", False):
        kwargs["type"] = click_type(opt.type)
    if isinstance(opt.type, Value) and opt.type.as_text:
        kwargs["callback"] = converted(opt)
    for key in ("is_flag", "multiple", "required", "metavar", "callback"):
        if getattr(opt, key):
            kwargs[key] = getattr(opt, key)
    if opt.required and default is None:
        # click >= 8.3 takes an explicit default=None as a value given: the option would
        # never be missing
        del kwargs["default"]
    decls = opt.decls
    if opt.aliases:
        # The old names come FIRST in click's declarations: code that read an option's first
        # flag (``param.opts[0]``) before the rename still finds it; ``flag`` is the one shown
        # (help, messages), and the parameter is named explicitly.
        assert not any("/" in d for d in (*decls, *opt.aliases)), "alias of a --x/--no-x pair"
        decls = (*opt.aliases, *(d for d in decls if d.startswith("-")), opt.name)
    return click.option(*decls, cls=DeclaredOption, opt=opt, **kwargs)


def click_type(value):
    """The click type of a value type (a click type given by a command passes through)."""
    if isinstance(value, Choice):
        return click.Choice(list(value.choices))
    if isinstance(value, Workers):
        return WorkerCount()
    if isinstance(value, IntRange):
        return click.IntRange(value.min, value.max)
    if isinstance(value, FloatRange):
        return FiniteFloatRange(value.min, value.max, min_open=value.min_open,
                                max_open=value.max_open)
    if isinstance(value, PathValue):
        return click.Path(path_type=Path)
    return value


def converted(opt: Opt):
    """A click callback converting a text option through its value type (a usage error naming
    the option otherwise)."""
    def parse(ctx, param, value):
        if value is None:
            return opt.type.missing()
        try:
            return opt.type.convert(value)
        except OptionValueError as err:
            raise click.BadParameter(str(err), ctx, param) from None
    return parse


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
            fn = click_option(opt)(fn)
        return fn
    return apply


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


class WorkerCount(click.IntRange):
    """``values.Workers`` for click: 0 .. the usable cores."""

    def __init__(self):
        super().__init__(0)

    def convert(self, value, param, ctx):
        n = super().convert(value, param, ctx)
        try:
            return Workers().convert(n)
        except OptionValueError as err:
            self.fail(str(err), param, ctx)


def output_name_option(ctx, param, value):
    if value is not None and check_output_name(value):
        raise click.BadParameter(check_output_name(value), ctx, param)
    return value
