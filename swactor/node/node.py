"""`StageNode`: one swactor node process — arena, worker, transport, control, stage slot.

Theory of operation. The node boots through the generated `node_boot` machine (spec §8,
bound by `membership.boot.NodeBoot`, which emits node_started / node_available /
node_faulted): `_BootSteps` carries out each step and answers with the next milestone,
always fed on the event loop (`deliver`), never re-entrantly:

1. NodeProcessStarted -> ConstructArena: the `ArenaManager` constructs the memfd arena
   (`arena_ceiling` bytes); the node's actors (StageHost, ArenaActor, GpuWorkerCtl) ->
   ArenaReady / ArenaFailed;
2. StartWorker: GpuWorkerCtl spawns `python -m swactor.worker` with the arena fd ->
   WorkerReady(generation) / WorkerFailed (also later, if the worker dies for good);
3. StartTransport: one `QuicEndpoint` (the node's Ed25519 identity), the edge `Driver`
   on the arena (behind a `DriverActor`), the `EdgeEstablisher` (spec §26: per-edge
   records bound to the `edge_record` / `edge_teardown` tables; rings leased from the
   ArenaActor, installed in the worker by a `WorkerRingInstaller`), the
   `ControlChannel` on `swactor/ctl/1` -> TransportReady / Failed;
4. JoinMembership: with `swim_bind`, `SwimJoin` (seeds; the QUIC address in the signed
   member metadata, BootHealth published Available / Unavailable as the machine
   decides, which is how an orchestrator started with `--seed` finds the pool);
   without it the node is joined at once (its orchestrator is given its address);
5. NodeAvailable: `start()` returns the bound QUIC address (the CLI prints it as one
   JSON line). An Unavailable machine makes `start()` raise `NodeBootError` naming
   the failed step. Every ProvisionStage is fed to the machine as ProvisionRequested
   and held until its row answers: AdmitProvisioning (NodeAvailable) hands it to the
   StageHost, RejectProvisioning (any other state) drops it and reports StageFault with
   the row's reason and component (ProvisioningRejected, node_boot).

Serving. The control channel accepts `AddressBook`, `ProvisionStage`, `StopRunMessage`
and `PreloadStage` (a warm spare's preload, extension beyond the spec: the StageHost's
module doc) only from the orchestrator the node trusts (`--trust-orchestrator`;
the channel's `ControlAuthority` answers anyone else `Unauthorized`). AddressBook admits
the run's peers to the endpoint and records their addresses; between runs it replaces
the allow-list, so a past session's peers lose their links and are refused (spec §4).
Each inbound edge accepts its stream only from the producer node its ProvisionStage
names (the driver refuses any other peer's stream with PeerNotAllowed). ProvisionStage
goes to the `StageHost`, which runs one fresh `StageController` per run on `NodeStagePorts`: the
worker and weight ports of `WorkerStagePorts`, the edge ports of `EdgeStagePorts`
(ProvisionRx / ProvisionTx to the EdgeEstablisher, StopEdge to the edge actors;
the StageHost owns both edge actors through a `StageOwner`), reports as
control requests back to the orchestrator, events through the node's emitter. While a
run is active the authority accepts only messages of that run; when its controller
stops, the node is idle again and the next run may open (no restart). If the trusted
orchestrator's last live control connection closes while a run is active (the
orchestrator died or went away without teardown), the node stops that run itself, as if
StopRun had come; a previous session's link closing while the current one is live is
not that (`_WatchedControl`).

Between runs. `HEAP_RELEASE_DELAY_S` after a stage finished (its edges are torn down
by then) the node collects the run's cyclic garbage and hands freed heap pages back to
the kernel (`swactor.heap.release`), so resident memory does not creep up run after run
while it waits for Python's next full collection or in glibc's free lists.

`stop()` feeds Shutdown, leaves SWIM, shuts the worker down, closes the endpoint and
the arena. `status()` is the
leak check a test or operator reads: active run, live ring leases (the ArenaManager's,
as (edge id, ring id) pairs), worker pid. The fault hook `node.ring_oversize` makes the
stage's edge ports ask for a ring larger than the arena (the ArenaManager rejects it:
RingRequestOversized).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swactor import faults, heap
from swactor.actors import Actor, ActorRef, Context, Runtime
from swactor.arena import Arena, ArenaDown, ArenaManager
from swactor.arena.allocator import align_up
from swactor.edges import (
    ArenaActor,
    DriverActor,
    EdgeEstablisher,
    EdgeStagePorts,
    EstablisherConfig,
    ExpectRecv,
    WakeFanout,
    WorkerRingInstaller,
)
from swactor.events.emitter import Emitter
from swactor.events.schema import LifecycleEvent
from swactor.fsm.generated import gpu_worker_ctl as gwc
from swactor.fsm.generated import node_boot as nb
from swactor.fsm.generated import stage_controller as scm
from swactor.membership.admission import ID_ONLY_REFUSAL, Admission, swim_allow_list
from swactor.membership.boot import NodeBoot
from swactor.node.pool_weights import PoolWeights
from swactor.node.stage_host import (
    PreloadOutcome,
    PreloadRequest,
    StageHost,
    StageHostConfig,
    StageHostState,
    StopRunRequest,
)
from swactor.node.stage_ports import StageOutcome, StageReport
from swactor.node.stage_worker_ports import HTTP_CACHE, WorkerStagePorts
from swactor.node.worker_ctl import (
    GpuWorkerCtl,
    WorkerCtlConfig,
    WorkerFailedNotice,
    WorkerReadyNotice,
    WorkerRoutes,
)
from swactor.ring import WorkerDoorbells
from swactor.transport import ControlAuthority, ControlChannel, QuicEndpoint
from swactor.transport.artifact_stream import ArtifactChannel
from swactor.transport.config import TransportConfig
from swactor.transport.control import Handler
from swactor.transport.endpoint import QuicLink
from swactor.transport.errors import ControlError
from swactor.transport.factory import QuicTransport, Transport
from swactor.transport.identity import NodeIdentity
from swactor.transport.run_control import (
    ORCHESTRATOR_ONLY,
    REGISTRY,
    AddressBook,
    PreloadStage,
    StageFaultReport,
    StagePreloaded,
    StopRunMessage,
    report_message,
)
from swactor.wire import (
    ArenaFailure,
    Component,
    EdgeId,
    GrantSteps,
    NodeId,
    ProvisionStage,
    RoleId,
    RunFaultReason,
    RunId,
    ShutdownMode,
    StageFootprint,
    StageIndex,
    WorkerGeneration,
)
from swactor.wire.codec import JsonValue, WireStruct

log = logging.getLogger("swactor.node")

DEFAULT_ARENA_CEILING = 256 << 20
REPORT_TIMEOUT_S = 30.0
BOOT_SLACK_S = 60.0
JOIN_TIMEOUT_S = 30.0
HEAP_RELEASE_DELAY_S = 1.0
"""After a stage finished, when the node collects the run's garbage and trims its heap
(`swactor.heap.release`)."""


class NodeBootError(Exception):
    """The node could not boot; the message names the step and the cause."""


def worker_failure(notice: WorkerFailedNotice) -> str:
    """Node boot's account of a worker that failed to start: the WorkerFatal reason it
    reported, if any, and its own last stderr line (a backend's exception, say)."""
    reason = f" ({notice.fatal.value})" if notice.fatal is not None else ""
    said = f": {notice.stderr_tail}" if notice.stderr_tail else " (see its stderr)"
    return f"the GPU worker failed to start{reason}{said}"


@dataclass(frozen=True)
class NodeConfig:
    """What one node process is told on its command line."""

    identity: NodeIdentity
    orchestrator: NodeId
    bind_host: str = "127.0.0.1"
    quic_port: int = 0
    arena_ceiling: int = DEFAULT_ARENA_CEILING
    models_dir: Path = Path(".")
    weights: str = "blocks"
    """How the worker holds quantised matrices: "blocks" (computes from the file's
    blocks, Q2_K-Q6_K, Q4_0-Q8_0, F16/BF16: faster on CPU, about the file's bytes in memory)
    or "dense" (dequantised once at load); `role_config.DEFAULT_WEIGHT_MODE`."""
    device: str | None = None
    """The worker's tinygrad device (`swactor node --device`); None: tinygrad's best."""
    threads: int | None = None
    """Threads the worker runs a CPU step's sliced kernels on (`swactor node --threads`);
    None: the worker's default, the CPUs it may use (`cpu_graph.cpu_count`)."""
    transport: TransportConfig = dataclasses.field(default_factory=TransportConfig)
    worker_init_timeout_s: float = 120.0
    swim_bind: tuple[str, int] | None = None
    """Join SWIM on this UDP address (None: no membership; the orchestrator is given
    the node's address instead)."""
    seeds: tuple[tuple[str, int], ...] = ()
    advertise_host: str | None = None
    """The QUIC host published in SWIM metadata (default: `bind_host`)."""
    admission: Admission | None = None
    """The pinned pool (`--pool`): SWIM admits only its keys, AddressBook entries
    outside it are ignored and the QUIC endpoint pins its members' full public keys.
    None is refused unless `open_pool` is set."""
    open_pool: bool = False
    """Run without a pool file (`--open-pool`): SWIM admits any key and QUIC checks its
    peers by their 64-bit ids alone (`admission.ID_ONLY_REFUSAL`)."""
    network: Transport | None = None
    """How to build the endpoint, driver and control channel (None: real QUIC)."""


class _Notices(Actor[Any]):
    """Hands GpuWorkerCtl's boot notices to the node's boot coroutine."""

    def __init__(self, queue: asyncio.Queue[Any]) -> None:
        self.queue = queue

    async def receive(self, ctx: Context[Any], message: Any) -> None:
        if isinstance(message, WorkerReadyNotice | WorkerFailedNotice):
            self.queue.put_nowait(message)


class NodeStagePorts:
    """`StagePorts` of the node: worker/weights, edges, reports, events (module doc)."""

    def __init__(self, node: StageNode) -> None:
        self.node = node
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def _worker(self) -> WorkerStagePorts:
        assert self.node.worker_ports is not None
        return self.node.worker_ports

    def worker_generation(self) -> WorkerGeneration:
        return self._worker.worker_generation()

    async def configure_role(self, provision: ProvisionStage) -> None:
        await self._worker.configure_role(provision)

    async def load_weights(self, provision: ProvisionStage) -> None:
        await self._worker.load_weights(provision)

    async def grant_steps(self, command: GrantSteps) -> None:
        await self._worker.grant_steps(command)

    async def revoke_steps(self, role_id: RoleId) -> None:
        await self._worker.revoke_steps(role_id)

    async def reset_role(self, role_id: RoleId) -> None:
        await self._worker.reset_role(role_id)

    @property
    def _edges(self) -> EdgeStagePorts:
        assert self.node.edge_ports is not None
        return self.node.edge_ports

    async def establish_inbound(self, provision: ProvisionStage) -> None:
        await self._edges.establish_inbound(self._oversize(provision, inbound=True))

    async def establish_outbound(self, provision: ProvisionStage) -> None:
        await self._edges.establish_outbound(self._oversize(provision, inbound=False))

    async def stop_edges(self, inbound: EdgeId, outbound: EdgeId) -> None:
        await self._edges.stop_edges(inbound, outbound)

    def _oversize(self, provision: ProvisionStage, inbound: bool) -> ProvisionStage:
        """SWACTOR_FAULT_INJECT `node.ring_oversize`: the ring asks for the whole arena and
        more, which the ArenaManager rejects (LeaseNeverFits -> RingRequestOversized)."""
        if not faults.hit("node.ring_oversize"):
            return provision
        assert self.node.arena is not None
        size = self.node.arena.size
        if inbound:
            edge_in = provision.inbound
            spec = dataclasses.replace(edge_in.ring_spec, data_capacity=align_up(
                size + 1, edge_in.ring_spec.alignment))
            return dataclasses.replace(
                provision, inbound=dataclasses.replace(edge_in, ring_spec=spec))
        edge_out = provision.outbound
        spec = dataclasses.replace(edge_out.ring_spec, data_capacity=align_up(
            size + 1, edge_out.ring_spec.alignment))
        return dataclasses.replace(
            provision, outbound=dataclasses.replace(edge_out, ring_spec=spec))

    async def report(self, orchestrator: NodeId, run_id: RunId, message: StageReport,
                     footprint: StageFootprint | None = None) -> None:
        task = asyncio.get_running_loop().create_task(
            self.node.send_report(orchestrator, report_message(run_id, message, footprint)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def emit(self, event: LifecycleEvent, mono_ns: int | None = None) -> None:
        self.node.emitter.emit(event, mono_ns)

    def emit_all(self, events: Sequence[tuple[LifecycleEvent, int | None]]) -> None:
        self.node.emitter.emit_all(events)


class _WatchedControl(ControlChannel):
    """The node's control channel, which also says when a peer's last connection closed.

    A peer may hold more than one control link to this node: each orchestrator session
    has an endpoint of its own, so the previous session's link can be seen closing after
    the next session already provisioned this node over a new one. Only the close of the
    last link that carried control traffic means the peer is gone (`on_lost`).
    """

    on_lost: Callable[[int], None] | None = None

    def __init__(self, endpoint: QuicEndpoint, registry: Iterable[type[WireStruct]],
                 handler: Handler, authority: ControlAuthority) -> None:
        super().__init__(endpoint, registry, handler, authority)
        self._live: dict[int, set[QuicLink]] = {}
        """Per peer, the links that carried control traffic and have not closed."""

    def stream_data(self, link: QuicLink, stream_id: int, data: bytes, end: bool) -> None:
        if link.peer_node_id is not None and not link.closed:
            self._live_links(link.peer_node_id).add(link)
        super().stream_data(link, stream_id, data, end)

    def link_closed(self, link: QuicLink, reason: str) -> None:
        super().link_closed(link, reason)
        peer = link.peer_node_id
        if peer is None:
            return
        live = self._live_links(peer)
        live.discard(link)
        live -= {other for other in live if other.closed}
        if live:
            log.info("node: a control link of node %#018x closed; another is live", peer)
        elif self.on_lost is not None:
            self.on_lost(peer)

    def _live_links(self, peer: int) -> set[QuicLink]:
        return self._live.setdefault(peer, set())


class _BootSteps:
    """`BootSteps` of the node_boot binding: each step answers with the next milestone."""

    def __init__(self, node: StageNode) -> None:
        self.node = node
        self._tasks: set[asyncio.Task[None]] = set()

    def _task(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def construct_arena(self, ceiling: int) -> None:
        manager = ArenaManager(ceiling, faults=faults.from_env())
        try:
            outputs = manager.construct()
        except Exception as error:
            self.node.boot_failure = f"arena of {ceiling} bytes: {error}"
            self.node.deliver(nb.ArenaFailed(ArenaFailure.MemfdFailed))
            return
        down = [o for o in outputs if isinstance(o, ArenaDown)]
        if down or manager.arena is None:
            reason = down[0].reason if down else ArenaFailure.MemfdFailed
            self.node.boot_failure = f"arena of {ceiling} bytes: {reason.value}"
            self.node.deliver(nb.ArenaFailed(reason))
            return
        self.node.arena_manager, self.node.arena = manager, manager.arena
        self.node.spawn_actors(manager)
        self.node.deliver(nb.ArenaReady())

    def start_worker(self) -> None:
        self._task(self.node.await_worker())

    def start_transport(self) -> None:
        self._task(self.node.start_transport())

    def join_membership(self) -> None:
        self.node.join_membership()

    def admit_provisioning(self, run: RunId, stage: StageIndex) -> None:
        self.node.admit(run, stage)

    def reject_provisioning(self, run: RunId, stage: StageIndex, reason: RunFaultReason,
                            component: Component) -> None:
        self.node.reject(run, stage, reason, component)

    def shutdown(self) -> None:
        return None


async def _notices(queue: asyncio.Queue[Any]) -> AsyncIterator[Any]:
    while True:
        yield await queue.get()


class StageNode:
    """One node: boot, serve stages, stop (module doc)."""

    def __init__(self, config: NodeConfig, emitter: Emitter) -> None:
        if config.admission is None and not config.open_pool:
            raise ValueError(f"no pool file: the node {ID_ONLY_REFUSAL} "
                             "(NodeConfig.admission, or open_pool)")
        self.config = config
        self.emitter = emitter
        self.node_id = NodeId(config.identity.node_id)
        self.arena: Arena | None = None
        self.runtime: Runtime | None = None
        self.arena_manager: ArenaManager | None = None
        self.endpoint: QuicEndpoint | None = None
        self.driver: Any = None
        """The edge driver (owned by the DriverActor `_driver_ref`)."""
        self.edge_ports: EdgeStagePorts | None = None
        self.control: ControlChannel | None = None
        self.worker_ports: WorkerStagePorts | None = None
        self.pool_weights: PoolWeights | None = None
        self.host_state = StageHostState()
        self.authority = ControlAuthority(
            orchestrator_id=int(config.orchestrator),
            orchestrator_only=ORCHESTRATOR_ONLY,
            opening_types=frozenset({"ProvisionStage"}),
        )
        self.finished: asyncio.Queue[StageOutcome] = asyncio.Queue()
        self._arena_ref: ActorRef[Any] | None = None
        self._driver_ref: ActorRef[Any] | None = None
        self._establisher: ActorRef[Any] | None = None
        self._routes: WorkerRoutes | None = None
        self._installer: WorkerRingInstaller | None = None
        self._host: ActorRef[Any] | None = None
        self._ctl: ActorRef[Any] | None = None
        self._bells: WorkerDoorbells | None = None
        """The worker's wake doorbells (GpuWorkerCtl hands them to every generation; the
        ring installer's `WorkerWakeRoute` reads and rings them, and closes them)."""
        self._worker_pid: int | None = None
        self.membership: Any = None
        self.swim_join: Any = None
        self.boot: NodeBoot | None = None
        self.boot_failure: str | None = None
        self.boot_refusals = 0
        self._held: dict[tuple[RunId, StageIndex], tuple[NodeId, ProvisionStage]] = {}
        """ProvisionStage messages waiting for node_boot's answer (admit or reject)."""
        self._active_stage = StageIndex(0)
        self.notices: asyncio.Queue[Any] = asyncio.Queue()
        self._booted: asyncio.Future[None] | None = None

    # -- boot -------------------------------------------------------------------------

    async def start(self) -> tuple[str, int]:
        """Boot through the node_boot machine (module doc); the bound QUIC address.

        Raises `NodeBootError` naming the step when the machine ends Unavailable."""
        loop = asyncio.get_running_loop()
        self._booted = loop.create_future()
        faults.bind_node(self.node_id)  # SWACTOR_FAULT_INJECT (swactor/faults)
        self.boot = NodeBoot(self.node_id, self.config.arena_ceiling, _BootSteps(self),
                             health=self, emitter=self.emitter)
        self.deliver(nb.NodeProcessStarted())
        timeout = self.config.worker_init_timeout_s + BOOT_SLACK_S
        try:
            await asyncio.wait_for(asyncio.shield(self._booted), timeout)
        except TimeoutError:
            raise NodeBootError(f"boot did not finish within {timeout:.0f}s "
                                f"(state {self.boot.state.value})") from None
        assert self.endpoint is not None
        return self.endpoint.address

    def deliver(self, event: nb.Event) -> None:
        """Feed one boot milestone on the event loop (never re-entrantly)."""
        self._loop().call_soon(self._feed, event)

    def deliver_threadsafe(self, event: nb.Event) -> None:
        self._loop().call_soon_threadsafe(self._feed, event)

    def _loop(self) -> asyncio.AbstractEventLoop:
        assert self._booted is not None
        return self._booted.get_loop()

    def _feed(self, event: nb.Event) -> None:
        assert self.boot is not None and self._booted is not None
        self.boot.handle(event)
        state = self.boot.state
        if self._booted.done():
            return
        if state is nb.State.NodeAvailable:
            self._booted.set_result(None)
        elif state in (nb.State.Unavailable, nb.State.Stopped):
            self._booted.set_exception(NodeBootError(self.boot_failure or state.value))

    def publish_health(self, health: Any) -> None:
        """`HealthPublisher`: the boot health goes into the SWIM metadata."""
        if self.swim_join is not None:
            self.swim_join.publish_health(health)

    def spawn_actors(self, manager: ArenaManager) -> None:
        """The node's actors: stage host, arena, boot notices, GpuWorkerCtl (the driver
        and the EdgeEstablisher come with the transport)."""
        config = self.config
        assert manager.arena is not None
        arena = manager.arena
        runtime = self.runtime = Runtime(f"node-{self.node_id:x}")
        routes = self._routes = WorkerRoutes()
        host = runtime.spawn(lambda: StageHost(
            StageHostConfig(self.node_id, config.orchestrator), NodeStagePorts(self),
            self.host_state, self._stage_finished, routes), "stage-host",
            mailbox_capacity=4096)
        self._host = host
        self._arena_ref = runtime.spawn(lambda: ArenaActor(manager), "arena",
                                        mailbox_capacity=4096)
        watcher = runtime.spawn(lambda: _Notices(self.notices), "boot")
        routes.node_boot, routes.stage_controllers = watcher, [host]
        backend: dict[str, JsonValue] = {
            key: value for key, value in (("device", config.device), ("threads", config.threads))
            if value is not None}
        ctl_config = WorkerCtlConfig(arena.fd, arena.size, backend=backend or None,
                                     init_timeout_s=config.worker_init_timeout_s)
        bells = self._bells = WorkerDoorbells.create()
        self._ctl = runtime.spawn(lambda: GpuWorkerCtl(ctl_config, routes, arena,
                                                       doorbells=bells),
                                  "gpu-worker", mailbox_capacity=4096)

    async def await_worker(self) -> None:
        """Start the worker; WorkerReady / WorkerFailed to the boot machine."""
        assert self._ctl is not None and self._host is not None
        self._ctl.tell(gwc.StartWorker())
        notice = await self.notices.get()
        if isinstance(notice, WorkerFailedNotice):
            self.boot_failure = worker_failure(notice)
            self.deliver(nb.WorkerFailed())
            return
        self._worker_pid = notice.pid
        self.worker_ports = WorkerStagePorts(self._ctl, self._host,
                                             models_dir=self.config.models_dir,
                                             cache_dir=self.config.models_dir / HTTP_CACHE,
                                             weights=self.config.weights,
                                             generation=notice.generation,
                                             fetch=self.pool_weights)
        self.deliver(nb.WorkerReady(notice.generation))
        async for later in _notices(self.notices):  # a worker that fails after boot
            if isinstance(later, WorkerFailedNotice):
                self.deliver(nb.WorkerFailed())
            else:  # a restarted generation is ready (§31): stages report its number
                self._worker_pid = later.pid
                self.worker_ports.set_generation(later.generation)

    async def start_transport(self) -> None:
        """The QUIC endpoint, edge driver and control channel; TransportReady / Failed."""
        config = self.config
        network = config.network or QuicTransport(faults.from_env())
        endpoint = network.endpoint(config.identity, config.transport,
                                    {int(config.orchestrator)},
                                    None if config.admission is None
                                    else config.admission.pinned_keys)
        try:
            await endpoint.start(config.bind_host, config.quic_port)
        except Exception as error:
            self.boot_failure = f"transport: {error}"
            self.deliver(nb.TransportFailed())
            return
        self.endpoint = endpoint
        if isinstance(endpoint, QuicEndpoint):  # PoolPeer weights (node.pool_weights)
            self.pool_weights = PoolWeights(ArtifactChannel(endpoint), config.models_dir)
            if self.worker_ports is not None:
                self.worker_ports.fetch = self.pool_weights
        self._spawn_edges(endpoint, network)
        control: Any = network.control(endpoint, REGISTRY, self._on_request, self.authority,
                                       _WatchedControl)
        control.on_lost = self._link_lost
        self.control = control
        self.deliver(nb.TransportReady())

    def _spawn_edges(self, endpoint: Any, network: Transport) -> None:
        """The DriverActor and the EdgeEstablisher on the endpoint; the edge ports."""
        manager, runtime, routes = self.arena_manager, self.runtime, self._routes
        ctl, host, arena_ref = self._ctl, self._host, self._arena_ref
        assert manager is not None and manager.arena is not None and runtime is not None
        assert routes is not None and ctl is not None and host is not None
        assert arena_ref is not None
        arena = manager.arena
        installer = self._installer = WorkerRingInstaller(ctl, routes.edges, self._bells)
        driver_actor = DriverActor(endpoint, arena, WakeFanout(installer), network.driver)
        self.driver = driver_actor.driver
        if installer.route is not None:  # the worker's wake hints reach the driver directly
            installer.route.bind(driver_actor.driver)
        driver = self._driver_ref = runtime.spawn(lambda: driver_actor, "driver",
                                                  mailbox_capacity=4096)
        # edge_ready is the StageController's event (on EdgeReady): no emit here
        est_config = EstablisherConfig(self.node_id, arena_ref, driver, installer,
                                       manager.take_minter())
        establisher = self._establisher = runtime.spawn(
            lambda: EdgeEstablisher(est_config), "edge-establisher", mailbox_capacity=4096)
        routes.establisher, routes.driver = establisher, driver
        self.edge_ports = EdgeStagePorts(establisher, host)

    def join_membership(self) -> None:
        """SWIM join when configured (SwimJoin reports the outcome); else joined at once."""
        from swactor.membership import (
            BootHealth,
            MemberMeta,
            MembershipNode,
            SwimConfig,
            SwimJoin,
        )

        config = self.config
        if config.swim_bind is None:
            self.deliver(nb.MembershipJoinStarted())
            self.deliver(nb.MembershipJoined())
            return
        assert self.endpoint is not None
        quic = self.endpoint.address
        meta = MemberMeta(swim_host=config.swim_bind[0], swim_port=0,
                          quic_host=config.advertise_host or quic[0], quic_port=quic[1],
                          boot_health=BootHealth.Booting, device_kind="cpu",
                          memory_bytes=config.arena_ceiling)
        seeds = [seed for seed in config.seeds if seed != config.swim_bind]
        try:
            self.membership = MembershipNode(config.identity, SwimConfig(), meta, seeds=seeds,
                                             bind=config.swim_bind,
                                             allowed_keys=swim_allow_list(config.admission))
        except Exception as error:
            self.boot_failure = f"membership: {error}"
            self.deliver(nb.MembershipJoinFailed())
            return
        self.boot_failure = "membership: the SWIM join was not acknowledged"
        self.swim_join = SwimJoin(self.membership, self.deliver_threadsafe, JOIN_TIMEOUT_S)
        self.swim_join.start()

    # -- serving ------------------------------------------------------------------------

    async def _on_request(self, peer: int, message: WireStruct) -> WireStruct | None:
        assert self._host is not None and self.endpoint is not None
        match message:
            case AddressBook():
                if faults.hit("node.address_drop"):
                    return None
                pinned = self.config.admission
                outside = {int(e.node_id) for e in message.peers
                           if pinned is not None and e.node_id not in pinned.member_ids}
                if outside:
                    log.warning("node: AddressBook names %d node(s) outside the pool file; "
                                "ignored", len(outside))
                peers = {int(entry.node_id): (entry.host, entry.port)
                         for entry in message.peers
                         if int(entry.node_id) not in outside | {int(self.node_id)}}
                allowed = {int(self.config.orchestrator), *peers}
                if self.host_state.active_run is None:
                    self.endpoint.set_allowed(allowed)  # past sessions' peers leave
                else:
                    self.endpoint.allowed |= allowed  # never cut a live run's links
                self.endpoint.address_book.update(peers)
            case ProvisionStage():
                if faults.hit("node.provision_reject"):
                    raise ControlError("provisioning refused (fault injection)")
                # node_boot's rows decide (§8): admit() or reject() runs inside handle()
                assert self.boot is not None
                self._held[(message.run_id, message.stage_index)] = (NodeId(peer), message)
                try:
                    self.boot.handle(nb.ProvisionRequested(message.run_id,
                                                           message.stage_index))
                finally:
                    self._held.pop((message.run_id, message.stage_index), None)
            case StopRunMessage():
                self._host.tell(StopRunRequest(NodeId(peer), message.run_id,
                                               message.stage_index))
            case PreloadStage():
                return await self._preload(peer, message)
        return None

    async def _preload(self, peer: int, message: PreloadStage) -> StagePreloaded:
        """A warm spare's preload (StageHost module doc): answered once the worker
        configured the role, or refused naming why."""
        assert self._host is not None and self.boot is not None
        role = message.provision.runtime.role_id
        if self.boot.state is not nb.State.NodeAvailable:
            return StagePreloaded(role, False, f"the node is {self.boot.state.value}")
        answer: asyncio.Future[PreloadOutcome] = asyncio.get_running_loop().create_future()
        self._host.tell(PreloadRequest(NodeId(peer), message.provision, answer))
        outcome = await answer
        return StagePreloaded(role, outcome.ok, outcome.detail, outcome.footprint)

    def admit(self, run: RunId, stage: StageIndex) -> None:
        """AdmitProvisioning: the held ProvisionStage goes to the StageHost."""
        peer, message = self._held.pop((run, stage))
        assert self._host is not None and self._driver_ref is not None
        self._active_stage = stage
        if self.host_state.active_run is None:
            self.authority.active_run_id = int(run)
        inbound = message.inbound
        self._driver_ref.tell(ExpectRecv(((int(inbound.edge_id),
                                           int(inbound.producer_node_id)),)))
        self._host.tell(scm.ProvisionStage(peer, message))

    def reject(self, run: RunId, stage: StageIndex, reason: RunFaultReason,
               component: Component) -> None:
        """RejectProvisioning: the held ProvisionStage is dropped and the sender told."""
        peer, _message = self._held.pop((run, stage))
        self.boot_refusals += 1
        log.warning("node: run %d stage %d refused by node_boot (%s): the node is %s",
                    int(run), int(stage), reason.value,
                    self.boot.state.value if self.boot is not None else "booting")
        asyncio.get_running_loop().create_task(self.send_report(
            peer, StageFaultReport(run, stage, reason, component)))

    def _link_lost(self, peer: int) -> None:
        """The orchestrator's control connection closed: stop its run here (no orphan)."""
        run = self.host_state.active_run
        if peer != int(self.config.orchestrator) or run is None or self._host is None:
            return
        log.warning("node: lost the orchestrator's connection; stopping run %d", int(run))
        self._host.tell(StopRunRequest(NodeId(peer), run, self._active_stage))

    def _stage_finished(self, outcome: StageOutcome) -> None:
        self.authority.active_run_id = None
        self.finished.put_nowait(outcome)
        # the run's edge actors finish stopping just after: then free what the run left
        asyncio.get_running_loop().call_later(HEAP_RELEASE_DELAY_S, heap.release)

    async def send_report(self, orchestrator: NodeId, message: WireStruct) -> None:
        assert self.control is not None
        try:
            await self.control.request(int(orchestrator), message, timeout=REPORT_TIMEOUT_S)
        except Exception as error:
            log.warning("node: report %s to the orchestrator failed: %s",
                        type(message).__name__, error)

    def status(self) -> dict[str, object]:
        """Leak check: active run, live ring leases, worker pid, runs served, and the
        QUIC endpoint's connection counts (`QuicEndpoint.status`)."""
        return {
            "node_id": int(self.node_id),
            "active_run": None if self.host_state.active_run is None
            else int(self.host_state.active_run),
            "live_leases": [] if self.arena_manager is None else
            [(int(lease.edge_id), int(lease.ring_id))
             for lease in self.arena_manager.live_leases()],
            "worker_pid": self._worker_pid,
            **({} if self.pool_weights is None else self.pool_weights.status()),
            "runs_served": [int(o.run_id) for o in self.host_state.history
                            if o.run_id is not None],
            "transport": (self.endpoint.status() if isinstance(self.endpoint, QuicEndpoint)
                          else None),
        }

    # -- stop ---------------------------------------------------------------------------

    async def stop(self) -> None:
        """Leave the pool, shut the worker down, close the transport and the arena."""
        if self.boot is not None:
            self.boot.handle(nb.Shutdown())
        if self.swim_join is not None:
            await asyncio.to_thread(self.swim_join.stop)
            self.swim_join = self.membership = None
        elif self.membership is not None:
            await asyncio.to_thread(self.membership.stop, True)
            self.membership = None
        if self._ctl is not None:
            self._ctl.tell(gwc.ShutdownWorker(ShutdownMode.Graceful))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(15):
                    while self._ctl.alive and self._worker_alive():
                        await asyncio.sleep(0.05)
        if self._installer is not None and self._installer.route is not None:
            self._installer.route.close()  # no wake hint reaches the driver from now on
            self._bells = None
        elif self._bells is not None:
            self._bells.close()
            self._bells = None
        if self._driver_ref is not None:
            await self._driver_ref.stop_and_join()  # DriverActor.stopped closes the driver
        if self.endpoint is not None:
            await self.endpoint.close()
        if self.runtime is not None:
            await self.runtime.shutdown()
        if self.arena is not None:
            with contextlib.suppress(Exception):
                self.arena.close()

    def _worker_alive(self) -> bool:
        pid = self._worker_pid
        if pid is None:
            return False
        try:
            with open(f"/proc/{pid}/stat") as stat:
                return stat.read().split(") ")[-1][:1] not in ("Z", "X")
        except OSError:
            return False
