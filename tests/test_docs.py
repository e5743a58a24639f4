"""The documentation cites only paths that exist, and the README stays short.

Checked: README.md, CONTRIBUTING.md and every ``docs/**/*.md`` — every repository path in
backticks (``fxremat/x.py``, ``passes/y.py``, ``bench/results/cpu/...``, ``tests/...``,
``docs/...``; brace lists such as ``memory_prediction.{json,md}`` are expanded), every
relative markdown link target (resolved from the file that holds it, as a renderer does),
every ``#anchor`` of a link into a markdown file (GitHub's heading slugs), every
``fxremat.passes.<name>`` module name (``passes/<name>.py``), and the names in a layout
tree (a fenced block whose lines start with ``fxremat/`` or ``passes/``, names nested by
indentation). The result notes under ``bench/results/`` are checked for their markdown links
only (the generated ``summary.md`` files quote commands with scratch output folders).
CHANGELOG.md is not checked: history may name files that no longer exist.

Pure file reading: no torch, fast.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 300

# A repository path: starts with one of the repository's top-level folders (or a top-level
# file), and is not the tail of a longer path (``/tmp/x/bench/...``) or of a dotted name.
_TOP = r"(?:fxremat|passes|bench|tests|docs|\.ci)/"
_PATH = re.compile(r"(?<![\w./-])(" + _TOP + r"[\w.{},/<>*-]*)")
_TOP_FILES = re.compile(r"(?<![\w./-])((?:README|CONTRIBUTING|CHANGELOG)\.md|pyproject\.toml)(?![\w.-])")
_MODULE = re.compile(r"(?<![\w.])fxremat\.passes\.([a-z_][a-z0-9_]*)")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)


def _expand_braces(path: str) -> list[str]:
    """``a.{json,md}`` -> ``a.json``, ``a.md`` (several groups multiply)."""
    parts = re.split(r"\{([^{}]*)\}", path)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def _clean(path: str) -> str | None:
    path = path.split("::")[0].split("#")[0]
    path = path.rstrip(".,;:")
    if not path or any(c in path for c in "<>*") or "..." in path:
        return None  # a pattern or a placeholder, not a path
    return path


def _paths_in_text(text: str) -> set[str]:
    found = set()
    for match in itertools.chain(_PATH.finditer(text), _TOP_FILES.finditer(text)):
        cleaned = _clean(match.group(1))
        if cleaned:
            found.update(_expand_braces(cleaned))
    for match in _MODULE.finditer(text):
        found.add(f"passes/{match.group(1)}.py")
    return found


def _layout_paths(block: str) -> set[str]:
    """Paths named by a layout tree: ``fxremat/`` at column 0, ``backend.py`` indented under
    it, ``strategies/`` opening a deeper folder; names may share a line (``a.py  b.py`` or
    ``a.py, b.py``) and a description may name more (``devices.py: ...``)."""
    lines = block.splitlines()
    if not any(re.match(r"(fxremat|passes)/\s", line) for line in lines):
        return set()
    found: set[str] = set()
    stack: list[tuple[int, str]] = []  # (indent, folder)
    for line in lines:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else ""
        head = re.match(r"\s*((?:[\w.-]+/?(?:,\s*|\s+))+)", line + " ")
        names = re.findall(r"[\w.-]+/?", head.group(1)) if head else []
        # only the leading run of file/folder names; the description starts at the first word
        # that is neither
        leading = list(itertools.takewhile(lambda n: n.endswith("/") or n.endswith(".py"), names))
        for name in leading:
            found.add(parent + name)
            if name.endswith("/") and len(leading) == 1:
                stack.append((indent, parent + name))
        for extra in re.findall(r"(?<![\w./-])([\w/]+\.py)\b", line):
            if extra not in leading:
                found.add(parent + extra)
    return found


def _cited(doc: Path, links_only: bool = False) -> set[str]:
    """Repository-relative paths cited by one markdown file."""
    text = doc.read_text(encoding="utf-8")
    cited: set[str] = set()
    for match in _LINK.finditer(text):
        target = match.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor in the same file
        target = _clean(target)
        if target:
            resolved = (doc.parent / target).resolve()
            try:
                cited.add(resolved.relative_to(ROOT).as_posix() or ".")
            except ValueError:
                cited.add(target)  # points outside the repository: reported as missing
    if links_only:
        return cited
    for block in _FENCE.findall(text):
        cited |= _layout_paths(block)
        cited |= _paths_in_text(block)
    for match in _INLINE_CODE.finditer(_FENCE.sub("", text)):
        cited |= _paths_in_text(match.group(2))
    return cited


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    text = _FENCE.sub("", doc.read_text(encoding="utf-8"))
    slugs: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
        slug, n = _slug(heading), 0
        while (slug if n == 0 else f"{slug}-{n}") in slugs:
            n += 1
        slugs.add(slug if n == 0 else f"{slug}-{n}")
    return slugs


def _broken_anchors(doc: Path) -> list[str]:
    """``file.md#anchor`` (or ``#anchor``) links whose anchor is no heading of that file."""
    broken = []
    for match in _LINK.finditer(_FENCE.sub("", doc.read_text(encoding="utf-8"))):
        target = match.group(1)
        if "#" not in target or re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue
        path, anchor = target.split("#", 1)
        file = (doc.parent / path).resolve() if path else doc
        if file.suffix == ".md" and file.is_file() and anchor not in _anchors(file):
            broken.append(target)
    return broken


