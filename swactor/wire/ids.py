"""Identifier newtypes of spec §6, and the device object handle.

Theory of operation
-------------------
Each identifier is an `int` subclass whose constructor checks the integer range of its
spec width (u64, `StageIndex` u32) and rejects `bool` and non-integers with an
`IdentifierRangeError`/`FieldTypeError`. Arithmetic on an identifier returns a plain
`int` (identifiers are names, not numbers), so `EdgeId(3) + 1` must be wrapped again to
be an identifier. `repr()` reads `EdgeId(3)`; `str()` reads `3`; JSON carries a number.

`NodeId` is a u64 even though node identity derives it from a public key (a u64 taken
from a hash): the derivation lives with node identity, not here.

`DeviceObjectHandle` is opaque to the node process and valid only in the worker
generation that created it (spec §6).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Self

from swactor.wire.codec import WireStruct
from swactor.wire.errors import FieldTypeError, IdentifierRangeError

U16_MAX = (1 << 16) - 1
U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1


class Identifier(int):
    """Base of the identifier newtypes: an int checked against `MAX` on construction."""

    MAX: ClassVar[int] = U64_MAX
    __slots__ = ()

    def __new__(cls, value: int) -> Self:
        if isinstance(value, bool) or not isinstance(value, int):
            raise FieldTypeError(
                cls.__name__, "value", f"must be an int, not {type(value).__name__}"
            )
        if not 0 <= value <= cls.MAX:
            raise IdentifierRangeError(cls.__name__, "value", f"{value} is outside 0..{cls.MAX}")
        return super().__new__(cls, value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({int(self)})"

    def __str__(self) -> str:
        return str(int(self))


class RunId(Identifier):
    """One run of the pipeline (u64), chosen by the orchestrator."""

    __slots__ = ()


class NodeId(Identifier):
    """One node of the pool (u64; node identity derives it from the node's public key)."""

    __slots__ = ()


class RoleId(Identifier):
    """One role configured on a worker (u64)."""

    __slots__ = ()


class StageIndex(Identifier):
    """Position of a stage in the pipeline (u32), 0 is the first stage."""

    MAX = U32_MAX
    __slots__ = ()


class EdgeId(Identifier):
    """One edge of a run (u64); unique within the run, assigned only by the orchestrator."""

    __slots__ = ()


class RingId(Identifier):
    """One ring lease (u64); unique for the node lifetime, never reused."""

    __slots__ = ()


class ObjectId(Identifier):
    """One object on an edge (u64)."""

    __slots__ = ()


class Sequence(Identifier):
    """Inference-step index carried on object records (u64); not a token id or offset."""

    __slots__ = ()


class StepId(Identifier):
    """One step (u64): spec §29 numbers ExecuteStep commands; here a standing grant
    numbers its steps from `GrantSteps.first_step_id`."""

    __slots__ = ()


class WorkerGeneration(Identifier):
    """Worker process incarnation (u64); a restart makes a new generation."""

    __slots__ = ()


class PortId(Identifier):
    """A role's input or output port (u64), named by rings and bindings."""

    __slots__ = ()


class LeaseRequestId(Identifier):
    """A caller's id for one ArenaManager lease request (u64)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class DeviceObjectHandle(WireStruct):
    """Opaque handle of a device object; valid only in `worker_generation`."""

    worker_generation: WorkerGeneration
    id: int

    def _validate(self) -> None:
        self._check_u64("id")
