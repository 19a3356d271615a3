"""A serving run carries many sequences (fsm/orchestrator_run.yaml Serving states and
fsm/sequence.yaml), driven through fake ports like tests/orchestrator/test_run.py.

Every scenario's events must be an order the tables allow (`run_test` checks them).
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field

from swactor.actors import Runtime
from swactor.fsm.generated import orchestrator_run as orun
from swactor.model.sampling import SamplingPolicy
from swactor.orchestrator.run import (
    RunHandle,
    RunTimeouts,
    Serving,
    SubmitSequence,
    TokenOutput,
    start_run,
)
from swactor.orchestrator.serving import SequenceRequest, pick_candidate
from swactor.wire import (
    Component,
    ObjectId,
    RunFaultReason,
    RunOutcome,
    Sequence,
    StageIndex,
    TeardownOutcome,
)
from swactor.wire.tags import (
    CANDIDATES_K,
    SequenceTag,
    batch_flags,
    mixed_flags,
    prompt_flags,
)
from tests.orchestrator.fake_ports import FakePorts
from tests.orchestrator.test_run import (
    EOS,
    SLOW,
    TOKEN_IN,
    TOKEN_OUT,
    make_plan,
    make_ready,
    run_test,
    stop_all,
)

GREEDY = SamplingPolicy.greedy()


@dataclass
class Sink:
    """What one sequence's stream received."""

    started: int = 0
    ids: list[int] = field(default_factory=list)
    end: tuple[str, str] | None = None

    def started_(self) -> None:
        self.started += 1

    def tokens(self, ids: tuple[int, ...]) -> None:
        assert self.end is None, "no tokens after the end"
        self.ids.extend(ids)

    def finished(self, reason: str, detail: str) -> None:
        assert self.end is None, "one end only"
        self.end = (reason, detail)


class _SinkPort:
    def __init__(self, sink: Sink) -> None:
        self.sink = sink

    def started(self) -> None:
        self.sink.started_()

    def tokens(self, ids: tuple[int, ...]) -> None:
        self.sink.tokens(ids)

    def finished(self, reason: str, detail: str) -> None:
        self.sink.finished(reason, detail)


async def serving(runtime: Runtime, ports: FakePorts, slots: int = 2,
                  timeouts: RunTimeouts = SLOW, max_seq_len: int = 64,
                  max_in_flight: int | None = None, max_batch: int | None = None,
                  mixed: bool = True) -> RunHandle:
    opened = asyncio.Event()
    handle = start_run(runtime, make_plan(max_tokens=1, max_seq_len=max_seq_len), ports,
                       stop_token_ids=frozenset({EOS, 0}), timeouts=timeouts,
                       serving=Serving(slots, opened.set, max_in_flight=max_in_flight,
                                       max_batch=max_batch, mixed=mixed))
    await ports.until(lambda: len(ports.of("provision")) == 3)
    make_ready(handle)
    await asyncio.wait_for(opened.wait(), 5)
    return handle


def submit(handle: RunHandle, sequence_id: int, prompt: tuple[int, ...], max_tokens: int = 8,
           sampling: SamplingPolicy = GREEDY, first_step: int = 0) -> Sink:
    sink = Sink()
    handle.submit(sequence_id, SequenceRequest(prompt, max_tokens, sampling, first_step),
                  _SinkPort(sink))
    return sink


def out(step: int, flags: int, *ids: int) -> TokenOutput:
    return TokenOutput(TOKEN_OUT, ObjectId(step + 1), Sequence(step), ids, flags)


def tag(slot: int, position: int, candidates: bool = False) -> int:
    return SequenceTag(slot, position, candidates).pack()


def injected(ports: FakePorts) -> list[tuple[int, tuple[int, ...], int]]:
    """(edge step, ids, flags) of every injection so far."""
    return [(int(c[2]), c[3], ports.flags[int(c[2])])  # type: ignore[misc,arg-type]
            for c in ports.of("inject")]


def test_two_sequences_interleave_each_routed_by_edge_step() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await serving(runtime, ports)
        await asyncio.sleep(0.01)
        assert ports.of("inject") == [], "a serving run injects nothing at the barrier"
        a = submit(handle, 10, (1, 5, 6), max_tokens=8)
        b = submit(handle, 11, (1, 7), max_tokens=2)
        await ports.until(lambda: len(ports.of("inject")) == 2)
        assert injected(ports) == [(0, (1, 5, 6), tag(0, 0)), (1, (1, 7), tag(1, 0))]
        assert (a.started, b.started) == (1, 1)
        handle.tell(out(0, tag(0, 0), 40))  # a's first token
        await ports.until(lambda: len(ports.of("inject")) == 3)
        assert injected(ports)[2] == (2, (40,), tag(0, 3))
        handle.tell(out(1, tag(1, 0), 50))  # b's first token
        await ports.until(lambda: len(ports.of("inject")) == 4)
        assert injected(ports)[3] == (3, (50,), tag(1, 2))
        handle.tell(out(2, tag(0, 3), 41))
        handle.tell(out(3, tag(1, 2), 51))  # b's second = max_tokens: length
        await ports.until(lambda: b.end is not None and len(ports.of("inject")) == 5)
        assert b.ids == [50, 51] and b.end == ("length", "")
        assert injected(ports)[4] == (4, (41,), tag(0, 4))
        handle.tell(out(4, tag(0, 4), EOS))  # a ends: stop, EOS not yielded
        await ports.until(lambda: a.end is not None)
        assert a.ids == [40, 41] and a.end == ("stop", "")
        c = submit(handle, 12, (1, 9), max_tokens=1)  # a slot is free again
        await ports.until(lambda: len(ports.of("inject")) == 6)
        assert injected(ports)[5] == (5, (1, 9), tag(0, 0)), "the lowest free slot"
        handle.tell(out(5, tag(0, 0), 60))
        await ports.until(lambda: c.end is not None)
        assert c.ids == [60] and c.end == ("length", "")
        handle.stop()
        result = await stop_all(handle, ports)
        assert (result.outcome, result.teardown) == (RunOutcome.OperatorStopped,
                                                     TeardownOutcome.Clean)
        names = ports.event_names()
        assert names.count("sequence_started") == 3
        assert names.count("sequence_first_token") == 3
        assert names.count("sequence_finished") == 3
        assert "sequence_failed" not in names and "prompt_injected" not in names

    run_test(body)


