"""Writes docs/CLI.md, the command-line reference, from the click commands of cli.py: every
command, its options by --help group (type, default, help), then the advanced (hidden) options
and the old names still accepted.  tests/test_options.py fails when docs/CLI.md is stale.

    python docs/make_cli_md.py            # rewrite docs/CLI.md
    python docs/make_cli_md.py --check    # exit 1 if docs/CLI.md is stale

A script beside the file it writes, not a module of the pipeline: it imports cli.py, which sits
above every stage package (tests/test_layout.py).
"""
from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "CLI.md"

INTRO = """\
# Command-line reference

Every command of `cli.py` (installed as `trust-oracles`), its options under the headings of its
`--help`, then the advanced options and the old option names.  Generated from the click commands
by `python docs/make_cli_md.py` (tests/test_options.py fails when this file is stale): change an
option's help in the code, then re-run it.

## One vocabulary

One concept has one name, in every command:

- **`--out DIR` is always a directory**: the one a command writes its results into (extract's
  cache root, train-oracle's run directory, attack's and corrupt's data root, report's and
  sweep's folder).  A single file a command writes is **`--out-file FILE`** (fit-classifier's
  checkpoint, predict's table), and a name given to what is written inside is
  **`--out-<what>`** (`attack --out-split`, the split folder; `predict --out-name`, the file
  stem).
- **`--max-samples N`**: a seeded subset of N rows, wherever a command can take one
  (fit-classifier, attack, train-oracle).
- **`--seed N` is a value; a count is `--num-<things>`**: `demo --num-seeds 3` trains seeds
  0..2, like `fit-classifier --num-classes`.
- **A comma-separated list is a plural** (`demo --classifiers vit,resnet`, `--losses`); the
  sweep's list of values of train-oracle's `--X` is **`--X-values`** (`sweep --alpha-neg-values
  1,3,5`), so `--alpha-neg` is one number wherever it is given.  A repeatable option keeps its
  singular name (`--split train --split test`).
- **A format says what it formats**: `report --report-format`, `corrupt --image-format`.
- **Where weights come from**: `--weights FILE` a file, `--hub-weights` timm's hub, and
  `--random-init` none (tests, benchmarks).
- **Names say what they set**: `train-oracle --ss-distance` chooses what the SS
  loss's slopes act on.

## Why some options differ

A few options keep one name across commands with a different range or default, or two names for
what looks like one concept, because the commands need different things of them:

- **`train-oracle --head-only`, `sweep --fine-tune`**: each flag names the kind of oracle that is
  not its command's default.  `train-oracle` fine-tunes the whole oracle, the paper's protocol; a
  sweep trains one oracle per point, so it trains head-only banks (seconds a point) unless told
  to fine-tune.
- **`--jobs`**: `demo --jobs N` is how many of its commands run at once (at least 1); `report
  --jobs` is a worker-process count where 0 means one per CPU core (an advanced option).
- **`--max-samples N`**: `train-oracle`'s 0 means every row, so that a preset's subset can be
  undone; `fit-classifier` needs 2 images or more, since it holds some out (`--val-fraction`);
  `attack` takes 1 or more.  `extract` has none: a cache holds every row of its split, the rows
  every later stage joins by index; take a subset when training (`train-oracle --max-samples`).
- **`--val-fraction`**: `train-oracle` takes 0 (no held-out rows: the final model is kept);
  `fit-classifier` needs a held-out share to score, so 0 is refused.
- **`import-weights --model`**: the timm architecture of a weights file saved by another
  implementation.  The checkpoint it writes is given to any stage's `--weights`, as a classifier
  or as an oracle, so the option names no role (`--classifier`, `--oracle` do).

Every option shows its default.  Where the value is chosen at run time, the default says how:
for train-oracle, "from the preset (embedded: 0.01; paper: 1e-05)" is
`pipeline/core/presets.py`'s EMBEDDED_ORACLE on the embedded Fashion-MNIST and PAPER_ORACLE (the
paper's protocol) on any other data; `run.json` records the resolved values.

Options are grouped as in `--help`: data (what is read), model (which network, which weights),
protocol (what is computed: losses, hyperparameters, seeds), runtime (how fast, where; never
what is computed) and output (where and what is written).  Knobs for tests, benchmarks and
internals are left out of `--help` but still work: [Advanced options](#advanced-options).  The
old names of renamed options still work too, hidden, with a one-line note on stderr naming the
new one: [Old names](#old-names).
"""


