"""The demo's plan as a job list, for a scheduler's job array or ``xargs -P`` on one machine.

    python cli.py demo --full --job-list jobs.json        # write the list; nothing runs
    python cli.py demo --job jobs.json 17                 # run job 17 (one step of the plan)

A job is one step of the plan (``pipeline.demo.plan``): one ``cli.py`` command, or, for a step
that runs once per complete run of a classifier (``predict`` on the adversarial split), every
such command, expanded when the job runs.  Jobs come in *waves*: consecutive steps of one stage,
which read only what earlier waves wrote (the plan's order already guarantees it: the demo runs
them side by side with ``--jobs``); a wave may start once the one before has finished, and its
jobs in any order or at once.  A wave is a contiguous range of job numbers, so one array of a
scheduler runs it (``sbatch --array=FIRST-LAST``; ``cluster/slurm_waves.sh``), or ``seq FIRST
LAST | xargs -P N`` (``cluster/run_waves.sh``).

Each job is idempotent as its commands are: a complete cache, run or report is skipped, an
interrupted one resumed (a killed job: run it again), one that another process holds is refused
(its directory's lock), never done twice.  The list records the demo's settings; ``--job`` reads
them from it, so every job of a list runs the plan it was written from, and refuses a list whose
plan this code would no longer write.
"""
from __future__ import annotations

import json
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Callable

from cache.errors import TrustOraclesError
from cache.manifest import read_json, write_json_atomic
from pipeline.demo.plan import expand, plan
from pipeline.demo.run import StepRunner, run_step
from pipeline.demo.steps import DemoConfig, Step

SCHEMA = "trust-oracles-jobs/1"


class JobError(TrustOraclesError, RuntimeError):
    """A job list that cannot be run as asked: the message names the file, the job and the fix."""


def waves(steps: list[Step]) -> list[dict]:
    """Consecutive steps of one stage: [{"first", "last", "stage"}], job numbers inclusive."""
    out: list[dict] = []
    for i, step in enumerate(steps):
        if out and out[-1]["stage"] == step.stage:
            out[-1]["last"] = i
        else:
            out.append({"first": i, "last": i, "stage": step.stage})
    return out


def write_job_list(cfg: DemoConfig, path: Path) -> dict:
    """The plan of ``cfg`` as a job list at ``path`` (JSON, written atomically); returns it."""
    cfg = replace(cfg, dry_run=False, jobs=1)      # a job runs its own step, for real
    steps = plan(cfg)
    doc = {"schema": SCHEMA, "config": json.loads(json.dumps(asdict(cfg), default=str)),
           "folder": str(Path.cwd().resolve()),
           "run": f"python cli.py demo --job {path} N", "jobs": [
               {"job": i, "stage": s.stage, "label": s.label, "command": s.command()}
               for i, s in enumerate(steps)], "waves": waves(steps)}
    write_json_atomic(Path(path), doc)
    return doc


def read_config(doc: dict, path: Path) -> DemoConfig:
    """The demo settings a job list records (tuples given back their type)."""
    if doc.get("schema") != SCHEMA:
        raise JobError(f"{path} is not a job list of this version (schema {doc.get('schema')!r}, "
                       f"expected {SCHEMA!r}): write it again with `cli.py demo ... --job-list`")
    given = doc["config"]
    values = {f.name: tuple(given[f.name]) if isinstance(given.get(f.name), list)
              else given[f.name] for f in fields(DemoConfig) if f.name in given}
    return DemoConfig(**{**values, "artifacts": Path(values["artifacts"])})


def run_job(path: Path, index: int, echo: Callable[[str], None],
            in_process: StepRunner | None = None) -> int:
    """Job ``index`` of the list at ``path``: its step's command(s), run as the demo runs them;
    returns the first non-zero exit code, else 0 (``in_process``: as ``run.run_step``)."""
    doc = read_json(Path(path), "job list")
    cfg = read_config(doc, Path(path))
    if Path.cwd().resolve() != Path(doc["folder"]):
        raise JobError(f"{path} was written in {doc['folder']}, and its commands' paths are "
                       f"relative to that folder: run its jobs there (cd {doc['folder']}; a "
                       "scheduler's jobs start where they were submitted)")
    steps = plan(cfg)
    recorded = [j["command"] for j in doc["jobs"]]
    if [s.command() for s in steps] != recorded:
        raise JobError(f"{path} was written for another plan than this code makes of its "
                       "settings (the code changed since): write it again with `cli.py demo "
                       "... --job-list`, then run its jobs")
    if not 0 <= index < len(steps):
        raise JobError(f"{path} has jobs 0 to {len(steps) - 1}, not job {index}")
    for step in expand(steps[index], Path(cfg.artifacts) / "runs"):
        echo(f"[job {index}] {step.stage}: {step.label}\n$ {step.command()}")
        result = run_step(step, False, in_process)
        if result.returncode:
            return result.returncode
    return 0
