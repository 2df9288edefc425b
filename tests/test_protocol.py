"""train-oracle's protocol defaults come from one place: presets.PAPER_ORACLE, or EMBEDDED_ORACLE
on the embedded Fashion-MNIST; explicit options win; run.json records the resolved values."""
from __future__ import annotations

import json

from oracle_fixtures import extract, run_cli, train_args, write_colour_tree
from pipeline.core.presets import EMBEDDED_ORACLE, PAPER_ORACLE
from pipeline.oracle.settings.config import TrainConfig, resolve_protocol


def test_presets_fill_only_what_was_not_given():
    cfg, origin = resolve_protocol(TrainConfig(lr=0.5), embedded=True)
    assert cfg.lr == 0.5 and "lr" not in origin["from_preset"]
    for key in ("momentum", "batch_size", "epochs", "train_limit", "precision"):
        assert getattr(cfg, key) == EMBEDDED_ORACLE[key] and key in origin["from_preset"]
    assert origin["preset"].endswith("EMBEDDED_ORACLE")
    paper, origin = resolve_protocol(TrainConfig(), embedded=False)
    assert (paper.lr, paper.momentum, paper.batch_size, paper.epochs, paper.warmup_steps) == \
        (1e-5, 0.05, 40, 1, 100)
    assert {k: getattr(paper, k) for k in PAPER_ORACLE} == PAPER_ORACLE
    assert origin["preset"].endswith("PAPER_ORACLE")
    every_row, _ = resolve_protocol(TrainConfig(train_limit=0), embedded=True)
    assert every_row.train_limit is None            # 0 = every row, even on the embedded set


def test_run_json_records_the_resolved_paper_protocol(tmp_path):
    data = write_colour_tree(tmp_path / "data", {"train": 12, "val": 4})
    cache = tmp_path / "cache"
    extract(data, cache)
    args = train_args(data, cache, tmp_path / "run")
    i = args.index("--epochs")
    del args[i:i + 2]
    # train_args fixes --batch-size 8 and --precision fp32; the rest comes from PAPER_ORACLE,
    # whose one epoch of these 34 rows (4 steps) the small-run rule raises to 25 (100 steps)
    result = run_cli(args)
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    config = run["run"]["config"]
    assert config["lr"] == 1e-5 and config["momentum"] == 0.05 and config["epochs"] == 25
    assert config["batch_size"] == 8 and config["precision"] == "fp32"
    assert run["protocol"]["preset"] == "pipeline.presets.PAPER_ORACLE"
    assert "batch_size" not in run["protocol"]["from_preset"] and "lr" in run["protocol"]["from_preset"]
    assert run["schedule"]["total_steps"] == 100
    note = ("note: 34 training rows make 4 optimizer step(s) of batch 8 in the preset's 1 "
            "epoch(s), too few to train: running 25 epochs (100 steps; the rule: at least 100 "
            "steps, at most 50 epochs). --epochs N sets it")
    assert note in result.output and run["protocol"]["notes"]["epochs"] == note[len("note: "):]


def test_runs_root_places_the_default_run_directory_without_changing_the_group(tmp_path):
    data = write_colour_tree(tmp_path / "data", {"train": 12, "val": 4})
    cache = tmp_path / "cache"
    extract(data, cache)
    run_cli(train_args(data, cache, None, "--runs-root", tmp_path / "a", "--stop-at-step", 1))
    run_cli(train_args(data, cache, None, "--runs-root", tmp_path / "b", "--stop-at-step", 1))
    (a,), (b,) = list((tmp_path / "a").iterdir()), list((tmp_path / "b").iterdir())
    assert a.name == b.name and a.name.startswith("vit_tiny_patch16_224-vit_tiny_patch16_224_ce_seed0_")
