"""A StageHost drives a real worker process through GpuWorkerCtl for two runs in a row.

Real: the memfd arena, the rings, `python -m swactor.worker` with the llama_stage role on
a tiny GGUF, GpuWorkerCtl, the StageHost and its controllers, `WorkerStagePorts`. Played
by the test: the edge ends (an `EdgePlayer` actor installs and uninstalls the rings
through GpuWorkerCtl in the EdgeEstablisher's place and reports EdgeReady /
EdgeStopped), the orchestrator (it writes token objects into the ingress ring and reads
the sampled token from the egress ring), and the control channel (reports are kept).

Both runs must give the token ids of the model package's StageRole over the whole
model under the controller's standing grant, and each must end StageStopped(clean):
both rings quiesced (every input object was freed by the worker with its step).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from swactor.actors import Actor, ActorRef, Context, Runtime
from swactor.arena import Arena
from swactor.events.emitter import Emitter
from swactor.events.schema import LifecycleEvent, validate_line
from swactor.events.schema import StageReady as StageReadyEvent
from swactor.events.sinks import MemorySink
from swactor.fsm.generated import gpu_worker_ctl as gwc
from swactor.fsm.generated import orchestrator_run as orun
from swactor.fsm.generated import stage_controller as scm
from swactor.node.stage_host import StageHost, StageHostConfig, StageHostState, StopRunRequest
from swactor.node.stage_ports import StageOutcome, StageReport
from swactor.node.stage_worker_ports import WorkerStagePorts
from swactor.node.worker_ctl import (
    GpuWorkerCtl,
    WorkerCtlConfig,
    WorkerReadyNotice,
    WorkerRoutes,
)
from swactor.orchestrator.inventory import synthetic_pool
from swactor.orchestrator.model_info import model_info_from_gguf
from swactor.orchestrator.planner import PlanRequest, plan_run, stage_runtime_facts
from swactor.ring import Ring, WorkerDoorbells, header_len
from swactor.wire import (
    OBJECT_HEADER_LEN,
    EdgeId,
    EdgeReady,
    GrantSteps,
    InstallRing,
    NodeId,
    ObjectHeader,
    ObjectId,
    PromptSource,
    ProvisionStage,
    RingDirection,
    RingId,
    RingInstalled,
    RingLayout,
    RingQuiesced,
    RoleId,
    RunId,
    Sequence,
    ShutdownMode,
    StageFootprint,
    StageIndex,
    UninstallReason,
    WorkerGeneration,
    provision_stage,
)
from tests import single_stage
from tests.model.tiny_gguf import TinyConfig, write_tiny_gguf

TINY = TinyConfig(blocks=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=64, context=32,
                  seed=9)
PROMPT = (3, 17, 42, 9)
STEPS = 3
RING_BYTES = 1 << 16
ORCHESTRATOR = NodeId(1000)
NODE = NodeId(1)


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("stage-worker") / "tiny.gguf", TINY)


def one_stage(gguf: Path, run: int) -> ProvisionStage:
    request = PlanRequest(run_id=RunId(run), prompt=PromptSource.from_token_ids(PROMPT),
                          max_tokens=STEPS, max_seq_len=16, first_edge_id=run * 10)
    plan = plan_run(synthetic_pool(1), model_info_from_gguf(gguf, with_stop_ids=False),
                    request).plan
    return provision_stage(plan, 0, stage_runtime_facts(plan, 0))


def reference_tokens(gguf: Path) -> list[int]:
    return single_stage.reference_tokens(gguf, TINY.blocks, PROMPT, STEPS, 16)


class EdgePlayer(Actor[Any]):
    """Stands in for the EdgeEstablisher: ring installed -> EdgeReady, quiesced ->
    EdgeStopped, both to the StageHost."""

    def __init__(self, host: ActorRef[Any], edges: dict[RingId, EdgeId],
                 events: asyncio.Queue[Any]) -> None:
        self.host, self.edges, self.events = host, edges, events

    async def receive(self, ctx: Context[Any], message: Any) -> None:
        match message:
            case RingInstalled(ring_id=ring):
                self.host.tell(EdgeReady(self.edges[ring], ring))
            case RingQuiesced(ring_id=ring):
                self.host.tell(scm.EdgeStopped(self.edges[ring], True))
            case WorkerReadyNotice():
                self.events.put_nowait(message)


class NodePorts:
    """WorkerStagePorts plus the edge, report and event ports this test plays."""

    def __init__(self, arena: Arena, edges: dict[RingId, EdgeId]) -> None:
        self.arena = arena
        self.edges = edges
        self.rings: dict[EdgeId, Ring] = {}
        self.ring_ids: dict[EdgeId, RingId] = {}
        self.worker_ports: WorkerStagePorts | None = None
        self.ctl: ActorRef[Any] | None = None
        self.bells = WorkerDoorbells.create()
        """The worker's doorbells: this test rings `to_worker` for both rings' hints."""
        self.reports: list[StageReport] = []
        self.footprints: list[StageFootprint | None] = []
        self.sink = MemorySink()
        self.emitter = Emitter("node-test", [self.sink])
        self._next_ring = 1
        self._offset = 0

    @property
    def w(self) -> WorkerStagePorts:
        assert self.worker_ports is not None
        return self.worker_ports

    def worker_generation(self) -> WorkerGeneration:
        return self.w.worker_generation()

    async def configure_role(self, provision: ProvisionStage) -> None:
        await self.w.configure_role(provision)

    async def load_weights(self, provision: ProvisionStage) -> None:
        await self.w.load_weights(provision)

    async def grant_steps(self, command: GrantSteps) -> None:
        await self.w.grant_steps(command)

    async def revoke_steps(self, role_id: RoleId) -> None:
        await self.w.revoke_steps(role_id)

    async def reset_role(self, role_id: RoleId) -> None:
        await self.w.reset_role(role_id)

    def _install(self, edge: EdgeId, direction: RingDirection, provision: ProvisionStage
                 ) -> None:
        ring_id = RingId(self._next_ring)
        self._next_ring += 1
        offset = self._offset
        layout = RingLayout.at(ring_id, offset, RING_BYTES, header_bytes=header_len())
        self._offset = layout.end_offset
        self.rings[edge] = Ring.init(self.arena, layout)
        self.ring_ids[edge] = ring_id
        self.edges[ring_id] = edge
        runtime = provision.runtime
        inbound = direction is RingDirection.Ingress
        port = runtime.input_port if inbound else runtime.output_port
        spec = provision.inbound.object_spec if inbound else provision.outbound.object_spec
        assert self.ctl is not None
        self.ctl.tell(gwc.InstallRing(InstallRing(ring_id, edge, port, direction, layout, spec)))

    async def establish_inbound(self, provision: ProvisionStage) -> None:
        self._install(provision.inbound.edge_id, RingDirection.Ingress, provision)

    async def establish_outbound(self, provision: ProvisionStage) -> None:
        self._install(provision.outbound.edge_id, RingDirection.Egress, provision)

    async def stop_edges(self, inbound: EdgeId, outbound: EdgeId) -> None:
        assert self.ctl is not None
        for edge in (inbound, outbound):
            self.ctl.tell(gwc.UninstallRing(self.ring_ids[edge], UninstallReason.EdgeStopped))

    async def report(self, orchestrator: NodeId, run_id: RunId, message: StageReport,
                     footprint: StageFootprint | None = None) -> None:
        assert orchestrator == ORCHESTRATOR
        self.reports.append(message)
        self.footprints.append(footprint)

    def emit(self, event: LifecycleEvent, mono_ns: int | None = None) -> None:
        validate_line(self.emitter.emit(event, mono_ns).to_line())

    def emit_all(self, events: Iterable[tuple[LifecycleEvent, int | None]]) -> None:
        for emitted in self.emitter.emit_all(events):
            validate_line(emitted.to_line())

    # -- the orchestrator's side of the two rings -------------------------------------------

    async def inject(self, edge: EdgeId, sequence: int, ids: list[int]) -> None:
        payload = np.asarray(ids, dtype="<u4").tobytes()
        data = ObjectHeader(ObjectId(sequence + 1), Sequence(sequence), len(payload)).pack()
        data += payload
        ring, sent = self.rings[edge], 0
        assert self.ctl is not None
        while sent < len(data):
            n, _ = ring.write_from(memoryview(data)[sent:])
            sent += n
            self.bells.to_worker.notify()
            await asyncio.sleep(0.002 if n == 0 else 0)

    async def take_token(self, edge: EdgeId, sequence: int) -> int:
        out = bytearray(OBJECT_HEADER_LEN + 4)
        ring, got = self.rings[edge], 0
        assert self.ctl is not None
        async with asyncio.timeout(60):
            while got < len(out):
                n, _ = ring.read_into(memoryview(out)[got:])
                got += n
                if n:
                    self.bells.to_worker.notify()
                else:
                    await asyncio.sleep(0.002)
        header = ObjectHeader.unpack(bytes(out))
        assert (header.sequence, header.object_id, header.extent) == (sequence, sequence + 1, 4)
        return int(np.frombuffer(bytes(out[OBJECT_HEADER_LEN:]), dtype="<u4")[0])

    async def until(self, predicate: Any, timeout_s: float = 60.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not predicate():
                await asyncio.sleep(0.005)


async def serve(ports: NodePorts, host: ActorRef[Any], provision: ProvisionStage,
                done: asyncio.Queue[StageOutcome]) -> tuple[list[int], StageOutcome]:
    ready = len([r for r in ports.reports if isinstance(r, orun.StageReady)])
    host.tell(scm.ProvisionStage(ORCHESTRATOR, provision))
    await ports.until(lambda: len([r for r in ports.reports
                                   if isinstance(r, orun.StageReady)]) == ready + 1)
    tokens: list[int] = []
    ids = list(PROMPT)
    for step in range(STEPS):
        await ports.inject(provision.inbound.edge_id, step, ids)
        tokens.append(await ports.take_token(provision.outbound.edge_id, step))
        ids = [tokens[-1]]
    host.tell(StopRunRequest(ORCHESTRATOR, provision.run_id, provision.stage_index))
    outcome = await asyncio.wait_for(done.get(), 60)
    return tokens, outcome


async def scenario(gguf: Path) -> None:
    arena = Arena.create(1 << 22)
    edges: dict[RingId, EdgeId] = {}
    ports = NodePorts(arena, edges)
    done: asyncio.Queue[StageOutcome] = asyncio.Queue()
    notices: asyncio.Queue[Any] = asyncio.Queue()
    state = StageHostState()
    async with Runtime("node") as runtime:
        host = runtime.spawn(lambda: StageHost(StageHostConfig(NODE, ORCHESTRATOR, 30.0), ports,
                                               state, done.put_nowait), "stage-host")
        player = runtime.spawn(lambda: EdgePlayer(host, edges, notices), "edges")
        routes = WorkerRoutes(node_boot=player, establisher=player, stage_controllers=[host])
        ctl = runtime.spawn(lambda: GpuWorkerCtl(WorkerCtlConfig(arena.fd, arena.size), routes,
                                                 arena, doorbells=ports.bells),
                            "gpu-worker", mailbox_capacity=1024)
        ports.ctl = ctl
        ports.worker_ports = WorkerStagePorts(ctl, host, models_dir=gguf.parent)
        ctl.tell(gwc.StartWorker())
        ready = await asyncio.wait_for(notices.get(), 60)
        ports.w.set_generation(ready.generation)

        expected = reference_tokens(gguf)
        for run in (21, 22):
            tokens, outcome = await serve(ports, host, one_stage(gguf, run), done)
            assert tokens == expected, f"run {run}"
            assert (outcome.run_id, outcome.clean) == (run, True)
            # StopRun follows the last token, so the last StepCompleted may come after it
            assert outcome.steps_completed in (STEPS - 1, STEPS)
            assert outcome.fault is None and outcome.rejected_events == []
        assert [r for r in ports.reports if isinstance(r, orun.StageStopped)] == [
            orun.StageStopped(StageIndex(0), True)] * 2
        assert [o.run_id for o in state.history] == [21, 22]
        # the worker's measured footprint reaches both StageReady reports (the second run
        # re-arms the same role, so it says the role was reused) and both stage_ready events
        footprints = [f for r, f in zip(ports.reports, ports.footprints, strict=True)
                      if isinstance(r, orun.StageReady)]
        assert len(footprints) == 2 and footprints[0] is not None
        assert not footprints[0].reused
        assert footprints[1] == replace(footprints[0], reused=True)
        fp = footprints[0]
        assert fp.file_bytes > 0 and fp.weights_bytes > 0 and fp.kv_cache_bytes > 0
        assert fp.rss_bytes > fp.weights_bytes  # the worker process holds more than that
        ready_events = [e for e in (validate_line(x.to_line()).event for x in ports.sink.events)
                        if isinstance(e, StageReadyEvent)]  # as `swactor check` reads them
        assert [(e.weights_bytes, e.kv_cache_bytes, e.rss_bytes, e.file_bytes)
                for e in ready_events] == [(fp.weights_bytes, fp.kv_cache_bytes,
                                            fp.rss_bytes, fp.file_bytes)] * 2
        names = [e.name.value for e in ports.sink.events]
        assert names.count("stage_ready") == 2
        steps = sum(o.steps_completed for o in state.history)
        for name in ("object_loaded", "execute_step_started", "object_produced",
                     "step_completed"):
            assert names.count(name) == steps, name  # all four from each step's report

        ctl.tell(gwc.ShutdownWorker(ShutdownMode.Graceful))
        async with asyncio.timeout(30):
            while ctl.alive:
                actor = getattr(ctl._cell, "_actor", None)  # tests only: peek at the binding
                if isinstance(actor, GpuWorkerCtl) and actor.state is gwc.State.Stopped:
                    break
                await asyncio.sleep(0.02)
    for ring in ports.rings.values():
        ring.close()
    ports.bells.close()
    arena.close()


def test_two_runs_through_a_real_worker_match_the_model(gguf: Path) -> None:
    asyncio.run(asyncio.wait_for(scenario(gguf), timeout=240))
