"""Every option declared once: each command registered in cli.py declares the shared flags
(--data, --device, --precision, ...) through their bundles in pipeline/core/options.py, and
--precision follows one rule everywhere (bf16 on a CUDA device, fp32 on the CPU).  One vocabulary
on the command line: one name per concept, old names accepted but hidden, every option with help
and a default shown, --help grouped, and docs/CLI.md generated from it all."""
from __future__ import annotations

import importlib.util
import json
import re

import click
import pytest
import torch
from click.testing import CliRunner

from cache.manifest import IDENTITY_FILE, MANIFEST_FILE
from cache.reader import ClassifierCache
from cli import cli
from conftest import ROOT, TINY_VIT, make_imagenet_tree
from pipeline.core.losses import all_params

PARAMS = all_params()
from pipeline.core.commandline import DeclaredOption, options
from pipeline.core.options import BUNDLES, GROUPS, MODEL_KWARGS, PRECISION
from pipeline.core.precision import PRECISION_RULE, default_precision
from pipeline.data.labels import imagenet_synsets

BUNDLE_OF = {opt.flag: opt for opt in BUNDLES}
# The commands that run a model: each has --precision (the test fails if one loses it)
WITH_PRECISION = {"extract", "attack", "fit-classifier", "train-oracle", "predict"}


def shared_options():
    """(command name, click option, bundle) for every option of a bundle's flag in cli.py."""
    out = []
    for name, command in sorted(cli.commands.items()):
        for param in command.params:
            out += [(name, param, BUNDLE_OF[flag]) for flag in
                    (*param.opts, *param.secondary_opts) if flag in BUNDLE_OF]
    return out


def test_the_bundles_have_distinct_flags_and_the_commands_use_them():
    assert len(BUNDLE_OF) == len(BUNDLES)
    assert {bundle.flag for _, _, bundle in shared_options()} == set(BUNDLE_OF)


@pytest.mark.parametrize("command, param, bundle", [
    pytest.param(*case, id=f"{case[0]} {case[2].flag}") for case in shared_options()])
def test_every_shared_flag_comes_from_its_bundle(command, param, bundle):
    where = f"{command} {bundle.flag}"
    assert isinstance(param, DeclaredOption), f"{where}: declared by hand, not through its bundle"
    opt = param.opt
    assert (opt.base or opt) is bundle, f"{where}: derived from another option than its bundle"
    for key in ("decls", "type", "callback", "is_flag", "multiple"):
        assert getattr(opt, key) == getattr(bundle, key), f"{where}: its {key} differs"
    assert param.name == bundle.name
    # another help only as the command's own text, marked as such by Opt.but / Opt.more
    assert param.help == bundle.help or opt.base is bundle, where
    if opt.default != bundle.default:   # a command whose default differs says so
        shown = opt.default_text or (param.show_default and opt.default is not None)  # [default:]
        assert shown or (param.help != bundle.help and "Default" in param.help), \
            f"{where}: default {opt.default!r} differs from the bundle's, and its help is silent"


def test_precision_defaults_to_the_one_rule_everywhere():
    seen = set()
    for command, param, bundle in shared_options():
        if bundle is not PRECISION:
            continue
        seen.add(command)
        assert param.default is None, f"{command} --precision has default {param.default!r}"
        if command == "predict":    # None = the precision the run was trained with
            assert "precision the run was trained with" in param.opt.default_text
        else:
            assert param.help.startswith(PRECISION_RULE), command
    assert seen == WITH_PRECISION


def test_the_rule():
    assert default_precision(None, torch.device("cpu")) == "fp32"
    assert default_precision(None, torch.device("cuda", 1)) == "bf16"   # no GPU needed to ask
    for given in ("bf16", "fp16", "fp32"):
        assert default_precision(given, torch.device("cpu")) == given


