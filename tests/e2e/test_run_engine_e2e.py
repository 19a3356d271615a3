"""RunEngine over real nodes: one warm serving run carries many sequences at once.

Real: `swactor node` processes (LocalCluster), QUIC with TLS, memfd rings, worker
subprocesses, tinygrad on SmolLM2, and the orchestrator's serving run (tables
fsm/orchestrator_run.yaml Serving states and fsm/sequence.yaml). For a 1-stage and a
3-stage pipeline: four sequences with different prompts submitted together each give
exactly the greedy tokens of their prompt run alone (one StageRole over the whole
model), with each decode step its own object or (3 stages too) decode rows of several
sequences in batch objects, whose tag tables cross every activation edge padded to
whole rows; two equal sampled requests (candidates sampled by the orchestrator) give equal
tokens; with every slot busy, a sequence cancelled mid-stream frees its slot and the
next one completes; stop() tears down Clean with no token ring left leased, and every
process's events are an order the tables allow.
"""

from __future__ import annotations

import asyncio
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from swactor.cluster.launcher import LocalCluster
from swactor.events.emitter import configure
from swactor.model.gguf_range import open_reader
from swactor.model.llama_role import StageRole
from swactor.model.paths import default_model_path
from swactor.model.tokenizer import Tokenizer
from swactor.orchestrator.model_info import model_info_from_gguf
from swactor.orchestrator.session import SessionOptions
from swactor.serve.engine import Finished, FinishReason, SamplingParams, Started, Tokens
from swactor.serve.pipeline import RunEngine, RunStream
from swactor.wire import RunOutcome, TeardownOutcome
from tests.trace_check import assert_tables_allow, read_events

pytestmark = [pytest.mark.slow, pytest.mark.soak, pytest.mark.timeout(1500)]

MAX_SEQ = 64
TOKENS = 8
SLOTS = 4
PROMPTS = ("The capital of France is", "Water boils at", "One, two, three,",
           "My favourite colour is")


async def collect(stream: RunStream) -> tuple[list[int], Finished]:
    ids: list[int] = []
    async for event in stream:
        if isinstance(event, Tokens):
            ids.extend(event.ids)
        elif isinstance(event, Finished):
            return ids, event
        else:
            assert isinstance(event, Started)
    raise AssertionError("the stream ended without Finished")


@cache
def alone(model: Path, prompts: tuple[tuple[int, ...], ...], stops: frozenset[int]
          ) -> list[list[int]]:
    """Each prompt's greedy tokens run alone (one StageRole over the whole model, each
    prompt from position 0), up to (not with) an end-of-generation id; computed once for
    both pipelines."""
    whole = StageRole(open_reader(model).load_stage(0, 30, is_first=True, is_last=True),
                      max_seq_len=MAX_SEQ)
    out: list[list[int]] = []
    for prompt in prompts:
        tokens: list[int] = []
        ids = list(prompt)
        for step in range(TOKENS):
            token = int(whole.step(step, np.array(ids, dtype=np.int32))[0])
            if token in stops:
                break
            tokens.append(token)
            ids = [token]
        out.append(tokens)
    return out


async def scenario(tmp: Path, stages: int, batch_rows: int, in_flight: int | None) -> None:
    model = default_model_path()
    if not model.is_file():
        pytest.fail(f"{model} missing: run scripts/setup.sh")
    tokenizer = Tokenizer.from_gguf(model)
    prompts = tuple(tuple(tokenizer.encode(text)) for text in PROMPTS)
    stops = model_info_from_gguf(model, with_stop_ids=True).stop_token_ids
    # before any node or QUIC endpoint exists: this blocks the event loop for a while
    references = alone(model, prompts, stops)
    events = tmp / "events"
    cluster = LocalCluster(stages, tmp / "keys", events)
    emitter = configure("orchestrator-test", str(events / "orchestrator.jsonl"), verbosity=None)
    try:
        members = await cluster.start()
        options = SessionOptions(identity=cluster.orchestrator, nodes=members, model=model,
                                 max_seq_len=MAX_SEQ, admission=cluster.admission)
        engine = await RunEngine.start(options, slots=SLOTS, batch_rows=batch_rows,
                                       objects_in_flight=in_flight, emitter=emitter)
        assert engine.slots == SLOTS and engine.context_length == MAX_SEQ
        greedy = SamplingParams(max_tokens=TOKENS)

        # four sequences at once, each equal to its prompt run alone
        streams = [engine.submit(prompt, greedy) for prompt in prompts]
        results = await asyncio.wait_for(asyncio.gather(*map(collect, streams)), 600)
        for prompt, expected, (ids, end) in zip(prompts, references, results, strict=True):
            assert ids == expected, (prompt, ids, expected, end)
            assert end.reason is (FinishReason.LENGTH if len(ids) == TOKENS
                                  else FinishReason.STOP), end

        # sampled (the last stage answers candidates): equal requests give equal output
        sampled = SamplingParams(max_tokens=TOKENS, temperature=0.8, top_p=0.95, seed=11)
        twins = [engine.submit(prompts[2], sampled) for _ in range(2)]
        (one, end_one), (two, end_two) = await asyncio.wait_for(
            asyncio.gather(*map(collect, twins)), 600)
        assert one == two and end_one == end_two and end_one.reason is not FinishReason.ERROR

        # every slot busy; a cancel mid-stream frees one and the next sequence completes
        long = SamplingParams(max_tokens=MAX_SEQ - max(map(len, prompts)))
        busy = [engine.submit(prompt, long) for prompt in prompts]
        first = busy[0].__aiter__()
        assert isinstance(await asyncio.wait_for(first.__anext__(), 300), Started)
        assert isinstance(await asyncio.wait_for(first.__anext__(), 300), Tokens)
        engine.cancel(busy[0].sequence_id)
        rest = [event async for event in first]
        assert rest[-1] == Finished(FinishReason.CANCELLED), rest
        after = engine.submit(prompts[1], greedy)
        ids, end = await asyncio.wait_for(collect(after), 600)
        assert end.reason is not FinishReason.ERROR, end
        assert ids == references[1]
        for stream in busy[1:]:
            engine.cancel(stream.sequence_id)

        result = await asyncio.wait_for(engine.stop(), 120)
        assert result.outcome is RunOutcome.OperatorStopped, result
        assert result.teardown is TeardownOutcome.Clean, result
        assert not engine.failed.is_set()
        # batches did travel (four sequences decoding at once), or none with 1 row
        assert (result.batched_rows > 0) is (batch_rows > 1), result.batched_rows
        await cluster.wait_reports(1, timeout_s=60)
        for node in cluster.nodes:
            last = [r for r in node.reports if r["kind"] == "stage_finished"][-1]
            assert last["clean"] and last["live_leases"] == [], last
    finally:
        codes = await cluster.stop()
        emitter.close()
    assert codes == [0] * stages
    assert_tables_allow(read_events(*sorted(events.glob("*.jsonl"))))


# Four sequences fill the default in-flight cap of 3 stages (4) one row per object, so
# that case caps it at 2 for its rows to travel in batches across the activation edges.
@pytest.mark.parametrize(("stages", "batch_rows", "in_flight"),
                         [(1, SLOTS, None), (3, 1, None), (3, SLOTS, 2)])
def test_a_warm_run_serves_concurrent_sequences_equal_to_each_alone(
        tmp_path: Path, stages: int, batch_rows: int, in_flight: int | None) -> None:
    asyncio.run(scenario(tmp_path, stages, batch_rows, in_flight))