def test_an_output_out_of_edge_order_faults_every_live_sequence() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await serving(runtime, ports)
        a = submit(handle, 1, (1, 5))
        b = submit(handle, 2, (1, 6))
        await ports.until(lambda: len(ports.of("inject")) == 2)
        handle.tell(out(1, tag(1, 0), 40))  # step 0 is awaited
        result = await stop_all(handle, ports)
        assert result.outcome is RunOutcome.Faulted
        assert result.fault is not None
        assert result.fault.reason is RunFaultReason.SequenceViolation
        for sink in (a, b):
            assert sink.end is not None and sink.end[0] == "error"
            assert "SequenceViolation" in sink.end[1]

    run_test(body)


def test_an_output_whose_tag_is_not_the_injected_one_is_a_sequence_violation() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await serving(runtime, ports)
        a = submit(handle, 1, (1, 5))
        await ports.until(lambda: len(ports.of("inject")) == 1)
        handle.tell(out(0, tag(1, 0), 40))  # right step, another slot
        result = await stop_all(handle, ports)
        assert result.fault is not None
        assert result.fault.reason is RunFaultReason.SequenceViolation
        assert a.end is not None and a.end[0] == "error" and a.ids == []

    run_test(body)


def test_cancel_frees_the_slot_at_once_and_the_late_output_is_dropped() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await serving(runtime, ports, slots=1)
        a = submit(handle, 1, (1, 5))
        await ports.until(lambda: len(ports.of("inject")) == 1)
        handle.cancel(1)
        b = submit(handle, 2, (1, 6), max_tokens=1)  # the one slot, freed by the cancel
        await ports.until(lambda: len(ports.of("inject")) == 2)
        assert a.end == ("cancelled", "")
        assert injected(ports)[1] == (1, (1, 6), tag(0, 0))
        handle.tell(out(0, tag(0, 0), 40))  # a's late output: dropped
        handle.tell(out(1, tag(0, 0), 41))
        await ports.until(lambda: b.end is not None)
        assert a.ids == [] and b.ids == [41] and b.end == ("length", "")
        handle.cancel(1)  # ended already: nothing happens
        handle.cancel(99)  # never submitted: nothing happens
        handle.stop()
        result = await stop_all(handle, ports)
        assert result.fault is None and result.teardown is TeardownOutcome.Clean
        assert len(ports.of("inject")) == 2

    run_test(body)


def test_a_sequence_past_the_free_slots_is_refused() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await serving(runtime, ports, slots=1)
        a = submit(handle, 1, (1, 5))
        b = submit(handle, 2, (1, 6))
        await ports.until(lambda: b.end is not None)
        assert b.end is not None and b.end[0] == "error" and "slot" in b.end[1]
        assert a.end is None and len(ports.of("inject")) == 1
        handle.stop()
        await stop_all(handle, ports)
        assert a.end == ("error", "the run was stopped")

    run_test(body)


def test_a_stage_fault_ends_every_live_sequence_naming_it() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await serving(runtime, ports)
        a = submit(handle, 1, (1, 5))
        await ports.until(lambda: len(ports.of("inject")) == 1)
        handle.tell(orun.StageFault(StageIndex(1), RunFaultReason.WorkerCrashed,
                                    Component.WorkerCtl))
        result = await stop_all(handle, ports)
        assert result.fault is not None and result.fault.stage_index == 1
        assert a.end is not None and a.end[0] == "error"
        assert "WorkerCrashed" in a.end[1] and "stage 1" in a.end[1]
        late = submit(handle, 2, (1, 6))  # the actor is gone: nobody answers
        await asyncio.sleep(0.01)
        assert late.end is None

    run_test(body)


def test_a_held_stream_fault_ends_sequences_with_the_root_cause() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await serving(runtime, ports, timeouts=RunTimeouts(30, 30, 30, 30))
        a = submit(handle, 1, (1, 5))
        await ports.until(lambda: len(ports.of("inject")) == 1)
        handle.tell(orun.StageFault(StageIndex(2), RunFaultReason.StreamFault,
                                    Component.RecvPump))
        refused = submit(handle, 2, (1, 6))  # Settling: the run is not serving
        await ports.until(lambda: refused.end is not None)
        assert a.end is None, "the reason is not known yet"
        handle.tell(orun.StageFault(StageIndex(1), RunFaultReason.DeviceOutOfMemory,
                                    Component.Worker))
        await stop_all(handle, ports)
        assert a.end is not None and "DeviceOutOfMemory" in a.end[1]
        assert refused.end is not None and "not serving" in refused.end[1]

    run_test(body)


