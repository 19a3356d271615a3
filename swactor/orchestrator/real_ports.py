"""`RunPorts` over the real world: the control channel to the stage nodes and local token rings.

Theory of operation. `NetworkRunPorts` carries out the orchestrator_run machine's
effects for one run on the orchestrator process's own QUIC endpoint, edge `Driver` and
memfd arena:

- `provision_stage` / `send_stop_run`: one control request (`ProvisionStage`,
  `StopRunMessage`) to the stage's node; the node acknowledges at once and reports
  StageReady / StageFault / StageStopped later as its own requests, which
  `on_request` (the orchestrator's control handler) turns into the machine's events for
  the run handle. A request that fails (timeout, rejection, no connection) raises
  `PortError(NodeUnavailable / ProvisioningRejected)`.
- `create_token_endpoints`: leases two rings in the arena (`TokenRings`): token-in is an
  egress ring this process produces into and the driver sends to stage 0
  (`EstablishSend`), token-out an ingress ring the driver fills from the last stage
  (`EstablishRecv`) and this process consumes. Each becomes `EndpointReady` on the
  driver's `DriverEdgeReady`; a stream or pump fault on either is `EndpointFault`,
  except `PeerReset`: the stage at the other end stopped the edge during teardown.
- `inject`: one token object (header + u32 ids) written into token-in; waits for ring
  space (the driver's RingWritable hint, with a short poll as a safety net).
- the token-out reader task parses each object (header, then exactly `extent` bytes)
  and tells the run `TokenOutput` with the decoded ids. The bytes are consumed as they
  are read, so `release_output` has nothing left to release.
- `stop_token_endpoints`: `StopEdge` for both edges; when both pumps stopped the rings
  are released and `EndpointsStopped(clean)` goes to the run.
- `emit`: the process's emitter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from swactor.arena import Arena
from swactor.arena.allocator import FreeList, align_up
from swactor.events.emitter import Emitter
from swactor.events.schema import LifecycleEvent
from swactor.fsm.generated import orchestrator_run as orun
from swactor.node.control_messages import StopRunMessage, report_event
from swactor.orchestrator.ports import PortError
from swactor.orchestrator.run import RunHandle, TokenOutput
from swactor.orchestrator.tokens import decode_token_ids, encode_token_ids
from swactor.ring import Ring
from swactor.transport import ControlChannel, Driver
from swactor.transport.control import ControlRejectedError
from swactor.transport.messages import (
    DriverEdgeReady,
    EstablishRecv,
    EstablishSend,
    PumpStopped,
    StopEdge,
    StreamFault,
)
from swactor.transport.messages import RingReadable as DriverReadable
from swactor.transport.messages import RingWritable as DriverWritable
from swactor.wire import (
    OBJECT_HEADER_LEN,
    Component,
    EdgeId,
    NodeId,
    ObjectHeader,
    ObjectId,
    ObjectSpec,
    ProvisionRx,
    ProvisionStage,
    ProvisionTx,
    RingId,
    RingLayout,
    RingSpec,
    RunFaultReason,
    RunId,
    Sequence,
    StageIndex,
    StreamFaultReason,
)
from swactor.wire.codec import WireStruct

log = logging.getLogger("swactor.orchestrator.ports")

HEADER_PAGE = 4096
REQUEST_TIMEOUT_S = 30.0
POLL_S = 0.05


@dataclass
class TokenRing:
    """One leased token ring and its edge."""

    edge_id: EdgeId
    ring: Ring
    layout: RingLayout
    object_spec: ObjectSpec
    lease: tuple[int, int]
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    ready: bool = False
    stopped: bool = False
    faulted: bool = False


class TokenRings:
    """Ring leases in the orchestrator's arena (one header page + data region each)."""

    def __init__(self, arena: Arena) -> None:
        self.arena = arena
        self.free = FreeList(arena.size)
        self._next = 1

    def lease(self, edge_id: EdgeId, spec: RingSpec, object_spec: ObjectSpec) -> TokenRing:
        alignment = max(spec.alignment, HEADER_PAGE)
        capacity = align_up(spec.data_capacity, alignment)
        size = HEADER_PAGE + capacity
        offset = self.free.find(size, alignment, skew=HEADER_PAGE)
        if offset is None:
            raise PortError(RunFaultReason.RingRequestOversized,
                            f"token ring of {size} bytes does not fit the arena")
        self.free.take(offset, size)
        layout = RingLayout(ring_id=RingId(self._next), arena_offset=offset, total_len=size,
                            header_offset=offset, data_offset=offset + HEADER_PAGE,
                            data_capacity=capacity, alignment=spec.alignment)
        self._next += 1
        return TokenRing(edge_id, Ring.init(self.arena, layout), layout, object_spec,
                         (offset, size))

    def release(self, token_ring: TokenRing) -> None:
        token_ring.ring.close()
        self.free.give(*token_ring.lease)


