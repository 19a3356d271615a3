"""µs of control path per inference step in a StageController, beside what it is made of.

Theory of operation
-------------------
A stage's control path per step is one report: the worker runs each step under the
standing grant the controller issued when the stage became ready and reports it by one
StepCompleted with its `StepRecord`; the controller records it (the step's four
lifecycle events). This benchmark plays those reports into a controller with in-memory
ports (no worker, no rings, no network) and waits until the last is recorded, so the
figure is the controller's own cost, its mailbox hop and lifecycle events (into a memory
sink) included. Beside it, on the same machine in the same run:

* the bare generated machine: the same event through `handle()` alone;
* an actor round trip: one `ask` to an actor that replies at once (the runtime's floor
  for any message-driven step).

The ratio that matters is the control path against a decode step of the model:
SmolLM2-135M at 80 tokens/s (llama.cpp on 2 cores) is 12.5 ms per token per pipeline.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Iterable
from typing import Any

from swactor import wire
from swactor.actors import Actor, ActorRef, Context, Runtime
from swactor.events.emitter import Emitter
from swactor.events.schema import LifecycleEvent
from swactor.events.schema import StepCompleted as StepCompletedEvent
from swactor.events.sinks import MemorySink
from swactor.fsm.generated import orchestrator_run as orun
from swactor.fsm.generated import stage_controller as scm
from swactor.node.stage_controller import StageController, StageControllerConfig
from swactor.node.stage_ports import StageOutcome, StageReport
from swactor.testing.examples import example
from swactor.wire import (
    EdgeId,
    EdgeKind,
    GrantSteps,
    NodeId,
    ObjectId,
    ProvisionStage,
    RingId,
    RoleId,
    RunId,
    Sequence,
    StageFootprint,
    StepId,
    StepRecord,
    WorkerGeneration,
)

DECODE_STEP_MS = 12.5


class AnsweringPorts:
    """Ports that answer every worker command at once, as a zero-latency worker would."""

    def __init__(self) -> None:
        self.stage: ActorRef[Any] | None = None
        self.sink = MemorySink()
        self.emitter = Emitter("bench", [self.sink])
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.grants: list[GrantSteps] = []
        self.recorded = 0
        """step_completed events emitted."""
        self.wake: asyncio.Event = asyncio.Event()

    def worker_generation(self) -> WorkerGeneration:
        return WorkerGeneration(1)

    async def configure_role(self, provision: ProvisionStage) -> None:
        assert self.stage is not None
        self.stage.tell(wire.RoleConfigured(provision.runtime.role_id))

    async def load_weights(self, provision: ProvisionStage) -> None:
        assert self.stage is not None
        self.stage.tell(scm.WeightsReady())

    async def establish_inbound(self, provision: ProvisionStage) -> None:
        assert self.stage is not None
        self.stage.tell(wire.EdgeReady(provision.inbound.edge_id, RingId(1)))

    async def establish_outbound(self, provision: ProvisionStage) -> None:
        assert self.stage is not None
        self.stage.tell(wire.EdgeReady(provision.outbound.edge_id, RingId(2)))

    async def grant_steps(self, command: GrantSteps) -> None:
        self.grants.append(command)
        self.wake.set()

    async def revoke_steps(self, role_id: RoleId) -> None:
        pass

    async def stop_edges(self, inbound: EdgeId, outbound: EdgeId) -> None:
        assert self.stage is not None
        self.stage.tell(scm.EdgeStopped(inbound, True))
        self.stage.tell(scm.EdgeStopped(outbound, True))

    async def reset_role(self, role_id: RoleId) -> None:
        pass

    async def report(self, orchestrator: NodeId, run_id: RunId, message: StageReport,
                     footprint: StageFootprint | None = None) -> None:
        if isinstance(message, orun.StageReady) and not self.ready.done():
            self.ready.set_result(None)

    def emit(self, event: LifecycleEvent, mono_ns: int | None = None) -> None:
        self.emitter.emit(event, mono_ns)
        if isinstance(event, StepCompletedEvent):
            self.recorded += 1
            self.wake.set()

    def emit_all(self, events: Iterable[tuple[LifecycleEvent, int | None]]) -> None:
        for event, mono_ns in events:
            self.emit(event, mono_ns)


def _provision() -> tuple[ProvisionStage, NodeId]:
    provision = example(ProvisionStage)
    trusted = (provision.outbound.consumer_node_id
               if provision.outbound.kind is EdgeKind.TokenOut else NodeId(9000))
    return provision, trusted


async def controller_steps(steps: int) -> tuple[float, StageOutcome]:
    """Seconds for `steps` steps through a provisioned, ready controller."""
    provision, trusted = _provision()
    spec = provision.inbound.object_spec
    async with Runtime("bench") as runtime:
        ports = AnsweringPorts()
        finished: asyncio.Future[StageOutcome] = asyncio.get_running_loop().create_future()
        config = StageControllerConfig(NodeId(1), trusted)
        ref = runtime.spawn(lambda: StageController(config, ports, finished), "stage",
                            mailbox_capacity=steps + 64)
        ports.stage = ref
        ref.tell(scm.ProvisionStage(trusted, provision))
        await ports.ready
        while not ports.grants:  # the grant is issued with StageReady
            await ports.wake.wait()
            ports.wake.clear()
        grant = ports.grants[0]
        reports = [wire.StepCompleted(grant.role_id, StepId(grant.first_step_id + k),
                                      _record(k, spec.alignment))
                   for k in range(steps)]
        start = time.perf_counter()
        for report in reports:
            ref.tell(report)
        while ports.recorded < steps:
            await ports.wake.wait()
            ports.wake.clear()
        elapsed = time.perf_counter() - start
        ref.tell(scm.StopRun(provision.run_id))
        outcome = await finished
    return elapsed, outcome


def _record(k: int, extent: int) -> StepRecord:
    """What the worker would report for step k (times 1 µs apart)."""
    base = 1_000_000 + 4_000 * k
    return StepRecord(Sequence(k), ObjectId(k + 1), extent, ObjectId(k + 1), extent,
                      base, base + 1_000, base + 2_000, base + 3_000)


class _Guards:
    def provision_valid(self, event: Any) -> bool:
        return True

    def setup_complete(self, event: Any) -> bool:
        return True

    def teardown_pending(self, event: Any) -> bool:
        return False

    def teardown_clean(self, event: Any) -> bool:
        return True


def machine_steps(steps: int) -> float:
    """Seconds for the same event per step through `handle()` alone."""
    provision, trusted = _provision()
    machine = scm.StageControllerMachine(_Guards(), stopping_grace_s=1.0)
    machine.handle(scm.ProvisionStage(trusted, provision))
    machine.handle(scm.WeightsReady())
    role = provision.runtime.role_id
    events = [wire.StepCompleted(role, StepId(k + 1), _record(k, 64)) for k in range(steps)]
    start = time.perf_counter()
    for completed in events:
        machine.handle(completed)
    return time.perf_counter() - start


class _Echo(Actor[Any]):
    async def receive(self, ctx: Context[Any], message: Any) -> None:
        ctx.reply(message)


async def ask_round_trips(count: int) -> float:
    async with Runtime("bench") as runtime:
        ref = runtime.spawn(_Echo, "echo")
        await ref.ask(0, timeout=5)
        start = time.perf_counter()
        for i in range(count):
            await ref.ask(i, timeout=5)
        return time.perf_counter() - start


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench stage_controller")
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    steps = args.steps
    best_ctl = min(asyncio.run(controller_steps(steps))[0] for _ in range(args.repeats))
    _, outcome = asyncio.run(controller_steps(min(steps, 100)))
    best_machine = min(machine_steps(steps) for _ in range(args.repeats))
    best_ask = min(asyncio.run(ask_round_trips(steps)) for _ in range(args.repeats))
    ctl_us = best_ctl / steps * 1e6
    machine_us = best_machine / steps * 1e6
    ask_us = best_ask / steps * 1e6
    print(f"steps per run: {steps} (best of {args.repeats}); last check run clean="
          f"{outcome.clean} steps={outcome.steps_completed}")
    print(f"controller, per step (1 mailbox message, 1 event):   {ctl_us:9.1f} µs")
    print(f"bare machine, per step (1 handle() call):             {machine_us:9.1f} µs "
          f"({ctl_us / machine_us:5.1f}x less than the controller)")
    print(f"actor ask round trip:                                 {ask_us:9.1f} µs "
          f"(controller step = {ctl_us / ask_us:4.1f} round trips)")
    share = ctl_us / (DECODE_STEP_MS * 1e3) * 100
    print(f"controller step vs a {DECODE_STEP_MS} ms decode step (80 tokens/s): {share:.2f} %")
    return 0 if outcome.clean else 1