def test_the_progress_timer_runs_only_while_objects_are_in_flight() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        quick = RunTimeouts(readiness_s=30, step_s=0.05, teardown_s=30, prefill_s=0.05)
        handle = await serving(runtime, ports, timeouts=quick)
        await asyncio.sleep(0.3)  # idle: six step timeouts long, nothing in flight
        a = submit(handle, 1, (1, 5), max_tokens=1)
        await ports.until(lambda: len(ports.of("inject")) == 1)
        handle.tell(out(0, tag(0, 0), 40))
        await ports.until(lambda: a.end is not None)
        assert a.end == ("length", "")
        await asyncio.sleep(0.3)  # idle again
        b = submit(handle, 2, (1, 6))  # in flight, never answered
        result = await stop_all(handle, ports)
        assert result.fault is not None
        assert result.fault.reason is RunFaultReason.ProgressTimeout
        assert b.end is not None and "ProgressTimeout" in b.end[1]

    run_test(body)


def test_a_sampled_sequence_asks_for_candidates_and_samples_them() -> None:
    ids = tuple(range(100, 100 + CANDIDATES_K))
    logits = [float(CANDIDATES_K - i) / 8 for i in range(CANDIDATES_K)]
    bits = struct.unpack(f"<{CANDIDATES_K}I", struct.pack(f"<{CANDIDATES_K}f", *logits))
    policy = SamplingPolicy.sample(temperature=0.9, top_p=0.95, seed=7)

    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await serving(runtime, ports)
        a = submit(handle, 1, (1, 5), max_tokens=2, sampling=policy)
        await ports.until(lambda: len(ports.of("inject")) == 1)
        assert injected(ports)[0][2] == tag(0, 0, candidates=True)
        handle.tell(out(0, tag(0, 0, True), *ids, *bits))
        await ports.until(lambda: len(ports.of("inject")) == 2)
        handle.tell(out(1, tag(0, 2, True), *ids, *bits))
        await ports.until(lambda: a.end is not None)
        expected = [pick_candidate((*ids, *bits), policy, step) for step in (0, 1)]
        assert a.ids == expected and all(t in ids for t in a.ids)
        assert injected(ports)[1][1] == (expected[0],)
        b = submit(handle, 2, (1, 6), sampling=policy)
        await ports.until(lambda: len(ports.of("inject")) == 3)
        handle.tell(out(2, tag(0, 0, True), 42))  # one id where candidates were asked
        result = await stop_all(handle, ports)
        assert result.fault is not None
        assert result.fault.reason is RunFaultReason.ObjectHeaderMalformed
        assert b.end is not None and b.end[0] == "error"

    run_test(body)


def test_a_continuation_samples_from_its_first_step_on() -> None:
    ids = tuple(range(100, 100 + CANDIDATES_K))
    bits = struct.unpack(f"<{CANDIDATES_K}I", struct.pack(
        f"<{CANDIDATES_K}f", *([1.0] * CANDIDATES_K)))
    policy = SamplingPolicy.sample(temperature=1.0, seed=11)
    flat = (*ids, *bits)
    steps = (5, 6)
    assert [pick_candidate(flat, policy, s) for s in steps] != [
        pick_candidate(flat, policy, s) for s in (0, 1)], "the offset changes the draws"

    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await serving(runtime, ports)
        # a sequence that generated 5 tokens on a run that faulted: they end its prompt
        a = submit(handle, 1, (1, 5, 9, 9, 9, 9, 9), max_tokens=2, sampling=policy,
                   first_step=5)
        await ports.until(lambda: len(ports.of("inject")) == 1)
        handle.tell(out(0, tag(0, 0, True), *flat))
        await ports.until(lambda: len(ports.of("inject")) == 2)
        handle.tell(out(1, tag(0, 7, True), *flat))
        await ports.until(lambda: a.end is not None)
        assert a.ids == [pick_candidate(flat, policy, s) for s in steps]
        handle.stop()
        await stop_all(handle, ports)

    run_test(body)


def test_pick_candidate_is_seeded_by_seed_and_step() -> None:
    ids = tuple(range(CANDIDATES_K))
    bits = struct.unpack(f"<{CANDIDATES_K}I", struct.pack(
        f"<{CANDIDATES_K}f", *([1.0] * CANDIDATES_K)))
    flat = (*ids, *bits)
    policy = SamplingPolicy.sample(temperature=1.0, seed=3)
    draws = [pick_candidate(flat, policy, step) for step in range(20)]
    assert draws == [pick_candidate(flat, policy, step) for step in range(20)]
    assert len(set(draws)) > 1, "equal logits: the step changes the draw"
    assert all(d < 40 for d in draws), "top_k 40 (llama.cpp's default) of the 64"