class NetworkRunPorts:
    """The orchestrator's `RunPorts` for one run (module doc)."""

    def __init__(
        self,
        control: ControlChannel,
        driver_factory: Callable[[Callable[[object], None], Callable[[object], None]], Driver],
        arena: Arena,
        emitter: Emitter,
        run_id: RunId,
        stage0_node: NodeId,
        last_node: NodeId,
    ) -> None:
        self.control = control
        self.driver = driver_factory(self._driver_event, self._driver_wake)
        self.rings = TokenRings(arena)
        self.emitter = emitter
        self.run_id = run_id
        self.stage0_node = stage0_node
        self.last_node = last_node
        self.handle: RunHandle | None = None
        self.token_in: TokenRing | None = None
        self.token_out: TokenRing | None = None
        self.on_token: Callable[[int], None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._stopping = False

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
            raise PortError(refused, str(error)) from None
        except Exception as error:
            raise PortError(RunFaultReason.NodeUnavailable, str(error)) from None

    async def provision_stage(self, node_id: NodeId, message: ProvisionStage) -> None:
        await self._request(node_id, message, RunFaultReason.ProvisioningRejected)

    async def send_stop_run(self, node_id: NodeId, run_id: RunId, stage_index: StageIndex) -> None:
        await self._request(node_id, StopRunMessage(run_id, stage_index),
                            RunFaultReason.NodeUnavailable)

    # -- token endpoints --------------------------------------------------------------

    async def create_token_endpoints(self, token_in: ProvisionTx, token_out: ProvisionRx) -> None:
        self.token_in = self.rings.lease(token_in.edge_id, token_in.ring_spec,
                                         token_in.object_spec)
        self.token_out = self.rings.lease(token_out.edge_id, token_out.ring_spec,
                                          token_out.object_spec)
        out = self.token_out
        self.driver.expect_recv([int(out.edge_id)])
        self.driver.handle(EstablishRecv(int(out.edge_id), int(out.layout.ring_id), out.layout))
        tin = self.token_in
        self.driver.handle(EstablishSend(int(tin.edge_id), int(token_in.rx_node_id),
                                         int(tin.layout.ring_id), tin.layout))
        self._reader = asyncio.get_running_loop().create_task(self._read_outputs(out))

    async def inject(
        self, edge_id: EdgeId, object_id: ObjectId, sequence: Sequence, token_ids: tuple[int, ...]
    ) -> None:
        tin = self.token_in
        if tin is None or tin.edge_id != edge_id:
            raise PortError(RunFaultReason.EdgeEstablishmentFailed,
                            f"edge {int(edge_id)} is not the token-in edge")
        payload = encode_token_ids(token_ids, tin.object_spec)
        record = ObjectHeader(object_id, sequence, len(payload)).pack() + payload
        view, sent = memoryview(record), 0
        while sent < len(record):
            tin.ring.clear_writable_pending()
            written, wake = tin.ring.write_from(view[sent:])
            sent += written
            if written:
                self.driver.ring_readable(int(tin.layout.ring_id))
            if sent < len(record):
                tin.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(tin.wake.wait(), POLL_S)

    async def release_output(self, edge_id: EdgeId, object_id: ObjectId) -> None:
        return None  # the reader consumed the object's bytes as it parsed them

    async def _read_exact(self, token_ring: TokenRing, count: int) -> bytes:
        out = bytearray(count)
        view, got = memoryview(out), 0
        while got < count:
            token_ring.ring.clear_readable_pending()
            n, _ = token_ring.ring.read_into(view[got:])
            got += n
            if n:
                self.driver.ring_writable(int(token_ring.layout.ring_id))
                continue
            token_ring.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(token_ring.wake.wait(), POLL_S)
        return bytes(out)

    async def _read_outputs(self, out: TokenRing) -> None:
        try:
            while True:
                header = ObjectHeader.unpack(await self._read_exact(out, OBJECT_HEADER_LEN))
                payload = await self._read_exact(out, header.extent)
                ids = decode_token_ids(payload, out.object_spec)
                self._tell(TokenOutput(out.edge_id, header.object_id, header.sequence, ids))
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.error("token-out: %s", error)
            self._tell(orun.EndpointFault(out.edge_id, RunFaultReason.ObjectHeaderMalformed,
                                          Component.TokenEndpoint))

    async def stop_token_endpoints(self) -> None:
        self._stopping = True
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        rings = [r for r in (self.token_in, self.token_out) if r is not None]
        if not rings:
            self._tell(orun.EndpointsStopped(True))
            return
        for token_ring in rings:
            self.driver.handle(StopEdge(int(token_ring.edge_id)))
        await asyncio.gather(*(self.driver.wait_stopped(int(r.edge_id)) for r in rings))
        async with asyncio.timeout(10):
            while not all(r.stopped for r in rings):
                await asyncio.sleep(0.01)
        clean = not any(r.faulted for r in rings)
        for token_ring in rings:
            self.rings.release(token_ring)
        self.token_in = self.token_out = None
        self._tell(orun.EndpointsStopped(clean))

    # -- driver callbacks -------------------------------------------------------------

    def _ring_of(self, edge_id: int | None) -> TokenRing | None:
        for token_ring in (self.token_in, self.token_out):
            if token_ring is not None and int(token_ring.edge_id) == edge_id:
                return token_ring
        return None

    def _driver_event(self, event: object) -> None:
        token_ring = self._ring_of(getattr(event, "edge_id", None))
        if token_ring is None:
            return
        match event:
            case DriverEdgeReady() if not token_ring.ready:
                token_ring.ready = True
                self._tell(orun.EndpointReady(token_ring.edge_id))
            case PumpStopped():
                token_ring.stopped = True
            case StreamFault(reason=StreamFaultReason.PeerReset):
                log.info("token edge %d: peer stopped the stream", int(token_ring.edge_id))
            case StreamFault():
                log.warning("token edge %d: %s %s", int(token_ring.edge_id), event.reason.value,
                            event.detail)
                if not token_ring.faulted and not self._stopping:
                    self._tell(orun.EndpointFault(token_ring.edge_id, RunFaultReason.StreamFault,
                                                  Component.Driver))
                token_ring.faulted = True

    def _driver_wake(self, hint: object) -> None:
        ring_id = getattr(hint, "ring_id", None)
        for token_ring in (self.token_in, self.token_out):
            if token_ring is None or int(token_ring.layout.ring_id) != ring_id:
                continue
            if isinstance(hint, DriverReadable | DriverWritable):
                token_ring.wake.set()

    def emit(self, event: LifecycleEvent) -> None:
        self.emitter.emit(event)
