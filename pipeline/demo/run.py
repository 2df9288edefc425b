"""``cli.py demo``: the whole pipeline on the embedded Fashion-MNIST, through the commands a user
would type.

fit-classifier vit, resnet -> extract train + test (with the flipped view and the pooled
features of both views; the vit's evaluated splits with MC-Dropout passes too) and a shifted copy
of test (ImageNet-C-style corruption) -> an adversarial copy of part of test per classifier
(attack, then extract it) -> train-oracle for the <oracle, classifier> pairs (O = C; --full:
all), losses (CE, focal, TCP, SS; --full: plus CE/focal in the authors' broadcasting variant)
and seeds -> the grid of every pair head-only (the frozen oracle backbone's cached features), ConfidNet's
head and the stacked head on each classifier's own features -> predict: every run on its
classifier's adversarial split -> one alpha sweep (<vit, vit> SS, head-only) -> report.

Every step is a ``python cli.py ...`` command, printed before it runs so it can be copied: a
subprocess, except the head-only runs, the sweep and the predictions (seconds each), which run
the same click command inside the demo's process (sparing an interpreter start-up, ~3 s, each).
The commands themselves skip completed work (checkpoints, caches, runs), so a re-run is cheap and
``--num-seeds 3`` after the default adds only the missing seeds.  Hyperparameters are not passed:
they come from ``pipeline/core/presets.py``, exactly as for the bare commands.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from cache.errors import TrustOraclesError
from cache.manifest import write_json_atomic
from pipeline.core.options import usable_cpus
from pipeline.demo.plan import expand, plan, with_slopes
from pipeline.demo.pretrained import missing_wheel, paths
from pipeline.demo.steps import CLI, DemoConfig, Step
from pipeline.report import tables as T

class DemoError(TrustOraclesError, RuntimeError):
    """A step of the demo failed; the message names the command and its exit code."""


@dataclass
class StepResult:
    step: Step
    seconds: float
    returncode: int
    output: list[str] = field(default_factory=list)


# A step run inside the demo's process: given by the command layer (``pipeline.demo.command``), which
# holds the click commands; without it every step is a subprocess.
StepRunner = Callable[[Step, bool], StepResult]
# The seconds-long stages, where an interpreter start-up (~3 s with torch) would be most of the
# cost: run in process where a runner is given.
IN_PROCESS_STAGES = ("head-only", "sweep", "predict")


def run_step(step: Step, capture: bool, in_process: StepRunner | None = None) -> StepResult:
    """One ``cli.py`` command; its output goes to the terminal (progress bars) or is kept."""
    if in_process is not None and step.stage in IN_PROCESS_STAGES:
        return in_process(step, capture)
    return run_subprocess(step, capture)


def run_subprocess(step: Step, capture: bool, env: dict | None = None,
                   cores: list[int] | None = None) -> StepResult:
    """One ``cli.py`` subprocess; its output goes to the terminal (progress bars) or is kept.
    ``cores``: the CPUs it may run on (through taskset, where installed): its loader workers and
    threads size themselves to them (``core.options.usable_cores``)."""
    t0 = time.perf_counter()
    pin = ["taskset", "-c", ",".join(map(str, cores))] if cores and shutil.which("taskset") else []
    proc = subprocess.run([*pin, sys.executable, str(CLI), *step.args], text=True, env=env,
                          stdout=subprocess.PIPE if capture else None,
                          stderr=subprocess.STDOUT if capture else None)
    lines = proc.stdout.splitlines() if capture and proc.stdout else []
    return StepResult(step, time.perf_counter() - t0, proc.returncode, lines)


def run(cfg: DemoConfig, echo=print, capture: bool = False,
        in_process: StepRunner | None = None) -> dict:
    """Run (or, with ``dry_run``, list) every step; stop at the first failure (DemoError).
    Returns a summary; ``log_path(cfg)`` (demo.json) records the commands and their wall
    times."""
    steps = plan(cfg)
    why = missing_wheel() if cfg.pretrained and not cfg.dry_run else None
    if why:
        raise DemoError(why)
    if cfg.dry_run:
        for step in steps:
            echo(step.command())
        return {"steps": len(steps), "dry_run": True}
    t0, results, i = time.perf_counter(), [], 0
    stages = parallel_stages(len(visible_gpus()))
    while i < len(steps):
        expanded = expand(steps[i], Path(cfg.artifacts) / "runs")
        steps[i:i + 1] = expanded
        if not expanded:            # no run to predict, or a sweep that kept the defaults
            continue
        batch = _batch(steps, i, cfg.jobs, stages)
        for k, step in enumerate(batch, start=i + 1):
            echo(f"\n[{k}/{len(steps)}] {step.stage}: {step.label}   "
                 f"({_clock(time.perf_counter() - t0)} elapsed)")
            echo(f"$ {step.command()}")
        done = _run_batch(batch, capture, in_process)
        for k, result in enumerate(done, start=i + 1):
            results.append(result)
            if len(batch) > 1:
                echo(f"\n[{k}/{len(steps)}] done in {_clock(result.seconds)}: {result.step.label}")
            for line in result.output:
                echo(f"  {line}")
            if result.returncode:
                _write_log(cfg, results, time.perf_counter() - t0, failed=True)
                raise DemoError(f"step {k}/{len(steps)} failed with exit code "
                                f"{result.returncode}: {result.step.command()}\nFix the cause and "
                                "re-run the demo: completed steps are skipped.")
        i += len(batch)
    total = time.perf_counter() - t0
    log = _write_log(cfg, results, total, failed=False)
    return {"steps": len(steps), "seconds": total, "log": str(log),
            "by_stage": _by_stage(results), "report": report_summary(cfg)}


# Stages whose consecutive steps are independent subprocesses: each writes its own checkpoint,
# adversarial split or run directory and reads only what earlier stages wrote.  Not extract on a
# machine of one GPU or none: its loader workers already keep the cores busy (on 2 cores, two
# extractions side by side took 297 s against 278 s one after the other).
PARALLEL_STAGES = ("fit", "attack", "train")
# With several GPUs, each step of a batch has a GPU of its own (visible_gpus, in turn), so these
# run side by side too: an extraction's loader then feeds its own device, and the head-only runs
# and predictions, seconds of GPU work each, pay an interpreter start-up apiece but run
# ``jobs`` at once instead of one after the other in the demo's process.
MULTI_GPU_STAGES = ("extract", "head-only", "predict")


def parallel_stages(gpus: int) -> tuple[str, ...]:
    """The stages whose consecutive steps run side by side on a machine with ``gpus`` GPUs."""
    return PARALLEL_STAGES + (MULTI_GPU_STAGES if gpus >= 2 else ())


def _batch(steps: list[Step], i: int, jobs: int, stages: tuple[str, ...]) -> list[Step]:
    """The steps to start together at ``i``: with ``jobs`` > 1, up to ``jobs`` consecutive steps
    of one stage of ``stages`` (``parallel_stages``); otherwise step ``i`` alone."""
    stage = steps[i].stage               # steps[i] is expanded (run's loop)
    if jobs <= 1 or stage not in stages:
        return [steps[i]]
    k = i + 1
    while k < len(steps) and k - i < jobs and steps[k].stage == stage \
            and steps[k].each_run_of is None:
        filled = with_slopes(steps[k])          # its sweep ran before this batch (plan order)
        steps[k:k + 1] = filled
        k += len(filled)
    return steps[i:k]


def _run_batch(batch: list[Step], capture: bool,
               in_process: StepRunner | None) -> list[StepResult]:
    """The batch's results in plan order; several steps run at once with their output kept
    (printed when each is done), each with an equal share of the cores as its threads (small
    models gain little from a second thread: two runs side by side finish sooner than one after
    the other with two threads each)."""
    if len(batch) == 1:
        return [run_step(batch[0], capture, in_process)]
    jobs = len(batch)       # the cores shared among the batch's steps, a short batch's too
    threads = str(max(1, (os.cpu_count() or 1) // jobs))
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", threads)}
    gpus, cores = visible_gpus(), sorted(usable_cpus())
    envs = [env if len(gpus) < 2 else {**env, "CUDA_VISIBLE_DEVICES": gpus[k % len(gpus)]}
            for k in range(len(batch))]
    # disjoint core sets: each step's loader workers count its share, not the machine's (16
    # steps on 64 cores would otherwise start 16 x 32 workers)
    n = len(cores)
    shares = [(cores[k * n // jobs:(k + 1) * n // jobs] if n >= jobs else [cores[k % n]])
              if n else None for k in range(len(batch))]
    with ThreadPoolExecutor(max_workers=len(batch)) as pool:
        return list(pool.map(lambda s, e, c: run_subprocess(s, True, e, c), batch, envs, shares))



def visible_gpus() -> list[str]:
    """The CUDA devices this process may use, as CUDA_VISIBLE_DEVICES names them: the steps of a
    batch go to them in turn (one GPU each), so a several-GPU machine runs them side by side."""
    import torch

    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip()][:torch.cuda.device_count()]
    return [str(k) for k in range(torch.cuda.device_count())]


def _clock(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m{s:02d}s"


def _by_stage(results: list[StepResult]) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in results:
        out[r.step.stage] = round(out.get(r.step.stage, 0.0) + r.seconds, 1)
    return out


def log_path(cfg: DemoConfig) -> Path:
    """demo.json, beside the report the invocation ends with: ``<artifacts>``, or with
    ``--pretrained-only`` the pretrained grid's root (the base grid's record stays)."""
    return (Path(cfg.artifacts) if cfg.base_oracles else paths(cfg)["root"]) / "demo.json"


def _write_log(cfg: DemoConfig, results: list[StepResult], total: float, failed: bool) -> Path:
    path = log_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)   # a first step that fails wrote nothing yet
    write_json_atomic(path, {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
        "failed": failed, "seconds": round(total, 1), "by_stage": _by_stage(results),
        "steps": [{"command": r.step.command(), "stage": r.step.stage, "label": r.step.label,
                   "seconds": round(r.seconds, 2), "returncode": r.returncode}
                  for r in results],
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine()})
    return path


def machine() -> dict:
    """Where the demo ran, for the results it produced (demo.json): CPU model and cores, the GPU
    the steps saw (none: CPU only), library versions.  Step seconds summed by stage overlap
    when ``--jobs`` runs steps at once; ``seconds`` is the wall time."""
    import platform

    import timm
    import torch

    cpu = platform.processor() or platform.machine()    # where /proc/cpuinfo names no model
    info = Path("/proc/cpuinfo")
    lines = info.read_text(errors="replace").splitlines() if info.exists() else []
    cpu = next((l.split(":", 1)[1].strip() for l in lines if l.startswith("model name")), cpu)
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu, "cores": os.cpu_count(), "gpu": gpu,
            "gpus": torch.cuda.device_count() if gpu else 0, "python": platform.python_version(),
            "torch": torch.__version__, "timm": timm.__version__}


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
