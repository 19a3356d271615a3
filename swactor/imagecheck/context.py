"""The build context a Docker engine would send: the repository through its ignore file.

Theory of operation. `IgnoreRules` reads a `.dockerignore` as BuildKit does: one
pattern a line, `#` comments and blank lines dropped, each pattern cleaned (no leading
`/`, `./` or trailing `/`), `!` marking an exception. A path is left out when the last
pattern that matches it, or one of its parent directories, is an exclusion (moby's
patternmatcher `MatchesOrParentMatches`). Patterns use Go's filepath.Match syntax plus
`**`: `*` and `?` never cross a `/`, `**` crosses any number of directories, `[...]`
is a character class, `\\` escapes. `context_files(root, rel, rules)` lists the files
(and symbolic links) under one source path of a `COPY` that the context holds.

BuildKit takes `<Dockerfile>.dockerignore` next to the Dockerfile before the context
root's `.dockerignore`; `ignore_file_for` applies that order.
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path


class ContextError(Exception):
    """A COPY source is missing from the build context (named)."""


@dataclass(frozen=True)
class Pattern:
    text: str
    exclusion: bool
    regex: re.Pattern[str]


def _clean(pattern: str) -> str:
    pattern = posixpath.normpath(pattern.strip())
    while pattern.startswith("/"):
        pattern = pattern[1:]
    return pattern or "."


def _translate(pattern: str) -> re.Pattern[str]:
    out: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "*":
            if pattern.startswith("**", i):
                i += 1
                if pattern.startswith("/", i + 1):
                    out.append("(?:.*/)?")
                    i += 1
                else:
                    out.append(".*")
            else:
                out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "\\" and i + 1 < len(pattern):
            i += 1
            out.append(re.escape(pattern[i]))
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1:end]
                if body.startswith(("^", "!")):
                    body = "^" + body[1:]
                out.append(f"[{body}]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("^" + "".join(out) + "$")


class IgnoreRules:
    """Parsed `.dockerignore` patterns (module doc)."""

    def __init__(self, text: str) -> None:
        self.patterns: list[Pattern] = []
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            exclusion = not line.startswith("!")
            body = _clean(line if exclusion else line[1:])
            self.patterns.append(Pattern(line, exclusion, _translate(body)))

    def excluded(self, path: str) -> bool:
        """Whether the context leaves out `path` (relative, `/`-separated)."""
        parents = []
        parent = posixpath.dirname(path)
        while parent:
            parents.append(parent)
            parent = posixpath.dirname(parent)
        matched = False
        for pattern in self.patterns:
            if pattern.regex.match(path) or any(pattern.regex.match(p) for p in parents):
                matched = pattern.exclusion
        return matched


def ignore_file_for(dockerfile: Path, context: Path) -> Path | None:
    """The ignore file BuildKit would use for this Dockerfile and context, if any."""
    for candidate in (dockerfile.with_name(dockerfile.name + ".dockerignore"),
                      context / ".dockerignore"):
        if candidate.is_file():
            return candidate
    return None


def context_files(root: Path, rel: str, rules: IgnoreRules) -> list[str]:
    """Paths (relative to `root`) of the context's files under source `rel`, sorted."""
    rel = posixpath.normpath(rel).lstrip("/")
    if rel.startswith(".."):
        raise ContextError(f"COPY source {rel!r} is outside the build context")
    top = root / rel
    found: list[str] = []
    if top.is_symlink() or top.is_file():
        if rel != "." and not rules.excluded(rel):
            found.append(rel)
    elif top.is_dir():
        for dirpath, dirnames, filenames in os.walk(top):
            base = Path(dirpath).relative_to(root).as_posix()
            for name in sorted(filenames) + [d for d in dirnames
                                             if (Path(dirpath) / d).is_symlink()]:
                path = name if base == "." else f"{base}/{name}"
                if not rules.excluded(path):
                    found.append(path)
    if not found:
        raise ContextError(f"COPY source {rel!r} is not in the build context"
                           + ("" if top.exists() else " (no such path)")
                           + " (after the ignore file)")
    return sorted(found)
