"""A stage node killed mid-run (kill -9) ends the run Faulted, reason MembershipLost.

Three real `swactor node` processes on loopback, joined to SWIM through the test's own
orchestrator participant (`swactor.testing.swim_pool.SwimPool`, as `swactor run`), run
the tiny GGUF of the fault matrix. Stage 2's worker is made to stall on step 2
(`worker.step` delay), so the run is still in flight, with the first two tokens
received, when the node holding stage 1 is sent SIGKILL. A killed process sends
nothing: no QUIC close, no fault report. Only SWIM can tell (its probes go unanswered),
and it must before the 30 s QUIC idle timeout would make stage 0 report its edge's
StreamFault instead: the run must end Faulted with exactly one reason, MembershipLost
from membership, keep the tokens received so far (the model's own), and the two
surviving nodes must end their stage holding no lease. Every event of the orchestrator
and the survivors must be an order the protocol tables allow (`swactor check`; the
killed node's log stops mid-run by construction and is left out). How fast SWIM tells
is measured by `just bench recovery`, not asserted here.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from swactor.events.schema import TokenReceived
from swactor.faults import arm
from swactor.orchestrator.run import RunTimeouts
from swactor.testing.swim_pool import SwimPool
from swactor.wire import RunOutcome
from tests.faults.rig import MAX_SEQ, PROMPT, TINY, reference_tokens
from tests.model.tiny_gguf import write_tiny_gguf
from tests.trace_check import assert_tables_allow, read_events

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

TOKENS = 12
STALL_S = 10.0
"""Stage 2's stall on step 2: the run cannot end on its own while the kill is seen."""
RUN_ID = 41
TOKENS_BEFORE_KILL = 2  # steps 0 and 1; step 2 stalls at stage 2


async def _wait(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} after {timeout_s:.0f}s"
        await asyncio.sleep(0.05)


def test_a_killed_stage_node_faults_the_run_with_membership_lost(tmp_path: Path) -> None:
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", TINY)
    expected = reference_tokens(gguf, TOKENS)
    root = tmp_path / "pool"

    async def main() -> tuple[Any, list[dict[str, Any]], int]:
        async with SwimPool(root, 3, arena_ceiling="32MiB") as pool:
            arm(pool.fault_file, {"point": "worker.step", "sequence": 2, "mode": "delay",
                                  "delay_s": STALL_S, "node": int(pool.members[2].node_id)})
            options = replace(pool.options(gguf), prompt_token_ids=PROMPT, decode=False,
                              max_tokens=TOKENS, max_seq_len=MAX_SEQ, run_id=RUN_ID,
                              timeouts=RunTimeouts(readiness_s=180.0, step_s=180.0,
                                                   teardown_s=60.0))
            session = pool.session(options)
            await _wait(lambda: session.done() or sum(
                isinstance(e.event, TokenReceived) for e in pool.events.events)
                >= TOKENS_BEFORE_KILL, 240.0, f"{TOKENS_BEFORE_KILL} tokens")
            assert not session.done(), session.result().result
            victim = pool.node_pid(1)
            os.kill(victim, signal.SIGKILL)
            report = await asyncio.wait_for(session, 120.0)
            survivors = [n for n in pool.cluster.nodes if n.process.pid != victim]
            await _wait(lambda: all(any(r.get("kind") == "stage_finished"
                                        and r.get("run_id") == RUN_ID for r in n.reports)
                                    for n in survivors), 60.0, "stage_finished")
            finished = [r for n in survivors for r in n.reports
                        if r.get("kind") == "stage_finished" and r.get("run_id") == RUN_ID]
            return report, finished, next(n.index for n in pool.cluster.nodes
                                          if n.process.pid == victim)

    report, finished, killed = asyncio.run(main())
    result = report.result
    assert result.outcome is RunOutcome.Faulted, result
    assert result.fault is not None
    assert (result.fault.reason.value, result.fault.component.value) == (
        "MembershipLost", "membership"), result.fault
    tokens = list(result.generated_token_ids)
    assert TOKENS_BEFORE_KILL <= len(tokens) < TOKENS, tokens
    assert tokens == expected[:len(tokens)]
    assert len(finished) == 2, finished
    for document in finished:
        assert document["active_run"] is None and document["live_leases"] == [], document
    logs = [root / "orchestrator.jsonl",
            *(path for path in sorted((root / "events").glob("node-*.jsonl"))
              if path.name != f"node-{killed}.jsonl")]
    events = read_events(*logs, run_id=RUN_ID)
    assert sum(e.name.value == "run_faulted" for e in events) == 1
    assert_tables_allow(events)
