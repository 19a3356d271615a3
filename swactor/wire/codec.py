"""Shared machinery of the wire types: field type checks and the strict JSON codec.

Theory of operation
-------------------
Every wire type is a `@dataclass(frozen=True, slots=True)` subclass of `WireStruct`.
On construction `WireStruct.__post_init__` looks up (once per class, then cached) one
`_FieldCodec` per field, built from the field's type hint, and runs two passes:

1. type pass: each field value must be of its declared type. A plain `int` given for an
   identifier newtype is converted (and range-checked) in place (another identifier
   kind is rejected: a `RingId` is never silently an `EdgeId`), a `list` given for a
   `tuple[X, ...]` field becomes a tuple, an `int` given for a `float` becomes a float;
   anything else raises `FieldTypeError` naming the type and the field.
2. rule pass: the subclass's `_validate()` checks ranges and cross-field rules and raises
   a `WireError` subclass naming the field and the rule.

`to_json()` gives a JSON-able dict (identifiers as numbers, enums as their value
strings, nested types as dicts, tuples as lists). `from_json(data)` is strict: the input
must be a dict with exactly the field names as keys, values of the right JSON kinds;
anything else raises `JsonShapeError`/`FieldTypeError` before the constructor's own
validation runs.

Supported field hints: `bool`, `int`, `float`, `str`, `int` subclasses with a
one-argument validating constructor (the identifiers), `enum.Enum` subclasses,
`WireStruct` subclasses, `tuple[X, ...]`, `X | None`, and `JsonValue` (free-form JSON
that must not contain bytes: low-frequency metadata, never payload).
"""

from __future__ import annotations

import enum
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, NoReturn, Self, TypeAlias, Union

from swactor.wire.errors import FieldTypeError, InvalidFieldError, JsonShapeError, WireError

JsonValue: TypeAlias = Union[  # noqa: UP007 - forward references need typing.Union
    bool, int, float, str, list["JsonValue"], dict[str, "JsonValue"], None
]
"""Free-form JSON: None, bool, int, float, str, list of JsonValue, str-keyed dict."""

JsonObject: TypeAlias = dict[str, JsonValue]

_U16_MAX = (1 << 16) - 1
_U32_MAX = (1 << 32) - 1
_U64_MAX = (1 << 64) - 1
_MAX_JSON_DEPTH = 32


def _describe(value: object) -> str:
    return type(value).__name__


def check_json_value(value: object, type_name: str, field: str, depth: int = 0) -> None:
    """Raise `FieldTypeError` unless `value` is JSON-able (and holds no bytes)."""
    if depth > _MAX_JSON_DEPTH:
        raise InvalidFieldError(type_name, field, f"JSON nests deeper than {_MAX_JSON_DEPTH}")
    if value is None or isinstance(value, bool | int | str):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidFieldError(type_name, field, "JSON numbers must be finite")
        return
    if isinstance(value, list):
        for item in value:
            check_json_value(item, type_name, field, depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise FieldTypeError(type_name, field, "JSON object keys must be str")
            check_json_value(item, type_name, field, depth + 1)
        return
    raise FieldTypeError(
        type_name, field, f"{_describe(value)} is not JSON (payload bytes never go in JSON)"
    )


@dataclass(frozen=True, slots=True)
class _FieldCodec:
    """How one field hint is checked, encoded and decoded."""

    name: str
    check: Callable[[object, str, str], object]
    encode: Callable[[Any], JsonValue]
    decode: Callable[[object, str, str], object]


def _identity(value: Any) -> JsonValue:
    return typing.cast(JsonValue, value)


def _codec_for(hint: Any) -> _FieldCodec:
    if hint is JsonValue or hint == "JsonValue":

        def check_json(value: object, type_name: str, field: str) -> object:
            check_json_value(value, type_name, field)
            return value

        return _FieldCodec("JsonValue", check_json, _identity, check_json)
    origin = typing.get_origin(hint)
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) != 2 or args[1] is not Ellipsis:
            raise TypeError(f"wire codec supports tuple[X, ...] only, not {hint!r}")
        return _tuple_codec(_codec_for(args[0]))
    if origin is Union or origin is types.UnionType:
        present = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(present) != 1 or len(typing.get_args(hint)) != 2:
            raise TypeError(f"wire codec supports X | None only, not {hint!r}")
        return _optional_codec(_codec_for(present[0]))
    if not isinstance(hint, type):
        raise TypeError(f"wire codec does not support {hint!r}")
    if hint is bool:
        return _scalar_codec("bool", lambda v: isinstance(v, bool), lambda v: v)
    if hint is int:
        return _scalar_codec(
            "int", lambda v: isinstance(v, int) and not isinstance(v, bool), lambda v: v
        )
    if hint is float:
        return _float_codec()
    if hint is str:
        return _scalar_codec("str", lambda v: isinstance(v, str), lambda v: v)
    if issubclass(hint, enum.Enum):
        return _enum_codec(hint)
    if issubclass(hint, WireStruct):
        return _struct_codec(hint)
    if issubclass(hint, int):
        return _identifier_codec(hint)
    raise TypeError(f"wire codec does not support {hint!r}")


