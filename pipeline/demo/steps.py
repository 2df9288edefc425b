"""The demo's building blocks: its config, a step (one ``cli.py`` command), and the steps every
grid shares -- a model's caches, a classifier's adversarial split.  pipeline/demo/plan.py
composes the demo's plan from them, pipeline/demo/pretrained.py the pretrained-oracle grid."""
from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from cache.reader import split_tag
from pipeline.core.presets import DEMO, DEMO_ATTACK

CLI = Path(__file__).resolve().parents[2] / "cli.py"     # pipeline/demo/steps.py -> cli.py
RUN_DIR = "RUN_DIR"        # a predict step's placeholder: one command per matching run
SLOPES = ("SWEPT_ALPHA_POS", "SWEPT_ALPHA_NEG")   # a step's placeholders: a sweep's chosen slopes
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
    pretrained: bool = False                # the pretrained study (demo/pretrained.py)
    full: bool = False                      # --full: the study's fits and seeds too
    fits: int | None = None                 # the study's fits per size (None: presets')
    base_oracles: bool = True               # the from-scratch oracles' grid and its report


@dataclass(frozen=True)
class Step:
    stage: str              # fit | extract | attack | train | predict | head-only | sweep | report
    args: tuple[str, ...]                   # cli.py arguments
    label: str
    each_run_of: str | None = None          # classifier: repeat for each of its complete runs
    runs_root: str | None = None            # ... under this root (None: <artifacts>/runs)
    slopes_from: str | None = None          # sweep directory whose chosen SS slopes fill SLOPES

    def command(self) -> str:
        """What a user types in the repository root."""
        cli = os.path.relpath(CLI) if not os.path.relpath(CLI).startswith("..") else str(CLI)
        return shlex.join(["python", cli, *self.args])


def extract_steps(cfg: DemoConfig, name: str, model: tuple[str, ...], feats: tuple[str, ...],
                  quiet: tuple[str, ...]) -> list[Step]:
    """One model's caches of train and test (with the flipped view) and of the shifted test;
    ``model``: the options naming it (--classifier, --weights, --data)."""
    mc, steps = mc_dropout_args(name), []
    shifted = split_tag("test", cfg.corruption, cfg.severity)
    splits = (("--split", "train", "--split", "test"),) if not mc else (
        ("--split", "train"), ("--split", "test", *mc))
    for split in splits:
        steps.append(Step("extract", ("extract", *model, *split, "--flip-view", *feats, *quiet,
                                      *cfg.extract_args),
                          f"{name}: cache {' + '.join(split[1::2][:2])}"))
    steps.append(Step("extract", ("extract", *model, "--split", "test", "--corruption",
                                  cfg.corruption, "--severity", str(cfg.severity), "--flip-view",
                                  *feats, *mc, *quiet, *cfg.extract_args),
                      f"{name}: cache {shifted}"))
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


def attack_options(attack: dict) -> tuple[str, ...]:
    """`cli.py attack`'s options for a preset (presets.DEMO_ATTACK, PRETRAINED["attack"]): its
    method, the strength it sets (the attack's own defaults otherwise), rows and precision."""
    strength = (("--eps", attack["eps"]) if "eps" in attack else ()) + \
        (("--step-size", attack["step_size"]) if "step_size" in attack else ()) + \
        (("--steps", str(attack["steps"])) if "steps" in attack else ()) + \
        (("--no-random-start",) if attack.get("random_start") is False else ())
    return ("--attack", attack["attack"], *strength, "--max-samples", str(attack["max_samples"]),
            "--precision", attack["precision"])


def adversarial_steps(cfg: DemoConfig, models: dict[str, tuple[str, ...]], data: tuple,
                      quiet: tuple, adv_root: Path, cache_root: Path,
                      attack: dict = DEMO_ATTACK, which: str = "") -> list[Step]:
    """Per classifier (``models``: name -> the options giving its weights, if any): attack a
    seeded part of test against it (``attack``: a preset, attack_options), then cache the
    classifier's outputs on the stored images; ``which`` tells the classifier's fit in the
    labels.  Every attack first, then every extraction: consecutive steps of one stage can run
    side by side (``demo --jobs``)."""
    attacks, extracts = [], []
    for name, weights in models.items():
        split = adversarial_split(name)
        attacks.append(Step("attack", (
            "attack", "--classifier", name, *weights, *data, "--split", "test",
            *attack_options(attack), "--out", str(adv_root), "--out-split", split, *quiet),
            f"{name}{which}: adversarial copy of test ({attack.get('label', attack['attack'])})"))
        extracts.append(Step("extract", (
            # with the classifier's features (as its other splits): TrustScore scores these too
            "extract", "--classifier", name, *weights, "--data", str(adv_root), "--split", split,
            *(("--features",) if cfg.head_only else ()),
            "--precision", attack["precision"], "--out", str(cache_root),
            *mc_dropout_args(name), *quiet, *cfg.extract_args), f"{name}{which}: cache {split}"))
    return attacks + extracts
