"""`StageNode`: one swactor node process — arena, worker, transport, control, stage slot.

Theory of operation. The node boots in spec §8's order and serves stages until told to
stop:

1. `node_started`; the memfd arena (`--arena-ceiling` bytes);
2. the GPU worker: `GpuWorkerCtl` spawns `python -m swactor.worker` with the arena fd
   and waits for its WorkerReady (a worker that cannot start fails the boot);
3. the transport: one `QuicEndpoint` (the node's Ed25519 identity), the edge `Driver`
   on the arena, the `ControlChannel` on `swactor/ctl/1`;
4. with `swim_bind`, SWIM membership (seeds; the QUIC address and BootHealth.Available
   in the signed member metadata, which is how an orchestrator started with `--seed`
   finds the pool);
5. `node_available`, and one JSON line on stdout (`{"node_id", "quic"}`) that launchers
   read to learn the node's id and bound address.

Serving. The control channel accepts `AddressBook`, `ProvisionStage` and
`StopRunMessage` only from the orchestrator the node trusts (`--trust-orchestrator`;
the channel's `ControlAuthority` answers anyone else `Unauthorized`). AddressBook admits
the run's peers to the endpoint and records their addresses. ProvisionStage goes to the
`StageHost`, which runs one fresh `StageController` per run on `NodeStagePorts`: the
worker and weight ports of `WorkerStagePorts`, the edge ends of `EdgeKeeper`, reports as
control requests back to the orchestrator, events through the node's emitter. While a
run is active the authority accepts only messages of that run; when its controller
stops, the node is idle again and the next run may open (no restart).

`stop()` shuts the worker down, closes the endpoint and the arena. `status()` is the
leak check a test or operator reads: active run, live ring leases, worker pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swactor.actors import Actor, ActorRef, Context, Runtime
from swactor.arena import Arena
from swactor.events.emitter import Emitter
from swactor.events.schema import LifecycleEvent, NodeAvailable, NodeStarted
from swactor.fsm.generated import gpu_worker_ctl as gwc
from swactor.fsm.generated import stage_controller as scm
from swactor.node.control_messages import (
    ORCHESTRATOR_ONLY,
    REGISTRY,
    AddressBook,
    StopRunMessage,
    report_message,
)
from swactor.node.edge_keeper import EdgeKeeper, EstablishEdge, StopEdges
from swactor.node.stage_host import StageHost, StageHostConfig, StageHostState, StopRunRequest
from swactor.node.stage_ports import StageOutcome, StageReport
from swactor.node.stage_worker_ports import WorkerStagePorts
from swactor.node.worker_ctl import (
    GpuWorkerCtl,
    WorkerCtlConfig,
    WorkerFailedNotice,
    WorkerReadyNotice,
    WorkerRoutes,
)
from swactor.transport import ControlAuthority, ControlChannel, Driver, QuicEndpoint
from swactor.transport.config import TransportConfig
from swactor.transport.identity import NodeIdentity
from swactor.wire import (
    DeviceObjectHandle,
    EdgeId,
    ExecuteStep,
    NodeId,
    ProvisionStage,
    RoleId,
    RunId,
    ShutdownMode,
    WorkerGeneration,
)
from swactor.wire.codec import WireStruct

log = logging.getLogger("swactor.node")

DEFAULT_ARENA_CEILING = 256 << 20
REPORT_TIMEOUT_S = 30.0


class NodeBootError(Exception):
    """The node could not boot; the message names the step and the cause."""


@dataclass(frozen=True)
class NodeConfig:
    """What one node process is told on its command line."""

    identity: NodeIdentity
    orchestrator: NodeId
    bind_host: str = "127.0.0.1"
    quic_port: int = 0
    arena_ceiling: int = DEFAULT_ARENA_CEILING
    models_dir: Path = Path(".")
    transport: TransportConfig = TransportConfig()
    worker_init_timeout_s: float = 120.0
    swim_bind: tuple[str, int] | None = None
    """Join SWIM on this UDP address (None: no membership; the orchestrator is given
    the node's address instead)."""
    seeds: tuple[tuple[str, int], ...] = ()
    advertise_host: str | None = None
    """The QUIC host published in SWIM metadata (default: `bind_host`)."""


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

    async def execute_step(self, command: ExecuteStep) -> None:
        await self._worker.execute_step(command)

    async def release_input(self, handle: DeviceObjectHandle) -> None:
        await self._worker.release_input(handle)

    async def reset_role(self, role_id: RoleId) -> None:
        await self._worker.reset_role(role_id)

    async def establish_inbound(self, provision: ProvisionStage) -> None:
        self.node.keeper_ref().tell(EstablishEdge(provision, inbound=True))

    async def establish_outbound(self, provision: ProvisionStage) -> None:
        self.node.keeper_ref().tell(EstablishEdge(provision, inbound=False))

    async def stop_edges(self, inbound: EdgeId, outbound: EdgeId) -> None:
        self.node.keeper_ref().tell(StopEdges((inbound, outbound)))

    async def report(self, orchestrator: NodeId, run_id: RunId, message: StageReport) -> None:
        task = asyncio.get_running_loop().create_task(
            self.node.send_report(orchestrator, report_message(run_id, message)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def emit(self, event: LifecycleEvent) -> None:
        self.node.emitter.emit(event)


class StageNode:
    """One node: boot, serve stages, stop (module doc)."""

    def __init__(self, config: NodeConfig, emitter: Emitter) -> None:
        self.config = config
        self.emitter = emitter
        self.node_id = NodeId(config.identity.node_id)
        self.arena: Arena | None = None
        self.runtime: Runtime | None = None
        self.endpoint: QuicEndpoint | None = None
        self.driver: Driver | None = None
        self.control: ControlChannel | None = None
        self.worker_ports: WorkerStagePorts | None = None
        self.host_state = StageHostState()
        self.authority = ControlAuthority(
            orchestrator_id=int(config.orchestrator),
            orchestrator_only=ORCHESTRATOR_ONLY,
            opening_types=frozenset({"ProvisionStage"}),
        )
        self.finished: asyncio.Queue[StageOutcome] = asyncio.Queue()
        self._keeper: EdgeKeeper | None = None
        self._keeper_ref: ActorRef[Any] | None = None
        self._host: ActorRef[Any] | None = None
        self._ctl: ActorRef[Any] | None = None
        self._worker_pid: int | None = None
        self.membership: Any = None

    def keeper_ref(self) -> ActorRef[Any]:
        assert self._keeper_ref is not None
        return self._keeper_ref

    # -- boot -------------------------------------------------------------------------

    async def start(self) -> tuple[str, int]:
        """Boot (module doc); the bound QUIC address. Raises `NodeBootError`."""
        config = self.config
        self.emitter.emit(NodeStarted(node_id=self.node_id))
        try:
            self.arena = Arena.create(config.arena_ceiling)
        except Exception as error:
            raise NodeBootError(f"arena of {config.arena_ceiling} bytes: {error}") from None
        self.runtime = Runtime(f"node-{self.node_id:x}")
        await self.runtime.__aenter__()
        notices: asyncio.Queue[Any] = asyncio.Queue()
        runtime, arena = self.runtime, self.arena
        host = runtime.spawn(lambda: StageHost(
            StageHostConfig(self.node_id, config.orchestrator), NodeStagePorts(self),
            self.host_state, self._stage_finished), "stage-host", mailbox_capacity=4096)
        self._host = host
        self._keeper = EdgeKeeper(arena, host)
        keeper = self._keeper
        self._keeper_ref = runtime.spawn(lambda: keeper, "edges", mailbox_capacity=4096)
        watcher = runtime.spawn(lambda: _Notices(notices), "boot")
        routes = WorkerRoutes(node_boot=watcher, establisher=self._keeper_ref,
                              driver=self._keeper_ref, stage_controllers=[host])
        ctl_config = WorkerCtlConfig(arena.fd, arena.size,
                                     init_timeout_s=config.worker_init_timeout_s)
        self._ctl = runtime.spawn(lambda: GpuWorkerCtl(ctl_config, routes, arena), "gpu-worker",
                                  mailbox_capacity=4096)
        self._ctl.tell(gwc.StartWorker())
        notice = await asyncio.wait_for(notices.get(), config.worker_init_timeout_s + 10)
        if isinstance(notice, WorkerFailedNotice):
            raise NodeBootError("the GPU worker failed to start (see its stderr)")
        self._worker_pid = notice.pid
        self.worker_ports = WorkerStagePorts(self._ctl, host, models_dir=config.models_dir,
                                             generation=notice.generation)

        endpoint = QuicEndpoint(config.identity, config.transport,
                                allowed={int(config.orchestrator)})
        try:
            address = await endpoint.start(config.bind_host, config.quic_port)
        except Exception as error:
            raise NodeBootError(f"transport: {error}") from None
        self.endpoint = endpoint
        emit, wake = keeper.driver_callbacks(self._keeper_ref)
        self.driver = Driver(endpoint, arena, emit=emit, wake=wake)
        keeper.bind(self.driver, self._ctl)
        self.control = ControlChannel(endpoint, REGISTRY, self._on_request, self.authority)
        if config.swim_bind is not None:
            self._join(address)
        self.emitter.emit(NodeAvailable(node_id=self.node_id))
        return address

    def _join(self, quic: tuple[str, int]) -> None:
        from swactor.membership import BootHealth, MemberMeta, MembershipNode, SwimConfig

        config = self.config
        assert config.swim_bind is not None
        meta = MemberMeta(swim_host=config.swim_bind[0], swim_port=0,
                          quic_host=config.advertise_host or quic[0], quic_port=quic[1],
                          boot_health=BootHealth.Available, device_kind="cpu",
                          memory_bytes=config.arena_ceiling)
        try:
            self.membership = MembershipNode(config.identity, SwimConfig(), meta,
                                             seeds=list(config.seeds), bind=config.swim_bind)
            self.membership.start()
        except Exception as error:
            raise NodeBootError(f"membership: {error}") from None

    # -- serving ------------------------------------------------------------------------

    async def _on_request(self, peer: int, message: WireStruct) -> WireStruct | None:
        assert self._host is not None and self.endpoint is not None
        match message:
            case AddressBook():
                for entry in message.peers:
                    if int(entry.node_id) == int(self.node_id):
                        continue
                    self.endpoint.allowed.add(int(entry.node_id))
                    self.endpoint.address_book[int(entry.node_id)] = (entry.host, entry.port)
            case ProvisionStage():
                if self.host_state.active_run is None:
                    self.authority.active_run_id = int(message.run_id)
                assert self.driver is not None
                self.driver.expect_recv([int(message.inbound.edge_id)])
                self._host.tell(scm.ProvisionStage(NodeId(peer), message))
            case StopRunMessage():
                self._host.tell(StopRunRequest(NodeId(peer), message.run_id,
                                               message.stage_index))
        return None

    def _stage_finished(self, outcome: StageOutcome) -> None:
        self.authority.active_run_id = None
        self.finished.put_nowait(outcome)

    async def send_report(self, orchestrator: NodeId, message: WireStruct) -> None:
        assert self.control is not None
        try:
            await self.control.request(int(orchestrator), message, timeout=REPORT_TIMEOUT_S)
        except Exception as error:
            log.warning("node: report %s to the orchestrator failed: %s",
                        type(message).__name__, error)

    def status(self) -> dict[str, object]:
        """Leak check: active run, live ring leases, worker pid, runs served."""
        return {
            "node_id": int(self.node_id),
            "active_run": None if self.host_state.active_run is None
            else int(self.host_state.active_run),
            "live_leases": self._keeper.live_leases() if self._keeper is not None else [],
            "worker_pid": self._worker_pid,
            "runs_served": [int(o.run_id) for o in self.host_state.history
                            if o.run_id is not None],
        }

    # -- stop ---------------------------------------------------------------------------

    async def stop(self) -> None:
        """Leave the pool, shut the worker down, close the transport and the arena."""
        if self.membership is not None:
            await asyncio.to_thread(self.membership.stop, True)
            self.membership = None
        if self._ctl is not None:
            self._ctl.tell(gwc.ShutdownWorker(ShutdownMode.Graceful))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(15):
                    while self._ctl.alive and self._worker_alive():
                        await asyncio.sleep(0.05)
        if self.driver is not None:
            await self.driver.close()
        if self.endpoint is not None:
            await self.endpoint.close()
        if self.runtime is not None:
            await self.runtime.shutdown()
        if self._keeper is not None:
            for end in list(self._keeper.ends.values()):
                end.ring.close()
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