def _scalar_codec(
    name: str, accepts: Callable[[object], bool], convert: Callable[[Any], object]
) -> _FieldCodec:
    def check(value: object, type_name: str, field: str) -> object:
        if not accepts(value):
            raise FieldTypeError(type_name, field, f"expected {name}, got {_describe(value)}")
        return convert(value)

    return _FieldCodec(name, check, _identity, check)


def _float_codec() -> _FieldCodec:
    def check(value: object, type_name: str, field: str) -> object:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise FieldTypeError(type_name, field, f"expected float, got {_describe(value)}")
        number = float(value)
        if not math.isfinite(number):
            raise InvalidFieldError(type_name, field, "must be a finite number")
        return number

    return _FieldCodec("float", check, _identity, check)


def _enum_codec(enum_type: type[enum.Enum]) -> _FieldCodec:
    def check(value: object, type_name: str, field: str) -> object:
        if not isinstance(value, enum_type):
            raise FieldTypeError(
                type_name, field, f"expected {enum_type.__name__}, got {_describe(value)}"
            )
        return value

    def decode(value: object, type_name: str, field: str) -> object:
        if not isinstance(value, str):
            raise FieldTypeError(
                type_name, field, f"expected a {enum_type.__name__} name, got {_describe(value)}"
            )
        try:
            return enum_type(value)
        except ValueError:
            shown = value if len(value) <= 40 else value[:40] + "..."
            raise InvalidFieldError(
                type_name, field, f"{shown!r} is not a {enum_type.__name__}"
            ) from None

    def encode(value: Any) -> JsonValue:
        return typing.cast(JsonValue, value.value)

    return _FieldCodec(enum_type.__name__, check, encode, decode)


def _identifier_codec(id_type: type[int]) -> _FieldCodec:
    def check(value: object, type_name: str, field: str) -> object:
        if type(value) is id_type:
            return value
        # A plain int is converted; another identifier kind (a RingId given for an
        # EdgeId) or a bool is a mix-up, not a number to convert.
        if type(value) is not int:
            raise FieldTypeError(
                type_name, field, f"expected {id_type.__name__}, got {_describe(value)}"
            )
        try:
            return id_type(value)
        except WireError as exc:
            raise type(exc)(type_name, field, exc.rule) from None

    def encode(value: Any) -> JsonValue:
        return int(value)

    return _FieldCodec(id_type.__name__, check, encode, check)


def _struct_codec(struct_type: type[WireStruct]) -> _FieldCodec:
    def check(value: object, type_name: str, field: str) -> object:
        if not isinstance(value, struct_type):
            raise FieldTypeError(
                type_name, field, f"expected {struct_type.__name__}, got {_describe(value)}"
            )
        return value

    def decode(value: object, type_name: str, field: str) -> object:
        if not isinstance(value, dict):
            raise FieldTypeError(
                type_name,
                field,
                f"expected a JSON object ({struct_type.__name__}), got {_describe(value)}",
            )
        return struct_type.from_json(value)

    def encode(value: Any) -> JsonValue:
        return typing.cast(JsonValue, value.to_json())

    return _FieldCodec(struct_type.__name__, check, encode, decode)


