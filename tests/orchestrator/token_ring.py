"""A token-out ring in a real memfd arena, with the producer's side driven by the test."""

from __future__ import annotations

from dataclasses import dataclass, field

from swactor.arena import Arena
from swactor.orchestrator.planner import token_object_spec
from swactor.orchestrator.token_out import TokenOutReader
from swactor.ring import Ring
from swactor.ring.ring import header_len
from swactor.wire import (
    EdgeId,
    InstallRing,
    ObjectHeader,
    ObjectId,
    ObjectSpec,
    PortId,
    RingDirection,
    RingId,
    RingLayout,
    RunFaultReason,
    Sequence,
)

RING_ID = 7
EDGE_ID = 3
OFFSET = 1 << 16


def layout(capacity: int) -> RingLayout:
    return RingLayout.at(RING_ID, OFFSET, capacity, header_bytes=header_len())


@dataclass
class TokenRing:
    """The producer's ring (`producer`) and the orchestrator's reader on the same ring."""

    capacity: int = 4096
    spec: ObjectSpec = field(default_factory=lambda: token_object_spec(1))
    loaded: list[tuple[int, int, tuple[int, ...]]] = field(default_factory=list)
    failed: list[RunFaultReason] = field(default_factory=list)
    flags: list[int] = field(default_factory=list)
    """The header flags of each loaded object, in order."""
    writable: int = 0

    def __post_init__(self) -> None:
        self.layout = layout(self.capacity)
        self.arena = Arena.create((self.layout.end_offset + 4095) // 4096 * 4096)
        self.producer = Ring.init(self.arena, self.layout)
        self.consumer = Ring.open(self.arena, self.layout)
        command = InstallRing(RingId(RING_ID), EdgeId(EDGE_ID), PortId(0),
                              RingDirection.Ingress, self.layout, self.spec)
        self.reader = TokenOutReader(command, self.consumer, writable=self._writable,
                                     loaded=self._loaded, failed=self._failed)
        self.reader.install()

    def _writable(self) -> None:
        self.writable += 1

    def _loaded(self, object_id: ObjectId, sequence: Sequence, ids: tuple[int, ...],
                flags: int) -> None:
        self.loaded.append((int(object_id), int(sequence), ids))
        self.flags.append(flags)

    def _failed(self, reason: RunFaultReason, detail: str) -> None:
        self.failed.append(reason)

    def write(self, data: bytes) -> None:
        written, _ = self.producer.write_from(data)
        assert written == len(data)
        self.reader.readable()

    @staticmethod
    def record(sequence: int, payload: bytes, extent: int | None = None) -> bytes:
        size = len(payload) if extent is None else extent
        return ObjectHeader(ObjectId(sequence + 1), Sequence(sequence), size).pack() + payload

    def close(self) -> None:
        self.reader.uninstall()
        self.consumer.close()
        self.producer.close()
        self.arena.close()
