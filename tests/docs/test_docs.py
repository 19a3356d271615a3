"""A fresh clone makes sense alone: docs/ covers every table, and no link leaves the repo.

- every table in `fsm/` has its page `docs/protocols/<machine>.md`, which links the table
  and its diagram, names each of its states and events, and describes what the binding
  does for exactly the table's effects;
- every relative link of the repository's Markdown (README, docs/, fsm/, diagrams/,
  docker/) names a file that exists inside the repository, and a `#fragment` names a
  heading of that file;
- nothing the repository ships points at files outside it (the spec and design notes
  live elsewhere: they are cited by section number, "spec §21");
- every spec section cited in docs/ exists (the spec has sections 1 to 43).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MARKDOWN = ("README.md", "docs", "fsm", "diagrams", "docker")
SPEC_SECTIONS = range(1, 44)

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
_OUTSIDE = re.compile(r"\.\./shared|shared/spec|MVP_SYSTEM_SPEC|ARCHITECTURE\.md|/work/")


def _markdown_files() -> Iterator[Path]:
    for name in MARKDOWN:
        path = REPO / name
        if path.is_file():
            yield path
        else:
            yield from sorted(path.rglob("*.md"))


def _tables() -> list[str]:
    return sorted(p.stem for p in (REPO / "fsm").glob("*.yaml"))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `_` and `-` dropped,
    spaces to dashes."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.MULTILINE)}


def links(path: Path) -> Iterator[str]:
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    for match in _LINK.finditer(text):
        yield match.group(1) or match.group(2)


def link_problem(source: Path, target: str) -> str | None:
    """Why `target`, linked from `source`, does not resolve inside the repo (None: it does)."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
        return None
    file_part, _, fragment = target.partition("#")
    resolved = (source.parent / file_part).resolve() if file_part else source
    if not resolved.is_relative_to(REPO):
        return "points outside the repository"
    if not resolved.exists():
        return "names a file that does not exist"
    if fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
        return f"names no heading of {resolved.relative_to(REPO)}"
    return None


@pytest.mark.parametrize("machine", _tables())
def test_every_table_has_a_page_that_links_its_table_and_diagram(machine: str) -> None:
    page = REPO / "docs" / "protocols" / f"{machine}.md"
    assert page.is_file(), f"fsm/{machine}.yaml has no page docs/protocols/{machine}.md"
    targets = set(links(page))
    assert f"../../fsm/{machine}.yaml" in targets
    assert f"../../diagrams/{machine}.svg" in targets
    assert f"index.md#{machine}" in targets


def _declared(machine: str) -> dict[str, list[str]]:
    table = yaml.safe_load((REPO / "fsm" / f"{machine}.yaml").read_text(encoding="utf-8"))
    return {key: list(table[key]) for key in ("states", "events", "effects")}


def effects_described(page: str) -> set[str]:
    """The effect names in the first column of the page's "What the binding does" table."""
    _, _, section = page.partition("\n## What the binding")
    section = section.split("\n## ", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            names |= set(re.findall(r"`([A-Z]\w*)`", line.split("|")[1]))
    return names


@pytest.mark.parametrize("machine", _tables())
def test_every_page_names_its_states_and_events_and_describes_each_effect(
        machine: str) -> None:
    """A table that gains, loses or renames a state, event or effect needs its page updated."""
    page = (REPO / "docs" / "protocols" / f"{machine}.md").read_text(encoding="utf-8")
    declared = _declared(machine)
    unnamed = [name for name in declared["states"] + declared["events"]
               if not re.search(rf"\b{name}\b", page)]
    assert unnamed == [], f"docs/protocols/{machine}.md does not name {unnamed}"
    assert effects_described(page) == set(declared["effects"])


def test_every_page_of_docs_protocols_is_a_table_or_the_index() -> None:
    pages = {p.stem for p in (REPO / "docs" / "protocols").glob("*.md")}
    assert pages == {*_tables(), "index"}


def test_every_relative_link_resolves_inside_the_repository() -> None:
    problems = [f"{path.relative_to(REPO)}: ({target}) {problem}"
                for path in _markdown_files()
                for target in links(path)
                if (problem := link_problem(path, target)) is not None]
    assert problems == []


def test_link_checks_catch_what_they_should(tmp_path: Path) -> None:
    page = REPO / "docs" / "README.md"
    assert link_problem(page, "architecture.md#the-per-token-path") is None
    assert link_problem(page, "architecture.md#no-such-heading") is not None
    assert link_problem(page, "missing.md") is not None
    assert link_problem(page, "../../shared/spec/MVP_SYSTEM_SPEC.md") is not None
    assert link_problem(page, "https://example.org/x") is None
    assert slug("`swactor check`: a run against its tables") == \
        "swactor-check-a-run-against-its-tables"


def _shipped_text() -> Iterator[Path]:
    yield from _markdown_files()
    yield from sorted((REPO / "fsm").glob("*.yaml"))
    for root in ("swactor", "codegen", "bench"):
        yield from sorted((REPO / root).rglob("*.py"))
    yield REPO / "justfile"


def test_nothing_points_outside_the_repository() -> None:
    problems = []
    for path in _shipped_text():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _OUTSIDE.search(line):
                problems.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert problems == [], "cite the spec by section number or link docs/:\n" + "\n".join(
        problems)


def test_spec_sections_cited_in_docs_exist() -> None:
    bad = [f"{path.relative_to(REPO)}: §{number}"
           for path in sorted((REPO / "docs").rglob("*.md"))
           for number in map(int, re.findall(r"§(\d+)", path.read_text(encoding="utf-8")))
           if number not in SPEC_SECTIONS]
    assert bad == []


_PATH = re.compile(r"`((?:swactor|codegen|native|tests|bench|fsm|diagrams|docker|scripts)"
                   r"/[\w./-]+\.(?:py|c|h|yaml|md|svg|dot|sh))(?:::\w+)?`")


_DIR = re.compile(r"`((?:swactor|codegen|native|tests|bench|fsm|diagrams|docker|scripts)"
                  r"/(?:\w+/)*)`")
"""A folder, written with its trailing slash (`swactor/ring/`)."""
_MODULE = re.compile(r"`(swactor(?:\.\w+)+)`")


def module_exists(dotted: str) -> bool:
    """`swactor.a.b` is a module or package, or a name in module `swactor.a`."""
    def found(parts: list[str]) -> bool:
        path = REPO.joinpath(*parts)
        return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()
    parts = dotted.split(".")
    return found(parts) or found(parts[:-1])


def test_files_named_in_docs_exist() -> None:
    missing = []
    for page in sorted((REPO / "docs").rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        missing += [f"{page.relative_to(REPO)}: {name}"
                    for name in _PATH.findall(text) + _DIR.findall(text)
                    if not (REPO / name).exists()]
        missing += [f"{page.relative_to(REPO)}: {name}" for name in _MODULE.findall(text)
                    if not module_exists(name)]
    assert missing == [], "a file moved or was renamed; update docs/:\n" + "\n".join(missing)
