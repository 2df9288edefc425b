"""The tree is the architecture: imports flow one way between the stage packages, without cycles,
and `cli.py report` loads no torch.  Parsed statically with ``ast`` (plus one real report run), so
a change that breaks the layering fails here before anyone has to notice it in review.

    core  <-  data  <-  extract, classifier, oracle        report <- core (torch-free modules)
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

# What each package may import (first-party only; third-party imports are not restricted here).
ALLOWED = {
    "cache": {"cache"},
    "core": {"cache", "core"},
    "data": {"cache", "core", "data"},
    "extract": {"cache", "core", "data", "extract"},
    "classifier": {"cache", "core", "data", "classifier"},
    "oracle": {"cache", "core", "data", "oracle"},
    "corrupt": {"cache", "core", "data", "corrupt"},
    "attack": {"cache", "core", "data", "attack"},
    "report": {"cache", "core", "report"},
    "sweep": {"cache", "core", "data", "oracle", "sweep"},   # trains oracles through the oracle stage
    # runs the stages as subprocesses, the seconds-long head-only ones through their commands
    "demo": {"cache", "core", "data", "report", "oracle", "sweep", "demo"},
    # the Python API: above every stage, and nothing below imports it
    "trust_oracles": {"cache", "core", "data", "oracle", "report", "trust_oracles"},
}
# The only core modules `report` may use: they import no torch.
TORCH_FREE_CORE = {"pipeline.core", "pipeline.core.metrics", "pipeline.core.counts",
                   "pipeline.core.selective", "pipeline.core.losses", "pipeline.core.presets",
                   "pipeline.core.catalog", "pipeline.core.artifacts",
                   "pipeline.core.options", "pipeline.core.logits", "pipeline.core.values",
                   "pipeline.core.commandline",
                   *(f"pipeline.core.losses.{m}" for m in ("base", "registry", "ce", "focal",
                                                           "tcp", "ss"))}
TORCH = ("torch", "torchvision", "timm")
# Where a function-level import of a first-party module is allowed: a command loads its stage on
# call, which keeps torch out of the commands that do not need it.
LAZY_OK = ("command.py", "cli.py")
# The API loads a module on first use of one of its names, so that its metrics load no torch.
LAZY_API = ("trust_oracles/__init__.py", "trust_oracles/errors.py")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def sources() -> dict[str, Path]:
    files = [ROOT / "cli.py", *sorted((ROOT / "pipeline").rglob("*.py")),
             *sorted((ROOT / "cache").rglob("*.py")),
             *sorted((ROOT / "trust_oracles").rglob("*.py"))]
    return {module_name(p): p for p in files}


MODULES = sources()


def resolve(name: str) -> str | None:
    """A dotted import target -> the first-party module it loads (``pipeline.core`` for
    ``from pipeline.core import dist`` resolves to ``pipeline.core.dist`` by the caller)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str) -> list[tuple[str, int, bool]]:
    """(first-party module imported, line, at module level?) for every import in ``module``."""
    tree = ast.parse(MODULES[module].read_text())
    typing_only = {id(n) for s in tree.body if isinstance(s, ast.If) and "TYPE_CHECKING" in
                   ast.unparse(s.test) for n in ast.walk(s)}     # never imported at run time
    top = {id(n) for n in tree.body}
    top |= {id(n) for s in tree.body if isinstance(s, (ast.If, ast.Try)) for n in ast.walk(s)}
    out = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        for target in targets:
            first = resolve(target)
            if first is None and target.split(".")[0] in TORCH:
                first = target
            if first is not None:
                out.append((first, node.lineno, id(node) in top))
    return sorted(set(out))


def package(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] in ("cache", "trust_oracles"):
        return parts[0]
    return parts[1] if parts[0] == "pipeline" and len(parts) > 1 else None


def test_every_stage_imports_only_the_layers_below_it():
    wrong = []
    for module in MODULES:
        pkg = package(module)
        if pkg is None:
            continue
        assert pkg in ALLOWED, f"{module}: package {pkg!r} has no place in the layering (add it)"
        for target, line, _ in imports(module):
            tpkg = package(target)
            if tpkg is not None and tpkg not in ALLOWED[pkg]:
                wrong.append(f"{MODULES[module].relative_to(ROOT)}:{line} imports {target}")
            if pkg == "report" and tpkg == "core" and target not in TORCH_FREE_CORE:
                wrong.append(f"{MODULES[module].relative_to(ROOT)}:{line} imports {target}, "
                             "which loads torch")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


# The oracle stage's sub-packages by job, in the order imports may flow (a module imports its own
# sub-package and those before it; finetune and headonly, side by side, not each other).
ORACLE_LAYERS = {"nets": 0, "settings": 1, "loop": 2, "finetune": 3, "headonly": 3, "deploy": 4,
                 "command": 5}


