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
moves on. After the last ObjectProduced comes StepCompleted; the outputs' device memory goes
back to the bridge (which keeps small allocations for reuse) and, with
`release_inputs_after`, the inputs are released with it: StepCompleted says so, and no
DeviceObjectReleased follows for them (a worker line per token less; the node forgets
the handles on StepCompleted). A failure
anywhere emits StepFailed with its reason and the next step starts.

`pump()` is a loop driven by the worker after every command or wake hint; the egress
callbacks only record what happened, so nothing recurses across steps.

A step issued ahead (`ExecuteStep.awaits`, see `swactor.wire.worker`) waits at the head
of the queue until its awaited objects are loaded: the worker reports every object its
ingress rings load (`object_loaded`), and the step takes the one of its ring and
sequence, bound like an InputBinding; an output `per_input_row` gets as many rows as the
input has. The loaded object of another sequence on an awaited ring fails the step
(InvalidInputHandle: the node armed a step for an object that is not the one that came).
A ring uninstalled under a waiting step fails it (WorkerShuttingDown), and so does a
drain (`abort_waiting`): its object can no longer come. Loaded objects no step took stay
listed until a step takes them or they are released (`forget`) or their ring goes.

Standing grants (`GrantSteps`, see `swactor.wire.worker`): `grant` keeps one per role
and, whenever no step runs or waits, the runner issues the grant's next step (step k:
step id first + k, awaiting sequence first + k on the grant's ring, output advanced by
k, inputs released after) as soon as an object is loaded on that ring, so nothing waits
at the head of the queue for an object that has not come. The object of another
sequence fails the step there, in `_bind` (the one place the sequence is gated). Objects
loaded on a granted ring are the grant's: `object_loaded` answers True for them, and the
worker writes no ObjectLoaded line; a granted step's ObjectProduced is not written
either (`object_produced`), and its StepCompleted carries a `StepRecord` with the input
and output objects and the monotonic times of load, start, output commit and completion.
`revoke` ends a grant: no further step of it is issued, and the objects it holds, or
that its ring loads later, are freed at once; a step already started finishes. A drain
(`abort_waiting`) revokes every grant, and an uninstalled ring ends the grant on it
and frees what the grant left there.