def test_a_single_prompt_run_refuses_sequences() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = start_run(runtime, make_plan(), ports, stop_token_ids=frozenset({EOS}),
                           timeouts=SLOW)
        await ports.until(lambda: len(ports.of("provision")) == 3)
        make_ready(handle)
        await ports.until(lambda: len(ports.of("inject")) == 1)
        s = submit(handle, 1, (1, 5))
        await ports.until(lambda: s.end is not None)
        assert s.end is not None and "not serving" in s.end[1]
        assert ports.flags == {0: 0}, "a spec run's objects are untagged"
        handle.stop()
        await stop_all(handle, ports)
        _ = TOKEN_IN

    run_test(body)


def test_a_serving_plan_lets_token_out_carry_candidates() -> None:
    from swactor.orchestrator.inventory import synthetic_pool
    from swactor.orchestrator.planner import PlanRequest, plan_run
    from swactor.wire import EdgeKind, PromptSource, RunId
    from tests.orchestrator.conftest import synthetic_model

    def token_out_extent(serving: bool, slots: int = 1) -> int:
        request = PlanRequest(run_id=RunId(5), prompt=PromptSource.from_token_ids((1,)),
                              serving=serving, slots=slots)
        plan = plan_run(synthetic_pool(2), synthetic_model(blocks=6), request).plan
        edge = next(e for e in plan.edges if e.kind is EdgeKind.TokenOut)
        return edge.object_spec.max_extent

    assert token_out_extent(False) == 4
    # a batch of every slot's row, each asking for candidates, after its table
    assert token_out_extent(True, slots=1) == (1 + 2 * CANDIDATES_K) * 4
    assert token_out_extent(True, slots=4) == 4 * (1 + 2 * CANDIDATES_K) * 4


def test_a_sequence_ends_when_its_next_position_would_pass_the_context() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await serving(runtime, ports, max_seq_len=8)
        a = submit(handle, 1, (1, 5, 6, 7, 8), max_tokens=100)  # positions 0..4
        for step, position in enumerate((0, 5, 6, 7)):
            await ports.until(lambda step=step: len(ports.of("inject")) == step + 1)
            assert injected(ports)[step][2] == tag(0, position)
            handle.tell(out(step, tag(0, position), 40 + step))
        await ports.until(lambda: a.end is not None)
        assert a.ids == [40, 41, 42, 43] and a.end == ("length", "")
        assert len(ports.of("inject")) == 4, "position 8 is past max_seq_len 8"

    run_test(body)


# -- batched decode: ready decode rows travel as one object ----------------------------

def test_ready_decode_rows_go_as_one_batch_and_each_row_is_routed() -> None:
    ids = tuple(range(100, 100 + CANDIDATES_K))
    bits = struct.unpack(f"<{CANDIDATES_K}I", struct.pack(
        f"<{CANDIDATES_K}f", *(float(CANDIDATES_K - i) for i in range(CANDIDATES_K))))
    policy = SamplingPolicy.sample(temperature=0.8, seed=5)

    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await serving(runtime, ports, slots=3, max_in_flight=1)
        a = submit(handle, 1, (1, 5), max_tokens=3)
        b = submit(handle, 2, (1, 6, 7), max_tokens=2)
        c = submit(handle, 3, (1, 8), max_tokens=3, sampling=policy)
        await ports.until(lambda: len(ports.of("inject")) == 3)  # prompts go at once
        assert [f for _, _, f in injected(ports)] == [tag(0, 0), tag(1, 0), tag(2, 0, True)]
        handle.tell(out(0, tag(0, 0), 40))
        handle.tell(out(1, tag(1, 0), 50))
        await ports.until(lambda: b.ids == [50])
        assert len(ports.of("inject")) == 3, "rows wait while an object is in flight"
        handle.tell(out(2, tag(2, 0, True), *ids, *bits))
        await ports.until(lambda: len(ports.of("inject")) == 4)
        c0 = pick_candidate((*ids, *bits), policy, 0)
        table = (tag(0, 2), tag(1, 3), tag(2, 2, True))
        assert injected(ports)[3] == (3, (*table, 40, 50, c0), batch_flags(3))
        # the last stage answers the table, then each row's answer in table order
        handle.tell(out(3, batch_flags(3), *table, 41, 51, *ids, *bits))
        await ports.until(lambda: len(ports.of("inject")) == 5)
        c1 = pick_candidate((*ids, *bits), policy, 1)
        assert (a.ids, b.ids, c.ids) == ([40, 41], [50, 51], [c0, c1])
        assert b.end == ("length", "")
        table = (tag(0, 3), tag(2, 3, True))  # b ended: two rows left
        assert injected(ports)[4] == (4, (*table, 41, c1), batch_flags(2))
        handle.tell(out(4, batch_flags(2), *table, EOS, *ids, *bits))
        await ports.until(lambda: a.end is not None and c.end is not None)
        assert a.ids == [40, 41] and a.end == ("stop", "")
        assert c.ids == [c0, c1, pick_candidate((*ids, *bits), policy, 2)]
        assert len(ports.of("inject")) == 5
        d = submit(handle, 4, (1, 9), max_tokens=2)  # alone: plain tagged objects
        await ports.until(lambda: len(ports.of("inject")) == 6)
        handle.tell(out(5, tag(0, 0), 60))
        await ports.until(lambda: len(ports.of("inject")) == 7)
        assert injected(ports)[6] == (6, (60,), tag(0, 2))
        handle.tell(out(6, tag(0, 2), 61))
        await ports.until(lambda: d.end is not None)
        handle.stop()
        result = await stop_all(handle, ports)
        assert result.fault is None and result.teardown is TeardownOutcome.Clean

    run_test(body)


