"""train-oracle's options are TrainConfig's fields, declared once: the CLI, the group hash, the
head-only refusals, the loss options and the sweep's value lists all derive from them."""
from __future__ import annotations

from dataclasses import asdict, fields

import click
import pytest

from pipeline.core.losses import all_params, check_options, get, loss_params, names
from pipeline.oracle.settings.config import (BANK_FREE, FINE_TUNE_ONLY, LOSS_OPTIONS, NOT_IN_GROUP,
                                             TrainConfig)
from pipeline.oracle.settings.given import config_from_params
from pipeline.oracle.settings.record import as_record, group_hash

PARAMS = all_params()


def _train_oracle():
    from pipeline.oracle.command import train_oracle
    return train_oracle


def test_every_option_of_train_oracle_is_one_field_or_one_loss_parameter():
    params = {p.name for p in _train_oracle().params}
    declared = {f.metadata["opt"].name for f in fields(TrainConfig) if f.metadata["opt"]}
    assert params == declared | set(loss_params()) and not declared & set(loss_params())
    unset = [f.name for f in fields(TrainConfig) if f.metadata["opt"] is None]
    # derived: the --weights file's sha256 (prepare), the artifacts root (--data); the losses'
    # own parameters, each its option (pipeline.core.losses)
    assert unset == ["weights_sha256", "loss_params", "artifacts"]


def test_a_command_line_becomes_the_fields_it_names():
    cmd = ["--classifier", "resnet", "--loss", "focal", "--gamma", "0.5", "--authors-broadcast",
           "--z", "linear", "--lr", "0.1", "--no-flip", "--eval-split", "a", "--eval-split", "b",
           "--compile", "--no-progress", "--model-kwargs", '{"depth": 2}', "--out", "x/y",
           "--no-channels-last", "--split-seed", "3"]
    ctx = _train_oracle().make_context("train-oracle", cmd)
    cfg = config_from_params(ctx.params)
    assert (cfg.classifier, cfg.loss, cfg.loss_params["gamma"], cfg.broadcast, cfg.z, cfg.lr, cfg.flip) == \
        ("resnet", "focal", 0.5, True, "linear", 0.1, False)
    assert cfg.eval_splits == ("a", "b") and cfg.compile and not cfg.progress
    assert cfg.model_kwargs == {"depth": 2} and cfg.out == "x/y" and not cfg.channels_last
    assert cfg.split_seed == 3 and cfg.workers is None and cfg.precision is None
    assert cfg.cache == "artifacts/fashion-mnist/cache" and cfg.artifacts == "artifacts/fashion-mnist"
    defaults = config_from_params(_train_oracle().make_context("train-oracle", []).params)
    assert asdict(defaults) == asdict(TrainConfig())


def test_the_group_hash_leaves_out_exactly_where_runtime_and_seed():
    """Pinned: a change here renames every run directory (their group hash)."""
    assert set(NOT_IN_GROUP) == {
        "seed", "out", "runs_root", "artifacts", "data", "cache", "labels_file", "eval_splits",
        "resume", "progress", "workers", "device", "compile", "cuda_graph", "eval_batch_size",
        "ckpt_every", "log_every", "stop_at_step", "features_cache",
        # where the oracle's weights come from: the weights themselves (weights, weights_sha256)
        # are in the group, so the classifier's file taken by default and the same file given
        # with --weights make one group
        "hub_weights"}
    ident = {"model": "m", "weights_sha256": "w", "dataset_fingerprint": "f", "split": "train",
             "corruption": "none"}
    base = as_record(TrainConfig())
    for name in NOT_IN_GROUP:
        changed = {**base, name: "something else"}
        assert group_hash(changed, ident) == group_hash(base, ident), name
    for name in ("lr", "precision", "channels_last", "accum_steps", "train_split", "alpha_pos"):
        assert group_hash({**base, name: 123}, ident) != group_hash(base, ident), name


def test_runs_without_weights_keep_their_group_and_weights_are_named_by_contents():
    """Pinned: the group of a run without --weights (every demo run, most runs) did not move
    when the weights file came to be named by its sha256 instead of its path."""
    ident = {"model": "m", "weights_sha256": "w", "dataset_fingerprint": "f", "split": "train",
             "corruption": "none"}
    assert group_hash(as_record(TrainConfig()), ident) == "162ce89213ee"
    head_only = TrainConfig(random_init=True, head_only=True, lr=0.1)
    assert group_hash(as_record(head_only), ident) == "f056f8b91779"
    k3 = as_record(TrainConfig(weights="k3.pth", weights_sha256="a" * 64))
    assert group_hash({**k3, "weights": "./k3.pth"}, ident) == group_hash(k3, ident)
    assert group_hash({**k3, "weights_sha256": "b" * 64}, ident) != group_hash(k3, ident)
    assert group_hash(k3, ident) != group_hash(as_record(TrainConfig()), ident)


def test_derived_lists_follow_the_field_declarations():
    assert set(FINE_TUNE_ONLY) == {"accum_steps", "precision", "channels_last",
                                   "workers", "eval_batch_size", "ckpt_every", "stop_at_step",
                                   "resume"}
    weights = set(PARAMS) - set(loss_params())
    assert set(LOSS_OPTIONS) == {"z", "broadcast", "class_balanced", "loss_params", *weights}
    assert set(BANK_FREE) == {"class_balanced", "out", "runs_root", "loss_params", *weights}
    loss = next(p for p in _train_oracle().params if p.name == "loss")
    assert list(loss.type.choices) == list(names())


@pytest.mark.parametrize("name", list(PARAMS))
def test_each_numeric_loss_option_has_one_range_on_the_cli_and_in_the_checks(name):
    from pipeline.core.losses import LossOptionError

    opt = next(p for p in _train_oracle().params if p.name == name)
    loss = next(n for n in names() if name in {p.name for p in get(n).params}) if name not in (
        "pos_weight", "neg_weight", "cb_beta") else "ce"
    with pytest.raises(click.BadParameter):
        opt.type.convert(-1.0, opt, None)          # the CLI refuses it ...
    given = {name: -1.0, **({"class_balanced": True} if name == "cb_beta" else {})}
    with pytest.raises(LossOptionError, match=PARAMS[name].flag):
        check_options(loss, given)          # ... and so does the API


def test_the_sweep_offers_a_value_list_for_each_numeric_loss_option():
    from pipeline.sweep.command import sweep
    from pipeline.sweep.grid import FLAGS, SWEEPABLE

    lists = [p.opts[0] for p in sweep.params if p.opts[0] in FLAGS.values()]
    assert lists == [p.flag for p in PARAMS.values()] and list(SWEEPABLE) == list(PARAMS)
