"""The step runner: standing step grants, role execution and output writing (spec §29).

Theory of operation
-------------------
Steps run only under standing grants (`GrantSteps`, see `swactor.wire.worker`, which
takes the place of spec §29's ExecuteStep), one at a time. `grant` keeps one grant per
role; whenever no step runs, `pump` issues a grant's next step as soon as its ring has
loaded an object: step k (step id first + k) takes the object of sequence first + k
on the grant's ring, bound to the grant's input port, and writes the grant's output
advanced by k (object id and sequence), with as many rows as its input has when the
output is `per_input_row`. The object of another sequence fails the step
(InvalidInputHandle: the one place the sequence is gated), and so does an extent that
is not whole rows (OutputExtentInvalid). So no step ever waits for an object that has
not come, and no handle crosses the wire.

Starting a step checks, in §29's order: the role is configured (RoleUnavailable); the
input is held by this worker generation (InvalidInputHandle); the output names an
installed egress ring that is waiting for output (InvalidOutputRing) and fits its
ObjectSpec (OutputExtentInvalid). The role then runs over a tinygrad view of the input
(TinygradError, DeviceOutOfMemory); its output must be exactly the declared port with
exactly the declared byte size (OutputExtentInvalid). Nothing is written unless all of
that holds. After the role ran (or raised), tinygrad's memory-planner caches are
dropped (`planner_caches`), or every planned schedule's allocators would stay alive for
the life of the worker.

The output is then written through its egress ring. A ring without space leaves the
step waiting (`pump` returns); the RingWritable that frees space lets the ring
continue, its `output_done` marks the output written, and the next `pump` completes the
step: StepCompleted with its `StepRecord` (the input and output objects and the
monotonic times of load, start, output commit and completion); the output's device
memory goes back to the bridge (which keeps small allocations for reuse) and the input
is released with it (no DeviceObjectReleased follows: the node never held it). A
failure anywhere emits StepFailed with its reason, frees the input, and ends the
grant: nothing after a failed step may run.

Objects loaded on a granted ring are the grant's: `object_loaded` answers True for
them, and the worker writes no ObjectLoaded line; a step's ObjectProduced is not
written either (`object_produced`). An object loaded on a ring no grant names yet is
reported (ObjectLoaded) and kept: a grant that arrives after its object takes it.
`revoke` ends a grant: no further step of it is issued, and the objects it holds, or
that its ring loads later, are freed at once; a step already started finishes. A drain
revokes every grant (`revoke_all`), and an uninstalled ring ends the grant on it and
frees what the grant left there.

`pump()` is a loop driven by the worker after every command or wake hint; the egress
callbacks only record what happened, so nothing recurses across steps.

Sequence tags (`swactor.wire.tags`, an extension beyond spec §17): the ingress ring keeps
each object's header `flags` with its device allocation, and a step's output carries the
flags of its input, so a tag travels through every stage to the token-out edge. The
role reads them on its output binding (`OutputBinding.flags`: set to the input's when
the node left them 0). An output to a TokenIds ring of a step whose tag asks for
CANDIDATES is `2 * CANDIDATES_K * 4` bytes (the candidates object) instead of its
binding's one id. Flags that are neither 0 nor a
valid tag fail the step (OutputExtentInvalid, as a role's bad input does). Untagged
objects (flags 0) run exactly as the spec says. A batch object (flags BATCH) has `B`
rows after its tag table, which is padded to whole rows of its edge
(`swactor.wire.tags.table_bytes` of the ring's alignment): a batch input must be
exactly that table and `B` rows (else OutputExtentInvalid); its output gets `B` rows
per_input_row plus the table padded to the output ring's rows, or on a TokenIds
ring (4-byte rows: no padding) the table plus each row's answer (one id, or a
candidates object where the row's tag asks for it); a table the runner cannot read
fails the step the same way. A prompt batch (flags BATCH and PROMPTS) is read the
same way, its table one entry per prompt: its input is the table and whole rows (the
role checks they are the prompts' row counts), its outputs that many rows per_input_row
plus the table, or on a TokenIds ring the table plus each prompt's answer.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from swactor.faults import NO_FAULTS, Faults
from swactor.wire import (
    DeviceObjectHandle,
    GrantSteps,
    ObjectId,
    ObjectKind,
    ObjectLoaded,
    ObjectProduced,
    OutputBinding,
    PortId,
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
    read_table,
    table_bytes,
    table_entries,
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


@dataclass(frozen=True, slots=True)
class Step:
    """Step k of a standing grant, bound to the object it takes (module doc)."""

    grant: GrantSteps
    step_id: StepId
    port_id: PortId
    input: ObjectLoaded
    loaded_ns: int
    output: OutputBinding

    @property
    def role_id(self) -> RoleId:
        return self.grant.role_id


@dataclass(eq=False)
class ActiveStep:
    """A step whose output is being written (the egress ring's OutputListener)."""

    step: Step
    output: DeviceAllocation
    started_ns: int
    written: bool = False
    writing: bool = False
    failure: StepFailure | None = None
    produced_ns: int = 0
    output_extent: int = 0

    def output_done(self) -> None:
        self.written = True
        self.writing = False

    def output_failed(self, reason: StepFailure) -> None:
        self.failure = reason
        self.writing = False


class StepRunner:
    """Runs the steps of standing grants; see the module docstring."""

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
        self._loaded: dict[tuple[RingId, Sequence], tuple[ObjectLoaded, int]] = {}
        """Loaded objects no step took yet, with their monotonic load time (ns)."""
        self._grants: dict[RoleId, tuple[GrantSteps, int]] = {}
        """Each role's standing grant and how many of its steps were issued."""
        self._grant_rings: dict[RingId, RoleId] = {}
        self._closed_rings: set[RingId] = set()
        """Rings of revoked grants: what they load is freed at once."""
        self.current: ActiveStep | None = None

    @property
    def idle(self) -> bool:
        return self.current is None

    def abort(self, reason: StepFailure) -> None:
        """Fail the running step with `reason`."""
        if self.current is not None:
            step, self.current = self.current.step, None
            self._fail(step, reason)

    def object_loaded(self, event: ObjectLoaded) -> bool:
        """An ingress ring loaded this object; True when it is a grant's (the worker then
        writes no ObjectLoaded line for it)."""
        ring = event.ring_id
        if ring in self._closed_rings:
            self._free(event.device_handle)  # its grant was revoked: never run
            return True
        self._loaded[(ring, event.sequence)] = (event, time.monotonic_ns())
        return ring in self._grant_rings

    def object_produced(self, event: ObjectProduced) -> bool:
        """An egress ring committed an output; True when it is the running step's
        (recorded in its StepCompleted, no ObjectProduced line)."""
        step = self.current
        if step is None:
            return False
        step.produced_ns = time.monotonic_ns()
        step.output_extent = event.extent
        return True

    def grant(self, command: GrantSteps) -> None:
        """Hold a standing grant (module doc); a second one for the role replaces it."""
        self.revoke(command.role_id, free=False)
        ring = command.input.ring_id
        self._closed_rings.discard(ring)
        self._grants[command.role_id] = (command, 0)
        self._grant_rings[ring] = command.role_id

    def revoke(self, role_id: RoleId, free: bool = True) -> None:
        """End `role_id`'s grant: no further step of it is issued, and its ring's
        objects (now and later) are freed unless `free` is False."""
        held = self._grants.pop(role_id, None)
        if held is None:
            return
        ring = held[0].input.ring_id
        self._grant_rings.pop(ring, None)
        if free:
            self._closed_rings.add(ring)
            for key in [k for k in self._loaded if k[0] == ring]:
                self._free(self._loaded.pop(key)[0].device_handle)

    def revoke_all(self) -> None:
        """Revoke every grant (a drain): nothing new starts."""
        for role in list(self._grants):
            self.revoke(role)

    def forget(self, handle: DeviceObjectHandle) -> None:
        """The object was released: no step may take it any more."""
        for key, (loaded, _) in list(self._loaded.items()):
            if loaded.device_handle == handle:
                del self._loaded[key]

    def ring_gone(self, ring_id: RingId) -> None:
        """Ring `ring_id` is uninstalled: end its grant (freeing what the grant held) and
        drop its objects."""
        role = self._grant_rings.get(ring_id)
        if role is not None:
            self.revoke(role)
        self._closed_rings.discard(ring_id)
        for key in [k for k in self._loaded if k[0] == ring_id]:
            del self._loaded[key]

    def pump(self) -> None:
        """Advance steps as far as they can go without waiting for ring space or input."""
        while True:
            active = self.current
            if active is None:
                if not self._issue():
                    return
                continue
            if active.failure is not None:
                self.current = None
                self._fail(active.step, active.failure)
                continue
            if active.writing:
                return
            if active.written:
                self.current = None
                self._complete(active)
                continue
            binding = active.step.output
            ring = self._rings.get(binding.ring_id)
            if not isinstance(ring, EgressRing):
                active.failure = StepFailure.InvalidOutputRing
                continue
            active.writing = True
            ring.produce(binding, active.output, active)

    # -- steps ------------------------------------------------------------------------

    def _issue(self) -> bool:
        """Issue the next step of a grant whose ring has loaded an object: started (or
        failed); False when no grant has one (module doc)."""
        for role, (command, issued) in self._grants.items():
            ring = command.input.ring_id
            if not any(key[0] == ring for key in self._loaded):
                continue
            self._grants[role] = (command, issued + 1)
            step = self._bind(command, issued)
            if isinstance(step, Step):
                self.current = self._start(step)
            else:
                self._fail_unbound(command, StepId(command.first_step_id + issued), step)
            return True
        return False

    def _bind(self, grant: GrantSteps, k: int) -> Step | StepFailure:
        """The grant's step k bound to the object of its sequence, which it takes; the
        failure when its ring loaded another sequence or the extent is not rows."""
        awaited = grant.input
        sequence = Sequence(awaited.sequence + k)
        held = self._loaded.get((awaited.ring_id, sequence))
        if held is None:
            log.warning("step %d awaits sequence %d of ring %d; another loaded",
                        int(grant.first_step_id + k), int(sequence), int(awaited.ring_id))
            return StepFailure.InvalidInputHandle
        loaded, loaded_ns = held
        rows = self._rows(loaded, awaited.row_bytes)
        if rows is None:
            return StepFailure.OutputExtentInvalid
        del self._loaded[(awaited.ring_id, sequence)]
        output = replace(grant.output, object_id=ObjectId(grant.output.object_id + k),
                         sequence=Sequence(grant.output.sequence + k))
        if output.per_input_row:
            output = replace(output, extent=output.extent * rows, per_input_row=False)
        return Step(grant, StepId(grant.first_step_id + k), awaited.port_id, loaded,
                    loaded_ns, output)

    def _free(self, handle: DeviceObjectHandle) -> None:
        with contextlib.suppress(InvalidHandle):
            self._bridge.release(handle)

    def _rows(self, loaded: ObjectLoaded, row_bytes: int) -> int | None:
        """Rows of a loaded object (a batch's after its tag table, padded to whole
        rows); None when its extent is not whole rows, or a batch's is not exactly its
        padded table and one row per table entry."""
        try:
            flags = self._bridge.lookup(loaded.device_handle).flags
            entries, batch = table_entries(flags), batch_rows(flags)
        except (InvalidHandle, TagError):
            entries = batch = None  # the step fails when it runs, naming why
        body = loaded.extent - (0 if entries is None else table_bytes(entries, row_bytes))
        if body < 0 or body % row_bytes:
            return None
        if batch is not None and body // row_bytes != batch:
            return None
        return body // row_bytes

    def _fail(self, step: Step, reason: StepFailure) -> None:
        """A bound step failed: its input, which no node holds, is freed."""
        self._free(step.input.device_handle)
        self._fail_unbound(step.grant, step.step_id, reason)

    def _fail_unbound(self, grant: GrantSteps, step_id: StepId, reason: StepFailure) -> None:
        """Report the failed step; its grant ends (nothing after it may run)."""
        self._emit(StepFailed(grant.role_id, step_id, reason))
        held = self._grants.get(grant.role_id)
        if held is not None and held[0] is grant:
            self.revoke(grant.role_id)

    def _complete(self, active: ActiveStep) -> None:
        step = active.step
        completed = time.monotonic_ns()
        record = StepRecord(step.input.sequence, step.input.object_id, step.input.extent,
                            step.output.object_id, active.output_extent or step.output.extent,
                            step.loaded_ns or active.started_ns, active.started_ns,
                            active.produced_ns or completed, completed)
        self._emit(StepCompleted(step.role_id, step.step_id, record))
        self._bridge.free(active.output)  # written to its ring: the bridge may reuse it
        self._free(step.input.device_handle)  # StepCompleted reports it (module doc)

    def _start(self, step: Step) -> ActiveStep | None:
        """Run the step's role; the step whose output is to be written."""
        started = time.monotonic_ns()
        try:
            step, output = self._run(step)
        except StepRefused as refused:
            log.warning("step %s refused: %s", int(step.step_id), refused)
            self._fail(step, refused.reason)
            return None
        return ActiveStep(step, output, started)

    def _run(self, step: Step) -> tuple[Step, DeviceAllocation]:
        """Run the step's role; the step as run (its output tagged) and its output."""
        role = self._roles.get(step.role_id)
        if role is None:
            raise StepRefused(StepFailure.RoleUnavailable, f"role {int(step.role_id)}")
        try:
            allocation = self._bridge.lookup(step.input.device_handle)
        except InvalidHandle as exc:
            raise StepRefused(StepFailure.InvalidInputHandle, str(exc)) from None
        views = {int(step.port_id): self._bridge.wrap(allocation)}
        if allocation.flags:
            table = self._table(allocation)
            step = replace(step, output=self._tagged(step.output, allocation.flags, table))
        out = step.output
        ring = self._rings.get(out.ring_id)
        if not isinstance(ring, EgressRing) or not ring.idle:
            raise StepRefused(StepFailure.InvalidOutputRing, f"ring {int(out.ring_id)}")
        if ring.refusal(out.extent) is not None:
            raise StepRefused(StepFailure.OutputExtentInvalid, f"ring {int(out.ring_id)}")
        try:
            self._faults.worker_step(int(out.sequence))
            self._flush()  # the node hears what happened so far before the compute
            produced = role.run(views, (out,))
            if set(produced) != {int(out.port_id)}:
                raise StepRefused(StepFailure.OutputExtentInvalid, "output ports differ")
            output = self._bridge.adopt(produced[int(out.port_id)])
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
        if output.extent != out.extent:
            raise StepRefused(
                StepFailure.OutputExtentInvalid,
                f"port {int(out.port_id)}: {output.extent} bytes, binding says {out.extent}",
            )
        return step, output

    def _table(self, allocation: DeviceAllocation) -> tuple[SequenceTag, ...] | None:
        """A batch, prompt batch or mixed step input's tag table, read from the head of
        its object (None when the input has none); checked against the wire's bounds
        (the role checks it against its slots)."""
        try:
            rows = table_entries(allocation.flags)
            if rows is None:
                return None
            if allocation.extent < rows * TAG_WIDTH:
                raise TagError("table", f"a batch of {rows} rows in {allocation.extent} bytes")
            head = bytearray(rows * TAG_WIDTH)
            self._bridge.device_to_host(allocation, 0, memoryview(head))
            words = struct.unpack(f"<{rows}I", head)
            return read_table(allocation.flags, words, MAX_SLOTS)
        except (TagError, DeviceError) as error:
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
