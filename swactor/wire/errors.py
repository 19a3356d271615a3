"""Typed errors raised by `swactor.wire` when a value breaks a wire rule.

Theory of operation
-------------------
Every wire type validates itself on construction and on decoding. A violation raises a
`WireError` subclass that names the type, the field and the rule, so that a caller can
report bad input without a traceback and a test can assert on the exact rule. Messages
never contain payload bytes: decoders quote lengths and numeric fields only.

Classes
-------
- `WireError`: base (a `ValueError`); `type_name`, `field`, `rule` attributes.
- `InvalidFieldError`: one field breaks a rule of its own (range, enum, format).
- `IdentifierRangeError`: an identifier newtype built out of its integer range.
- `FieldTypeError`: a field holds a value of the wrong Python type.
- `JsonShapeError`: a JSON document is not an object, or has missing/unknown keys.
- `PlanError`: a cross-field rule of a plan or message (layer ranges, edge wiring, ...).
- `RingLayoutError`: a `RingLayout` offset/alignment/containment rule.
- `ObjectHeaderError`: a malformed object header or record; carries the spec §37
  `ObjectFailure` reason.
- `PreambleError`: a malformed edge preamble; carries a `StreamFaultReason`.
- `ControlMessageError`: a worker control line that is not a known message.
- `ReasonError`: base of the errors that carry a typed reason (an enum member) and a
  one-line detail; `str()` reads `Reason: detail`. `RunFaultError` is the one whose
  reason is the spec §36 `RunFaultReason` (a stage or run port could not act).
"""

from __future__ import annotations

import enum
from typing import Generic, TypeVar

from swactor.wire.enums import ObjectFailure, RunFaultReason, StreamFaultReason

R = TypeVar("R", bound=enum.Enum)


class ReasonError(Exception, Generic[R]):
    """A failure with a typed `reason` (an enum member) and a one-line `detail`."""

    reason: R
    detail: str

    def __init__(self, reason: R, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


class RunFaultError(ReasonError[RunFaultReason]):
    """A stage or run port could not carry out an action; `reason` is the spec §36
    run-level fault source."""


class WireError(ValueError):
    """A value broke a wire rule; `str()` reads `Type.field: rule`."""

    def __init__(self, type_name: str, field: str, rule: str) -> None:
        self.type_name = type_name
        self.field = field
        self.rule = rule
        where = f"{type_name}.{field}" if field else type_name
        super().__init__(f"{where}: {rule}")


class InvalidFieldError(WireError):
    """One field breaks a rule of its own (range, format, enum membership)."""


class IdentifierRangeError(InvalidFieldError):
    """An identifier newtype was built from an integer out of its range."""


class FieldTypeError(InvalidFieldError):
    """A field holds a value of the wrong Python type."""


class JsonShapeError(WireError):
    """A JSON document is not an object of the expected keys and value kinds."""


class PlanError(WireError):
    """A cross-field rule of a plan or a message is broken."""


class RingLayoutError(WireError):
    """A `RingLayout` breaks an offset, alignment or containment rule."""


class ObjectHeaderError(WireError):
    """An object header or record is rejected; `reason` is the spec §37 ObjectFailure."""

    def __init__(self, reason: ObjectFailure, field: str, rule: str) -> None:
        self.reason = reason
        super().__init__("ObjectHeader", field, f"{reason.value}: {rule}")


class PreambleError(WireError):
    """An edge stream preamble is rejected; `reason` is the StreamFaultReason."""

    def __init__(self, reason: StreamFaultReason, field: str, rule: str) -> None:
        self.reason = reason
        super().__init__("EdgePreamble", field, f"{reason.value}: {rule}")


class ControlMessageError(WireError):
    """A worker control line is not valid JSON or not a known message shape."""