Sequence tags (`swactor.wire.tags`, an extension beyond spec §17): the ingress ring keeps
each object's header `flags` with its device allocation, and a step's outputs carry the
flags of its inputs (every input of a step must carry the same), so a tag travels
through every stage to the token-out edge. The role reads them on its output bindings
(`OutputBinding.flags`: set to the input's when the node left them 0). An output to a
TokenIds ring of a step whose tag asks for CANDIDATES is `2 * CANDIDATES_K * 4` bytes
(the candidates object) instead of its binding's one id. Flags that are neither 0 nor a
valid tag fail the step (OutputExtentInvalid, as a role's bad input does). Untagged
objects (flags 0) run exactly as the spec says. A batch object (flags BATCH) has `B`
rows after its tag table, which is padded to whole rows of its edge
(`swactor.wire.tags.table_bytes` of the ring's alignment): an awaited batch input must
be exactly that table and `B` rows (else OutputExtentInvalid); its outputs get `B`
rows per_input_row plus the table padded to the output ring's rows, or on a TokenIds
ring (4-byte rows: no padding) the table plus each row's answer (one id, or a
candidates object where the row's tag asks for it); a table the runner cannot read
fails the step the same way.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from tinygrad.tensor import Tensor

from swactor.faults import NO_FAULTS, Faults
from swactor.wire import (
    DeviceObjectHandle,
    ExecuteStep,
    GrantSteps,
    InputBinding,
    ObjectId,
    ObjectKind,
    ObjectLoaded,
    ObjectProduced,
    OutputBinding,
    RingId,
    RoleId,
    Sequence,
    StepCompleted,
    StepFailed,
    StepFailure,
    StepId,
    StepRecord,
    WorkerEvent,
)
from swactor.wire.tags import (
    CANDIDATES_K,
    MAX_SLOTS,
    TAG_WIDTH,
    SequenceTag,
    TagError,
    answer_words,
    batch_rows,
    batch_table,
    table_bytes,
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


@dataclass(slots=True)
class _Granted:
    """What the runner knows of a granted step while it runs (its StepRecord to be)."""

    input: ObjectLoaded
    loaded_ns: int
    started_ns: int
    produced_ns: int = 0
    output_extent: int = 0


@dataclass(eq=False)
class ActiveStep:
    """A step whose outputs are being written (the egress rings' OutputListener)."""

    command: ExecuteStep
    outputs: list[DeviceAllocation]
    index: int = 0
    writing: bool = False
    failure: StepFailure | None = None
    detail: list[str] = field(default_factory=list)
    granted: _Granted | None = None
    """Set for a step of a standing grant (module doc)."""

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
        flush: Callable[[], None] = lambda: None,
        faults: Faults = NO_FAULTS,
    ) -> None:
        self._bridge = bridge
        self._faults = faults
        self._flush = flush
        self._roles = roles
        self._rings = rings
        self._emit = emit
        self._queue: deque[ExecuteStep] = deque()
        self._loaded: dict[tuple[RingId, Sequence], tuple[ObjectLoaded, int]] = {}
        """Loaded objects no step took yet, with their monotonic load time (ns)."""
        self._grants: dict[RoleId, tuple[GrantSteps, int]] = {}
        """Each role's standing grant and how many of its steps were issued."""
        self._grant_rings: dict[RingId, RoleId] = {}
        self._closed_rings: set[RingId] = set()
        """Rings of revoked grants: what they load is freed at once."""
        self._granted_steps: set[StepId] = set()
        """Issued grant steps not started yet (queued, waiting for their object)."""
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

    def object_loaded(self, event: ObjectLoaded) -> bool:
        """An ingress ring loaded this object (a step issued ahead may be waiting); True
        when it is a grant's (the worker then writes no ObjectLoaded line for it)."""
        ring = event.ring_id
        if ring in self._closed_rings:
            self._free(event.device_handle)  # its grant was revoked: never run
            return True
        key = (ring, event.sequence)
        self._loaded[key] = (event, time.monotonic_ns())
        return ring in self._grant_rings

    def object_produced(self, event: ObjectProduced) -> bool:
        """An egress ring committed an output; True when it is the running granted
        step's (recorded in its StepCompleted, no ObjectProduced line)."""
        step = self.current
        if step is None or step.granted is None:
            return False
        step.granted.produced_ns = time.monotonic_ns()
        step.granted.output_extent = event.extent
        return True

    def grant(self, command: GrantSteps) -> None:
        """Hold a standing grant (module doc); a second one for the role replaces it."""
        self.revoke(command.role_id, free=False)
        ring = command.input.ring_id
        self._closed_rings.discard(ring)
        self._grants[command.role_id] = (command, 0)
        self._grant_rings[ring] = command.role_id

    def revoke(self, role_id: RoleId, free: bool = True) -> None:
        """End `role_id`'s grant: its unstarted step is dropped, and its ring's objects
        (now and later) are freed unless `free` is False."""
        held = self._grants.pop(role_id, None)
        if held is None:
            return
        ring = held[0].input.ring_id
        self._grant_rings.pop(ring, None)
        for command in [c for c in self._queue if c.step_id in self._granted_steps
                        and c.role_id == role_id]:
            self._queue.remove(command)
            self._granted_steps.discard(command.step_id)
        if free:
            self._closed_rings.add(ring)
            for key in [k for k in self._loaded if k[0] == ring]:
                self._free(self._loaded.pop(key)[0].device_handle)

    def forget(self, handle: DeviceObjectHandle) -> None:
        """The object was released: no step may take it any more."""
        for key, (loaded, _) in list(self._loaded.items()):
            if loaded.device_handle == handle:
                del self._loaded[key]

    def ring_gone(self, ring_id: RingId) -> None:
        """Ring `ring_id` is uninstalled: end its grant (freeing what the grant held),
        fail the steps waiting for it, drop its objects."""
        role = self._grant_rings.get(ring_id)
        if role is not None:
            self.revoke(role)
        self._closed_rings.discard(ring_id)
        for key in [k for k in self._loaded if k[0] == ring_id]:
            del self._loaded[key]
        waiting = [c for c in self._queue if any(a.ring_id == ring_id for a in c.awaits)]
        for command in waiting:
            self._queue.remove(command)
            self._fail(command, StepFailure.WorkerShuttingDown)

    def abort_waiting(self, reason: StepFailure) -> None:
        """Revoke every grant and fail every queued step still waiting for an awaited
        input (a drain)."""
        for role in list(self._grants):
            self.revoke(role)
        for command in [c for c in self._queue if c.awaits]:
            self._queue.remove(command)
            self._fail(command, reason)

    def pump(self) -> None:
        """Advance steps as far as they can go without waiting for ring space or input."""
        while True:
            step = self.current
            if step is None:
                if not self._queue and not self._issue():
                    return
                head = self._queue[0]
                granted: _Granted | None = None
                if head.awaits:
                    if head.step_id in self._granted_steps:
                        key = (head.awaits[0].ring_id, head.awaits[0].sequence)
                        held = self._loaded.get(key)
                        if held is not None:
                            granted = _Granted(held[0], held[1], 0)
                    bound = self._bind(head)
                    if bound is None:
                        return  # its input is not loaded yet
                    self._queue.popleft()
                    self._granted_steps.discard(head.step_id)
                    if isinstance(bound, StepFailure):
                        self._fail(head, bound)
                        continue
                    head = bound
                else:
                    self._queue.popleft()
                if granted is not None:
                    granted.started_ns = time.monotonic_ns()
                self.current = self._start(head)
                if self.current is not None:
                    self.current.granted = granted
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

    def _issue(self) -> bool:
        """Queue the next step of a grant whose ring has loaded an object; False when
        no grant has one (module doc)."""
        for role, (command, issued) in self._grants.items():
            ring = command.input.ring_id
            if not any(key[0] == ring for key in self._loaded):
                continue
            self._grants[role] = (command, issued + 1)
            step = _grant_step(command, issued)
            self._granted_steps.add(step.step_id)
            self._queue.append(step)
            return True
        return False

    def _free(self, handle: DeviceObjectHandle) -> None:
        with contextlib.suppress(InvalidHandle):
            self._bridge.release(handle)

    def _bind(self, command: ExecuteStep) -> ExecuteStep | StepFailure | None:
        """The step with its awaited inputs bound; None while one is not loaded yet; the
        failure when an awaited ring loaded another sequence or an extent is not rows."""
        found: list[tuple[ObjectLoaded, int]] = []
        for awaited in command.awaits:
            held = self._loaded.get((awaited.ring_id, awaited.sequence))
            if held is None:
                if any(ring == awaited.ring_id for ring, _ in self._loaded):
                    log.warning("step %d awaits sequence %d of ring %d; another loaded",
                                int(command.step_id), int(awaited.sequence),
                                int(awaited.ring_id))
                    return StepFailure.InvalidInputHandle
                return None
            loaded = held[0]
            rows = self._rows(loaded, awaited.row_bytes)
            if rows is None:
                return StepFailure.OutputExtentInvalid
            found.append((loaded, rows))
        for awaited in command.awaits:
            del self._loaded[(awaited.ring_id, awaited.sequence)]
        inputs = command.inputs + tuple(
            InputBinding(awaited.port_id, loaded.object_id, loaded.sequence,
                         loaded.device_handle)
            for awaited, (loaded, _) in zip(command.awaits, found, strict=True))
        rows = found[0][1]
        outputs = tuple(_per_rows(binding, rows) for binding in command.outputs)
        return replace(command, inputs=inputs, outputs=outputs, awaits=())

    def _rows(self, loaded: ObjectLoaded, row_bytes: int) -> int | None:
        """Rows of a loaded object (a batch's after its tag table, padded to whole
        rows); None when its extent is not whole rows, or a batch's is not exactly its
        padded table and one row per table entry."""
        try:
            batch = batch_rows(self._bridge.lookup(loaded.device_handle).flags)
        except (InvalidHandle, TagError):
            batch = None  # the step fails when it runs, naming why
        body = loaded.extent - (0 if batch is None else table_bytes(batch, row_bytes))
        if body < 0 or body % row_bytes:
            return None
        if batch is not None and body // row_bytes != batch:
            return None
        return body // row_bytes

    def _fail(self, command: ExecuteStep, reason: StepFailure) -> None:
        self._emit(StepFailed(command.role_id, command.step_id, reason))
        held = self._grants.get(command.role_id)
        if held is not None and held[0].first_step_id <= command.step_id < (
                held[0].first_step_id + held[1]):
            # a granted step failed: its grant ends (nothing after it may run) and its
            # input, which no node holds, is freed
            for binding in command.inputs:
                self._free(binding.device_handle)
            self.revoke(command.role_id)

    def _complete(self, step: ActiveStep) -> None:
        command = step.command
        granted = step.granted
        record = None
        if granted is not None:
            loaded, (out,) = granted.input, command.outputs
            completed = time.monotonic_ns()
            record = StepRecord(loaded.sequence, loaded.object_id, loaded.extent,
                                out.object_id, granted.output_extent or out.extent,
                                granted.loaded_ns or granted.started_ns, granted.started_ns,
                                granted.produced_ns or completed, completed)
        self._emit(StepCompleted(command.role_id, command.step_id, record))
        for output in step.outputs:  # written to their rings: the bridge may reuse them
            self._bridge.free(output)
        if command.release_inputs_after:  # StepCompleted reports these too (module doc)
            for binding in command.inputs:
                with contextlib.suppress(InvalidHandle):
                    self._bridge.release(binding.device_handle)

    def _start(self, command: ExecuteStep) -> ActiveStep | None:
        """Run the step's role (steps with awaited inputs come here bound)."""
        try:
            command, outputs = self._run(command)
        except StepRefused as refused:
            log.warning("step %s refused: %s", int(command.step_id), refused)
            self._fail(command, refused.reason)
            return None
        return ActiveStep(command, outputs)

    def _run(self, command: ExecuteStep) -> tuple[ExecuteStep, list[DeviceAllocation]]:
        """Run the step's role; the command as run (outputs tagged) and its outputs."""
        role = self._roles.get(command.role_id)
        if role is None:
            raise StepRefused(StepFailure.RoleUnavailable, f"role {int(command.role_id)}")
        views: dict[int, Tensor] = {}
        flags: set[int] = set()
        for binding in command.inputs:
            try:
                allocation = self._bridge.lookup(binding.device_handle)
            except InvalidHandle as exc:
                raise StepRefused(StepFailure.InvalidInputHandle, str(exc)) from None
            views[int(binding.port_id)] = self._bridge.wrap(allocation)
            flags.add(allocation.flags)
        if len(flags) > 1:
            raise StepRefused(StepFailure.OutputExtentInvalid,
                              "the step's inputs carry different sequence tags")
        if flags and flags != {0}:
            (word,) = flags
            table = self._table(word, command)
            command = replace(command, outputs=tuple(
                self._tagged(binding, word, table) for binding in command.outputs))
        for out in command.outputs:
            ring = self._rings.get(out.ring_id)
            if not isinstance(ring, EgressRing) or not ring.idle:
                raise StepRefused(StepFailure.InvalidOutputRing, f"ring {int(out.ring_id)}")
            if ring.refusal(out.extent) is not None:
                raise StepRefused(StepFailure.OutputExtentInvalid, f"ring {int(out.ring_id)}")
        try:
            if command.outputs:
                self._faults.worker_step(int(command.outputs[0].sequence))
            self._flush()  # the node hears what happened so far before the compute
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
        return command, allocations

    def _table(self, flags: int, command: ExecuteStep) -> tuple[SequenceTag, ...] | None:
        """A batch input's tag table, read from the head of its object (None when the
        input is no batch); checked against the wire's bounds (the role checks it
        against its slots)."""
        try:
            rows = batch_rows(flags)
            if rows is None:
                return None
            allocation = self._bridge.lookup(command.inputs[0].device_handle)
            if allocation.extent < rows * TAG_WIDTH:
                raise TagError("table", f"a batch of {rows} rows in {allocation.extent} bytes")
            head = bytearray(rows * TAG_WIDTH)
            self._bridge.device_to_host(allocation, 0, memoryview(head))
            words = struct.unpack(f"<{rows}I", head)
            return batch_table(flags, words, MAX_SLOTS)
        except (TagError, InvalidHandle, DeviceError) as error:
            raise StepRefused(StepFailure.OutputExtentInvalid, str(error)) from None

    def _tagged(self, binding: OutputBinding, flags: int,
                table: tuple[SequenceTag, ...] | None) -> OutputBinding:
        """`binding` carrying the input's `flags`; a candidates object's extent on a
        TokenIds ring; a batch's outputs carry its table (module doc)."""
        try:
            tag = None if table is not None else SequenceTag.unpack(flags)
        except TagError as error:
            raise StepRefused(StepFailure.OutputExtentInvalid, str(error)) from None
        tagged = binding if binding.flags else replace(binding, flags=flags)
        ring = self._rings.get(binding.ring_id)
        tokens = isinstance(ring, EgressRing) and ring.spec.kind is ObjectKind.TokenIds
        if table is not None:
            granule = ring.spec.alignment if isinstance(ring, EgressRing) else TAG_WIDTH
            head = table_bytes(len(table), granule)
            if tokens:
                words = sum(answer_words(row) for row in table)
                return replace(tagged, extent=head + words * TAG_WIDTH)
            return replace(tagged, extent=head + tagged.extent)
        if tag is not None and tag.candidates and tokens:
            tagged = replace(tagged, extent=2 * CANDIDATES_K * 4)
        return tagged


def _grant_step(grant: GrantSteps, k: int) -> ExecuteStep:
    """The grant's step k (module doc)."""
    output = replace(grant.output, object_id=ObjectId(grant.output.object_id + k),
                     sequence=Sequence(grant.output.sequence + k))
    awaited = replace(grant.input, sequence=Sequence(grant.input.sequence + k))
    return ExecuteStep(grant.role_id, StepId(grant.first_step_id + k), (), (output,), None,
                       True, (awaited,))


def _per_rows(binding: OutputBinding, rows: int) -> OutputBinding:
    if not binding.per_input_row:
        return binding
    return replace(binding, extent=binding.extent * rows, per_input_row=False)
