"""The demo's plan: every ``cli.py`` command of the demo, in order, and the expansion of a step
that runs once per complete run (``predict`` on the adversarial split).  Hyperparameters are not
passed: they come from ``pipeline/core/presets.py``, exactly as for the bare commands."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from cache.reader import split_tag
from cache.runs import RunDir, find_runs
from pipeline.core.presets import DEMO_ATTACK, PAPER_LOSS
from pipeline.demo.pretrained import pretrained_steps
from pipeline.sweep.report import read_chosen
from pipeline.demo.steps import (HEAD_SCORERS, RUN_DIR, SLOPES, DemoConfig, Step,
                                 adversarial_split, adversarial_steps, extract_steps)

BROADCAST = "--authors-broadcast"


def plan(cfg: DemoConfig) -> list[Step]:
    """Every command of the demo, in order (seed-major, so seed 0 of the whole grid comes first)."""
    data = ("--data", cfg.data) if cfg.data else ()
    quiet = () if cfg.progress else ("--no-progress",)
    shifted = split_tag("test", cfg.corruption, cfg.severity)
    if not cfg.base_oracles:                   # --pretrained-only: the study alone
        return pretrained_steps(cfg, data, quiet)
    steps = []
    for name in dict.fromkeys(cfg.classifiers + cfg.oracles):
        steps.append(Step("fit", ("fit-classifier", "--classifier", name, *data, *quiet,
                                  *cfg.fit_args), f"base classifier {name}"))
    # every oracle's cache too: a head-only oracle reads its own model's features
    extracted = cfg.classifiers + (cfg.oracles if cfg.head_only else ())
    # explicit either way (on is the embedded set's default, presets.EMBEDDED_EXTRACT)
    feats = ("--features",) if cfg.head_only else ("--no-features",)
    for name in dict.fromkeys(extracted):
        steps += extract_steps(cfg, name, ("--classifier", name, *data), feats, quiet)
    adv_root, cache_root = Path(cfg.artifacts) / "adversarial", Path(cfg.artifacts) / "cache"
    steps += adversarial_steps(cfg, {n: () for n in cfg.classifiers}, data, quiet, adv_root,
                               cache_root)
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
            *quiet),
            f"every run of {clf} on {adversarial_split(clf)}", each_run_of=clf))
    if cfg.head_only and "vit" in cfg.classifiers and "vit" in cfg.oracles and PAPER_LOSS in cfg.losses:
        # named, as the report's runs: a sweep without --data refuses when ./artifacts holds
        # caches of another dataset too
        where = data or ("--cache", str(Path(cfg.artifacts) / "cache"))
        steps.append(Step("sweep", ("sweep", "--classifier", "vit", "--oracle", "vit", *where,
                                    *quiet, *cfg.head_args), "<vit, vit> SS alpha-/alpha+ sweep"))
    if cfg.pretrained:
        steps += pretrained_steps(cfg, data, quiet)
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


def expand(step: Step, runs_root: Path) -> list[Step]:
    """A per-run step -> one step per complete run of its classifier under ``runs_root``; a
    step of swept slopes -> ``with_slopes``."""
    if step.each_run_of is None:
        return with_slopes(step)
    runs, root = [], Path(step.runs_root or runs_root)
    for path in find_runs(root) if root.is_dir() else []:
        run = RunDir(path).record_if_any()
        if run.complete and run.labels.classifier == step.each_run_of:
            runs.append(root / path.relative_to(root.resolve()))
    return [replace(step, args=tuple(str(r) if a == RUN_DIR else a for a in step.args),
                    label=f"{step.label}: {r.name}", each_run_of=None) for r in runs]


def with_slopes(step: Step) -> list[Step]:
    """A step whose SS slopes are a sweep's choice, with the chosen values in place of
    ``SLOPES`` once that sweep has run (unchanged before: a dry run prints the placeholders);
    none where the sweep kept the oracle's own slopes: the plan's paper-slopes step is that run."""
    if step.slopes_from is None:
        return [step]
    found = read_chosen(Path(step.slopes_from))
    if found is None:
        return [step]
    chosen, fixed = found
    if all(chosen[k] == fixed.get(k) for k in ("alpha_pos", "alpha_neg")):
        return []
    values = {SLOPES[0]: chosen["alpha_pos"], SLOPES[1]: chosen["alpha_neg"]}
    return [replace(step, args=tuple(f"{values[a]:g}" if a in values else a for a in step.args),
                    label=f"{step.label} (alpha+ {values[SLOPES[0]]:g}, alpha- "
                    f"{values[SLOPES[1]]:g})", slopes_from=None)]


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
