"""A loss is a module: adding one touches two product files (its module and the package's import
line) and it trains from the command line; a user's class trains through the API; a class that
lacks what training needs, or returns the wrong thing, is refused before training."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import ROOT
from oracle_fixtures import CLASSIFIER, TINY_VIT_KWARGS, extract, write_colour_tree
from pipeline.core.losses import CustomLossError, Loss, Param, get, names, register
from trust_oracles.heads import train_head
from trust_oracles.losses import loss_class_options

HINGE = '''"""Hinge on the head's output: max(0, margin - s z), s = +1 right, -1 wrong."""
from __future__ import annotations

from pipeline.core.losses.base import Loss, Param
from pipeline.core.losses.registry import register


@register
class Hinge(Loss):
    name = "hinge"
    label = "Hinge"
    params = (Param("margin", symbol="m", help="Hinge only: the margin.", default=1.0),)
    tnr = "half"
    graphable = True

    @classmethod
    def per_sample(cls, z, c_pos, c_neg, p_true, bank):
        return (bank["margin"] - (c_pos - c_neg) * z.float()).clamp_min(0)
'''


def test_a_loss_added_in_two_product_files_trains_from_the_command_line(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("cli.py", "cache", "pipeline", "trust_oracles"):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(ROOT / name, repo / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                          if (ROOT / name).is_dir() else {}))
    losses = repo / "pipeline" / "core" / "losses"
    (losses / "hinge.py").write_text(HINGE)                                   # product file 1
    init = losses / "__init__.py"                                            # product file 2
    init.write_text(init.read_text() + "from pipeline.core.losses import hinge  # noqa: F401,E402\n")

    data = write_colour_tree(tmp_path / "data", {"train": 40, "val": 12})
    extract(data, tmp_path / "cache", extra=("--features",))
    cmd = [sys.executable, "cli.py", "train-oracle", "--classifier", CLASSIFIER, "--oracle",
           CLASSIFIER, "--random-init", "--model-kwargs",
           json.dumps({**TINY_VIT_KWARGS, "num_classes": 3}), "--data", str(data), "--cache",
           str(tmp_path / "cache"), "--loss", "hinge", "--margin", "0.5", "--batch-size", "8",
           "--no-progress", "--head-only", "--epochs", "1", "--runs-root", str(tmp_path / "runs")]
    done = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    (run_json,) = (tmp_path / "runs").glob("*/run.json")
    run = json.loads(run_json.read_text())
    assert run["loss"]["name"] == "hinge" and run["loss"]["margin"] == 0.5
    assert run["run"]["loss_label"] == "Hinge (head-only)" and run["run"]["tnr"] == "half"
    assert run["run"]["config"]["margin"] == 0.5 and run["status"] == "complete"
    help_text = subprocess.run([sys.executable, "cli.py", "train-oracle", "--help"], cwd=repo,
                               capture_output=True, text=True, timeout=120).stdout
    assert "hinge" in help_text and "--margin" in help_text
    bad = subprocess.run(cmd[:-2] + ["--runs-root", str(tmp_path / "r2"), "--gamma", "1"],
                         cwd=repo, capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and "--gamma does not apply to --loss hinge" in bad.stderr


def _features(n=96, seed=0):
    g = np.random.default_rng(seed)
    correct = g.random(n) < 0.7
    x = g.normal(size=(n, 5)).astype(np.float32) + correct[:, None] * 1.5
    return x, correct


class Squared(Loss):
    name = "squared-test"
    label = "Squared"
    params = (Param("scale", default=1.0, help="test: a scale."),)
    tnr = "half"

    @classmethod
    def per_sample(cls, z, c_pos, c_neg, p_true, bank):
        return bank["scale"] * ((c_pos + c_neg) * (z.sigmoid() - (c_pos > 0).float())).pow(2)


def test_a_users_class_trains_through_the_api_and_is_registered(restore_registry):
    x, correct = _features()
    oracle = train_head(x, correct, loss=Squared(values={"scale": 2.0}), epochs=2, batch_size=16)
    assert oracle.loss == "squared-test" and "squared-test" in names()
    assert get("squared-test") is Squared
    assert loss_class_options(Squared(values={"scale": 2.0}, neg_weight=3.0)) == \
        ("squared-test", {"scale": 2.0, "neg_weight": 3.0})
    again = train_head(x, correct, loss=Squared, epochs=2, batch_size=16)   # the class: defaults
    assert np.isfinite(again.score(x)).all()


def test_two_classes_under_one_name_are_refused(restore_registry):
    register(Squared)

    class Other(Squared):
        pass

    with pytest.raises(CustomLossError, match="'squared-test' is taken by .*Squared; .*Other"):
        register(Other)


@pytest.mark.parametrize("attrs, match", [
    ({"tnr": ""}, "declares no TNR rule: set tnr to one of"),
    ({"label": ""}, "declares no label"),
    ({"name": ""}, "declares no name"),
    ({"params": ("scale",)}, "parameter 'scale' is not a Param"),
    ({"params": (Param("gamma", default=3.0),)}, "parameter 'gamma' clashes"),
    ({"head": "mlp"}, "head 'mlp'"),
])
def test_a_class_lacking_what_training_needs_is_refused_naming_it(restore_registry, attrs, match):
    cls = type("Partial", (Squared,), {"name": "partial-test", **attrs})
    with pytest.raises(CustomLossError, match=match):
        register(cls)


def test_a_class_without_a_formula_is_refused(restore_registry):
    cls = type("NoFormula", (Loss,), {"name": "no-formula", "label": "X", "tnr": "half"})
    with pytest.raises(CustomLossError, match="has no formula: implement per_sample"):
        register(cls)


@pytest.mark.parametrize("formula, match", [
    (lambda cls, z, c_pos, c_neg, p_true, bank: ((z - c_pos) ** 2).mean(),
     r"returned shape \(\): expected \(8, 1\), one loss per row and head"),
    (lambda cls, z, c_pos, c_neg, p_true, bank: torch.log(z - 10),
     "returned non-finite losses"),
    (lambda cls, z, c_pos, c_neg, p_true, bank: (z.detach() - c_pos) ** 2,
     "without a gradient in z"),
    (lambda cls, z, c_pos, c_neg, p_true, bank: (z.float() * c_pos).int(),
     "torch.int32 tensor"),
])
def test_a_class_returning_the_wrong_thing_is_refused_before_training(restore_registry, formula,
                                                                      match):
    cls = type("Wrong", (Loss,), {"name": "wrong-test", "label": "W", "tnr": "half",
                                  "per_sample": classmethod(formula)})
    x, correct = _features()
    with pytest.raises(CustomLossError, match=match):
        train_head(x, correct, loss=cls, epochs=2, batch_size=16)


def test_the_built_in_losses_are_modules_in_table_order():
    assert names()[:4] == ("ce", "focal", "tcp", "ss")
    for name in names()[:4]:
        cls = get(name)
        assert cls.__module__ == f"pipeline.core.losses.{name}" and cls.tnr and cls.graphable
    assert get("tcp").tnr == "chance" and get("tcp").needs_p_true
    assert {p.name for p in get("ss").params} == {"alpha_pos", "alpha_neg"}
