"""``cli.py demo``: the whole pipeline on the embedded Fashion-MNIST, through the commands a user
would type.

fit-classifier vit, resnet -> extract train + test (with the flipped view and the pooled
features of both views) and a shifted copy of test (ImageNet-C-style corruption) -> an
adversarial copy of part of test per classifier (attack, then extract it) -> train-oracle for
every <oracle, classifier> pair, loss (CE, focal, TCP, SS, plus CE/focal in the authors'
broadcasting variant) and seed -> predict: every fine-tuned run on its classifier's
adversarial split -> the same grid head-only (the frozen oracle backbone's cached features)
-> one alpha sweep (<vit, vit> SS, head-only) -> report.

Every step is a ``python cli.py ...`` command, printed before it runs so it can be copied: a
subprocess, except the head-only runs, the sweep and the predictions (seconds each), which run
the same click command inside the demo's process (sparing an interpreter start-up, ~3 s, each).
The commands themselves skip completed work (checkpoints, caches, runs), so a re-run is cheap and
``--seeds 3`` after the default adds only the missing seeds.  Hyperparameters are not passed:
they come from ``pipeline/core/presets.py``, exactly as for the bare commands.
"""
from __future__ import annotations

import io
import json
import os
import shlex
import subprocess
import sys
import time
from contextlib import ExitStack, redirect_stderr, redirect_stdout
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import click

from cache.manifest import write_json_atomic
from cache.reader import split_tag
from cache.runs import RunDir, find_runs
from pipeline.core.presets import DEMO, DEMO_ATTACK
from pipeline.oracle.command import predict, train_oracle
from pipeline.report import tables as T
from pipeline.sweep.command import sweep

CLI = Path(__file__).resolve().parents[2] / "cli.py"     # pipeline/demo/run.py -> cli.py
BROADCAST = "--authors-broadcast"
RUN_DIR = "RUN_DIR"        # a predict step's placeholder: one command per matching run


class DemoError(RuntimeError):
    """A step of the demo failed; the message names the command and its exit code."""


@dataclass(frozen=True)
class DemoConfig:
    artifacts: Path                         # artifacts/<dataset>: where the commands write
    data: str | None = None                 # None: the embedded copy
    seeds: int = 1
    corruption: str = "gaussian_noise"
    severity: int = 5
    classifiers: tuple[str, ...] = ("vit", "resnet")
    oracles: tuple[str, ...] = ("vit", "resnet")
    losses: tuple[str, ...] = ("ce", "focal", "tcp", "ss")
    broadcast_losses: tuple[str, ...] = ("ce", "focal")
    fit_args: tuple[str, ...] = ()          # appended to every fit-classifier command (tests)
    extract_args: tuple[str, ...] = ()
    train_args: tuple[str, ...] = ()
    head_args: tuple[str, ...] = ()         # head-only train-oracle commands and the sweep
    head_only: bool = True                  # the head-only grid and the sweep
    report_args: tuple[str, ...] = ()
    progress: bool = True
    dry_run: bool = False


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


