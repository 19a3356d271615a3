"""A StageController under test: a real actor runtime, a real 3-stage plan, fake ports.

`StageRig` spawns one controller and offers one method per thing its peers say to it
(the orchestrator's ProvisionStage/StopRun, the edge actors' EdgeReady/EdgeStopped,
the loader's WeightsReady, GpuWorkerCtl's wire events: a granted step's StepCompleted
with its record), each returning once the actor has acted on it (a port call, report or
event the test names, or `settle()`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from swactor import wire
from swactor.actors import ActorRef, Runtime
from swactor.fsm.generated import orchestrator_run as orun
from swactor.fsm.generated import stage_controller as scm
from swactor.node.stage_controller import (
    StageController,
    StageControllerConfig,
    StageMail,
    output_extent,
)
from swactor.node.stage_ports import StageOutcome
from swactor.orchestrator.inventory import synthetic_pool
from swactor.orchestrator.planner import PlanRequest, plan_run, stage_runtime_facts
from swactor.wire import (
    DeviceObjectHandle,
    EdgeReady,
    NodeId,
    ObjectId,
    PromptSource,
    ProvisionStage,
    RingId,
    RunId,
    RunPlan,
    Sequence,
    StageIndex,
    StepId,
    WorkerGeneration,
    provision_stage,
)
from tests.node.fake_stage_ports import FakeStagePorts
from tests.orchestrator.conftest import synthetic_model

RUN = RunId(7)
PROMPT = (1, 31, 32, 33, 34)
HIDDEN = 64
IN_RING, OUT_RING = RingId(11), RingId(12)


def make_plan(run_id: RunId = RUN) -> RunPlan:
    request = PlanRequest(
        run_id=run_id, prompt=PromptSource.from_token_ids(PROMPT), max_tokens=8,
        max_seq_len=64, first_edge_id=200,
    )
    return plan_run(synthetic_pool(3), synthetic_model(blocks=6, hidden=HIDDEN), request).plan


def provision_of(plan: RunPlan, index: int) -> ProvisionStage:
    return provision_stage(plan, index, stage_runtime_facts(plan, index))


def handle(n: int, generation: int = 1) -> DeviceObjectHandle:
    return DeviceObjectHandle(WorkerGeneration(generation), 100 + n)


@dataclass
class StageRig:
    runtime: Runtime
    ports: FakeStagePorts
    plan: RunPlan
    provision: ProvisionStage
    controller: StageController
    ref: ActorRef[StageMail]
    finished: asyncio.Future[StageOutcome]
    t0: int = field(default_factory=lambda: time.monotonic_ns() + 1_000_000_000)
    """The worker's time of the first step's load in `record` (ahead of the grant)."""

    @property
    def orchestrator(self) -> NodeId:
        return self.plan.orchestrator_node

    def state(self) -> scm.State:
        return self.controller.machine.state

    @property
    def inbound(self) -> wire.EdgeId:
        return self.provision.inbound.edge_id

    @property
    def outbound(self) -> wire.EdgeId:
        return self.provision.outbound.edge_id

    async def settle(self) -> None:
        """Let the actor drain its mailbox (nothing observable to wait for)."""
        for _ in range(20):
            await asyncio.sleep(0)

    async def provision_stage(self, sender: NodeId | None = None) -> None:
        self.ref.tell(scm.ProvisionStage(sender or self.orchestrator, self.provision))
        await self.settle()

    async def make_ready(self) -> None:
        await self.provision_stage()
        await self.ports.until(lambda: len(self.ports.of("establish_outbound")) == 1
                               and len(self.ports.of("load_weights")) == 1)
        self.ref.tell(EdgeReady(self.inbound, IN_RING))
        self.ref.tell(EdgeReady(self.outbound, OUT_RING))
        self.ref.tell(scm.WeightsReady())
        self.ref.tell(wire.RoleConfigured(self.provision.runtime.role_id))
        await self.ports.until(lambda: bool(self.ports.reported(orun.StageReady)))

    def grant(self) -> wire.GrantSteps:
        """The standing grant the controller issued when the stage became ready."""
        command = self.ports.of("grant_steps")[-1][1]
        assert isinstance(command, wire.GrantSteps)
        return command

    def step_of(self, k: int) -> StepId:
        return StepId(self.grant().first_step_id + k)

    def record(self, k: int, tokens: int = 1) -> wire.StepRecord:
        """What the worker reports for the grant's step k (times 1 µs apart from `t0`)."""
        spec = self.provision.inbound.object_spec
        extent = tokens * spec.alignment
        base = self.t0 + 10_000 * k
        return wire.StepRecord(Sequence(k), ObjectId(k + 1), extent, ObjectId(k + 1),
                               output_extent(self.provision, extent),
                               base, base + 1_000, base + 2_000, base + 3_000)

    def completed(self, k: int, tokens: int = 1) -> wire.StepCompleted:
        return wire.StepCompleted(self.provision.runtime.role_id, self.step_of(k),
                                  self.record(k, tokens))

    async def step(self, k: int, tokens: int = 1) -> StepId:
        """The worker's report of the grant's step k; returns once it is recorded."""
        before = self.ports.event_names().count("step_completed")
        self.ref.tell(self.completed(k, tokens))
        await self.ports.until(
            lambda: self.ports.event_names().count("step_completed") == before + 1)
        return self.step_of(k)

    async def stop_run(self) -> None:
        before = len(self.ports.of("stop_edges"))
        self.ref.tell(scm.StopRun(self.provision.run_id))
        await self.ports.until(lambda: len(self.ports.of("stop_edges")) == before + 1)

    async def edges_stopped(self, inbound_clean: bool = True, outbound_clean: bool = True
                            ) -> StageOutcome:
        self.ref.tell(scm.EdgeStopped(self.inbound, inbound_clean))
        self.ref.tell(scm.EdgeStopped(self.outbound, outbound_clean))
        return await asyncio.wait_for(asyncio.shield(self.finished), 5)


Body = Callable[[StageRig], Awaitable[None]]


def run_stage(body: Body, stage: int = 1, grace_s: float = 30.0,
              config: StageControllerConfig | None = None) -> None:
    async def main() -> None:
        async with Runtime("node") as runtime:
            plan = make_plan()
            ports = FakeStagePorts()
            finished: asyncio.Future[StageOutcome] = asyncio.get_running_loop().create_future()
            node = plan.stages[stage].node_id
            cfg = config or StageControllerConfig(
                node_id=node, orchestrator=plan.orchestrator_node, stopping_grace_s=grace_s,
            )
            controller = StageController(cfg, ports, finished)
            ref = runtime.spawn(lambda: controller, "stage")
            await body(StageRig(runtime, ports, plan, provision_of(plan, stage), controller,
                                ref, finished))

    asyncio.run(asyncio.wait_for(main(), timeout=20))


def stage_index(rig: StageRig) -> StageIndex:
    return rig.provision.stage_index