def test_a_cancelled_row_leaves_the_batch_and_its_late_answer_is_dropped() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await serving(runtime, ports, slots=3, max_in_flight=1)
        sinks = [submit(handle, i, (1, 5 + i), max_tokens=5) for i in range(3)]
        await ports.until(lambda: len(ports.of("inject")) == 3)
        for step in range(3):
            handle.tell(out(step, tag(step, 0), 40 + step))
        await ports.until(lambda: len(ports.of("inject")) == 4)
        table = (tag(0, 2), tag(1, 2), tag(2, 2))
        assert injected(ports)[3] == (3, (*table, 40, 41, 42), batch_flags(3))
        handle.cancel(1)  # its row is in flight
        await ports.until(lambda: sinks[1].end is not None)
        handle.tell(out(3, batch_flags(3), *table, 50, 51, 52))
        await ports.until(lambda: len(ports.of("inject")) == 5)
        assert sinks[1].ids == [41], "the cancelled row's answer is dropped"
        assert injected(ports)[4][2] == batch_flags(2)
        handle.cancel(0)  # its row is in flight in the batch of two: dropped too
        handle.tell(out(4, batch_flags(2), tag(0, 3), tag(2, 3), 60, 62))
        await ports.until(lambda: len(ports.of("inject")) == 6)
        assert injected(ports)[5] == (5, (62,), tag(2, 4)), "one row left: a plain object"
        assert sinks[0].ids == [40, 50] and sinks[2].ids == [42, 52, 62]
        handle.stop()
        await stop_all(handle, ports)

    run_test(body)


def test_at_most_max_in_flight_objects_and_prompts_go_at_once() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await serving(runtime, ports, slots=4, max_in_flight=2, mixed=False)
        for i in range(3):
            submit(handle, i, (1, 5 + i), max_tokens=9)
        await ports.until(lambda: len(ports.of("inject")) == 3)
        handle.tell(out(0, tag(0, 0), 40))  # 2 prompts still in flight: a's row waits
        await asyncio.sleep(0.02)
        assert len(ports.of("inject")) == 3
        handle.tell(out(1, tag(1, 0), 41))  # one in flight: the two rows go as one
        await ports.until(lambda: len(ports.of("inject")) == 4)
        assert injected(ports)[3][2] == batch_flags(2)
        submit(handle, 3, (1, 9), max_tokens=9)  # a prompt goes though two are in flight
        await ports.until(lambda: len(ports.of("inject")) == 5)
        assert injected(ports)[4] == (4, (1, 9), tag(3, 0))
        handle.stop()
        await stop_all(handle, ports)

    run_test(body)


def test_rows_ready_together_go_as_even_shares_of_the_objects_allowed() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await serving(runtime, ports, slots=4, max_in_flight=2)  # 4 rows/object
        sinks = submit_all(handle, *((i, (1, 5 + i), GREEDY) for i in range(4)))
        await ports.until(lambda: len(ports.of("inject")) == 1)
        table = tuple(tag(i, 2) for i in range(4))
        handle.tell(out(0, prompt_flags(4), *table, 40, 41, 42, 43))
        await ports.until(lambda: len(ports.of("inject")) == 3)  # one turn, two objects
        assert injected(ports)[1:] == [
            (1, (tag(0, 2), tag(1, 2), 40, 41), batch_flags(2)),
            (2, (tag(2, 2), tag(3, 2), 42, 43), batch_flags(2))]
        handle.tell(out(1, batch_flags(2), tag(0, 2), tag(1, 2), 50, 51))
        await ports.until(lambda: len(ports.of("inject")) == 4)
        assert injected(ports)[3] == (3, (tag(0, 3), tag(1, 3), 50, 51), batch_flags(2))
        assert [s.ids for s in sinks] == [[40, 50], [41, 51], [42], [43]]
        handle.stop()
        await stop_all(handle, ports)

    run_test(body)


def test_a_batch_answer_with_another_table_or_a_short_row_faults_the_run() -> None:
    async def body(runtime: Runtime, ports: FakePorts, answer: tuple[int, ...],
                   reason: RunFaultReason) -> None:
        handle = await serving(runtime, ports, slots=2, max_in_flight=1)
        sinks = [submit(handle, i, (1, 5 + i)) for i in range(2)]
        await ports.until(lambda: len(ports.of("inject")) == 2)
        handle.tell(out(0, tag(0, 0), 40))
        handle.tell(out(1, tag(1, 0), 41))
        await ports.until(lambda: len(ports.of("inject")) == 3)
        handle.tell(out(2, batch_flags(2), *answer))
        result = await stop_all(handle, ports)
        assert result.fault is not None and result.fault.reason is reason
        assert all(s.end is not None and s.end[0] == "error" for s in sinks)

    cases = [
        ((tag(1, 2), tag(0, 2), 50, 51), RunFaultReason.SequenceViolation),  # rows swapped
        ((tag(0, 2), tag(1, 2), 50), RunFaultReason.ObjectHeaderMalformed),  # one short
        ((tag(0, 2), tag(1, 2), 50, 51, 52), RunFaultReason.ObjectHeaderMalformed),
        ((tag(0, 2), tag(0, 2), 50, 51), RunFaultReason.ObjectHeaderMalformed),  # bad table
    ]
    for answer, reason in cases:
        run_test(lambda runtime, ports, answer=answer, reason=reason:  # type: ignore[misc]
                 body(runtime, ports, answer, reason))


