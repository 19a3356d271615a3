"""Multi-process loopback (slow): 3 `swactor node` processes + the orchestrator, real
QUIC, rings, workers and SmolLM2.

Two runs on the same nodes. Each must give the greedy tokens of the model package's
single StageRole over all 30 blocks (computed here, in process), end Completed with a
clean teardown, and leave every node idle with no ring lease; across the two runs the
nodes keep the same worker process, no extra child process and no extra fd. The event
logs (one file per process) hold the 22 events of a clean run in a legal order.
"""

from __future__ import annotations

import asyncio
import io
from dataclasses import replace
from pathlib import Path

import pytest

from swactor.cluster.launcher import LocalCluster
from swactor.events.emitter import configure
from swactor.events.names import EventName
from swactor.model.paths import default_model_path
from swactor.model.tokenizer import Tokenizer
from swactor.orchestrator.session import SessionOptions, SessionReport, run_session
from swactor.wire import RunOutcome, TeardownOutcome
from tests import single_stage
from tests.cluster.event_order import check_run_order, read_records

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TOKENS = 6
MAX_SEQ = 64
PROMPT = "hello world"
FAULT_ONLY = {EventName.node_faulted.value, EventName.run_faulted.value}
SPEC_EVENTS = [n.value for n in EventName][:24]
"""Spec §40's events; the ones after them are extensions a single-prompt run never emits
(a serving session's and its sequences')."""


def reference_tokens(path: Path, prompt: tuple[int, ...]) -> list[int]:
    return single_stage.reference_tokens(path, 30, prompt, TOKENS, MAX_SEQ)


async def scenario(tmp: Path) -> None:
    model = default_model_path()
    if not model.is_file():
        pytest.fail(f"{model} missing: run scripts/setup.sh")
    events = tmp / "events"
    cluster = LocalCluster(3, tmp / "keys", events)
    emitter = configure("orchestrator-test", str(events / "orchestrator.jsonl"), verbosity=None)
    try:
        members = await cluster.start()
        base = SessionOptions(identity=cluster.orchestrator, nodes=members, model=model,
                              admission=cluster.admission,  # pins the nodes' full keys
                              prompt=PROMPT, max_tokens=TOKENS, max_seq_len=MAX_SEQ)
        prompt = tuple(Tokenizer.from_gguf(model).encode(PROMPT))
        expected = reference_tokens(model, prompt)
        reports: list[SessionReport] = []
        facts: list[list[tuple[int, list[int]]]] = []
        for run in (1, 2):
            out = io.StringIO()
            report = await run_session(replace(base, run_id=run), emitter, out, io.StringIO())
            reports.append(report)
            result = report.result
            assert result.outcome is RunOutcome.Completed, report.summary_lines()
            assert result.teardown is TeardownOutcome.Clean, report.summary_lines()
            assert list(result.prompt_token_ids) == list(prompt)
            assert result.generated_token_ids == expected, f"run {run}"
            assert out.getvalue().strip() == report.text.strip() != ""
            assert [end - start for start, end in report.layer_ranges] == [10, 10, 10]
            await cluster.wait_reports(run, timeout_s=60)
            for node in cluster.nodes:
                finished = [r for r in node.reports if r["kind"] == "stage_finished"]
                last = finished[-1]
                assert (last["run_id"], last["clean"]) == (run, True), last
                assert last["active_run"] is None and last["live_leases"] == [], last
                assert last["runs_served"] == list(range(1, run + 1))
            facts.append([single_stage.process_facts(node.process.pid) for node in cluster.nodes])
        # the same worker per node served both runs; nothing leaked in between
        for node in cluster.nodes:
            workers = {r["worker_pid"] for r in node.reports if r["kind"] == "stage_finished"}
            assert len(workers) == 1
        for (fds1, kids1), (fds2, kids2) in zip(facts[0], facts[1], strict=True):
            assert kids1 == kids2 and len(kids2) == 1
            assert fds2 <= fds1, (fds1, fds2)
    finally:
        codes = await cluster.stop()
        emitter.close()
    assert codes == [0, 0, 0]

    records = read_records(sorted(events.glob("*.jsonl")))
    names = {r["event"] for r in records}
    assert names == set(SPEC_EVENTS) - FAULT_ONLY
    for run in (1, 2):
        assert check_run_order(records, run) == []


def test_two_runs_on_three_local_nodes_match_one_stage(tmp_path: Path) -> None:
    asyncio.run(scenario(tmp_path))
