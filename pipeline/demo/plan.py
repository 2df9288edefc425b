"""The demo's plan: every ``cli.py`` command of the demo, in order, and the expansion of a step
that runs once per complete run (``predict`` on the adversarial split).  Hyperparameters are not
passed: they come from ``pipeline/core/presets.py``, exactly as for the bare commands."""
from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

from cache.reader import split_tag
from cache.runs import RunDir, find_runs
from pipeline.core.presets import DEMO, DEMO_ATTACK

CLI = Path(__file__).resolve().parents[2] / "cli.py"     # pipeline/demo/plan.py -> cli.py
BROADCAST = "--authors-broadcast"
RUN_DIR = "RUN_DIR"        # a predict step's placeholder: one command per matching run
# The learned scorers on the classifier's own features (O = C), beside the linear head-only grid:
# ConfidNet's head (the paper's small-scale setup: at least DemoConfig.head_seeds seeds) and the
# same head fed with the features plus the per-row logit statistics ("stacked": DemoConfig.seeds),
# each with DemoConfig.scorer_losses.
HEAD_SCORERS = {"ConfidNet head": ("--head-arch", "confidnet"),
                "stacked ConfidNet head": ("--head-arch", "confidnet", "--head-inputs", "stacked")}



@dataclass(frozen=True)
class DemoConfig:
    artifacts: Path                         # artifacts/<dataset>: where the commands write
    data: str | None = None                 # None: the embedded copy
    # the grid: presets.DEMO's, unless the command line says otherwise
    seeds: int = DEMO["seeds"]
    corruption: str = DEMO["corruption"]
    severity: int = DEMO["severity"]
    classifiers: tuple[str, ...] = DEMO["classifiers"]
    oracles: tuple[str, ...] = DEMO["oracles"]
    losses: tuple[str, ...] = DEMO["losses"]
    broadcast_losses: tuple[str, ...] = DEMO["default_broadcast_losses"]   # --full: DEMO's
    pairs: str = DEMO["pairs"]              # fine-tuned pairs: "same" (O = C) or "all"
    head_seeds: int = DEMO["head_seeds"]    # at least this many seeds of ConfidNet's head
    scorer_losses: tuple[str, ...] = DEMO["scorer_losses"]   # the losses of HEAD_SCORERS' runs
    fit_args: tuple[str, ...] = ()          # appended to every fit-classifier command (tests)
    extract_args: tuple[str, ...] = ()
    train_args: tuple[str, ...] = ()
    head_args: tuple[str, ...] = ()         # head-only train-oracle commands and the sweep
    head_only: bool = True                  # the head-only grid and the sweep
    report_args: tuple[str, ...] = ()
    progress: bool = True
    dry_run: bool = False
    jobs: int = 1                           # fine-tuned train-oracle commands run at once


@dataclass(frozen=True)
class Step:
    stage: str              # fit | extract | attack | train | predict | head-only | sweep | report
    args: tuple[str, ...]                   # cli.py arguments
    label: str
    each_run_of: str | None = None          # classifier: repeat for each of its complete runs

    def command(self) -> str:
        """What a user types in the repository root."""
        cli = os.path.relpath(CLI) if not os.path.relpath(CLI).startswith("..") else str(CLI)
        return shlex.join(["python", cli, *self.args])