def test_batch_rows_1_writes_every_decode_step_at_once() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await serving(runtime, ports, slots=4, max_batch=1)  # 3 stages
        for i in range(4):
            submit(handle, i, (1, 5 + i), max_tokens=9)
        await ports.until(lambda: len(ports.of("inject")) == 4)
        for step in range(4):  # 4 objects in flight: each row goes alone, at once
            handle.tell(out(step, tag(step, 0), 40 + step))
            await ports.until(lambda step=step: len(ports.of("inject")) == 5 + step)
        assert [f for _, _, f in injected(ports)[4:]] == [tag(i, 2) for i in range(4)]
        handle.stop()
        await stop_all(handle, ports)

    run_test(body)


def test_by_default_each_stage_and_the_orchestrators_hop_hold_an_object() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await serving(runtime, ports, slots=6)  # 3 stages: 4 objects in flight
        for i in range(5):
            submit(handle, i, (1, 5 + i), max_tokens=9)
        await ports.until(lambda: len(ports.of("inject")) == 5)
        handle.tell(out(0, tag(0, 0), 40))  # 4 prompts still in flight: the row waits
        await asyncio.sleep(0.02)
        assert len(ports.of("inject")) == 5
        handle.tell(out(1, tag(1, 0), 41))  # 3 in flight: room for the fourth object
        await ports.until(lambda: len(ports.of("inject")) == 6)
        table = (tag(0, 2), tag(1, 2))
        assert injected(ports)[5] == (5, (*table, 40, 41), batch_flags(2))
        handle.stop()
        await stop_all(handle, ports)

    run_test(body)


def test_each_output_says_its_decode_rows_and_the_objects_in_flight_with_it() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await serving(runtime, ports, slots=3, max_in_flight=1)
        for i in range(3):
            submit(handle, i, (1, 5 + i), max_tokens=3)
        await ports.until(lambda: len(ports.of("inject")) == 3)
        for step in range(3):
            handle.tell(out(step, tag(step, 0), 40 + step))
        await ports.until(lambda: len(ports.of("inject")) == 4)
        table = (tag(0, 2), tag(1, 2), tag(2, 2))
        handle.tell(out(3, batch_flags(3), *table, 50, 51, 52))
        await ports.until(lambda: len(ports.of("inject")) == 5)
        handle.stop()
        await stop_all(handle, ports)
        received = [e.event.detail for e in ports.sink.events
                    if e.event.NAME.value == "token_received"]
        assert [(d["rows"], d["in_flight"]) for d in received] == [
            (0, 3), (0, 2), (0, 1), (3, 1)]


# -- prompts submitted together travel as prompt batches -------------------------------

def submit_all(handle: RunHandle, *requests: tuple[int, tuple[int, ...], SamplingPolicy]
               ) -> list[Sink]:
    sinks = [Sink() for _ in requests]
    handle.submit_all(tuple(
        SubmitSequence(sequence_id, SequenceRequest(prompt, 3, sampling), _SinkPort(sink))
        for (sequence_id, prompt, sampling), sink in zip(requests, sinks, strict=True)))
    return sinks


def test_sequences_submitted_together_go_as_one_prompt_batch_each_routed() -> None:
    ids = tuple(range(100, 100 + CANDIDATES_K))
    bits = struct.unpack(f"<{CANDIDATES_K}I", struct.pack(
        f"<{CANDIDATES_K}f", *(float(CANDIDATES_K - i) for i in range(CANDIDATES_K))))
    policy = SamplingPolicy.sample(temperature=0.8, seed=5)

    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await serving(runtime, ports, slots=4, mixed=False)
        a, b, c = submit_all(handle, (1, (1, 5, 6), GREEDY), (2, (1, 7), GREEDY),
                             (3, (1, 8, 9, 9), policy))
        await ports.until(lambda: len(ports.of("inject")) == 1)
        # one object: a table of (slot, row count) per prompt, then every prompt's ids
        table = (tag(0, 3), tag(1, 2), tag(2, 4, True))
        assert injected(ports) == [(0, (*table, 1, 5, 6, 1, 7, 1, 8, 9, 9), prompt_flags(3))]
        assert (a.started, b.started, c.started) == (1, 1, 1)
        # the answer repeats the table, then each prompt's answer in table order
        handle.tell(out(0, prompt_flags(3), *table, 40, 50, *ids, *bits))
        await ports.until(lambda: len(ports.of("inject")) == 4)
        c0 = pick_candidate((*ids, *bits), policy, 0)
        assert (a.ids, b.ids, c.ids) == ([40], [50], [c0])
        # three rows, three stages: one object each, at its next position, in one turn
        assert injected(ports)[1:] == [(1, (40,), tag(0, 3)), (2, (50,), tag(1, 2)),
                                       (3, (c0,), tag(2, 4, True))]
        d = submit(handle, 4, (1, 3))  # alone: a plain tagged prompt, at once
        await ports.until(lambda: len(ports.of("inject")) == 5)
        assert injected(ports)[4] == (4, (1, 3), tag(3, 0))
        assert d.started == 1
        handle.stop()
        result = await stop_all(handle, ports)
        assert result.fault is None and result.teardown is TeardownOutcome.Clean
        names = ports.event_names()
        assert names.count("sequence_started") == 4
        assert names.count("sequence_first_token") == 3

    run_test(body)


