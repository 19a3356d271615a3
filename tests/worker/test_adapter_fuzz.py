"""Hypothesis fuzz of the worker JSON adapter, both ends: no input crashes the node.

- The node end, `decode_worker_line`, is total: arbitrary text, arbitrary JSON and
  event-shaped JSON with random bodies give either a well-typed event or AdapterFailed.
- The worker end, `parse_command`, is total the same way (MalformedCommand).
- A real GpuWorkerCtl runs a stand-in worker process (a tiny Python script) that
  answers InitializeWorker with a valid WorkerReady and then prints a fuzzed line: the
  node process and the actor survive, and the line is either routed or ends in the
  crash path (the process is killed; the crash is reported).

"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swactor.actors import Runtime
from swactor.arena import Arena
from swactor.fsm.generated import gpu_worker_ctl as gwc
from swactor.fsm.generated import worker_process as wp
from swactor.node.worker_ctl import (
    GpuWorkerCtl,
    WorkerCrashed,
    WorkerCtlConfig,
    WorkerReadyNotice,
    WorkerRoutes,
    decode_worker_line,
)
from swactor.ring import WorkerDoorbells
from swactor.testing.examples import example
from swactor.wire import COMMAND_TYPES, EVENT_TYPES, RoleId, StepCompleted, StepId, StepRecord
from swactor.worker.adapter import parse_command
from tests.worker.ctl_rig import Collector

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def shaped(names: list[str]) -> st.SearchStrategy[str]:
    """JSON lines of the adapter's outer shape with a known or random type and any body."""
    return st.builds(
        lambda name, body: json.dumps({"type": name, "body": body}),
        st.sampled_from(names) | st.text(max_size=12),
        json_values,
    )


node_lines = st.text() | st.builds(json.dumps, json_values) | shaped(sorted(EVENT_TYPES))


@settings(max_examples=400, deadline=None)
@given(line=node_lines, truncated=st.booleans())
def test_node_adapter_is_total(line: str, truncated: bool) -> None:
    event = decode_worker_line(line, truncated)
    if not isinstance(event, gwc.AdapterFailed):
        # WorkerReady / WorkerFatal / WorkerStopped, or WorkerEvent carrying the event
        carried = event.event if isinstance(event, gwc.WorkerEvent) else event
        assert type(carried).__name__ in EVENT_TYPES
        assert not truncated


worker_lines = (
    st.binary()
    | st.builds(lambda s: s.encode(), node_lines)
    | st.builds(lambda s: s.encode(), shaped(sorted(COMMAND_TYPES)))
)


@settings(max_examples=400, deadline=None)
@given(line=worker_lines)
def test_worker_adapter_is_total(line: bytes) -> None:
    event = parse_command(line)
    assert type(event).__name__ in {t.__name__ for t in wp.__dict__.values() if isinstance(t, type)}


# A stand-in worker: answer InitializeWorker with WorkerReady, print the fuzzed line
# (JSON-quoted in argv), then wait for stdin to close. Real process, real pipes.
STAND_IN = """
import json, os, sys
init = json.loads(sys.stdin.readline())["body"]
ready = {"pid": os.getpid(), "worker_generation": init["worker_generation"],
         "ring_helper_abi": init["required_ring_helper_abi"], "backend": None}
sys.stdout.write(json.dumps({"type": "WorkerReady", "body": ready}) + "\\n")
sys.stdout.write(json.loads(sys.argv[1]) + "\\n")
sentinel = {"role_id": 0, "step_id": 0}
sys.stdout.write(json.dumps({"type": "StepCompleted", "body": sentinel}) + "\\n")
sys.stdout.flush()
sys.stdin.read()
"""

SENTINEL = StepCompleted(RoleId(0), StepId(0), example(StepRecord))

single_lines = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\n\r"),
    max_size=200,
) | shaped(sorted(EVENT_TYPES)).filter(lambda s: "\n" not in s and "\r" not in s)


async def run_stand_in(line: str, arena: Arena, bells: WorkerDoorbells) -> None:
    boot_q: asyncio.Queue[Any] = asyncio.Queue()
    stage_q: asyncio.Queue[Any] = asyncio.Queue()
    async with Runtime("fuzz") as runtime:
        routes = WorkerRoutes(
            node_boot=runtime.spawn(lambda: Collector(boot_q), "boot"),
            stage_controllers=[runtime.spawn(lambda: Collector(stage_q), "stage")],
        )
        argv = (sys.executable, "-c", STAND_IN, json.dumps(line))
        config = WorkerCtlConfig(arena.fd, arena.size, argv=argv, max_restarts=0, kill_grace_s=0.2)
        ctl = runtime.spawn(lambda: GpuWorkerCtl(config, routes, arena, doorbells=bells), "ctl",
                            mailbox_capacity=64)  # fmt: skip
        ctl.tell(gwc.StartWorker())
        async with asyncio.timeout(30):
            assert isinstance(await boot_q.get(), WorkerReadyNotice)
            event = decode_worker_line(line)
            if isinstance(event, gwc.WorkerEvent):
                # Routed, and the sentinel after it too: the actor kept serving.
                while await stage_q.get() != SENTINEL:
                    pass
            else:
                # Killed, exit reaped: the crash is reported (no restart budget).
                while not isinstance(await stage_q.get(), WorkerCrashed):
                    pass
        assert ctl.alive


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(line=single_lines)
def test_fuzzed_worker_output_never_crashes_the_node(line: str) -> None:
    bells = WorkerDoorbells.create()
    try:
        with Arena.create(1 << 16) as arena:
            asyncio.run(run_stand_in(line, arena, bells))
    finally:
        bells.close()
