"""Comments and docstrings describe the code as it is, not how it came to be.

History (commit ids, issue numbers, dated measurements) belongs in commit messages: a
reader of a fresh clone cannot follow an issue number or a commit id. This test reads
every comment and docstring of `swactor/`, `codegen/`, `bench/` and `tests/` (generated
modules excluded: codegen writes their text from the tables) and fails on the clearest
patterns (see `PATTERNS` and the examples below), naming file and line.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("swactor", "codegen", "bench", "tests")
SKIPPED = (Path("swactor/fsm/generated"), Path("tests/generated"))

# name -> pattern; each is matched against one comment or docstring line.
PATTERNS: dict[str, re.Pattern[str]] = {
    "issue reference": re.compile(r"(?<![\w&/])#\d+\b|\bissues? ?#?\d+\b", re.IGNORECASE),
    # 7 to 40 lowercase hex digits with at least one digit and one letter: a commit id.
    "commit id": re.compile(r"(?<![\w.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"),
    # a date (a timestamp's example format, with its `T`, is not history)
    "dated figure": re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b(?!T)"),
    "history note": re.compile(r"\bHistory:|\bused to be\b|\bbefore the fix\b"
                               r"|\bRound \d+\b"),
}


def _python_files() -> Iterator[Path]:
    for root in SCANNED:
        for path in sorted((REPO / root).rglob("*.py")):
            rel = path.relative_to(REPO)
            if not any(rel.is_relative_to(skip) for skip in SKIPPED):
                yield rel


def prose_lines(source: str) -> Iterator[tuple[int, str]]:
    """Every comment and every docstring line of `source`, with its line number."""
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef
                          | ast.AsyncFunctionDef):
            continue
        first = node.body[0] if node.body else None
        if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)):
            for offset, line in enumerate(first.value.value.split("\n")):
                yield first.lineno + offset, line


def history_findings(source: str) -> list[tuple[int, str, str]]:
    """(line, pattern name, text) for every comment or docstring line that is history."""
    found = []
    for line_no, text in prose_lines(source):
        for name, pattern in PATTERNS.items():
            if pattern.search(text):
                found.append((line_no, name, text.strip()))
                break
    return sorted(found)


@pytest.mark.parametrize("text", [
    "# see issue 9 for the layers",
    '"""Round 3 (issue #8): the decode JIT."""',
    "# #12 asked for this",
    "# the newest link wins (6ab29f2)",
    "# before a8ec6d9 the release ran per run",
    '"""Measured 2026-11-29 on a 2-core VM."""',
    '"""History: the release was taken out once."""',
])
def test_each_pattern_finds_history(text: str) -> None:
    assert history_findings(text + "\n"), text


@pytest.mark.parametrize("text", [
    "# Ed25519 keys, PKCS#8 PEM, gh-77894 upstream",
    '"""UTC wall time with milliseconds: 2026-11-29T17:51:05.123Z."""',
    "# 18446744073709551615 is the largest u64; 0x1f2e3d4c is a mask",
    "x = '#8 in a string is not a comment'",
    "# spec §21 allows any pending-bit scheme",
])
def test_present_tense_text_passes(text: str) -> None:
    assert history_findings(text + "\n") == []


def test_comments_and_docstrings_carry_no_history() -> None:
    problems = [f"{rel}:{line}: {name}: {text}"
                for rel in _python_files()
                for line, name, text in history_findings((REPO / rel).read_text("utf-8"))]
    assert problems == [], ("history belongs in commit messages; describe the code as it "
                            "is:\n" + "\n".join(problems))