def plan(cfg: DemoConfig) -> list[Step]:
    """Every command of the demo, in order (seed-major, so seed 0 of the whole grid comes first)."""
    data = ("--data", cfg.data) if cfg.data else ()
    quiet = () if cfg.progress else ("--no-progress",)
    shifted = split_tag("test", cfg.corruption, cfg.severity)
    steps = []
    for name in dict.fromkeys(cfg.classifiers + cfg.oracles):
        steps.append(Step("fit", ("fit-classifier", "--classifier", name, *data, *quiet,
                                  *cfg.fit_args), f"base classifier {name}"))
    # every oracle's cache too: a head-only oracle reads its own model's features
    extracted = cfg.classifiers + (cfg.oracles if cfg.head_only else ())
    # explicit either way (on is the embedded set's default, presets.EMBEDDED_EXTRACT)
    feats = ("--features",) if cfg.head_only else ("--no-features",)
    for name in dict.fromkeys(extracted):
        common = ("extract", "--classifier", name, *data)
        mc = mc_dropout_args(name)
        splits = (("--split", "train", "--split", "test"),) if not mc else (
            ("--split", "train"), ("--split", "test", *mc))
        for split in splits:
            steps.append(Step("extract", (*common, *split, "--flip-view", *feats, *quiet,
                                          *cfg.extract_args),
                              f"{name}: cache {' + '.join(split[1::2][:2])}"))
        steps.append(Step("extract", (*common, "--split", "test", "--corruption", cfg.corruption,
                                      "--severity", str(cfg.severity), "--flip-view", *feats,
                                      *mc, *quiet, *cfg.extract_args), f"{name}: cache {shifted}"))
    adv_root, cache_root = Path(cfg.artifacts) / "adversarial", Path(cfg.artifacts) / "cache"
    steps += adversarial_steps(cfg, data, quiet, adv_root, cache_root)
    variants = [(loss, ()) for loss in cfg.losses]
    variants += [(loss, (BROADCAST,)) for loss in cfg.broadcast_losses]
    steps += fine_tuned_steps(cfg, variants, data, quiet, shifted)
    if cfg.head_only:
        steps += head_only_steps(cfg, variants, data, quiet, shifted)
    # every run, fine-tuned and head-only, on its classifier's adversarial split (from images:
    # a head-only run's frozen backbone computes the features)
    for clf in cfg.classifiers:
        steps.append(Step("predict", (
            "predict", "--run", RUN_DIR, "--data", str(adv_root), "--split",
            adversarial_split(clf), "--cache", str(cache_root), "--out-name", DEMO_ATTACK["tag"],
            "--precision", DEMO["predict_precision"], *quiet),
            f"every run of {clf} on {adversarial_split(clf)}", each_run_of=clf))
    if cfg.head_only and "vit" in cfg.classifiers and "vit" in cfg.oracles and "ss" in cfg.losses:
        # named, as the report's runs: a sweep without --data refuses when ./artifacts holds
        # caches of another dataset too
        where = data or ("--cache", str(Path(cfg.artifacts) / "cache"))
        steps.append(Step("sweep", ("sweep", "--classifier", "vit", "--oracle", "vit", *where,
                                    *quiet, *cfg.head_args), "<vit, vit> SS alpha-/alpha+ sweep"))
    # named: a bare `report` refuses when ./artifacts holds runs of another dataset too; the
    # report goes to the runs' artifacts root (<artifacts>/report)
    where = ("--runs-root", str(Path(cfg.artifacts) / "runs"))
    steps.append(Step("report", ("report", *where, *cfg.report_args), "tables and figures"))
    return steps


def fine_tuned_steps(cfg: DemoConfig, variants: list, data: tuple, quiet: tuple,
                     shifted: str) -> list[Step]:
    """train-oracle for every pair of ``cfg.pairs``, loss variant and seed (seed-major)."""
    steps = []
    for seed in range(cfg.seeds):
        for clf in cfg.classifiers:
            for oracle in cfg.oracles if cfg.pairs == "all" else [o for o in cfg.oracles
                                                                   if o == clf]:
                for loss, extra in variants:
                    label = f"<{oracle}, {clf}> {loss}{' (broadcast)' if extra else ''} seed {seed}"
                    steps.append(Step("train", (
                        "train-oracle", "--classifier", clf, "--oracle", oracle, "--loss", loss,
                        *extra, "--seed", str(seed), *data, "--eval-split", shifted, *quiet,
                        *cfg.train_args), label))
    return steps


