"""µs of control path per inference step in a StageController, beside what it is made of.

Theory of operation
-------------------
A stage's control path per step is: the worker's ObjectLoaded arrives in the
controller's mailbox and the machine moves Ready -> Executing (the step armed ahead of
its object starts); ObjectProduced is recorded; StepCompleted moves it back and the
binding arms the next step (builds and sends its ExecuteStep). This benchmark plays the
worker's three reports per step into a controller with in-memory ports (no worker, no
rings, no network) and waits for the next ExecuteStep, so the figure is the
controller's own cost, mailbox hops and lifecycle events (into a memory sink) included.
Beside it, on the same machine in the same run:

* the bare generated machine: the two machine events through `handle()` alone;
* an actor round trip: one `ask` to an actor that replies at once (the runtime's floor
  for any message-driven step).

The ratio that matters is the control path against a decode step of the model:
SmolLM2-135M at 80 tokens/s (llama.cpp on 2 cores) is 12.5 ms per token per pipeline.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from swactor import wire
from swactor.actors import Actor, ActorRef, Context, Runtime
from swactor.events.emitter import Emitter
from swactor.events.schema import LifecycleEvent
from swactor.events.sinks import MemorySink
from swactor.fsm.generated import orchestrator_run as orun
from swactor.fsm.generated import stage_controller as scm
from swactor.node.stage_controller import StageController, StageControllerConfig
from swactor.node.stage_ports import StageOutcome, StageReport
from swactor.testing.examples import example
from swactor.wire import (
    DeviceObjectHandle,
    EdgeId,
    EdgeKind,
    ExecuteStep,
    NodeId,
    ObjectId,
    ProvisionStage,
    RingId,
    RoleId,
    RunId,
    Sequence,
    StageFootprint,
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
        self.commands: list[ExecuteStep] = []
        """Every ExecuteStep the controller armed, in order."""
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

    async def execute_step(self, command: ExecuteStep) -> None:
        self.commands.append(command)
        self.wake.set()

    async def release_input(self, handle: DeviceObjectHandle) -> None:
        assert self.stage is not None
        self.stage.tell(wire.DeviceObjectReleased(handle))

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

    def emit(self, event: LifecycleEvent) -> None:
        self.emitter.emit(event)


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
        ref = runtime.spawn(lambda: StageController(config, ports, finished), "stage")
        ports.stage = ref
        ref.tell(scm.ProvisionStage(trusted, provision))
        await ports.ready
        edge, port = provision.inbound.edge_id, provision.runtime.input_port
        while not ports.commands:  # the first step is armed with StageReady
            await ports.wake.wait()
            ports.wake.clear()
        start = time.perf_counter()
        for k in range(steps):
            command = ports.commands[k]
            out = command.outputs[0]
            ref.tell(wire.ObjectLoaded(RingId(1), edge, port, ObjectId(k + 1), Sequence(k),
                                       spec.alignment, DeviceObjectHandle(WorkerGeneration(1),
                                                                          k)))
            ref.tell(wire.ObjectProduced(out.ring_id, provision.outbound.edge_id, out.port_id,
                                         out.object_id, out.sequence, out.extent))
            ref.tell(wire.StepCompleted(command.role_id, command.step_id))
            while len(ports.commands) <= k + 1:  # the next step armed
                await ports.wake.wait()
                ports.wake.clear()
        elapsed = time.perf_counter() - start
        ref.tell(scm.StopRun(provision.run_id))
        outcome = await finished
    return elapsed, outcome


class _Guards:
    def provision_valid(self, event: Any) -> bool:
        return True

    def setup_complete(self, event: Any) -> bool:
        return True

    def is_next_sequence(self, event: Any) -> bool:
        return True

    def loads_ahead(self, event: Any) -> bool:
        return False

    def next_loaded_ahead(self, event: Any) -> bool:
        return False

    def teardown_pending(self, event: Any) -> bool:
        return False

    def teardown_clean(self, event: Any) -> bool:
        return True


def machine_steps(steps: int) -> float:
    """Seconds for the same two machine events per step through `handle()` alone."""
    provision, trusted = _provision()
    machine = scm.StageControllerMachine(_Guards(), stopping_grace_s=1.0)
    machine.handle(scm.ProvisionStage(trusted, provision))
    machine.handle(scm.WeightsReady())
    role = provision.runtime.role_id
    events = [
        (scm.ObjectLoaded(wire.RingId(1), provision.inbound.edge_id,
                          provision.runtime.input_port, ObjectId(k + 1), Sequence(k), 64,
                          DeviceObjectHandle(WorkerGeneration(1), k)),
         scm.StepCompleted(role, wire.StepId(k + 1)))
        for k in range(steps)
    ]
    start = time.perf_counter()
    for loaded, completed in events:
        machine.handle(loaded)
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
    print(f"controller, per step (3 mailbox messages, 2 events): {ctl_us:9.1f} µs")
    print(f"bare machine, per step (2 handle() calls):            {machine_us:9.1f} µs "
          f"({ctl_us / machine_us:5.1f}x less than the controller)")
    print(f"actor ask round trip:                                 {ask_us:9.1f} µs "
          f"(controller step = {ctl_us / ask_us:4.1f} round trips)")
    share = ctl_us / (DECODE_STEP_MS * 1e3) * 100
    print(f"controller step vs a {DECODE_STEP_MS} ms decode step (80 tokens/s): {share:.2f} %")
    return 0 if outcome.clean else 1
