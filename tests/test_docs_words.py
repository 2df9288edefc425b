"""The docs are a reference for users, not a lab notebook: README.md and docs/*.md name no issue
numbers of this project and none of the words of how the work was organised ("lent",
"session", "goal", "missed") or of files outside the repository ("REFERENCE.md").  History lives
in CHANGELOG.md, which this test does not read.

A citation of another project's issue or pull request by repository (``pytorch/vision#9606``) is
a source, not one of this project's issue numbers, and is allowed.

Nor do the docs tell what the code did before (that is CHANGELOG.md's): "it retried for a
minute", "was `ValueError ...`", "used to crash", "previously", "train-oracle now warns".  The
check reads prose only (code spans and code blocks, which quote messages and commands, are left
out) and looks for the forms history takes, not for every "was": a passive "the cache was
extracted with" states what is."""
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


HISTORY_RES = (
    re.compile(r"\bit (?:retried|crashed|hung)\b", re.I),
    re.compile(r"\(it (?:failed|printed|raised|wrote|went|gave|read)\b", re.I),
    re.compile(r"\bused to (?:be|have|take|give|write|crash|fail|hang|print|raise|run|read|"
               r"accept|refuse|return|work|keep|lose|skip)\b", re.I),
    re.compile(r"\b(?:previously|formerly|hitherto)\b", re.I),
    re.compile(r"(?:\(|;\s*|,\s*)was\s+``", re.I),    # "(was `--z`)", "; was `ValueError ...`"
    re.compile(r"(?:\(|;\s*)was\b(?!\s+(?:given|set|passed|written|recorded|extracted|"
               r"trained|made|chosen|read|run|used|computed|found|kept|claimed|built))", re.I),
    re.compile(r"\bnow (?:\w+s|named|called|spelled|refused|recorded|checked)\b", re.I),
    re.compile(r"\bended in a traceback\b|\bbefore (?:this|the) (?:fix|change)\b", re.I),
)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def prose(text: str):
    """(line number, the line with its code spans emptied) of every line outside code blocks."""
    in_code = False
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code:
            yield lineno, CODE_SPAN.sub("``", line)


def hits(text: str) -> list[str]:
    found = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for rx in (WORD_RE, *ISSUE_RES):
            for m in rx.finditer(line):
                found.append(f"line {lineno}: {m.group(0)!r} in {line.strip()[:120]!r}")
    return found


def history(text: str) -> list[str]:
    return [f"line {lineno}: {m.group(0)!r} in {line.strip()[:120]!r}"
            for lineno, line in prose(text) for rx in HISTORY_RES for m in rx.finditer(line)]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_history_of_the_code_in_the_docs(path):
    found = history(path.read_text(encoding="utf-8"))
    assert not found, f"{path.relative_to(ROOT)} tells what the code did (CHANGELOG.md's " \
        "job):\n  " + "\n  ".join(found)


def test_the_history_patterns_catch_what_they_should_and_only_that():
    bad = ["(it retried for about a minute, then stopped)", "(was `ValueError: x`)",
           "grey input; was `ValueError`", "`--ss-distance` (was `--z`)", "it used to crash",
           "previously it wrote NaN", "train-oracle now warns at training time",
           "(train-oracle ended in a traceback)", "(was silently wrong)",
           "(it read `artifacts/x` whatever the user had worked on)"]
    for line in bad:
        assert history(line), line
    good = ["the cache was extracted with `--weights FILE`", "where `--mc-dropout T` was given",
            "the threshold used to pick the rows", "the files as they are now, re-recorded",
            "| Command | Old name | Now |", "`note: --train-limit is now --max-samples`",
            "(the rate was set by the option)", "a process that no longer runs on this host",
            "```\nit retried\n```", "each command prints where it wrote"]
    for line in good:
        assert not history(line), line


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