def _escape(text: str) -> str:
    """Markdown for a table cell: code spans as they are; elsewhere |, <, * and a word-edge _
    escaped (a help text's <out>, shots/**/*.jpg, [_<variant>])."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        part = parts[i].replace("\\", "\\\\").replace("|", "\\|").replace("<", "\\<")
        part = part.replace("*", "\\*")
        parts[i] = re.sub(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])", r"\\_", part)
    for i in range(1, len(parts), 2):
        parts[i] = parts[i].replace("|", "\\|")
    return "`".join(parts)


def _names(param: click.Option) -> str:
    """The option as shown: its flags less its old names (``--flip / --no-flip``)."""
    old = getattr(getattr(param, "opt", None), "aliases", ())
    flags = [o for o in param.opts if o not in old]
    if param.secondary_opts:
        return " / ".join(f"`{o}`" for o in (*flags, *param.secondary_opts))
    return ", ".join(f"`{o}`" for o in flags)


def _type(param: click.Option, ctx: click.Context) -> str:
    if param.is_flag:
        return "flag"
    if isinstance(param.type, click.Choice):
        text = " | ".join(str(c) for c in param.type.choices)
    elif param.metavar:
        text = param.metavar
    else:
        text = param.type.name.replace(" range", "")
    extra = param.get_help_extra(ctx)
    if "range" in extra:
        text += f", {extra['range']}"
    return text + (", repeatable" if param.multiple else "")


def _default(param: click.Option, ctx: click.Context) -> str:
    if param.required:
        return "required"
    return param.get_help_extra(ctx).get("default", "")


def _table(params: list[click.Option], ctx: click.Context) -> list[str]:
    rows = ["| Option | Type | Default | Description |", "|---|---|---|---|"]
    for p in params:
        rows.append(f"| {_names(p)} | {_escape(_type(p, ctx))} | "
                    f"{_escape(_default(p, ctx))} | {_escape(p.help or '')} |")
    return rows


def _usage(name: str, command: click.Command, ctx: click.Context) -> str:
    return f"python cli.py {name} " + " ".join(command.collect_usage_pieces(ctx))


def render(cli: click.Group) -> str:
    """docs/CLI.md's text for the click group ``cli`` (cli.py's)."""
    from pipeline.core.options import OTHER

    root = click.Context(cli, info_name="cli.py")
    lines = [INTRO, "## Commands", ""]
    commands = list(cli.commands.items())
    for name, command in commands:
        lines.append(f"- [`{name}`](#{name}): {command.get_short_help_str(160)}")
    advanced, old = [], []
    for name, command in commands:
        ctx = click.Context(command, info_name=name, parent=root)
        lines += ["", f"## {name}", "", f"```\n{_usage(name, command, ctx)}\n```", "",
                  _docstring(command), ""]
        for title, params in command.grouped_params(ctx).items():
            params = [p for p in params if "--help" not in p.opts]
            if params and title != OTHER:
                lines += [f"### {name}: {title.lower()}", "", *_table(params, ctx), ""]
        if command.passes_on:
            title, rows = command.passes_on
            lines += [f"### {name}: {title[0].lower()}{title[1:]}", "", "| Group | Options |",
                      "|---|---|", *(f"| {g} | {_escape(flags)} |" for g, flags in rows), ""]
        hidden = [p for p in command.get_params(ctx)
                  if isinstance(p, click.Option) and p.hidden]
        if hidden:
            advanced.append((name, hidden, ctx))
        old += [(name, alias, p.opt.flag) for p in command.params
                for alias in getattr(getattr(p, "opt", None), "aliases", ())]
    lines += ["", "## Advanced options", "",
              "Left out of `--help` (tests, benchmarks, internals), still accepted as below.", ""]
    for name, params, ctx in advanced:
        lines += [f"### {name}: advanced", "", *_table(params, ctx), ""]
    lines += ["## Old names", "",
              "Renamed options keep their old name, hidden from `--help`; a command given one "
              "runs as before and notes the new name on stderr "
              "(`note: train-oracle --train-limit is now --max-samples (the old name still "
              "works)`).", "", "| Command | Old name | Now |", "|---|---|---|",
              *(f"| {c} | `{a}` | `{n}` |" for c, a, n in old), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _docstring(command: click.Command) -> str:
    """The command's help in Markdown: a paragraph per line, an indented example as code (click's
    \\b marker, which keeps a block as typed, left out)."""
    out = []
    for para in inspect.cleandoc(command.help or "").split("\n\n"):
        para = para.removeprefix("\b\n")
        if para.startswith("    "):
            out.append("```\n" + "\n".join(l.strip() for l in para.splitlines()) + "\n```")
        else:
            out.append(_escape(" ".join(l.strip() for l in para.splitlines())))
    return "\n\n".join(out)


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from cli import cli

    text = render(cli)
    if "--check" in sys.argv[1:]:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is stale: run python docs/make_cli_md.py",
                  file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