def test_an_extract_on_the_cpu_without_precision_records_fp32(tmp_path):
    """The rule resolved once the device is known, and the resolved value (never None) is what
    the cache's identity and manifest record."""
    tree = make_imagenet_tree(tmp_path / "inet", list(imagenet_synsets()[:3]), per_class=2,
                              splits=("val",))
    result = CliRunner().invoke(cli, [
        "extract", "--classifier", TINY_VIT[0], "--model-kwargs", json.dumps(TINY_VIT[1]),
        "--random-init", "--device", "cpu", "--workers", "0", "--batch-size", "4",
        "--data", str(tree), "--split", "val", "--out", str(tmp_path / "cache"),
        "--no-progress"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    cache = tmp_path / "cache" / TINY_VIT[0] / "val"
    assert ClassifierCache.open(cache).identity["precision"] == "fp32"
    manifest = json.loads((cache / MANIFEST_FILE).read_text())
    assert manifest["identity"]["precision"] == manifest["config"]["precision"] == "fp32"
    assert json.loads((cache / IDENTITY_FILE).read_text())["precision"] == "fp32"


def test_a_bundle_option_parses_as_declared():
    """MODEL_KWARGS's callback turns the JSON into a dict before the command body runs."""
    got = {}

    @click.command()
    @options(MODEL_KWARGS)
    def probe(model_kwargs):
        got.update(model_kwargs=model_kwargs)

    assert CliRunner().invoke(probe, ["--model-kwargs", '{"depth": 2}']).exit_code == 0
    assert got["model_kwargs"] == {"depth": 2}
    assert CliRunner().invoke(probe, []).exit_code == 0 and got["model_kwargs"] == {}


# --------------------------------------------------------------- one vocabulary (docs/CLI.md) --
def _command(name: str) -> click.Command:
    return cli.commands[name]


def _options(command: click.Command) -> list[click.Option]:
    return [p for p in command.params if isinstance(p, click.Option)]


def _visible(command: click.Command) -> dict[str, click.Option]:
    """{flag as --help shows it: the option} (old names left out)."""
    out = {}
    for p in _options(command):
        if not p.hidden:
            old = p.opt.aliases if isinstance(p, DeclaredOption) else ()
            out.update({o: p for o in (*p.opts, *p.secondary_opts) if o not in old})
    return out


# Every renamed option: (command, old name) -> the name it has now.  The old one stays accepted.
RENAMED = {
    ("train-oracle", "--train-limit"): "--max-samples",
    ("train-oracle", "--z"): "--ss-distance",
    ("fit-classifier", "--out"): "--out-file",
    ("fit-classifier", "--pretrained"): "--hub-weights",
    ("predict", "--out"): "--out-file",
    ("predict", "--name"): "--out-name",
    ("attack", "--name"): "--out-split",
    ("report", "--format"): "--report-format",
    ("corrupt", "--format"): "--image-format",
    ("demo", "--seeds"): "--num-seeds",
    ("demo", "--head-seeds"): "--num-head-seeds",
    **{("sweep", p.flag): f"{p.flag}-values" for p in PARAMS.values()},
}
# Names that said nothing, or one thing in one command and another elsewhere: shown nowhere
RETIRED = {"--name", "--format", "--z", "--seeds", "--head-seeds", "--train-limit", "--pretrained"}
# Test and benchmark knobs, internals: out of --help, still accepted (docs/CLI.md lists them)
ADVANCED = {
    "extract": {"--random-init", "--shard-size"},
    "attack": {"--random-init", "--shard-size"},
    "train-oracle": {"--random-init", "--split-seed", "--channels-last", "--cuda-graph",
                     "--eval-batch-size", "--ckpt-every", "--log-every"},
    "report": {"--resamples", "--ci-seed", "--jobs"},
    "demo": {"--fit-args", "--extract-args", "--train-args", "--head-args", "--report-args"},
}


def _make_cli_md():
    spec = importlib.util.spec_from_file_location("make_cli_md", ROOT / "docs" / "make_cli_md.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_cli_md_is_generated_from_the_commands():
    text = _make_cli_md().render(cli)
    assert (ROOT / "docs" / "CLI.md").read_text() == text, \
        "docs/CLI.md is stale: run python docs/make_cli_md.py"
    for (command, old), new in RENAMED.items():      # the old names have their own section
        assert f"| {command} | `{old}` | `{new}` |" in text
    advanced = text.split("## Advanced options", 1)[1].split("## Old names", 1)[0]
    for command, flags in ADVANCED.items():
        section = advanced.split(f"### {command}: advanced", 1)[1].split("###", 1)[0]
        assert all(f"`{flag}`" in section for flag in flags), command


@pytest.mark.parametrize("command, old", list(RENAMED))
def test_every_old_name_is_accepted_hidden_and_noted(command, old):
    new = RENAMED[(command, old)]
    param = next(p for p in _options(_command(command)) if old in p.opts)
    assert isinstance(param, DeclaredOption) and param.opt.flag == new
    assert old in param.opt.aliases and old not in _visible(_command(command))
    ctx = click.Context(_command(command), info_name=command)
    specs = [r[0] for p in _options(_command(command)) if (r := p.get_help_record(ctx))]
    assert not any(old in re.split(r"[\s,/]+", spec) for spec in specs), \
        f"{command} --help lists {old}"
    # --help is eager: the old name is parsed (and noted) without running anything
    args = [command, old] + ([] if param.is_flag else ["1"]) + ["--help"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert f"note: {command} {old} is now {new} (the old name still works)" in result.stderr


def test_an_old_name_sets_the_same_parameter_and_errors_name_what_was_typed():
    from pipeline.oracle.command import train_oracle

    old = train_oracle.make_context("train-oracle", ["--train-limit", "5", "--z", "linear"])
    new = train_oracle.make_context("train-oracle", ["--max-samples", "5", "--ss-distance",
                                                     "linear"])
    assert old.params == new.params and new.params["train_limit"] == 5
    for flag in ("--train-limit", "--max-samples"):
        result = CliRunner().invoke(cli, ["train-oracle", flag, "-1"])
        assert result.exit_code == 2 and f"Invalid value for '{flag}'" in result.output


def test_one_name_per_concept():
    seen: dict[str, tuple[str, click.Option]] = {}
    for name, command in cli.commands.items():
        visible = _visible(command)
        assert not RETIRED & set(visible), f"{name} shows {RETIRED & set(visible)}"
        for flag, p in visible.items():
            where = f"{name} {flag}"
            # --out is the directory a command writes into; a file is --out-file; names inside
            # the output are --out-<what>; all of them under "Output options"
            if flag == "--out":
                assert p.metavar == "DIR", f"{where}: --out is always a directory"
            if p.metavar == "FILE":
                assert flag == "--out-file", f"{where}: a file a command writes is --out-file"
            if flag.startswith("--out"):
                assert p.group == "output", where
            # a seeded subset of N rows is --max-samples everywhere
            if "seeded subset" in (p.help or ""):
                assert flag == "--max-samples", f"{where}: the sample limit is --max-samples"
            # a count is --num-<things>: never --seeds beside --seed
            if flag.endswith("seeds"):
                assert flag.startswith("--num-"), f"{where}: a count is --num-..."
            # one flag, one kind of value in every command (a float here is no list there)
            if flag in seen:
                other_name, other = seen[flag]
                assert _kind(p) == _kind(other), f"{where} and {other_name} {flag} differ in kind"
                if isinstance(p.type, click.Choice):
                    a, b = set(p.type.choices), set(other.type.choices)
                    assert a <= b or b <= a, f"{where} and {other_name} {flag}: other choices"
            else:
                seen[flag] = (name, p)


def _kind(p: click.Option) -> str:
    if p.is_flag:
        return "flag"
    if isinstance(p.type, click.Choice):
        return "choice"
    if isinstance(p.type, (click.types.IntParamType, click.types.FloatParamType)):
        return p.type.name.split()[0]
    return "text"       # str or a path


def _shows_default(p: click.Option, ctx: click.Context) -> bool:
    return bool(p.get_help_extra(ctx).get("default"))


@pytest.mark.parametrize("name", sorted(cli.commands))
def test_every_option_has_help_a_group_and_shows_its_default(name):
    command = _command(name)
    ctx = click.Context(command, info_name=name)
    for p in _options(command):
        if "--help" in p.opts:
            continue
        where = f"{name} {p.opts[-1]}"
        assert isinstance(p, DeclaredOption), f"{where}: declared by hand, not through Opt"
        assert p.help and p.help.strip(), f"{where} has no help"
        assert p.group in GROUPS, f"{where}: no --help group"
        # a flag off by default, a required option or one declared show_default=False (predict
        # --run, which has none) shows no default; every other one does
        off_flag = p.is_flag and not p.secondary_opts and not p.default
        if not (off_flag or p.required or not p.opt.show_default):
            assert _shows_default(p, ctx), f"{where} shows no default"


def test_help_is_grouped_and_advanced_options_are_hidden():
    for name, command in cli.commands.items():
        text = CliRunner().invoke(cli, [name, "--help"]).output
        headings = [h for h in GROUPS.values() if f"\n{h}:\n" in text]
        assert headings and "\nOptions:\n" not in text, name
        assert headings == sorted(headings, key=list(GROUPS.values()).index), name
        hidden = {f for p in _options(command) if p.hidden for f in p.opts}
        assert hidden == ADVANCED.get(name, set()), name
        listed = set(re.findall(r"^\s+(-[-\w]+)", text, re.M))     # each row's first flag
        assert not hidden & listed, f"{name} --help lists {hidden & listed}"
    # hidden, yet accepted: --help after them still parses them
    assert CliRunner().invoke(cli, ["extract", "--shard-size", "8", "--random-init",
                                    "--help"]).exit_code == 0


def test_sweep_help_lists_what_it_passes_on_to_train_oracle():
    from pipeline.oracle.settings.config import train_options
    from pipeline.sweep.command import OWN_RUNS_ROOT, SETS

    text = CliRunner().invoke(cli, ["sweep", "--help"]).output
    passed = text.split("Passed on to train-oracle", 1)[1]
    for opt in train_options():
        if not (opt.hidden or opt.flag in (*SETS, OWN_RUNS_ROOT) or opt.name in PARAMS):
            assert re.search(rf"{re.escape(opt.flag)}(,|\n)", passed), opt.flag


def test_no_help_cites_a_file_outside_the_repository():
    texts = [(name, c.help or "") for name, c in cli.commands.items()]
    texts += [(f"{name} {p.opts[-1]}", f"{p.help} {p.opt.default_text or ''}")
              for name, c in cli.commands.items() for p in _options(c)
              if isinstance(p, DeclaredOption)]
    bad = [where for where, text in texts if re.search(r"REFERENCE\.md|\.\./shared", text)]
    assert not bad, bad