def test_the_oracle_stage_imports_flow_one_way_between_its_jobs():
    def job(module: str) -> str:
        return module.split(".")[2]

    oracle = [m for m in MODULES if m.startswith("pipeline.oracle.")]
    assert {job(m) for m in oracle} == set(ORACLE_LAYERS), "a module outside the oracle's jobs"
    wrong = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {t}"
             for m in oracle for t, line, _ in imports(m)
             if t.startswith("pipeline.oracle.") and job(t) != job(m)
             and ORACLE_LAYERS[job(t)] >= ORACLE_LAYERS[job(m)]]
    assert not wrong, "oracle imports against its layering:\n" + "\n".join(wrong)


def test_no_import_cycles():
    graph = {m: {t for t, _, _ in imports(m) if t in MODULES and t != m} for m in MODULES}
    # a package's __init__ is imported with each of its modules: not an edge of its own
    graph = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}
    state, stack, cycles = {}, [], []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == "open":
                cycles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


# The command layer: the only modules that may import click or a command module.
COMMAND_LAYER = ("cli.py", "command.py", "commandline.py")


def _imports_click(path: Path) -> list[int]:
    tree = ast.parse(path.read_text())
    return [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Import) and any(a.name.split(".")[0] == "click" for a in n.names)
            or isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "click"]


def test_click_and_the_commands_only_in_the_command_layer():
    """The library stands below the command line (timm's train.py calls timm, never the
    reverse): the settings, the API and every stage's modules import neither click nor a
    command module; the commands convert their options through the same value types
    (pipeline.core.values) as the API."""
    wrong = []
    for m, path in MODULES.items():
        if path.name in COMMAND_LAYER:
            continue
        wrong += [f"{path.relative_to(ROOT)}:{line} imports click" for line in _imports_click(path)]
        wrong += [f"{path.relative_to(ROOT)}:{line} imports {t}" for t, line, _ in imports(m)
                  if t in MODULES and MODULES[t].name in COMMAND_LAYER]
    assert not wrong, "below the command layer:\n" + "\n".join(wrong)


def test_function_level_imports_of_the_project_only_in_commands():
    """A function-level import that dodges a cycle hides the architecture; commands may import
    their stage lazily (torch stays out of the commands that do not need it)."""
    lazy = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {t}"
            for m in MODULES if not MODULES[m].name in LAZY_OK
            and MODULES[m].relative_to(ROOT).as_posix() not in LAZY_API
            for t, line, top in imports(m) if not top and package(t) is not None]
    assert not lazy, "function-level imports of project modules:\n" + "\n".join(lazy)


def test_cli_report_imports_no_torch_statically():
    """Module-level imports from cli.py, plus what the report command loads on call."""
    seen, todo = set(), ["cli", "pipeline.report.run"]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        for t, line, top in imports(m):
            assert t.split(".")[0] not in TORCH or not top, \
                f"`cli.py report` loads torch: {MODULES[m].relative_to(ROOT)}:{line} imports {t}"
            if top and t in MODULES:
                todo.append(t)
                todo.extend(p for p in MODULES if t.startswith(p + ".") and p not in seen)


def _last_line_of_fresh_process(code: str, tmp_path) -> str:
    """Run ``code`` in a fresh interpreter (the project on its path, ``sys.argv[2]`` =
    ``tmp_path``); it must succeed; returns the last line it printed."""
    prefix = "import sys; sys.path.insert(0, sys.argv[1]);"
    out = subprocess.run([sys.executable, "-c", prefix + code, str(ROOT), str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_cli_report_run_loads_no_torch(tmp_path):
    """The real command on a synthetic study (the project's own writers), in a fresh process."""
    code = (
        "from pathlib import Path;"
        "from bench.synthetic_runs import write_study;"
        "runs, caches = write_study(Path(sys.argv[2]), n=200, seeds=(0,), losses=('ss',));"
        "from click.testing import CliRunner; import cli;"
        "r = CliRunner().invoke(cli.cli, ['report', str(runs), '--cache', str(caches), '--out',"
        " sys.argv[2] + '/report', '--jobs', '1', '--no-figures']);"
        "assert r.exit_code == 0, r.output;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision', 'timm')))"
    )
    assert _last_line_of_fresh_process(code, tmp_path) == "[]"


def test_every_help_and_a_report_error_load_no_torch(tmp_path):
    """`--help` of every command (and a user's error in `report`) in a fresh process: torch,
    timm and torchvision take seconds to import, so none may load before a command runs."""
    code = (
        "from click.testing import CliRunner; import cli;"
        "names = [[]] + [[c] for c in sorted(cli.cli.commands)];"
        "results = [CliRunner().invoke(cli.cli, n + ['--help']) for n in names];"
        "assert all(r.exit_code == 0 for r in results), [r.output for r in results];"
        "bad = CliRunner().invoke(cli.cli, ['report', sys.argv[2]]);"
        "assert bad.exit_code == 1 and 'error:' in bad.output, bad.output;"
        "print(len(names), sorted(m for m in sys.modules"
        "      if m.split('.')[0] in ('torch', 'torchvision', 'timm', 'matplotlib')))"
    )
    count, modules = _last_line_of_fresh_process(code, tmp_path).split(" ", 1)
    assert int(count) >= 10 and modules == "[]"


# The files of a run directory, named only by cache/runs.py (docs/DATA_CONTRACT.md, Stage 2).
RUN_FILE_NAMES = re.compile(r"(.*/)?(run\.json|log\.jsonl|val_split\.json|\S*\.timing\.json|"
                            r"last\.pt|best\.pt)")
RUN_FOLDERS = ("outputs", "checkpoints", "tensorboard", "heldout", "predictions")


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def test_only_cache_names_the_files_of_a_run_directory():
    """run.json, log.jsonl, val_split.json, checkpoints and outputs are opened through
    cache/runs.py (RunDir) by every stage: no other module spells their names or joins their
    folders (docstrings and help texts may mention them)."""
    files = [p for p in [*MODULES.values(), *sorted((ROOT / "bench").glob("*.py"))]
             if p.relative_to(ROOT).parts[0] != "cache"]
    wrong = []
    for path in files:
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    id(node) not in docs and RUN_FILE_NAMES.fullmatch(node.value):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} names {node.value!r}")
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                for side in (node.left, node.right):
                    if isinstance(side, ast.Constant) and side.value in RUN_FOLDERS:
                        wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} joins "
                                     f"{side.value!r}")
    assert not wrong, "run-directory files named outside cache/runs.py:\n" + "\n".join(wrong)


