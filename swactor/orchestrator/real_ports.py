"""`RunPorts` over the real world: the control channel to the stage nodes and local token rings.

Theory of operation. `NetworkRunPorts` carries out the orchestrator_run machine's
effects for one run on the orchestrator process's own QUIC endpoint, edge `Driver` and
memfd arena:

- `provision_stage` / `send_stop_run`: one control request (`ProvisionStage`,
  `StopRunMessage`) to the stage's node; the node acknowledges at once and reports
  StageReady / StageFault / StageStopped later as its own requests, which
  `on_request` (the orchestrator's control handler) turns into the machine's events for
  the run handle. A request that fails (timeout, rejection, no connection) raises
  `RunFaultError(NodeUnavailable / ProvisioningRejected)`.
- `create_token_endpoints`: the token edges are ordinary edge ends of this process,
  established the way a stage node establishes its own (spec §26, §38): an
  `ArenaManager` (behind an `ArenaActor`) leases both rings, a `LocalRingInstaller`
  opens this process's end of each, the `EdgeEstablisher` drives the `edge_record`
  machine through lease -> install -> EstablishSend/EstablishRecv on the edge `Driver`
  (behind a `DriverActor`) -> Ready. Token-in is an egress ring this process produces
  into and the driver sends to stage 0; token-out an ingress ring the driver fills
  from the last stage and this process consumes. The edge actors report to
  `TokenOwner`, which turns their EdgeReady / EdgeFailed / EdgeStopped into the run
  machine's EndpointReady / EndpointFault / EndpointsStopped.
- `inject`: one token object (header + u32 ids) written into token-in; waits for ring
  space (the driver's RingWritable hint). Both this wait and the token-out reader's are
  `WakeWatch` waits: event-driven, no timeout, with a once-a-second check under them
  that wakes a waiter whose ring has work when no hint came (a lost hint).
- the token-out reader task runs `TokenOutReader`, the generated ingress_ring machine
  over host memory: every record gets the checks a stage's ingress parser makes (spec
  §17, §32: header, extent against the ObjectSpec before any buffer is set aside,
  sequence policy, EOF mid-record, a Faulted ring), and each loaded object becomes a
  `TokenOutput` with the decoded ids; a failed record becomes `EndpointFault` with its
  §36 reason (EofMidObject, ObjectHeaderMalformed, SequenceViolation, RingFault). The
  bytes are consumed as they are read, so `release_output` has nothing left to release.
- lifecycle events of the token edges: `edge_provision_started` when each edge's
  ProvisionTx/ProvisionRx goes to the establisher, `edge_ready` from the establisher
  when its edge_record machine reaches Ready (spec §40).
- `stop_token_endpoints`: StopEdge to both edge actors; each edge stops in the
  §38 teardown order (pump stopped -> ring uninstalled -> lease released with its
  quiescence proof) and answers EdgeStopped; when both have, the run gets
  `EndpointsStopped(clean)`. `live_leases()` asks the ArenaManager what is still
  leased (the fault matrix checks it is nothing).
- `close()`: after the run, stop the driver, close the ring handles and unmap the arena.
- `emit`: the process's emitter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from swactor.actors import ActorRef, Runtime
from swactor.arena import ArenaManager, LiveLease
from swactor.edges import (
    ArenaActor,
    ArenaLiveLeases,
    DriverActor,
    EdgeEstablisher,
    EdgeProvisioned,
    EstablisherConfig,
    ExpectRecv,
    LocalRingInstaller,
    ProvisionEdge,
    StopEdge,
    WakeFanout,
)
from swactor.events.emitter import Emitter
from swactor.events.schema import EdgeProvisionStarted, LifecycleEvent
from swactor.fsm.generated import orchestrator_run as orun
from swactor.orchestrator.run import RunHandle, TokenOutput
from swactor.orchestrator.token_out import TokenOutReader
from swactor.orchestrator.tokens import encode_token_ids
from swactor.orchestrator.wake_watch import WakeWatch
from swactor.ring import Ring, RingState
from swactor.transport import ControlChannel
from swactor.transport.control import ControlRejectedError
from swactor.transport.run_control import StopRunMessage, report_event
from swactor.wire import (
    Component,
    EdgeId,
    InstallRing,
    NodeId,
    ObjectHeader,
    ObjectId,
    ObjectSpec,
    PortId,
    ProvisionRx,
    ProvisionStage,
    ProvisionTx,
    RingId,
    RunFaultError,
    RunFaultReason,
    RunId,
    Sequence,
    StageIndex,
)
from swactor.wire.codec import WireStruct

log = logging.getLogger("swactor.orchestrator.ports")

REQUEST_TIMEOUT_S = 30.0
PROVISION_TIMEOUT_S = 10.0
TOKEN_PORT = PortId(0)
"""The local installer binds no worker port; the record still carries one."""

MakeDriver = Callable[[Any, Any, Callable[[Any], None], Callable[[Any], None]], Any]


class TokenRings(LocalRingInstaller):
    """The token endpoint's ring installer, keeping each edge's InstallRing command
    (the token-out reader's machine is created from it)."""

    def __init__(self, arena: Any) -> None:
        super().__init__(arena)
        self.commands: dict[int, InstallRing] = {}

    def install(
        self, command: InstallRing, establisher: ActorRef[Any], edge_actor: ActorRef[Any]
    ) -> None:
        self.commands[int(command.edge_id)] = command
        super().install(command, establisher, edge_actor)


class NetworkRunPorts:
    """The orchestrator's `RunPorts` for one run (module doc); also the `EdgeOwner` of
    its two token edges (lifecycle reports only: it reads its rings itself)."""

    def __init__(
        self,
        control: ControlChannel,
        runtime: Runtime,
        endpoint: Any,
        make_driver: MakeDriver | None,
        emitter: Emitter,
        run_id: RunId,
        node_id: NodeId,
        arena_bytes: int,
    ) -> None:
        self.control = control
        self.emitter = emitter
        self.run_id = run_id
        self.handle: RunHandle | None = None
        self.on_token: Callable[[int], None] | None = None
        self.manager = ArenaManager(arena_bytes)
        self.manager.construct()
        arena = self.manager.arena
        if arena is None:
            raise RunFaultError(RunFaultReason.ArenaBootFailed,
                            f"the token arena of {arena_bytes} bytes could not be created")
        self.node_id = node_id
        self.rings = TokenRings(arena)
        manager = self.manager
        self._arena_ref = runtime.spawn(lambda: ArenaActor(manager), "token-arena")
        driver_actor = DriverActor(endpoint, arena, WakeFanout(self.rings), make_driver)
        self.driver = driver_actor.driver
        self._driver_ref = runtime.spawn(lambda: driver_actor, "token-driver")
        config = EstablisherConfig(node_id, self._arena_ref, self._driver_ref, self.rings,
                                   manager.take_minter(), emit=self.emit)
        self._establisher = runtime.spawn(lambda: EdgeEstablisher(config),
                                          "token-establisher")
        self._edges: dict[int, ActorRef[Any]] = {}
        self._specs: dict[int, ObjectSpec] = {}
        self._stopped: dict[int, bool] = {}
        self._token_in: EdgeId | None = None
        self._token_out: EdgeId | None = None
        self._out_ready = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self.token_out: TokenOutReader | None = None
        self.watch = WakeWatch()
        """The token rings' waits (their lost-hint check: `watch.lost`)."""

    # -- control channel --------------------------------------------------------------

    def _tell(self, event: orun.Event | TokenOutput) -> None:
        if self.handle is not None:
            self.handle.tell(event)

    async def on_request(self, peer: int, message: WireStruct) -> WireStruct | None:
        """The control handler: stage reports of this run become machine events."""
        event = report_event(message)
        if event is not None:
            self._tell(event)
        return None

    async def _request(self, node: NodeId, message: WireStruct, refused: RunFaultReason) -> None:
        try:
            await self.control.request(int(node), message, timeout=REQUEST_TIMEOUT_S)
        except ControlRejectedError as error:
            raise RunFaultError(refused, str(error)) from None
        except Exception as error:
            raise RunFaultError(RunFaultReason.NodeUnavailable, str(error)) from None

    async def provision_stage(self, node_id: NodeId, message: ProvisionStage) -> None:
        await self._request(node_id, message, RunFaultReason.ProvisioningRejected)

    async def send_stop_run(self, node_id: NodeId, run_id: RunId, stage_index: StageIndex) -> None:
        await self._request(node_id, StopRunMessage(run_id, stage_index),
                            RunFaultReason.NodeUnavailable)

    # -- token endpoints --------------------------------------------------------------

    async def _provision(self, provision: ProvisionTx | ProvisionRx) -> None:
        edge_id = int(provision.edge_id)
        self.emitter.emit(EdgeProvisionStarted(node_id=self.node_id, run_id=self.run_id,
                                               edge_id=provision.edge_id))
        answer = await self._establisher.ask(
            ProvisionEdge(provision, TOKEN_PORT, self, self.run_id), PROVISION_TIMEOUT_S)
        if not isinstance(answer, EdgeProvisioned):
            raise RunFaultError(RunFaultReason.EdgeEstablishmentFailed,
                            f"token edge {edge_id}: {getattr(answer, 'detail', answer)}")
        self._edges[edge_id] = answer.edge_actor
        self._specs[edge_id] = provision.object_spec

    async def create_token_endpoints(self, token_in: ProvisionTx, token_out: ProvisionRx) -> None:
        self._token_in, self._token_out = token_in.edge_id, token_out.edge_id
        self._driver_ref.tell(ExpectRecv(((int(token_out.edge_id), int(token_out.tx_node_id)),)))
        await self._provision(token_out)
        await self._provision(token_in)
        self._reader = asyncio.get_running_loop().create_task(self._read_outputs(token_out.edge_id))

    def _wake_event(self, edge_id: EdgeId) -> asyncio.Event:
        return self.rings.wake_event(int(self.rings.ring_id(edge_id)))

    async def inject(
        self, edge_id: EdgeId, object_id: ObjectId, sequence: Sequence,
        token_ids: tuple[int, ...], flags: int = 0,
    ) -> None:
        if edge_id != self._token_in:
            raise RunFaultError(RunFaultReason.EdgeEstablishmentFailed,
                            f"edge {int(edge_id)} is not the token-in edge")
        ring, ring_id = self.rings.ring(edge_id), int(self.rings.ring_id(edge_id))
        wake = self._wake_event(edge_id)
        payload = encode_token_ids(token_ids, self._specs[int(edge_id)])
        record = ObjectHeader(object_id, sequence, len(payload), flags).pack() + payload
        await write_record(ring, record, wake, self.watch,
                           lambda: self.driver.ring_readable(ring_id))

    async def release_output(self, edge_id: EdgeId, object_id: ObjectId) -> None:
        return None  # the reader consumed the object's bytes as it parsed them

    async def _read_outputs(self, edge_id: EdgeId) -> None:
        """Run the token-out reader until it faults, the ring ends, or the task is cancelled."""
        await self._out_ready.wait()
        ring, ring_id = self.rings.ring(edge_id), int(self.rings.ring_id(edge_id))
        wake = self._wake_event(edge_id)

        def loaded(object_id: ObjectId, sequence: Sequence, ids: tuple[int, ...],
                   flags: int) -> None:
            self._tell(TokenOutput(edge_id, object_id, sequence, ids, flags))

        def failed(reason: RunFaultReason, detail: str) -> None:
            log.error("token-out edge %d: %s", int(edge_id), detail)
            self._tell(orun.EndpointFault(edge_id, reason, Component.TokenEndpoint))

        reader = self.token_out = TokenOutReader(
            self.rings.commands[int(edge_id)], ring,
            writable=lambda: self.driver.ring_writable(ring_id), loaded=loaded, failed=failed)
        try:
            reader.install()
            await reader.consume(wake, self.watch)
        except Exception:  # a reader bug must end the run now, not at the step timer
            log.exception("token-out edge %d: the reader stopped", int(edge_id))
            failed(RunFaultReason.RingFault, "token-out reader stopped")

    async def stop_token_endpoints(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self.token_out is not None:
            self.token_out.uninstall()  # before the edge's teardown closes the handle
        if not self._edges:
            self._tell(orun.EndpointsStopped(True))
            return
        for edge_id, edge_actor in self._edges.items():
            edge_actor.tell(StopEdge(EdgeId(edge_id)))

    async def live_leases(self) -> list[LiveLease]:
        """What the token arena still has leased (nothing once the endpoints stopped)."""
        leases: list[LiveLease] = await self._arena_ref.ask(ArenaLiveLeases(), 5.0)
        return leases

    async def close(self) -> None:
        """Stop the driver, close this process's ring handles, unmap the token arena."""
        self.watch.close()
        await self._driver_ref.stop_and_join()  # DriverActor.stopped closes the driver
        self.rings.close()
        arena = self.manager.arena
        if arena is not None:
            try:
                arena.close()
            except Exception as error:
                log.warning("token arena: %s", error)

    # -- EdgeOwner: the edge actors' reports ------------------------------------------

    def edge_ready(self, edge_id: EdgeId, ring_id: RingId) -> None:
        if edge_id == self._token_out:
            self._out_ready.set()
        self._tell(orun.EndpointReady(edge_id))

    def edge_failed(self, edge_id: EdgeId, reason: RunFaultReason, component: Component
                    ) -> None:
        log.warning("token edge %d: %s (%s)", int(edge_id), reason.value, component.value)
        self._tell(orun.EndpointFault(edge_id, reason, component))

    def edge_stopped(self, edge_id: EdgeId, clean: bool) -> None:
        self._stopped[int(edge_id)] = clean
        if set(self._stopped) >= set(self._edges):
            self._tell(orun.EndpointsStopped(all(self._stopped.values())))

    def emit(self, event: LifecycleEvent) -> None:
        self.emitter.emit(event)


async def write_record(ring: Ring, record: bytes, wake: asyncio.Event, watch: WakeWatch,
                       readable: Callable[[], None]) -> None:
    """Write `record` into the token-in ring, telling the driver (`readable`) after each
    part; on a full ring, sleep until its RingWritable hint sets `wake`. `wake` is
    cleared and then the writable-pending bit, both before the cursors are read (spec
    §21), so room freed after the write always wakes the wait."""
    view, sent = memoryview(record), 0
    while sent < len(record):
        wake.clear()
        ring.clear_writable_pending()
        written, _ = ring.write_from(view[sent:])
        sent += written
        if written:
            readable()
        if sent < len(record):
            await watch.wait(wake, lambda: _has_room(ring), f"token-in ring {ring.ring_id}")


def _has_room(ring: Ring) -> bool:
    """Whether the token-in ring has free bytes, or is no longer Open: what the driver's
    RingWritable hint would have announced (`WakeWatch`'s check)."""
    if ring.closed:
        return False
    if ring.state is not RingState.Open:
        return True
    with ring.writable_span(1) as span:  # released at once: never pins the arena
        return len(span) > 0