async def _two_decoding(handle: RunHandle, ports: FakePorts) -> tuple[Sink, Sink]:
    """Sequences 1 and 2 (slots 0 and 1) prefilled as one prompt batch, their first
    decode rows in flight as one batch object (edge step 1)."""
    a, b = submit_all(handle, (1, (1, 5), GREEDY), (2, (1, 6), GREEDY))
    await ports.until(lambda: len(ports.of("inject")) == 1)
    handle.tell(out(0, prompt_flags(2), tag(0, 2), tag(1, 2), 40, 50))
    await ports.until(lambda: len(ports.of("inject")) == 2)
    return a, b


def test_a_lone_prompt_rides_with_the_rows_in_flight_as_one_mixed_step() -> None:
    """Mixed steps (fsm/orchestrator_run.yaml, prompt_rides): a prompt submitted while a
    decode object is in flight waits for its rows, then goes with them as one object;
    the answer routes the prompt's first token and each row's to their sequences."""
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await serving(runtime, ports, slots=4, max_in_flight=1)
        a, b = await _two_decoding(handle, ports)
        assert injected(ports)[1] == (1, (tag(0, 2), tag(1, 2), 40, 50), batch_flags(2))
        c = submit(handle, 3, (1, 7, 8))  # a decode object is in flight: held
        await asyncio.sleep(0.02)
        assert len(ports.of("inject")) == 2 and c.started == 1
        handle.tell(out(1, batch_flags(2), tag(0, 2), tag(1, 2), 41, 51))
        await ports.until(lambda: len(ports.of("inject")) == 3)
        table = (tag(2, 3), tag(0, 3), tag(1, 3))
        assert injected(ports)[2] == (2, (*table, 1, 7, 8, 41, 51), mixed_flags(3))
        handle.tell(out(2, mixed_flags(3), *table, 60, 42, 52))
        await ports.until(lambda: len(ports.of("inject")) == 4)
        # a and b reached their 3 tokens; c's first decode row goes on alone
        assert (a.ids, b.ids, c.ids) == ([40, 41, 42], [50, 51, 52], [60])
        assert injected(ports)[3] == (3, (60,), tag(2, 3))
        handle.stop()
        result = await stop_all(handle, ports)
        assert result.fault is None and result.mixed_steps == 1
        assert ports.event_names().count("sequence_first_token") == 3

    run_test(body)


def test_a_held_prompt_rides_only_with_the_rows_of_live_sequences() -> None:
    """A sequence cancelled while its row is in flight leaves no row behind: the held
    prompt rides with the other sequence's row alone, and the cancelled row's output is
    dropped."""
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await serving(runtime, ports, slots=4, max_in_flight=1)
        a, b = await _two_decoding(handle, ports)
        c = submit(handle, 3, (1, 7, 8))  # a decode object is in flight: held
        handle.cancel(2)  # b's row is in flight
        await asyncio.sleep(0.02)
        assert len(ports.of("inject")) == 2 and b.end == ("cancelled", "")
        handle.tell(out(1, batch_flags(2), tag(0, 2), tag(1, 2), 41, 51))
        await ports.until(lambda: len(ports.of("inject")) == 3)
        table = (tag(2, 3), tag(0, 3))  # c's prompt (slot 2, 3 rows), then a's row alone
        assert injected(ports)[2] == (2, (*table, 1, 7, 8, 41), mixed_flags(2))
        handle.tell(out(2, mixed_flags(2), *table, 60, 42))
        await ports.until(lambda: len(ports.of("inject")) == 4)
        assert (a.ids, b.ids, c.ids) == ([40, 41, 42], [50], [60])
        handle.stop()
        result = await stop_all(handle, ports)
        assert result.fault is None and result.mixed_steps == 1

    run_test(body)


def test_a_held_prompt_goes_alone_when_no_rows_come_back_for_it() -> None:
    """The rows in flight were their sequences' last: no decode object is left to take
    the held prompt (prompt_stranded), so it goes alone."""
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await serving(runtime, ports, slots=4, max_in_flight=1)
        a = submit(handle, 1, (1, 5), max_tokens=2)
        await ports.until(lambda: len(ports.of("inject")) == 1)
        handle.tell(out(0, tag(0, 0), 40))
        await ports.until(lambda: len(ports.of("inject")) == 2)
        c = submit(handle, 3, (1, 7, 8))  # held behind a's last decode row
        await asyncio.sleep(0.02)
        assert len(ports.of("inject")) == 2
        handle.tell(out(1, tag(0, 2), 41))  # a's second token: a ends
        await ports.until(lambda: len(ports.of("inject")) == 3)
        assert a.ids == [40, 41]
        assert injected(ports)[2] == (2, (1, 7, 8), tag(1, 0))
        assert c.started == 1
        handle.stop()
        result = await stop_all(handle, ports)
        assert result.fault is None and result.mixed_steps == 0

    run_test(body)


