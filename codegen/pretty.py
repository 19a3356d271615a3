"""Small text helpers that keep generated Python within ruff's 100-column limit.

Theory of operation
-------------------
Generated code must be ``ruff`` clean as written, without running a formatter, so the
writers lay out every construct that can grow (calls, unions, docstrings) with these
helpers: a call fits on one line or puts one argument per line; a docstring is wrapped
per line, keeping paragraph breaks and indentation of list items.
"""

from __future__ import annotations

import re
import textwrap

LIMIT = 99


def call(prefix: str, args: list[str], suffix: str, indent: int) -> list[str]:
    """``prefix(arg, ...)suffix`` on one line when it fits, else one arg per line."""
    pad = " " * indent
    one = f"{pad}{prefix}({', '.join(args)}){suffix}"
    if len(one) <= LIMIT or not args:
        return [one]
    return [f"{pad}{prefix}("] + [f"{pad}    {arg}," for arg in args] + [f"{pad}){suffix}"]


def union(names: list[str], indent: int, lead: str) -> list[str]:
    """``lead A | B | C`` on one line when it fits, else a parenthesised column."""
    pad = " " * indent
    one = f"{pad}{lead}{' | '.join(names)}"
    if len(one) <= LIMIT:
        return [one]
    return [f"{pad}{lead}("] + [f"{pad}    {'| ' if i else ''}{n}" for i, n in
                                 enumerate(names)] + [f"{pad})"]


def docstring(text: str, indent: int) -> list[str]:
    """A triple-quoted docstring for ``text``, wrapped to the limit."""
    pad = " " * indent
    safe = text.strip().replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    body = safe[:-1]
    if safe.endswith('"') and (len(body) - len(body.rstrip("\\"))) % 2 == 0:  # unescaped
        safe = safe[:-1] + '\\"'
    lines: list[str] = []
    for raw in safe.splitlines():
        raw = raw.rstrip()
        body = raw.lstrip()
        lead = raw[: len(raw) - len(body)]
        if len(pad) + len(raw) + 6 <= LIMIT or not body:
            lines.append(raw)
            continue
        hang = lead + ("  " if body[:2] in ("- ", "* ") else "")
        lines.extend(textwrap.wrap(body, width=LIMIT - len(pad) - 6, initial_indent=lead,
                                   subsequent_indent=hang, break_long_words=False,
                                   break_on_hyphens=False))
    if len(lines) == 1 and len(pad) + len(lines[0]) + 6 <= LIMIT:
        return [f'{pad}"""{lines[0]}"""']
    out = [f'{pad}"""{lines[0]}']
    out += [f"{pad}{line}" if line else "" for line in lines[1:]]
    out.append(f'{pad}"""')
    return out


def comment(text: str, indent: int) -> list[str]:
    """``# text`` comment lines wrapped to the limit."""
    pad = " " * indent
    flat = " ".join(text.split())
    return [f"{pad}# {line}" for line in textwrap.wrap(flat, width=LIMIT - indent - 2)]


def listing(lead: str, items: list[str]) -> list[str]:
    """``lead[a, b]`` on one line when it fits, else one item per line (top level)."""
    one = f"{lead}[{', '.join(items)}]"
    if len(one) <= LIMIT or not items:
        return [one]
    return [f"{lead}["] + [f"    {item}," for item in items] + ["]"]


def import_from(module: str, names: list[str]) -> list[str]:
    """``from module import a, b`` as isort (ruff ``I``) lays it out."""
    one = f"from {module} import {', '.join(names)}"
    if len(one) <= LIMIT:
        return [one]
    return [f"from {module} import ("] + [f"    {name}," for name in names] + [")"]


def natural_sorted(names: list[str]) -> list[str]:
    """``names`` in natural order (digit runs compare as numbers), as ruff RUF023 wants."""
    return sorted(names, key=_natural_key)


def all_sorted(names: list[str]) -> list[str]:
    """``__all__`` in ruff RUF022's isort order: CONSTANTS, then Classes, then the rest."""
    def kind(name: str) -> int:
        if len(name) > 1 and name.upper() == name and name.lower() != name:
            return 0
        return 1 if name[:1].isupper() else 2
    return sorted(names, key=lambda n: (kind(n), _natural_key(n)))


def _natural_key(name: str) -> list[tuple[int, int, str]]:
    return [(0, int(part), "") if part.isdigit() else (1, 0, part)
            for part in re.split(r"(\d+)", name) if part]
