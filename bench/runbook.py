"""docs/IMAGENET.md's ```bash blocks as data, and the one shell script that runs them: shared by
tests/test_runbook.py (tiny models, CPU) and bench/rehearse_imagenet.py (its measured rehearsal),
so both run the runbook's commands as written and neither retypes them."""
from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "IMAGENET.md"


def bash_blocks(text: str | None = None) -> list[tuple[str, str]]:
    """(section heading, code) of every ```bash block of the runbook, in document order."""
    blocks, heading = [], ""
    lines = (DOC.read_text() if text is None else text).splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("## "):
            heading = lines[i][3:].strip()
        if lines[i].strip() == "```bash":
            j = lines.index("```", i + 1)
            blocks.append((heading, "\n".join(lines[i + 1:j])))
            i = j
        i += 1
    return blocks


def section(heading: str) -> str:
    """The section number of a heading ("4. Unseen domains ..." -> "4"), else the heading."""
    match = re.match(r"(\d+)\.", heading)
    return match.group(1) if match else heading


def shell_script(body: str, settings: dict, python: str, shim: Path) -> str:
    """The settings block as written, then ``settings`` overriding its variables, then ``body``;
    `python` and `torchrun` are shell functions calling ``shim`` (which runs cli.py)."""
    prelude = "\n".join([
        "set -euo pipefail",
        f'python() {{ "{python}" "{shim}" "$@"; }}',
        f'torchrun() {{ "{python}" "{shim}" --torchrun "$@"; }}'])
    overrides = "\n".join(f"{k}={json.dumps(str(v))}" for k, v in settings.items())
    return f"{prelude}\n{bash_blocks()[0][1]}\n# overrides\n{overrides}\n{body}\n"
