"""One base class for every error a user can fix (``cache.errors.TrustOraclesError``): each
project exception derives from it (or is allowed not to, with the reason), and `cli.py` turns it
into one line, ``error: ...``, and the exit code of its class, whatever module raised it."""
from __future__ import annotations

import ast
import functools
import importlib
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from cache.errors import TrustOraclesError
from conftest import ROOT

# Exception classes of the project that do not derive from TrustOraclesError, and why.
_NOTE = "a warning, printed as one line `note: ...` (cli.py _show_warning), never raised"
NOT_USER_ERRORS = {
    "cache.reader.UnverifiedCacheWarning": _NOTE,
    "cache.reader.UnstampedCacheWarning": _NOTE,
    "cache.outputs.OtherDeviceNote": _NOTE,
    "pipeline.data.listing.SkippedLinkNote": _NOTE,
}
PACKAGES = ("cache", "pipeline", "trust_oracles")


@functools.cache
def exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined under the packages, by dotted name: the classes are found
    in the source (``ast``), then their modules imported to ask what each one derives from."""
    found = {}
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            classes = [n for n in ast.walk(ast.parse(path.read_text()))
                       if isinstance(n, ast.ClassDef) and n.bases]
            if not classes:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            loaded = importlib.import_module(module)
            for node in classes:
                cls = getattr(loaded, node.name, None)
                # a class nested in a function or another class: not reachable, so not checked
                assert isinstance(cls, type), f"{module}: class {node.name} is not at module level"
                if issubclass(cls, BaseException):
                    found[f"{module}.{node.name}"] = cls
    return found


def test_every_project_exception_is_a_user_error_or_says_why_not():
    classes = exception_classes()
    assert len(classes) >= 30, sorted(classes)          # the walk found the known ones
    missing = sorted(name for name, cls in classes.items()
                     if not issubclass(cls, TrustOraclesError) and name not in NOT_USER_ERRORS)
    assert not missing, ("exception classes that neither derive from TrustOraclesError nor are "
                         f"in NOT_USER_ERRORS with a reason: {missing}")
    stale = sorted(name for name in NOT_USER_ERRORS
                   if name not in classes or issubclass(classes[name], TrustOraclesError))
    assert not stale, f"NOT_USER_ERRORS entries to remove (gone, or user errors): {stale}"


def test_each_user_error_keeps_a_builtin_base():
    """``except ValueError`` (RuntimeError, ImportError) in callers and users' code keeps
    catching what it caught: the base class is added beside the built-in one, not instead."""
    lone = sorted(name for name, cls in exception_classes().items()
                  if issubclass(cls, TrustOraclesError) and cls is not TrustOraclesError
                  and not any(
                      base.__module__ == "builtins" and base not in (Exception, BaseException)
                      for base in cls.__mro__[1:-1]))
    assert not lone, f"derive these from a built-in error too (ValueError, ...): {lone}"


def test_the_api_exports_the_base_class():
    code = ("import sys, trust_oracles as to; from cache.errors import TrustOraclesError as T;"
            "assert to.TrustOraclesError is T and 'TrustOraclesError' in to.__all__;"
            "assert issubclass(to.InputError, T) and issubclass(to.DataError, ValueError);"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", "catching the API's errors loads torch"


def test_a_real_user_error_is_one_line_with_its_exit_code(tmp_path):
    """`report` on a folder holding no run: a ReportError, in a fresh process as a user runs it."""
    from pipeline.report.inputs import ReportError

    proc = subprocess.run([sys.executable, "cli.py", "report", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == ReportError.exit_code == 1, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(tmp_path) in lines[0], \
        proc.stderr


class Refused(TrustOraclesError, RuntimeError):
    """A user error of a kind the project does not have, with its own exit code."""
    exit_code = 3


class RefusedAlike(Refused):
    """Raised by every process alike under torchrun: rank 0 alone prints it."""
    quiet_off_rank0 = True


def _invoke(monkeypatch, error: BaseException, rank: str = "0"):
    """Run a command added to cli.py's group that raises ``error``; exit code and stderr."""
    import cli

    @click.command("raise-it")
    def raise_it():
        raise error

    monkeypatch.setitem(cli.cli.commands, "raise-it", raise_it)
    monkeypatch.setenv("RANK", rank)
    result = CliRunner().invoke(cli.cli, ["raise-it"])
    return result.exit_code, result.stderr


def test_a_new_error_class_exits_with_its_own_code_in_one_line(monkeypatch):
    code, err = _invoke(monkeypatch, Refused("no room for this: free some, then re-run"))
    assert code == 3 and err == "error: no room for this: free some, then re-run\n", err


def test_an_error_every_rank_raised_is_printed_by_rank_0_only(monkeypatch):
    assert _invoke(monkeypatch, RefusedAlike("modes differ"), rank="1") == (3, "")
    assert _invoke(monkeypatch, RefusedAlike("modes differ"), rank="0") == (
        3, "error: modes differ\n")


@pytest.mark.parametrize("error, code, text", [
    (click.UsageError("the options do not fit"), 2, "Usage: "),     # click's own, unchanged
    (KeyboardInterrupt(), 130, "interrupted: completed work is kept"),
])
def test_usage_errors_and_interrupts_keep_their_codes(monkeypatch, error, code, text):
    got, err = _invoke(monkeypatch, error)
    assert got == code and text in err and "Traceback" not in err, err
