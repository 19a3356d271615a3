"""In-memory RunPorts for the run binding's unit tests (the only place a fake is used).

Every call is recorded in `calls` as a tuple; `fail` maps a call kind (and optionally a
node or stage) to a RunFaultError to raise. Events go through a real `Emitter` into a
`MemorySink`, and every emitted record is also checked against the event schema by
round-tripping its JSON line through `validate_line`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from swactor.events.emitter import Emitter
from swactor.events.schema import LifecycleEvent, validate_line
from swactor.events.sinks import MemorySink
from swactor.wire import (
    EdgeId,
    NodeId,
    ObjectId,
    ProvisionRx,
    ProvisionStage,
    ProvisionTx,
    RunFaultError,
    RunId,
    Sequence,
    StageIndex,
)

Call = tuple[object, ...]


@dataclass
class FakePorts:
    sink: MemorySink = field(default_factory=MemorySink)
    calls: list[Call] = field(default_factory=list)
    fail: dict[tuple[str, int | None], RunFaultError] = field(default_factory=dict)
    provision_delay_s: dict[int, float] = field(default_factory=dict)
    """Per stage index, how long its ProvisionStage takes to be answered."""
    flags: dict[int, int] = field(default_factory=dict)
    """Per injected edge step, the header flags it was written with."""

    def __post_init__(self) -> None:
        self.emitter = Emitter("orchestrator-test", [self.sink])

    def _maybe_fail(self, kind: str, key: int | None = None) -> None:
        error = self.fail.get((kind, key)) or self.fail.get((kind, None))
        if error is not None:
            raise error

    async def provision_stage(self, node_id: NodeId, message: ProvisionStage) -> None:
        await asyncio.sleep(self.provision_delay_s.get(int(message.stage_index), 0))
        self.calls.append(("provision", int(node_id), int(message.stage_index)))
        self._maybe_fail("provision", int(message.stage_index))

    async def create_token_endpoints(self, token_in: ProvisionTx, token_out: ProvisionRx) -> None:
        self.calls.append(("endpoints", int(token_in.edge_id), int(token_out.edge_id)))
        self._maybe_fail("endpoints")

    async def inject(
        self, edge_id: EdgeId, object_id: ObjectId, sequence: Sequence,
        token_ids: tuple[int, ...], flags: int = 0,
    ) -> None:
        self.calls.append(("inject", int(edge_id), int(sequence), tuple(token_ids)))
        self.flags[int(sequence)] = flags
        self._maybe_fail("inject", int(sequence))

    async def release_output(self, edge_id: EdgeId, object_id: ObjectId) -> None:
        self.calls.append(("release", int(edge_id), int(object_id)))

    async def send_stop_run(self, node_id: NodeId, run_id: RunId, stage_index: StageIndex) -> None:
        self.calls.append(("stop_run", int(node_id), int(stage_index)))
        self._maybe_fail("stop_run", int(stage_index))

    async def stop_token_endpoints(self) -> None:
        self.calls.append(("stop_endpoints",))
        self._maybe_fail("stop_endpoints")

    def emit(self, event: LifecycleEvent) -> None:
        emitted = self.emitter.emit(event)
        validate_line(emitted.to_line())

    # -- test helpers ------------------------------------------------------------------

    def of(self, kind: str) -> list[Call]:
        return [call for call in self.calls if call[0] == kind]

    def event_names(self) -> list[str]:
        return [e.event.NAME.value for e in self.sink.events]

    def events(self, name: str) -> list[LifecycleEvent]:
        return [e.event for e in self.sink.events if e.event.NAME.value == name]

    async def until(self, condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not condition():
            if loop.time() > deadline:
                raise AssertionError(f"timed out; calls so far: {self.calls}")
            await asyncio.sleep(0.001)
