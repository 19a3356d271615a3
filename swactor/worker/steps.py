"""The step runner: ExecuteStep validation, role execution and output writing (spec §29).

Theory of operation
-------------------
Steps run one at a time, in arrival order; an ExecuteStep that arrives while another is
running waits in a queue. Starting a step checks, in the spec's order: the role is
configured (RoleUnavailable); every input handle is of this worker generation and held
(InvalidInputHandle); every output names an installed egress ring that is waiting for
output (InvalidOutputRing) and fits its ObjectSpec (OutputExtentInvalid). The role then
runs over tinygrad views of the inputs (TinygradError, DeviceOutOfMemory); its outputs
must be exactly the declared ports with exactly the declared byte sizes
(OutputExtentInvalid). Nothing is written unless all of that holds. After the role ran
(or raised), tinygrad's memory-planner caches are dropped (`planner_caches`), or every
planned schedule's allocators would stay alive for the life of the worker.

Outputs are then written one after another through their egress rings. A ring without
space leaves the step waiting (`pump` returns); the RingWritable that frees space lets
the ring continue, its `output_done` marks the output finished, and the next `pump`
moves on. After the last ObjectProduced comes StepCompleted (and, with
`release_inputs_after`, the inputs are released: DeviceObjectReleased). A failure
anywhere emits StepFailed with its reason and the next step starts.

`pump()` is a loop driven by the worker after every command or wake hint; the egress
callbacks only record what happened, so nothing recurses across steps.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tinygrad.tensor import Tensor

from swactor import faults
from swactor.wire import (
    DeviceObjectReleased,
    ExecuteStep,
    RingId,
    RoleId,
    StepCompleted,
    StepFailed,
    StepFailure,
    WorkerEvent,
)
from swactor.worker.bridge import DeviceAllocation, DeviceBridge, DeviceError, InvalidHandle
from swactor.worker.egress import EgressRing
from swactor.worker.ingress import IngressRing
from swactor.worker.planner_caches import drop_planner_caches
from swactor.worker.roles import Role, RoleRunError

log = logging.getLogger(__name__)


class StepRefused(Exception):
    """A step cannot run; `reason` is its §37 StepFailure."""

    def __init__(self, reason: StepFailure, detail: str) -> None:
        self.reason = reason
        super().__init__(f"{reason.value}: {detail}")


@dataclass(eq=False)
class ActiveStep:
    """A step whose outputs are being written (the egress rings' OutputListener)."""

    command: ExecuteStep
    outputs: list[DeviceAllocation]
    index: int = 0
    writing: bool = False
    failure: StepFailure | None = None
    detail: list[str] = field(default_factory=list)

    def output_done(self) -> None:
        self.index += 1
        self.writing = False

    def output_failed(self, reason: StepFailure) -> None:
        self.failure = reason
        self.writing = False


class StepRunner:
    """Runs ExecuteStep commands in order; see the module docstring."""

    def __init__(
        self,
        bridge: DeviceBridge,
        roles: Mapping[RoleId, Role],
        rings: Mapping[RingId, IngressRing | EgressRing],
        emit: Callable[[WorkerEvent], None],
    ) -> None:
        self._bridge = bridge
        self._roles = roles
        self._rings = rings
        self._emit = emit
        self._queue: deque[ExecuteStep] = deque()
        self.current: ActiveStep | None = None

    @property
    def idle(self) -> bool:
        return self.current is None and not self._queue

    def submit(self, command: ExecuteStep) -> None:
        self._queue.append(command)

    def abort(self, reason: StepFailure) -> None:
        """Fail the running step and every queued one with `reason`."""
        if self.current is not None:
            self._fail(self.current.command, reason)
            self.current = None
        while self._queue:
            self._fail(self._queue.popleft(), reason)

    def pump(self) -> None:
        """Advance steps as far as they can go without waiting for ring space."""
        while True:
            step = self.current
            if step is None:
                if not self._queue:
                    return
                self.current = self._start(self._queue.popleft())
                continue
            if step.failure is not None:
                self._fail(step.command, step.failure)
                self.current = None
                continue
            if step.writing:
                return
            if step.index == len(step.command.outputs):
                self._complete(step)
                self.current = None
                continue
            binding = step.command.outputs[step.index]
            ring = self._rings.get(binding.ring_id)
            if not isinstance(ring, EgressRing):
                step.failure = StepFailure.InvalidOutputRing
                continue
            step.writing = True
            ring.produce(binding, step.outputs[step.index], step)

    # -- steps ------------------------------------------------------------------------

    def _fail(self, command: ExecuteStep, reason: StepFailure) -> None:
        self._emit(StepFailed(command.role_id, command.step_id, reason))

    def _complete(self, step: ActiveStep) -> None:
        command = step.command
        self._emit(StepCompleted(command.role_id, command.step_id))
        if command.release_inputs_after:
            for binding in command.inputs:
                try:
                    self._bridge.release(binding.device_handle)
                except InvalidHandle:
                    continue
                self._emit(DeviceObjectReleased(binding.device_handle))

    def _start(self, command: ExecuteStep) -> ActiveStep | None:
        try:
            outputs = self._run(command)
        except StepRefused as refused:
            log.info("step %s refused: %s", int(command.step_id), refused)
            self._fail(command, refused.reason)
            return None
        return ActiveStep(command, outputs)

    def _run(self, command: ExecuteStep) -> list[DeviceAllocation]:
        role = self._roles.get(command.role_id)
        if role is None:
            raise StepRefused(StepFailure.RoleUnavailable, f"role {int(command.role_id)}")
        views: dict[int, Tensor] = {}
        for binding in command.inputs:
            try:
                allocation = self._bridge.lookup(binding.device_handle)
            except InvalidHandle as exc:
                raise StepRefused(StepFailure.InvalidInputHandle, str(exc)) from None
            views[int(binding.port_id)] = self._bridge.wrap(allocation)
        for out in command.outputs:
            ring = self._rings.get(out.ring_id)
            if not isinstance(ring, EgressRing) or not ring.idle:
                raise StepRefused(StepFailure.InvalidOutputRing, f"ring {int(out.ring_id)}")
            if ring.refusal(out.extent) is not None:
                raise StepRefused(StepFailure.OutputExtentInvalid, f"ring {int(out.ring_id)}")
        try:
            if command.outputs:  # SWACTOR_FAULT_INJECT worker.step (swactor/faults)
                faults.worker_step(int(command.outputs[0].sequence))
            produced = role.run(views, command.outputs, command.runtime)
            declared = {int(b.port_id) for b in command.outputs}
            if set(produced) != declared:
                raise StepRefused(StepFailure.OutputExtentInvalid, "output ports differ")
            allocations = [self._bridge.adopt(produced[int(b.port_id)]) for b in command.outputs]
        except StepRefused:
            raise
        except RoleRunError as exc:
            raise StepRefused(StepFailure.OutputExtentInvalid, str(exc)) from None
        except (MemoryError, DeviceError) as exc:
            raise StepRefused(StepFailure.DeviceOutOfMemory, str(exc)) from None
        except Exception as exc:  # tinygrad raises many types; all are the role's failure
            raise StepRefused(StepFailure.TinygradError, type(exc).__name__) from None
        finally:
            drop_planner_caches()  # else tinygrad keeps each plan's allocators (module doc)
        for out, allocation in zip(command.outputs, allocations, strict=True):
            if allocation.extent != out.extent:
                raise StepRefused(
                    StepFailure.OutputExtentInvalid,
                    f"port {int(out.port_id)}: {allocation.extent} bytes, "
                    f"binding says {out.extent}",
                )
        return allocations
