"""Every `--option` the docs name is one a command declares: README.md and docs/*.md are checked
against the click commands of cli.py (their options, with the old names they still accept), the
options the scripts of bench/ and cluster/ declare, and a short list of other programs' options
(pip, torchrun, Slurm, ...).  Where a command is typed (`predict --out-file F`, a
`python cli.py fit-classifier ...` line), each option must be one of that command's current
names: an old name in an example is refused even though the command still accepts it."""
from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from conftest import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
SPAN = re.compile(r"`([^`\n]+)`")
TYPED = re.compile(r"^(?:python cli\.py |trust-oracles |\$LAUNCH cli\.py |cli\.py )([a-z-]+)\b")
BARE = re.compile(r"^([a-z-]+)\b")

# Not options of this project: other programs' options and placeholders the docs spell out.
OTHERS = {
    "--no-deps",                                                     # pip
    "--nnodes", "--node-rank", "--nproc-per-node", "--standalone",   # torchrun
    "--rdzv-backend", "--rdzv-conf", "--rdzv-endpoint", "--rdzv-id",
    "--array", "--dependency", "--gres", "--time",                   # Slurm's sbatch
    "--notest",                                                      # convmv
    "--logdir",                                                      # tensorboard
    "--config", "--overwrite-config-file",                           # fd-shifts
    "--num",          # "--num-<things>", the naming rule of docs/CLI.md
    "--option",       # click's "No such option: '--option'"
    "--smoothing",    # a custom loss's parameter, the example of docs/ARCHITECTURE.md
    "--strict",       # mkdocs build
}
# Examples known to use an old name (fix at the source, then delete the entry).
KNOWN_OLD: set[tuple[str, str, str]] = set()


def _commands() -> dict[str, tuple[set[str], set[str]]]:
    """{command: (its current option names, its old names)}."""
    import cli

    out = {}
    for name, command in cli.cli.commands.items():
        current, old = set(), set()
        for p in command.params:
            aliases = set(getattr(getattr(p, "opt", None), "aliases", ()) or ())
            old |= aliases
            current |= {o for o in (*p.opts, *p.secondary_opts) if o not in aliases}
        out[name] = (current, old)
    return out


def _script_options() -> set[str]:
    files = [p for top in ("bench", "cluster") for p in sorted((ROOT / top).rglob("*"))
             if p.is_file() and p.suffix in (".py", ".sh")]
    found = set()
    for path in files:
        found |= set(re.findall(r"""["'](--[a-z][a-z0-9-]*)["']""", path.read_text()))
        found |= set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", path.read_text())) \
            if path.suffix == ".sh" else set()
    return found


COMMANDS = _commands()
KNOWN = set().union(*(c | o for c, o in COMMANDS.values())) | _script_options() | OTHERS


def _spans(text: str):
    """(line number, text) of each inline code span and each command line of a code block (a
    line continued with a backslash joined to the next)."""
    in_block, pending, start = False, "", 0
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            in_block, pending = not in_block, ""
            continue
        if in_block:
            pending, start = (pending + " " + line.strip(), start) if pending else \
                (line.strip(), lineno)
            if pending.endswith("\\"):
                pending = pending[:-1]
                continue
            yield start, pending, True
            pending = ""
        else:
            for span in SPAN.findall(line):
                yield lineno, span, False


def unknown_options(text: str) -> list[str]:
    return [f"line {n}: {o}" for n, line in enumerate(text.splitlines(), 1)
            for o in OPTION.findall(line) if o not in KNOWN]


def misused_options(text: str, doc: str = "") -> list[str]:
    """Options typed after a command that are not among its current names (sweep passes
    train-oracle's on to its points)."""
    wrong = []
    for lineno, span, in_block in _spans(text):
        m = (TYPED if in_block else BARE).match(span) or TYPED.match(span)
        if not m or m.group(1) not in COMMANDS:
            continue
        name = m.group(1)
        current, old = COMMANDS[name]
        if name == "sweep":
            current = current | COMMANDS["train-oracle"][0]
        for opt in OPTION.findall(span):
            if opt not in current and (doc, name, opt) not in KNOWN_OLD:
                what = "an old name" if opt in old else "not an option of it"
                wrong.append(f"line {lineno}: `{name} {opt}`: {what}")
    return wrong


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_option_named_in_the_docs_exists(path):
    text = path.read_text(encoding="utf-8")
    wrong = unknown_options(text) + misused_options(text, path.name)
    assert not wrong, f"{path.relative_to(ROOT)}:\n  " + "\n  ".join(wrong)


def test_the_checks_find_what_they_should():
    assert unknown_options("pass `--name-of-param` to it") == ["line 1: --name-of-param"]
    assert misused_options("`fit-classifier --out a.pt`") == \
        ["line 1: `fit-classifier --out`: an old name"]
    assert misused_options("```\npython cli.py predict --run R \\\n    --bogus 1\n```") == \
        ["line 2: `predict --bogus`: not an option of it"]
    assert not misused_options("`predict --out-file preds.csv`, `sweep --lr 0.1`")
    assert not unknown_options("pip install --no-deps x; torchrun --nproc-per-node 8")