def test_a_prompt_batch_holds_at_most_max_prompts_and_what_its_edges_hold() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await serving(runtime, ports, slots=6, max_seq_len=16)
        submit_all(handle, *((i, (1, 2, 3), GREEDY) for i in range(6)))
        await ports.until(lambda: len(ports.of("inject")) == 2)
        first, second = injected(ports)
        assert first[2] == prompt_flags(4) and len(first[1]) == 4 + 12
        assert second == (1, (*(tag(4, 3), tag(5, 3)), 1, 2, 3, 1, 2, 3), prompt_flags(2))
        handle.stop()
        await stop_all(handle, ports)

    async def fits(runtime: Runtime, ports: FakePorts) -> None:
        # 16 rows at most: 6 + 6 ids and 2 table entries fit, a third prompt does not
        handle = await serving(runtime, ports, slots=3, max_seq_len=16)
        submit_all(handle, *((i, (1,) * 6, GREEDY) for i in range(3)))
        await ports.until(lambda: len(ports.of("inject")) == 2)
        first, second = injected(ports)
        assert first[2] == prompt_flags(2) and len(first[1]) == 2 + 12
        assert second == (1, (1,) * 6, tag(2, 0)), "one prompt left: a plain object"
        handle.stop()
        await stop_all(handle, ports)

    run_test(body)
    run_test(fits)


def test_a_prompt_batch_answer_with_another_table_faults_the_run() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await serving(runtime, ports, slots=2)
        sinks = submit_all(handle, (1, (1, 5), GREEDY), (2, (1, 6, 7), GREEDY))
        await ports.until(lambda: len(ports.of("inject")) == 1)
        handle.tell(out(0, prompt_flags(2), tag(1, 3), tag(0, 2), 50, 51))  # swapped
        result = await stop_all(handle, ports)
        assert result.fault is not None
        assert result.fault.reason is RunFaultReason.SequenceViolation
        assert all(s.end is not None and s.end[0] == "error" for s in sinks)

    run_test(body)


def test_a_prompt_may_outlast_the_step_timeout_up_to_the_prefill_timeout() -> None:
    # a prompt of a new length builds its prefill kernels first: the run waits for it
    # (ExtendPrefillWait re-arms the progress timer) and serves on when it comes
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        patient = RunTimeouts(readiness_s=30, step_s=0.05, teardown_s=30, prefill_s=30)
        handle = await serving(runtime, ports, timeouts=patient)
        a = submit(handle, 1, (1, 5), max_tokens=2)
        await ports.until(lambda: len(ports.of("inject")) == 1)
        await asyncio.sleep(0.3)  # six step timeouts long
        handle.tell(out(0, tag(0, 0), 40))
        await ports.until(lambda: len(ports.of("inject")) == 2)
        handle.tell(out(1, tag(0, 2), 41))
        await ports.until(lambda: a.end is not None)
        assert (a.ids, a.end) == ([40, 41], ("length", ""))
        handle.stop()
        result = await stop_all(handle, ports)
        assert result.outcome is RunOutcome.OperatorStopped and result.fault is None

    run_test(body)


def test_a_decode_step_gets_only_the_step_timeout() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        patient = RunTimeouts(readiness_s=30, step_s=0.05, teardown_s=30, prefill_s=30)
        handle = await serving(runtime, ports, timeouts=patient)
        a = submit(handle, 1, (1, 5), max_tokens=4)
        await ports.until(lambda: len(ports.of("inject")) == 1)
        handle.tell(out(0, tag(0, 0), 40))  # the decode row goes in and never comes back
        result = await stop_all(handle, ports)
        assert result.fault is not None
        assert result.fault.reason is RunFaultReason.ProgressTimeout
        assert a.end is not None and "ProgressTimeout" in a.end[1]

    run_test(body)


def test_a_prompt_batch_behind_a_decode_row_gets_the_prefill_timeout_once_awaited() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        patient = RunTimeouts(readiness_s=30, step_s=0.05, teardown_s=30, prefill_s=30)
        handle = await serving(runtime, ports, slots=3, timeouts=patient)
        a = submit(handle, 1, (1, 5), max_tokens=4)
        await ports.until(lambda: len(ports.of("inject")) == 1)
        handle.tell(out(0, tag(0, 0), 40))
        await ports.until(lambda: len(ports.of("inject")) == 2)  # a's decode row
        handle.submit_all((SubmitSequence(2, SequenceRequest((1, 6), 2, GREEDY, 0),
                                          _SinkPort(Sink())),
                           SubmitSequence(3, SequenceRequest((1, 7), 2, GREEDY, 0),
                                          _SinkPort(Sink()))))
        await ports.until(lambda: len(ports.of("inject")) == 3)  # the prompt batch
        assert injected(ports)[2][2] == prompt_flags(2)
        handle.tell(out(1, tag(0, 2), 41))  # a's row: the prompt batch is awaited now
        await asyncio.sleep(0.3)
        assert a.ids == [40, 41] and a.end is None, "still serving after six timeouts"
        handle.stop()
        result = await stop_all(handle, ports)
        assert result.fault is None and result.outcome is RunOutcome.OperatorStopped

    run_test(body)
