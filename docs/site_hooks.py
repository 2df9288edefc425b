"""mkdocs hooks of the docs site (mkdocs.yml), so that the Markdown files read the same on the
site as in the repository, unchanged:

- the home page (index.md) is README.md, whose links are written from the repository's root:
  a link into docs/ drops the prefix (``docs/CLI.md`` -> ``CLI.md``) and a link to another file
  of the repository (CHANGELOG.md, a test) becomes its name in code, since the site holds only
  docs/;
- a link of another page to a file outside docs/ (``../bench/NOTES.md``) becomes its name in
  code, for the same reason;
- bracketed note numbers after a value (``57.06 ± 1.66[1][2]``, docs/RESULTS.md's tables) are
  text, not reference links: escaped, as they render in the repository.
"""
from __future__ import annotations

import re
from pathlib import Path

LINK = re.compile(r"\[([^\]]*)\]\((?!https?:|mailto:|#)([^)\s]+)\)")
NOTES = re.compile(r"((?:\[\d+\])+)")
CODE = re.compile(r"(^```.*?^```|`[^`\n]*`)", re.S | re.M)     # blocks and inline spans


def _rewrite(match: re.Match) -> str:
    text, target = match.groups()
    if target.startswith("docs/"):
        return f"[{text}]({target[len('docs/'):]})"
    return text if text.startswith("`") else f"`{text}`"


def _outside(match: re.Match) -> str:
    text, target = match.groups()
    if not target.startswith("../"):
        return match.group(0)
    return text if text.startswith("`") else f"`{text}`"


def _escape_notes(text: str) -> str:
    return NOTES.sub(lambda m: m.group(1).replace("[", r"\[").replace("]", r"\]"), text)


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == "index.md":
        readme = Path(config["config_file_path"]).parent / "README.md"
        markdown = LINK.sub(_rewrite, readme.read_text(encoding="utf-8"))
    # code, in blocks and inline, is left as it is
    parts = CODE.split(markdown)
    return "".join(p if i % 2 else _escape_notes(LINK.sub(_outside, p))
                   for i, p in enumerate(parts))