@dataclass
class StepResult:
    step: Step
    seconds: float
    returncode: int
    output: list[str] = field(default_factory=list)


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
        steps.append(Step("extract", (*common, "--split", "train", "--split", "test",
                                      "--flip-view", *feats, *quiet, *cfg.extract_args),
                          f"{name}: cache train + test"))
        steps.append(Step("extract", (*common, "--split", "test", "--corruption", cfg.corruption,
                                      "--severity", str(cfg.severity), "--flip-view", *feats,
                                      *quiet, *cfg.extract_args), f"{name}: cache {shifted}"))
    adv_root, cache_root = Path(cfg.artifacts) / "adversarial", Path(cfg.artifacts) / "cache"
    steps += adversarial_steps(cfg, data, quiet, adv_root, cache_root)
    variants = [(loss, ()) for loss in cfg.losses]
    variants += [(loss, (BROADCAST,)) for loss in cfg.broadcast_losses]
    for seed in range(cfg.seeds):
        for clf in cfg.classifiers:
            for oracle in cfg.oracles:
                for loss, extra in variants:
                    label = f"<{oracle}, {clf}> {loss}{' (broadcast)' if extra else ''} seed {seed}"
                    steps.append(Step("train", (
                        "train-oracle", "--classifier", clf, "--oracle", oracle, "--loss", loss,
                        *extra, "--seed", str(seed), *data, "--eval-split", shifted, *quiet,
                        *cfg.train_args), label))
    for clf in cfg.classifiers:
        steps.append(Step("predict", (
            "predict", "--run", RUN_DIR, "--data", str(adv_root), "--split",
            adversarial_split(clf), "--cache", str(cache_root), "--name", DEMO_ATTACK["tag"],
            "--precision", DEMO["predict_precision"], *quiet),
            f"every run of {clf} on {adversarial_split(clf)}", each_run_of=clf))
    if cfg.head_only:
        steps += head_only_steps(cfg, variants, data, quiet, shifted)
    # the bare `report` reads artifacts/fashion-mnist/runs; another --data writes elsewhere
    where = (("--runs-root", str(Path(cfg.artifacts) / "runs"), "--out",
              str(Path(cfg.artifacts) / "report")) if cfg.data else ())
    steps.append(Step("report", ("report", *where, *cfg.report_args), "tables and figures"))
    return steps


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
            "--precision", DEMO_ATTACK["precision"], "--out", str(adv_root), "--name", split,
            *quiet), f"{name}: adversarial copy of test ({DEMO_ATTACK['attack']})"))
        steps.append(Step("extract", (
            "extract", "--classifier", name, "--data", str(adv_root), "--split", split,
            "--precision", DEMO_ATTACK["precision"], "--out", str(cache_root), *quiet,
            *cfg.extract_args), f"{name}: cache {split}"))
    return steps


def expand(step: Step, runs_root: Path) -> list[Step]:
    """A per-run step -> one step per complete run of its classifier under ``runs_root``."""
    if step.each_run_of is None:
        return [step]
    runs, root = [], Path(runs_root)
    for path in find_runs(root) if root.is_dir() else []:
        doc = RunDir(path).read_if_any()
        if doc.get("status") == "complete" and doc["run"]["classifier"] == step.each_run_of \
                and not doc.get("head_only"):   # fine-tuned runs only, whatever exists
            runs.append(root / path.relative_to(root.resolve()))
    return [replace(step, args=tuple(str(r) if a == RUN_DIR else a for a in step.args),
                    label=f"{step.label}: {r.name}", each_run_of=None) for r in runs]


def head_only_steps(cfg: DemoConfig, variants: list, data: tuple, quiet: tuple,
                    shifted: str) -> list[Step]:
    """The fine-tuned grid again with --head-only, then the <vit, vit> SS alpha sweep."""
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
    if "vit" in cfg.classifiers and "vit" in cfg.oracles and "ss" in cfg.losses:
        steps.append(Step("sweep", ("sweep", "--classifier", "vit", "--oracle", "vit", *data,
                                    *quiet, *cfg.head_args), "<vit, vit> SS alpha-/alpha+ sweep"))
    return steps


def run_step(step: Step, capture: bool) -> StepResult:
    """One ``cli.py`` command; its output goes to the terminal (progress bars) or is kept."""
    if step.args[0] in IN_PROCESS and step.stage in ("head-only", "sweep", "predict"):
        return run_in_process(step, capture)
    return run_subprocess(step, capture)


# Commands the demo runs inside its own process (the same click objects cli.py dispatches to):
# seconds-long steps, where an interpreter start-up (~3 s with torch) would be most of the cost.
IN_PROCESS = {"train-oracle": train_oracle, "sweep": sweep, "predict": predict}


def run_in_process(step: Step, capture: bool) -> StepResult:
    """The step's click command called in this process; a failure is its exit code, as for a
    subprocess (click's usage/run errors, a user error of the stage: 1, with its message)."""
    t0, buf = time.perf_counter(), io.StringIO()
    with ExitStack() as stack:
        if capture:
            stack.enter_context(redirect_stdout(buf))
            stack.enter_context(redirect_stderr(buf))
        try:
            IN_PROCESS[step.args[0]].main(list(step.args[1:]), prog_name="cli.py",
                                          standalone_mode=False)
            code = 0
        except click.ClickException as err:
            err.show()
            code = err.exit_code
        except click.exceptions.Exit as err:
            code = err.exit_code
        except Exception as err:  # noqa: BLE001 - a stage's user error (CacheError, ...)
            click.echo(f"error: {err}", err=True)
            code = 1
    return StepResult(step, time.perf_counter() - t0, code, buf.getvalue().splitlines())


