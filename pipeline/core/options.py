"""Click helpers shared by the stages' commands; torch-free, since `cli.py report` imports them."""
from __future__ import annotations

import json
import shlex

import click

from pipeline.core import presets


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