def _tuple_codec(item: _FieldCodec) -> _FieldCodec:
    def check(value: object, type_name: str, field: str) -> object:
        if not isinstance(value, tuple | list):
            raise FieldTypeError(
                type_name, field, f"expected tuple[{item.name}, ...], got {_describe(value)}"
            )
        return tuple(item.check(v, type_name, f"{field}[{i}]") for i, v in enumerate(value))

    def decode(value: object, type_name: str, field: str) -> object:
        if not isinstance(value, list):
            raise FieldTypeError(type_name, field, f"expected a JSON list, got {_describe(value)}")
        return tuple(item.decode(v, type_name, f"{field}[{i}]") for i, v in enumerate(value))

    def encode(value: Any) -> JsonValue:
        return [item.encode(v) for v in value]

    return _FieldCodec(f"tuple[{item.name}, ...]", check, encode, decode)


def _optional_codec(inner: _FieldCodec) -> _FieldCodec:
    def check(value: object, type_name: str, field: str) -> object:
        return None if value is None else inner.check(value, type_name, field)

    def decode(value: object, type_name: str, field: str) -> object:
        return None if value is None else inner.decode(value, type_name, field)

    def encode(value: Any) -> JsonValue:
        return None if value is None else inner.encode(value)

    return _FieldCodec(f"{inner.name} | None", check, encode, decode)


_CODECS: dict[type, tuple[tuple[str, _FieldCodec], ...]] = {}


def _codecs_of(cls: type[WireStruct]) -> tuple[tuple[str, _FieldCodec], ...]:
    found = _CODECS.get(cls)
    if found is None:
        hints = typing.get_type_hints(cls)
        # A JsonValue annotation is matched by name: get_type_hints rebuilds the recursive
        # Union with fresh ForwardRefs, so identity with `JsonValue` is lost.
        found = tuple(
            (f.name, _codec_for("JsonValue" if f.type == "JsonValue" else hints[f.name]))
            for f in fields(cls)  # type: ignore[arg-type]
        )
        _CODECS[cls] = found
    return found


class WireStruct:
    """Base of every frozen wire dataclass: type checks, validation and JSON codec."""

    __slots__ = ()

    def __post_init__(self) -> None:
        type_name = type(self).__name__
        for name, codec in _codecs_of(type(self)):
            value = getattr(self, name)
            checked = codec.check(value, type_name, name)
            if checked is not value:
                object.__setattr__(self, name, checked)
        self._validate()

    def _validate(self) -> None:
        """Check field ranges and cross-field rules; subclasses override."""

    # -- helpers for _validate -----------------------------------------------------------

    def _fail(self, field: str, rule: str) -> NoReturn:
        raise InvalidFieldError(type(self).__name__, field, rule)

    def _check_range(self, field: str, low: int, high: int) -> None:
        value = getattr(self, field)
        if not low <= value <= high:
            self._fail(field, f"{value} is outside {low}..{high}")

    def _check_u16(self, field: str) -> None:
        self._check_range(field, 0, _U16_MAX)

    def _check_u32(self, field: str) -> None:
        self._check_range(field, 0, _U32_MAX)

    def _check_u64(self, field: str) -> None:
        self._check_range(field, 0, _U64_MAX)

    # -- JSON ----------------------------------------------------------------------------

    def to_json(self) -> JsonObject:
        """This value as a JSON-able dict (field order kept)."""
        return {name: codec.encode(getattr(self, name)) for name, codec in _codecs_of(type(self))}

    @classmethod
    def from_json(cls, data: object) -> Self:
        """Decode a dict made by `to_json()`; unknown or missing keys are rejected."""
        type_name = cls.__name__
        if not isinstance(data, dict):
            raise JsonShapeError(type_name, "", f"expected a JSON object, got {_describe(data)}")
        codecs = _codecs_of(cls)
        expected = {name for name, _ in codecs}
        keys = set(data)
        if keys != expected:
            missing = sorted(expected - keys)
            unknown = sorted(repr(k)[:40] for k in keys - expected)
            parts = []
            if missing:
                parts.append(f"missing keys {missing}")
            if unknown:
                parts.append(f"unknown keys [{', '.join(unknown)}]")
            raise JsonShapeError(type_name, "", "; ".join(parts))
        kwargs = {name: codec.decode(data[name], type_name, name) for name, codec in codecs}
        return cls(**kwargs)
