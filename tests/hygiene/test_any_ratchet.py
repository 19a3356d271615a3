"""`Any` is counted and may only shrink (a ratchet).

`python -m tests.hygiene.any_count` prints the count per module. A change that removes
uses lowers the limits below to the new totals; one that needs a new `Any` where
untyped data or an untyped library meets our types adds its module to
`any_count.BOUNDARY` with the reason, and only then raises `BOUNDARY_LIMIT`.
"""

from __future__ import annotations

from functools import cache

from tests.hygiene import any_count

#: Uses of `Any` in the modules of `any_count.BOUNDARY` (JSON, tinygrad, numpy, gguf,
#: aioquic internals, cffi).
BOUNDARY_LIMIT = 165
#: Uses everywhere else; these are to go (typed refs, messages and ports instead).
ELSEWHERE_LIMIT = 139


@cache
def counted() -> dict[str, int]:
    return dict(any_count.counts())


def report(found: dict[str, int], boundary: bool) -> str:
    rows = sorted(
        ((n, module) for module, n in found.items() if (module in any_count.BOUNDARY) == boundary),
        reverse=True,
    )
    return "\n".join(f"{n:5d}  {module}" for n, module in rows)


def test_any_outside_boundary_modules_does_not_grow() -> None:
    found = counted()
    _, elsewhere = any_count.split(found)
    assert elsewhere <= ELSEWHERE_LIMIT, (
        f"{elsewhere} uses of Any outside the boundary modules, at most {ELSEWHERE_LIMIT}:\n"
        + report(found, boundary=False)
    )


def test_any_in_boundary_modules_does_not_grow() -> None:
    found = counted()
    boundary, _ = any_count.split(found)
    assert boundary <= BOUNDARY_LIMIT, (
        f"{boundary} uses of Any in the boundary modules, at most {BOUNDARY_LIMIT}:\n"
        + report(found, boundary=True)
    )


def test_every_boundary_module_exists_and_uses_any() -> None:
    found = counted()
    stale = sorted(set(any_count.BOUNDARY) - set(found))
    assert not stale, f"boundary modules that no longer use Any (drop them): {stale}"


def test_the_count_sees_each_kind_of_use() -> None:
    source = (
        "import typing\nfrom typing import Any\n"
        "x: Any = 1\n"
        "def f(a: 'dict[str, Any]') -> typing.Any: ...\n"
        "y: list[tuple[Any, ...]] = []\n"
    )
    assert any_count.uses(source) == 4


def test_the_count_skips_prose_imports_and_namesakes() -> None:
    source = (
        '"""Any caller may pass Any value."""\n'
        "from typing import Any  # Any\n"
        "class Count:\n    Any = (0, None)\n"
        "c = Count.Any\n"
    )
    assert any_count.uses(source) == 0
