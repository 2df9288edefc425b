"""Where outputs go by default: one artifacts root per dataset, ``artifacts/<name>`` under the
working directory, holding every stage's default outputs: ``cache/``, ``runs/``, ``report/``,
``sweeps/``, ``classifiers/``, ``adversarial/``.

``pipeline.data.sources.default_artifacts`` gives a ``--data`` folder its name (the folder's
name; the embedded dataset: ``fashion-mnist``); train-oracle records the root in run.json
(config ``artifacts``), so the report writes beside the runs it reads, and a bare ``report``
finds the one root under ``./artifacts`` that holds runs.  Torch-free: ``report`` uses it.
"""
from __future__ import annotations

from pathlib import Path

from cache.manifest import MANIFEST_FILE
from cache.runs import find_runs
from cache.schema import CacheError
from pipeline.core.presets import ARTIFACTS


class ArtifactsError(CacheError):
    """No artifacts root, or several, where one is needed (cli.py prints it, exit code 1)."""


def artifacts_root(name: str) -> Path:
    """The artifacts root of the dataset called ``name`` (relative to the working directory)."""
    return ARTIFACTS / name


def roots_holding(what: str, base: Path = ARTIFACTS) -> dict[Path, int]:
    """{artifacts root under ``base``: how many run directories (``what="runs"``) or complete
    classifier caches (``"cache"``, extract's ``cache/<classifier>/<tag>``) it holds}, in name
    order; roots holding none are left out."""
    base = Path(base)
    found = {}
    for root in sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else ():
        folder = root / what
        if not folder.is_dir():
            continue
        count = len(find_runs(folder)) if what == "runs" else len(cache_manifests(root))
        if count:
            found[root] = count
    return found


def cache_manifests(root: Path) -> list[Path]:
    """The manifests of a root's complete classifier caches (``cache/<classifier>/<tag>``)."""
    return sorted((Path(root) / "cache").glob(f"*/*/{MANIFEST_FILE}"))


def listing(found: dict[Path, int], what: str) -> str:
    """``artifacts/a/runs (2 runs), artifacts/b/runs (1 run)``: the roots a refusal names."""
    noun = {"runs": "run", "cache": "cache"}[what]
    return ", ".join(f"{root}/{what} ({n} {noun}{'' if n == 1 else 's'})"
                     for root, n in found.items())


def only_runs_root(base: Path = ARTIFACTS) -> Path:
    """The ``runs/`` folder of the one artifacts root under ``base`` that holds runs; refused,
    never guessed, when there are several (listed with their run counts) or none."""
    found = roots_holding("runs", base)
    if len(found) == 1:
        return next(iter(found)) / "runs"
    if not found:
        raise ArtifactsError(
            f"no runs in any artifacts root ({base}/<dataset>/runs, under {Path.cwd()}): train "
            "oracles first (`cli.py extract`, then `cli.py train-oracle`), or pass RUN_DIR, "
            "--runs-root or --cache")
    raise ArtifactsError(f"several artifacts roots hold runs: {listing(found, 'runs')}; pick one "
                         f"with --runs-root (e.g. --runs-root {next(iter(found))}/runs), or pass "
                         "RUN_DIR ...")


def recorded_root(run_dir: Path, recorded: str) -> Path:
    """The artifacts root a run recorded (train-oracle's working directory relative, e.g.
    ``artifacts/flowers``), found among the run directory's ancestors when it lies inside it,
    so a report run from another directory or on a moved tree still writes beside the runs."""
    rec = Path(recorded)
    if rec.is_absolute() or not rec.parts:
        return rec
    for ancestor in Path(run_dir).resolve().parents:
        if ancestor.parts[-len(rec.parts):] == rec.parts:
            return ancestor
    return rec       # the run lives outside its root (--out / --runs-root elsewhere)


def cache_root_of(cache_dir: Path) -> Path | None:
    """The artifacts root holding a classifier cache at ``<root>/cache/<classifier>/<tag>``
    (extract's default layout), else None."""
    path = Path(cache_dir).resolve()
    return path.parents[2] if len(path.parents) > 2 and path.parents[1].name == "cache" else None
