"""Every option (or argument) a command declares required is required: without it the command
stops with click's usage error (exit 2, "Missing option '<flag>'", "Missing argument 'RUN'")
before any work, never a traceback."""
from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from cli import cli

# (command, what click's message names): an option by its flag, an argument (export's RUN) by
# its metavar
REQUIRED = sorted((name, f"option '{p.opts[-1]}'" if isinstance(p, click.Option) else
                   f"argument '{p.human_readable_name}'")
                  for name, cmd in cli.commands.items() for p in cmd.params
                  if getattr(p, "required", False))


def test_the_commands_declare_required_options():
    assert {name for name, _ in REQUIRED} >= {"predict", "corrupt", "import-weights"}


@pytest.mark.parametrize("command", sorted({name for name, _ in REQUIRED}))
def test_a_command_without_its_required_options_is_a_usage_error(command):
    result = CliRunner().invoke(cli, [command])
    flags = [flag for name, flag in REQUIRED if name == command]
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert any(f"Missing {flag}" in result.output for flag in flags), result.output
