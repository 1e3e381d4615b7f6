"""The README and docs/ stay true to the repository they describe.

A newcomer follows the README's links and copies its commands; a renamed file, heading, make target,
module or `worldrtc` command silently breaks that walk. These checks read the markdown only (no
process, no network), so they run in the fast tier and fail naming the file and what is wrong in it.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from urllib.parse import unquote

from worldrtc.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
MAX_README_LINES = 250

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
INLINE_CODE = re.compile(r"`([^`]+)`")
# [text](target) and ![alt](target), with an optional "title"; reference-style links are not used.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)
# Commands as they are typed: `[ \t]` rather than `\s` so that "import worldrtc" followed by a blank
# line in a Python example is not read as the command "worldrtc async".
MAKE = re.compile(r"(?<![\w./$-])make(?:[ \t]+[A-Z][A-Z0-9_]*=\S*)*[ \t]+([a-z][\w.-]*)")
PYTHON_M = re.compile(r"(?<![\w.-])(?:[\w./-]*/)?python3?[ \t]+-m[ \t]+([A-Za-z_][\w.]*)")
WORLDRTC = re.compile(r"(?<![\w./-])worldrtc[ \t]+([a-z][\w-]*)")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def prose(text: str) -> str:
    """The text outside fenced code blocks: a '#' comment in a bash block is not a heading, and a
    JSON example is not a link."""
    return FENCE.sub("", text)


def code(text: str) -> list[str]:
    """Fenced blocks line by line, and inline code spans with their line breaks folded (a span may
    wrap in the source but reads as one command)."""
    snippets = [line for block in FENCE.finditer(text) for line in block.group(0).splitlines()[1:-1]]
    snippets += [re.sub(r"\s+", " ", span) for span in INLINE_CODE.findall(prose(text))]
    return snippets


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lowercase, punctuation other than '-' and '_'
    removed, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link reads as its text
    text = re.sub(r"[`*]|<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor GitHub gives the page's headings; a repeated heading gets -1, -2, ..."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for match in HEADING.finditer(prose(page.read_text(encoding="utf-8"))):
        base = slug(match.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def module_exists(name: str) -> bool:
    """Whether `python -m name` finds a module; a missing parent package raises rather than
    returning None, and counts as missing too."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def make_targets() -> set[str]:
    """The Makefile's explicit rule targets (variable assignments such as `X ?= y` excluded)."""
    targets: set[str] = set()
    for line in (ROOT / "Makefile").read_text(encoding="utf-8").splitlines():
        rule = re.match(r"^([A-Za-z0-9_.][\w.\- ]*?)\s*::?(?![=])", line)
        if rule and not line.startswith("\t"):
            targets.update(rule.group(1).split())
    return targets


def test_docs_exist() -> None:
    # Without pages the other checks would pass over nothing.
    assert README.is_file(), "README.md is missing"
    assert DOCS, "docs/ holds no .md pages"


def test_readme_is_short() -> None:
    # The README is the entry point; the reference lives in docs/, one task per page.
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; at most {MAX_README_LINES} (move detail to docs/)"


def test_readme_links_every_docs_page() -> None:
    # A page nobody links to is a page nobody finds.
    targets = {unquote(t.split("#")[0]) for t in LINK.findall(prose(README.read_text(encoding="utf-8")))}
    unlinked = [rel(page) for page in DOCS if rel(page) not in targets]
    assert not unlinked, f"README.md links to none of: {', '.join(unlinked)}"


def test_relative_links_resolve() -> None:
    problems = []
    for page in PAGES:
        for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
            if SCHEME.match(target):
                continue  # external: checking it would need the network
            path_part, _, anchor = target.partition("#")
            dest = (page.parent / unquote(path_part)).resolve() if path_part else page
            if ROOT not in dest.parents and dest != ROOT:
                problems.append(f"{rel(page)}: link {target!r} leaves the repository")
            elif not dest.exists():
                problems.append(f"{rel(page)}: link {target!r}: {path_part} does not exist")
            elif anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest):
                problems.append(f"{rel(page)}: link {target!r}: no heading in {rel(dest)} has the anchor #{anchor}")
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_make_targets_exist() -> None:
    targets = make_targets()
    assert {"run", "test"} <= targets, "the Makefile parse found no `run`/`test` rule"
    named: set[str] = set()
    problems = []
    for page in PAGES:
        for snippet in code(page.read_text(encoding="utf-8")):
            for target in MAKE.findall(snippet):
                named.add(target)
                if target not in targets:
                    problems.append(f"{rel(page)}: `make {target}` is not a Makefile target (in: {snippet.strip()!r})")
    assert {"run", "test"} <= named, "README/docs name neither `make run` nor `make test` in code"
    assert not problems, "unknown make targets:\n" + "\n".join(problems)


def test_python_modules_exist() -> None:
    problems = []
    seen: set[str] = set()
    for page in PAGES:
        for snippet in code(page.read_text(encoding="utf-8")):
            for module in PYTHON_M.findall(snippet):
                seen.add(module)
                if not module_exists(module):
                    problems.append(f"{rel(page)}: `python -m {module}`: no such module (in: {snippet.strip()!r})")
    assert "server" in seen, "README/docs name no `python -m server` in code: the pattern finds nothing"
    assert not problems, "unknown modules:\n" + "\n".join(problems)


def test_worldrtc_commands_exist() -> None:
    problems = []
    seen: set[str] = set()
    for page in PAGES:
        for snippet in code(page.read_text(encoding="utf-8")):
            for command in WORLDRTC.findall(snippet):
                seen.add(command)
                if command not in COMMANDS:
                    known = ", ".join(COMMANDS)
                    problems.append(
                        f"{rel(page)}: `worldrtc {command}` is not one of {known} (in: {snippet.strip()!r})"
                    )
    assert "serve" in seen, "README/docs name no `worldrtc serve` in code: the pattern finds nothing"
    assert not problems, "unknown worldrtc commands:\n" + "\n".join(problems)


ARCHITECTURE = ROOT / "docs" / "architecture.md"
# A row of the architecture page's table: | `path` | what |
TABLE_PATH = re.compile(r"^\| `([^`]+)` \|", re.M)
SERVER_PACKAGE = re.compile(r"^\s{4}(\w+(?:\.py)?/?)\s", re.M)


def test_architecture_names_every_server_package_and_nothing_that_is_gone() -> None:
    """docs/architecture.md's table and server/__init__.py's map list every package of server/, and
    every path the page names in backquotes under server/ or workers/ exists."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    tabled = set(TABLE_PATH.findall(text))
    packages = {f"server/{p.name}/" for p in (ROOT / "server").iterdir() if (p / "__init__.py").is_file()}
    assert packages - tabled == set(), f"{rel(ARCHITECTURE)}: no row for {sorted(packages - tabled)}"
    mapped = {m.rstrip("/") for m in SERVER_PACKAGE.findall((ROOT / "server" / "__init__.py").read_text())}
    missing = {p.split("/")[1] for p in packages} - mapped
    assert missing == set(), f"server/__init__.py's map lacks {sorted(missing)}"
    named = {p for span in INLINE_CODE.findall(text) for p in re.findall(r"(?:server|workers)/[\w/.]+", span)}
    gone = sorted(p for p in named if not (ROOT / p).exists())
    assert gone == [], f"{rel(ARCHITECTURE)} names paths that do not exist: {gone}"