def _documents() -> list[Path]:
    docs = [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
    return docs + sorted((ROOT / "docs").glob("**/*.md"))


def _result_notes() -> list[Path]:
    return sorted((ROOT / "bench" / "results").glob("**/*.md"))


def _missing(docs: list[Path], links_only: bool = False) -> dict[str, list[str]]:
    missing = {}
    for doc in docs:
        absent = sorted(p for p in _cited(doc, links_only) if not (ROOT / p).exists())
        if absent:
            missing[doc.relative_to(ROOT).as_posix()] = absent
    return missing


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; at most {README_MAX_LINES}"


def test_docs_exist():
    for doc in _documents():
        assert doc.is_file(), doc


def test_cited_paths_exist():
    missing = _missing(_documents())
    assert not missing, "paths cited in the docs that do not exist:\n" + "\n".join(
        f"  {doc}: {', '.join(paths)}" for doc, paths in missing.items())


def test_link_anchors_exist():
    broken = {doc.relative_to(ROOT).as_posix(): _broken_anchors(doc) for doc in _documents() + _result_notes()}
    broken = {doc: links for doc, links in broken.items() if links}
    assert not broken, "links to headings that do not exist:\n" + "\n".join(
        f"  {doc}: {', '.join(links)}" for doc, links in broken.items())


def test_heading_slugs():
    assert _slug("Paired A/B in one process: `bench/ab.py`") == "paired-ab-in-one-process-benchabpy"
    assert _slug("5. Keep Inductor to that order") == "5-keep-inductor-to-that-order"
    assert _slug("Inductor's buffer reuse, bounded by the plan") == "inductors-buffer-reuse-bounded-by-the-plan"
    assert _slug("In `solver=\"auto\"` (`fxremat/strategies/auto.py`)") == "in-solverauto-fxrematstrategiesautopy"


def test_result_notes_link_existing_files():
    missing = _missing(_result_notes(), links_only=True)
    assert not missing, "links in bench/results notes to files that do not exist:\n" + "\n".join(
        f"  {doc}: {', '.join(paths)}" for doc, paths in missing.items())


@pytest.mark.parametrize("text, expected", [
    ("see `fxremat/timeline.py` and `passes/rotor.py`", {"fxremat/timeline.py", "passes/rotor.py"}),
    ("`bench/results/cpu/memory_prediction.{json,md}`",
     {"bench/results/cpu/memory_prediction.json", "bench/results/cpu/memory_prediction.md"}),
    ("`python bench/frontier.py --out /tmp/x/bench/results/cpu/frontier`", {"bench/frontier.py"}),
    ("`tests/conftest.py::train_step_matches_eager`", {"tests/conftest.py"}),
    ("`fxremat.passes.mincut`'s `byte_penalty`", {"passes/mincut.py"}),
    ("`passes/<name>.py`, `tests/test_<name>_solver.py`", set()),
    ("`fxremat.inspect.plans()`, `plan.notes[\"why\"]`, `--fx-options`", set()),
])
def test_path_pattern(text, expected):
    found = set()
    for match in _INLINE_CODE.finditer(text):
        found |= _paths_in_text(match.group(2))
    assert found == expected


def test_layout_tree_pattern():
    block = ("fxremat/            the torch integration\n"
             "  backend.py        the backend; Inductor's hook\n"
             "  strategies/       one module per strategy (strategies/__init__.py)\n"
             "    mincut.py  staged.py (the search)\n"
             "  costmodel.py      estimates; devices.py: profiles\n"
             "  inspect.py, cli.py\n"
             "passes/             the solvers, installed as fxremat.passes:\n"
             "                    mincut, knapsack\n"
             "tests/  bench/  docs/\n")
    assert _layout_paths(block) == {
        "fxremat/", "fxremat/backend.py", "fxremat/strategies/", "fxremat/strategies/__init__.py",
        "fxremat/strategies/mincut.py", "fxremat/strategies/staged.py", "fxremat/costmodel.py",
        "fxremat/devices.py", "fxremat/inspect.py", "fxremat/cli.py", "passes/", "tests/", "bench/",
        "docs/"}
