"""Every option declared once: each command registered in cli.py declares the shared flags
(--data, --device, --precision, ...) through their bundles in pipeline/core/options.py, and
--precision follows one rule everywhere (bf16 on a CUDA device, fp32 on the CPU)."""
from __future__ import annotations

import json

import click
import pytest
import torch
from click.testing import CliRunner

from cache.manifest import IDENTITY_FILE, MANIFEST_FILE
from cache.reader import ClassifierCache
from cli import cli
from conftest import TINY_VIT, make_imagenet_tree
from pipeline.core.options import BUNDLES, MODEL_KWARGS, PRECISION, DeclaredOption, options
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
    if opt.default != bundle.default:   # a command whose default differs says so in its help
        shown = param.show_default and opt.default is not None    # click's "[default: 256]"
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
            assert "precision the run was trained with" in param.help
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