def run_subprocess(step: Step, capture: bool) -> StepResult:
    """One ``cli.py`` subprocess; its output goes to the terminal (progress bars) or is kept."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(CLI), *step.args], text=True,
                          stdout=subprocess.PIPE if capture else None,
                          stderr=subprocess.STDOUT if capture else None)
    lines = proc.stdout.splitlines() if capture and proc.stdout else []
    return StepResult(step, time.perf_counter() - t0, proc.returncode, lines)


def run(cfg: DemoConfig, echo=print, capture: bool = False) -> dict:
    """Run (or, with ``dry_run``, list) every step; stop at the first failure (DemoError).
    Returns a summary; ``<artifacts>/demo.json`` records the commands and their wall times."""
    steps = plan(cfg)
    if cfg.dry_run:
        for step in steps:
            echo(step.command())
        return {"steps": len(steps), "dry_run": True}
    t0, results, i = time.perf_counter(), [], 0
    while i < len(steps):
        steps[i:i + 1] = expand(steps[i], Path(cfg.artifacts) / "runs")
        if i == len(steps):
            break
        step, i = steps[i], i + 1
        echo(f"\n[{i}/{len(steps)}] {step.stage}: {step.label}   ({_clock(time.perf_counter() - t0)} "
             "elapsed)")
        echo(f"$ {step.command()}")
        result = run_step(step, capture)
        results.append(result)
        for line in result.output:
            echo(f"  {line}")
        if result.returncode:
            _write_log(cfg, results, time.perf_counter() - t0, failed=True)
            raise DemoError(f"step {i}/{len(steps)} failed with exit code {result.returncode}: "
                            f"{step.command()}\nFix the cause and re-run the demo: completed "
                            "steps are skipped.")
    total = time.perf_counter() - t0
    log = _write_log(cfg, results, total, failed=False)
    return {"steps": len(steps), "seconds": total, "log": str(log),
            "by_stage": _by_stage(results), "report": report_summary(cfg)}


def _clock(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m{s:02d}s"


def _by_stage(results: list[StepResult]) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in results:
        out[r.step.stage] = round(out.get(r.step.stage, 0.0) + r.seconds, 1)
    return out


def _write_log(cfg: DemoConfig, results: list[StepResult], total: float, failed: bool) -> Path:
    path = Path(cfg.artifacts) / "demo.json"
    path.parent.mkdir(parents=True, exist_ok=True)   # a first step that fails wrote nothing yet
    write_json_atomic(path, {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
        "failed": failed, "seconds": round(total, 1), "by_stage": _by_stage(results),
        "steps": [{"command": r.step.command(), "stage": r.step.stage, "label": r.step.label,
                   "seconds": round(r.seconds, 2), "returncode": r.returncode}
                  for r in results],
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    return path


def report_summary(cfg: DemoConfig) -> dict:
    """Where the report is and its main table (paper definitions, the test split)."""
    out = _report_dir(cfg)
    doc = json.loads((out / "report.json").read_text())
    splits = {s["split"]: s for s in doc["splits"]}
    main = splits.get("test") or next(iter(splits.values()))
    table = T.build_tables(main, "paper")[0]
    return {"dir": str(out), "markdown": str(out / "report.md"), "split": main["split"],
            "splits": list(splits), "main_table": T.markdown_table(table)}


def _report_dir(cfg: DemoConfig) -> Path:
    args = list(plan_report_args(cfg))
    if "--out" in args:    # the last --out wins, as in click
        return Path(args[len(args) - 1 - args[::-1].index("--out") + 1])
    return Path(cfg.artifacts) / "report"


def plan_report_args(cfg: DemoConfig) -> tuple[str, ...]:
    return plan(cfg)[-1].args
