"""In-memory StagePorts for the StageController's unit tests (the only place a fake is used).

Every port call is recorded in `calls` as a tuple, reports in `reports` as
`(to, run_id, message)`; `fail` maps a call kind to a RunFaultError to raise. Events go
through a real `Emitter` into a `MemorySink`, and every emitted record is also checked
against the event schema by round-tripping its JSON line through `validate_line`.
`until(predicate)` waits (bounded) for the actor to have done something.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from swactor.events.emitter import Emitter
from swactor.events.schema import LifecycleEvent, validate_line
from swactor.events.sinks import MemorySink
from swactor.node.stage_ports import StageReport
from swactor.wire import (
    EdgeId,
    GrantSteps,
    NodeId,
    ProvisionStage,
    RoleId,
    RunFaultError,
    RunId,
    StageFootprint,
    WorkerGeneration,
)

Call = tuple[object, ...]


@dataclass
class FakeStagePorts:
    sink: MemorySink = field(default_factory=MemorySink)
    calls: list[Call] = field(default_factory=list)
    reports: list[tuple[int, int, StageReport]] = field(default_factory=list)
    footprints: list[StageFootprint | None] = field(default_factory=list)
    """The footprint each report carried, in report order."""
    fail: dict[str, RunFaultError] = field(default_factory=dict)
    generation: int = 1
    lines: list[str] = field(default_factory=list)
    establish_delay_s: float = 0.0
    """How long each edge establishment takes before it is recorded."""

    def __post_init__(self) -> None:
        self.emitter = Emitter("node-test", [self.sink])

    def _record(self, *call: object) -> None:
        self.calls.append(call)
        error = self.fail.get(str(call[0]))
        if error is not None:
            raise error

    def worker_generation(self) -> WorkerGeneration:
        return WorkerGeneration(self.generation)

    async def configure_role(self, provision: ProvisionStage) -> None:
        self._record("configure_role", int(provision.runtime.role_id))

    async def load_weights(self, provision: ProvisionStage) -> None:
        await asyncio.sleep(0)
        self._record("load_weights", provision.layer_start, provision.layer_end_exclusive)

    async def establish_inbound(self, provision: ProvisionStage) -> None:
        await asyncio.sleep(self.establish_delay_s)
        self._record("establish_inbound", int(provision.inbound.edge_id))

    async def establish_outbound(self, provision: ProvisionStage) -> None:
        await asyncio.sleep(self.establish_delay_s)
        self._record("establish_outbound", int(provision.outbound.edge_id))

    async def grant_steps(self, command: GrantSteps) -> None:
        self._record("grant_steps", command)

    async def revoke_steps(self, role_id: RoleId) -> None:
        self._record("revoke_steps", int(role_id))

    async def stop_edges(self, inbound: EdgeId, outbound: EdgeId) -> None:
        self._record("stop_edges", int(inbound), int(outbound))

    async def reset_role(self, role_id: RoleId) -> None:
        self._record("reset_role", int(role_id))

    async def report(self, orchestrator: NodeId, run_id: RunId, message: StageReport,
                     footprint: StageFootprint | None = None) -> None:
        self.reports.append((int(orchestrator), int(run_id), message))
        self.footprints.append(footprint)

    def emit(self, event: LifecycleEvent, mono_ns: int | None = None) -> None:
        line = self.emitter.emit(event, mono_ns).to_line()
        validate_line(line)
        self.lines.append(line)

    def emit_all(self, events: Sequence[tuple[LifecycleEvent, int | None]]) -> None:
        for emitted in self.emitter.emit_all(events):
            line = emitted.to_line()
            validate_line(line)
            self.lines.append(line)

    # -- test helpers ------------------------------------------------------------------

    def of(self, kind: str) -> list[Call]:
        return [call for call in self.calls if call[0] == kind]

    def kinds(self) -> list[str]:
        return [str(call[0]) for call in self.calls]

    def reported(self, kind: type) -> list[StageReport]:
        return [message for _, _, message in self.reports if isinstance(message, kind)]

    def event_names(self) -> list[str]:
        return [emitted.name.value for emitted in self.sink.events]

    async def until(self, predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
        async def poll() -> None:
            while not predicate():
                await asyncio.sleep(0.002)

        await asyncio.wait_for(poll(), timeout_s)