def test_each_package_says_what_its_modules_do():
    for init in sorted([*(ROOT / "pipeline").glob("*/__init__.py"),
                        *(ROOT / "pipeline").glob("*/*/__init__.py")]):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.splitlines()) <= 10, f"{init}: a docstring of at most ten lines"
        for module in sorted(init.parent.glob("*.py")):
            if module.name != "__init__.py":
                assert module.name in doc or module.stem in doc, \
                    f"{init.relative_to(ROOT)} does not say what {module.name} does"


def _architecture_map() -> dict[str, set[str]]:
    """docs/ARCHITECTURE.md's tree: {folder: the module file names its entry mentions}."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text().split("## The tree", 1)[1]
    block = text.split("```", 2)[1]
    out, folder = {}, None
    for line in block.splitlines():
        head = line.split(" ", 1)[0]
        if head.endswith("/"):
            folder = head.rstrip("/")
            line = line[len(head):]
        if folder is not None:
            out.setdefault(folder, set()).update(re.findall(r"\b([a-z_0-9]+\.py)\b", line))
    return out


def test_the_architecture_map_names_every_module_and_nothing_else():
    documented = _architecture_map()
    folders = {p.parent.relative_to(ROOT).as_posix()
               for top in ("cache", "pipeline", "trust_oracles") if (ROOT / top).is_dir()
               for p in (ROOT / top).rglob("__init__.py")}
    folders.discard("pipeline")
    assert folders == set(documented), \
        f"folders without an entry: {sorted(folders - set(documented))}; entries without a " \
        f"folder: {sorted(set(documented) - folders)}"
    for folder in sorted(folders):
        real = {p.name for p in (ROOT / folder).glob("*.py") if p.name != "__init__.py"}
        assert documented[folder] == real, \
            f"docs/ARCHITECTURE.md, {folder}/: not named {sorted(real - documented[folder])}; " \
            f"named but absent {sorted(documented[folder] - real)}"


def _sees_train_config(tree: ast.AST) -> bool:
    """Names TrainConfig, builds one (config_from_params) or reads a prepared run's ``.cfg``."""
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and n.id in ("TrainConfig", "config_from_params"):
            return True
        if isinstance(n, ast.alias) and n.name in ("TrainConfig", "config_from_params"):
            return True
        if isinstance(n, ast.Attribute) and n.attr == "cfg":
            return True
    return False


def test_the_training_config_reaches_at_most_15_modules():
    """Following train-oracle's config (TrainConfig) from the entry points (cli.py train-oracle,
    trust_oracles.train) visits few files: the settings, the loop's pieces that need a setting,
    the two training paths, the sweep that builds configs and the API.  Stages below the oracle
    (core, data, cache) never see it: they take the values they need as arguments."""
    mods = sources()
    seen = sorted(name for name, path in mods.items() if not path.name == "__init__.py"
                  and name.startswith(("pipeline.oracle", "pipeline.sweep", "pipeline.demo",
                                       "trust_oracles", "cli"))
                  and _sees_train_config(ast.parse(path.read_text())))
    assert 0 < len(seen) <= 15, seen
    below = [name for name, path in mods.items()
             if name.startswith(("pipeline.core", "pipeline.data", "cache"))
             and any(isinstance(n, (ast.Name, ast.alias)) and
                     getattr(n, "id", getattr(n, "name", None)) == "TrainConfig"
                     for n in ast.walk(ast.parse(path.read_text())))]
    assert below == []
