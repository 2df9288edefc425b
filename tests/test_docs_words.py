"""The docs are a reference for users, not a lab notebook: README.md and docs/*.md name no issue
numbers of this project and none of the words of how the work was organised ("lent",
"session", "goal", "missed") or of files outside the repository ("REFERENCE.md").  History lives
in CHANGELOG.md, which this test does not read.

A citation of another project's issue or pull request by repository (``pytorch/vision#9606``) is
a source, not one of this project's issue numbers, and is allowed."""
from __future__ import annotations

import re

import pytest

from conftest import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

WORDS = ("lent", "session", "REFERENCE.md", "goal", "missed")
WORD_RE = re.compile(r"(?<![\w.])(" + "|".join(re.escape(w) for w in WORDS) + r")(?![\w])",
                     re.IGNORECASE)
ISSUE_RES = (
    re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE),         # "issue 20", "issues 11 and 13"
    re.compile(r"\bissues?\s+[\"“']", re.IGNORECASE),         # issue "One core"
    re.compile(r"\(issue\b", re.IGNORECASE),                 # "(issue ..."
    re.compile(r"(?<![\w/.-])#\d+\b"),                       # "#12", not "owner/repo#12"
)


def hits(text: str) -> list[str]:
    found = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for rx in (WORD_RE, *ISSUE_RES):
            for m in rx.finditer(line):
                found.append(f"line {lineno}: {m.group(0)!r} in {line.strip()[:120]!r}")
    return found


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_issue_numbers_or_notebook_words(path):
    found = hits(path.read_text(encoding="utf-8"))
    assert not found, f"{path.relative_to(ROOT)}:\n  " + "\n  ".join(found)


def test_the_patterns_catch_what_they_should_and_only_that():
    bad = ["see issue 20", "(issue \"One core\")", "fixed in #12", "Goal missed", "the lent GPU",
           "this session", "REFERENCE.md §5", "issue \"At scale\""]
    for line in bad:
        assert hits(line), line
    good = ["pytorch/vision#9606", "BAD_INPUT.md#classes-and-labels", "silent", "sessions_",
            "goalkeeper", "issued by", "the lentil", "ImageSession"]
    for line in good:
        assert not hits(line), line


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens, repeats
    numbered."""
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        slug = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_their_anchors_resolve(path):
    broken = []
    for target in LINK.findall(path.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):            # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text("utf-8")):
            broken.append(f"{target}: no heading with that anchor in {dest.name}")
    assert not broken, f"{path.relative_to(ROOT)}:\n  " + "\n  ".join(broken)