def mc_dropout_args(classifier: str) -> tuple[str, ...]:
    """extract's MC-Dropout options for the evaluated splits of presets.DEMO's mc_dropout
    classifier (none for the others)."""
    mc = DEMO["mc_dropout"]
    if classifier != mc["classifier"]:
        return ()
    return ("--mc-dropout", str(mc["passes"]), "--mc-dropout-rate", str(mc["rate"]))


def adversarial_split(classifier: str) -> str:
    return f"test-{DEMO_ATTACK['attack']}-{classifier}"


def adversarial_steps(cfg: DemoConfig, data: tuple, quiet: tuple, adv_root: Path,
                      cache_root: Path) -> list[Step]:
    """Per classifier: attack a seeded part of test against it (presets.DEMO_ATTACK; the attack's
    own defaults otherwise), then cache the classifier's outputs on the stored images."""
    steps = []
    for name in cfg.classifiers:
        split = adversarial_split(name)
        steps.append(Step("attack", (
            "attack", "--classifier", name, *data, "--split", "test", "--attack",
            DEMO_ATTACK["attack"], "--max-samples", str(DEMO_ATTACK["max_samples"]),
            "--precision", DEMO_ATTACK["precision"], "--out", str(adv_root), "--out-split", split,
            *quiet), f"{name}: adversarial copy of test ({DEMO_ATTACK['attack']})"))
        steps.append(Step("extract", (
            # with the classifier's features (as its other splits): TrustScore scores these too
            "extract", "--classifier", name, "--data", str(adv_root), "--split", split,
            *(("--features",) if cfg.head_only else ()),
            "--precision", DEMO_ATTACK["precision"], "--out", str(cache_root),
            *mc_dropout_args(name), *quiet, *cfg.extract_args), f"{name}: cache {split}"))
    return steps


def expand(step: Step, runs_root: Path) -> list[Step]:
    """A per-run step -> one step per complete run of its classifier under ``runs_root``."""
    if step.each_run_of is None:
        return [step]
    runs, root = [], Path(runs_root)
    for path in find_runs(root) if root.is_dir() else []:
        run = RunDir(path).record_if_any()
        if run.complete and run.labels.classifier == step.each_run_of:
            runs.append(root / path.relative_to(root.resolve()))
    return [replace(step, args=tuple(str(r) if a == RUN_DIR else a for a in step.args),
                    label=f"{step.label}: {r.name}", each_run_of=None) for r in runs]


def head_only_steps(cfg: DemoConfig, variants: list, data: tuple, quiet: tuple,
                    shifted: str) -> list[Step]:
    """The fine-tuned grid again with --head-only (every pair), the learned head scorers of
    HEAD_SCORERS on each classifier's own features."""
    steps = []
    for seed in range(cfg.seeds):
        for clf in cfg.classifiers:
            for oracle in cfg.oracles:
                for loss, extra in variants:
                    label = (f"<{oracle}, {clf}> {loss}{' (broadcast)' if extra else ''} head-only "
                             f"seed {seed}")
                    steps.append(Step("head-only", (
                        "train-oracle", "--head-only", "--classifier", clf, "--oracle", oracle,
                        "--loss", loss, *extra, "--seed", str(seed), *data, "--eval-split",
                        shifted, *quiet, *cfg.head_args), label))
    seeds = {"ConfidNet head": max(cfg.seeds, cfg.head_seeds),
             "stacked ConfidNet head": cfg.seeds}
    for seed in range(max(seeds.values())):
        for clf in [c for c in cfg.classifiers if c in cfg.oracles]:
            for scorer, extra in HEAD_SCORERS.items():
                for loss in [l for l in cfg.losses if l in cfg.scorer_losses
                             and seed < seeds[scorer]]:
                    steps.append(Step("head-only", (
                        "train-oracle", "--head-only", *extra, "--classifier", clf, "--oracle",
                        clf, "--loss", loss, "--seed", str(seed), *data, "--eval-split", shifted,
                        *quiet, *cfg.head_args), f"<{clf}, {clf}> {loss} {scorer} seed {seed}"))
    return steps
