"""Field type expressions of the table schema: parse, check, and spell them in Python.

Theory of operation
-------------------
A field ``type`` is one of ``int``, ``float``, ``str``, ``bool``, ``X | None``,
``tuple[X, ...]`` or a name exported by ``swactor.wire``. ``parse_type`` turns the YAML
string into a small tree (``FieldType``) or raises ``ValueError`` naming the problem;
the loader wraps that into a ``TableError``. ``WireNames`` looks names up in
``swactor.wire`` once per run (an absent or partial package simply exports fewer names)
and says which of them are enums, whose member names are valid ``with:`` literals.
Generated modules import the package as ``from swactor import wire`` and spell wire
types ``wire.Name``, so that an event may share a name with a wire type.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import re
from dataclasses import dataclass

BUILTINS: frozenset[str] = frozenset({"int", "float", "str", "bool"})
PAYLOAD: frozenset[str] = frozenset({"bytes", "bytearray", "memoryview"})
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True, slots=True)
class FieldType:
    """``kind`` is ``name`` (builtin or wire), ``optional`` or ``tuple``."""

    kind: str
    name: str = ""
    inner: FieldType | None = None

    @property
    def wire(self) -> bool:
        return self.kind == "name" and self.name not in BUILTINS

    def names(self) -> set[str]:
        """Every wire name this type mentions."""
        if self.inner is not None:
            return self.inner.names()
        return {self.name} if self.wire else set()

    def python(self) -> str:
        """The annotation as generated code spells it."""
        if self.kind == "optional":
            assert self.inner is not None
            return f"{self.inner.python()} | None"
        if self.kind == "tuple":
            assert self.inner is not None
            return f"tuple[{self.inner.python()}, ...]"
        return f"wire.{self.name}" if self.wire else self.name

    def __str__(self) -> str:
        if self.kind == "optional":
            return f"{self.inner} | None"
        if self.kind == "tuple":
            return f"tuple[{self.inner}, ...]"
        return self.name

    def accepts(self, source: FieldType) -> bool:
        """A value of type ``source`` may be stored in a field of this type."""
        if self == source:
            return True
        if self.kind == "optional":
            assert self.inner is not None
            return self.inner.accepts(source)
        return self.kind == "name" and self.name == "float" and source == FieldType("name", "int")


def parse_type(text: str) -> FieldType:
    """Parse a type expression; ``ValueError`` says what is wrong with it."""
    text = " ".join(text.split())
    if text.endswith("| None"):
        inner = parse_type(text[: -len("| None")].strip())
        if inner.kind == "optional":
            raise ValueError(f"type {text!r}: nested `| None`")
        return FieldType("optional", inner=inner)
    if text.startswith("tuple[") and text.endswith("]"):
        body = text[len("tuple[") : -1].strip()
        if not body.endswith(", ..."):
            raise ValueError(f"type {text!r}: only homogeneous `tuple[X, ...]` is allowed")
        return FieldType("tuple", inner=parse_type(body[: -len(", ...")].strip()))
    if text in PAYLOAD:
        raise ValueError(f"type {text!r}: payload bytes are never a field")
    if not _NAME.match(text):
        raise ValueError(f"type {text!r} is not `int|float|str|bool`, `X | None`, "
                         "`tuple[X, ...]` or a swactor.wire name")
    return FieldType("name", name=text)


class WireNames:
    """The names ``swactor.wire`` exports, looked up lazily."""

    def __init__(self, module: str = "swactor.wire") -> None:
        self._module_name = module
        self._exports: dict[str, object] | None = None

    def _load(self) -> dict[str, object]:
        if self._exports is None:
            try:
                module = importlib.import_module(self._module_name)
            except ImportError:
                self._exports = {}
            else:
                names = getattr(module, "__all__", None)
                if names is None:
                    names = [n for n in dir(module) if not n.startswith("_")]
                self._exports = {n: getattr(module, n) for n in names if hasattr(module, n)}
        return self._exports

    def exports(self, name: str) -> bool:
        return name in self._load()

    def message_fields(self, name: str) -> list[tuple[str, str]] | None:
        """``(field, annotation text)`` of the dataclass ``name``, in order, when
        ``swactor.wire`` exports one by that name; else None."""
        value = self._load().get(name)
        if not (isinstance(value, type) and dataclasses.is_dataclass(value)):
            return None
        return [
            (f.name, f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "?"))
            for f in dataclasses.fields(value)
        ]

    def enum_members(self, name: str) -> frozenset[str] | None:
        """Member names when ``name`` is an ``enum.Enum`` subclass, else None."""
        value = self._load().get(name)
        if isinstance(value, type) and issubclass(value, enum.Enum):
            return frozenset(value.__members__)
        return None
