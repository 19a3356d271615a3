"""One 3-node loopback cluster shared by the fault cases, and the checks each case makes.

Theory of operation. `FaultRig` owns a persistent event loop (driven from the main
thread with `run_until_complete`, so the session's SIGINT handler works), a random
tiny GGUF (3 blocks, no tokenizer: token ids only), and a `LocalCluster` of three real
`swactor node` processes whose environment names the fault file
(`SWACTOR_FAULT_INJECT`, see `swactor.faults`). A case arms entries in that file, runs
one orchestrator session in this process, disarms, and then proves, from the lifecycle
event files and the nodes' own leak reports, what the issue asks of every fault:

- exactly one terminal outcome (`run_completed` xor `run_faulted` xor
  OperatorStopped in `run_torn_down`), and the first fault's reason and component;
- `run_torn_down` emitted with a teardown outcome;
- every node, asked by SIGUSR1 (`{"kind": "status"}` line), holds no ring lease and no
  active run (its EdgeKeeper's lease table), within `STATUS_WAIT_S` of the run's end;
- no orphan: each node process has exactly one live child (its worker) and every worker
  pid seen so far is either that child or gone (not a zombie, not re-parented);
- the surviving nodes accept the next run: a clean run right after gives the model's
  tokens, Completed, teardown Clean; when it does not, the row's notes carry the log
  lines each node wrote during the faulted run and the next one (`LOG_LINES_KEPT`);
- every process's events of every run (the faulted one and the clean one after it) are
  an order the protocol tables allow, seen to the end (`swactor check`, through
  `tests.trace_check`): a binding that drifts from its table fails the case.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from swactor.cluster.launcher import LocalCluster
from swactor.events.emitter import Emitter, configure
from swactor.events.schema import Emitted, RunFaulted, RunTornDown
from swactor.events.wait import JsonlFollower, wait_for_event
from swactor.faults import ENV_FILE, arm
from swactor.orchestrator.run import RunTimeouts
from swactor.orchestrator.session import (
    PoolMember,
    SessionError,
    SessionOptions,
    SessionReport,
    run_session,
)
from tests import single_stage
from tests.model.tiny_gguf import TinyConfig, write_tiny_gguf
from tests.trace_check import assert_tables_allow

T = TypeVar("T")

TINY = TinyConfig(blocks=3, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=64, context=32,
                  seed=11)
PROMPT = (3, 17, 42, 9)
TOKENS = 4
MAX_SEQ = 24
TIMEOUTS = RunTimeouts(readiness_s=30.0, step_s=30.0, teardown_s=20.0)
WARM_UP = RunTimeouts(readiness_s=180.0, step_s=180.0, teardown_s=30.0)
REPORT_WAIT_S = 30.0
STATUS_WAIT_S = 15.0
LOG_LINES_KEPT = 12
"""Per node, how many of its latest log lines a refused next run's notes carry."""


@dataclass
class FaultRow:
    """One fault case as the README table shows it."""

    source: str
    injected: str
    outcome: str = "?"
    reason: str = "-"
    component: str = "-"
    teardown: str = "-"
    torn_down: bool = False
    leases_left: int = -1
    orphans: int = -1
    next_run_ok: bool = False
    notes: list[str] = field(default_factory=list)


@dataclass
class Observed:
    """What one session left: its report (or the SessionError) and its events."""

    run_id: int
    report: SessionReport | None
    error: str | None
    events: list[Emitted]
    finished: dict[int, dict[str, Any]]
    """node index -> that node's stage_finished report for this run."""
    trace: list[str] = field(default_factory=list)
    """One verdict line per process whose events the tables do not allow (none: fine)."""
    logs: list[list[str]] = field(default_factory=list)
    """Each node's `stderr_tail` when the session began (see `FaultRig.node_logs`)."""

    def names(self) -> list[str]:
        return [e.name.value for e in self.events]

    def faults(self) -> list[RunFaulted]:
        return [e.event for e in self.events if isinstance(e.event, RunFaulted)]

    def torn_down(self) -> list[RunTornDown]:
        return [e.event for e in self.events if isinstance(e.event, RunTornDown)]


def trace_problems(events: list[Emitted]) -> list[str]:
    """The verdict lines of the processes whose events of a run the tables do not allow,
    or that did not reach their end (`tests.trace_check`)."""
    if not events:
        return []  # no run: nothing to replay
    try:
        assert_tables_allow(events)
    except AssertionError as failure:
        return str(failure).splitlines()[1:] or [str(failure)]
    return []


def reference_tokens(gguf: Path, count: int = TOKENS) -> list[int]:
    return single_stage.reference_tokens(gguf, TINY.blocks, PROMPT, count, MAX_SEQ)


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as handle:
            found += [int(c) for c in handle.read().split()]
    return sorted(found)


def process_state(pid: int) -> str | None:
    """The /proc state letter of `pid` (None: gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(") ", 1)[1][:1]
    except (OSError, IndexError):
        return None


class FaultRig:
    """The shared cluster, the fault file and the per-case checks (module doc)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.loop = asyncio.new_event_loop()
        self.fault_file = tmp / "faults.json"
        arm(self.fault_file)
        self.events_dir = tmp / "events"
        self.events_dir.mkdir(parents=True, exist_ok=True)
        self.gguf = write_tiny_gguf(tmp / "tiny.gguf", TINY)
        self.expected = reference_tokens(self.gguf)
        self.cluster = LocalCluster(3, tmp / "keys", self.events_dir, arena_ceiling="32MiB",
                                    extra_env={ENV_FILE: str(self.fault_file)})
        self.emitter: Emitter = configure("orchestrator-faults",
                                          str(self.events_dir / "orchestrator.jsonl"),
                                          verbosity=None)
        self.members: tuple[PoolMember, ...] = ()
        self.worker_pids: set[int] = set()
        self.held: set[tuple[int, int, int]] = set()
        """(node, edge, ring) leases already held when the current case began: a lease
        a case leaves is counted once, in that case's row, not again in every later one."""
        self._next_run = 100

    # -- lifecycle --------------------------------------------------------------------

    def run(self, coroutine: Awaitable[T]) -> T:
        return self.loop.run_until_complete(coroutine)

    def start(self) -> None:
        self.members = self.run(self.cluster.start())
        self._note_workers()

    def close(self) -> list[int | None]:
        try:
            codes = self.run(self.cluster.stop())
        finally:
            self.emitter.close()
            self.loop.close()
        return codes

    def node_pids(self) -> list[int]:
        return [node.process.pid for node in self.cluster.nodes]

    def _note_workers(self) -> None:
        for pid in self.node_pids():
            self.worker_pids.update(children(pid))

    def new_run_id(self) -> int:
        self._next_run += 1
        return self._next_run

    def options(self, **changes: Any) -> SessionOptions:
        base = SessionOptions(identity=self.cluster.orchestrator, nodes=self.members,
                              admission=self.cluster.admission,  # pins the nodes' keys
                              model=self.gguf, prompt_token_ids=PROMPT, decode=False,
                              max_tokens=TOKENS, max_seq_len=MAX_SEQ, timeouts=TIMEOUTS,
                              run_id=self.new_run_id())
        return replace(base, **changes)

    # -- one session ------------------------------------------------------------------

    def session(
        self,
        options: SessionOptions,
        *entries: dict[str, Any],
        during: Callable[[int], Awaitable[None]] | None = None,
    ) -> Observed:
        """Arm `entries`, run one session (and `during(run_id)` beside it), disarm."""
        arm(self.fault_file, *entries)
        try:
            return self.run(self._session(options, during))
        finally:
            arm(self.fault_file)

    async def _session(
        self, options: SessionOptions, during: Callable[[int], Awaitable[None]] | None
    ) -> Observed:
        run_id = options.run_id
        assert run_id is not None
        before = {node.index: len(node.reports) for node in self.cluster.nodes}
        logs = [list(node.stderr_tail) for node in self.cluster.nodes]
        helper = asyncio.ensure_future(during(run_id)) if during is not None else None
        report: SessionReport | None = None
        error: str | None = None
        try:
            report = await run_session(options, self.emitter, io.StringIO(), io.StringIO())
        except SessionError as failure:
            error = str(failure)
        finally:
            if helper is not None:
                helper.cancel()
                await asyncio.gather(helper, return_exceptions=True)
        finished = await self._finished(run_id, before, expect=report is not None)
        follower = JsonlFollower(*sorted(self.events_dir.glob("*.jsonl")))
        try:
            if report is not None:  # the orchestrator's run_torn_down closes the run
                await wait_for_event(follower, 10.0, event="run_torn_down", run_id=run_id)
            events, _ = follower.read_since(0)
        finally:
            follower.close()
        mine = [e for e in events if getattr(e.event, "run_id", None) == run_id]
        self._note_workers()
        return Observed(run_id, report, error, mine, finished, trace_problems(mine), logs)

    async def _finished(
        self, run_id: int, before: dict[int, int], expect: bool
    ) -> dict[int, dict[str, Any]]:
        """Each node's stage_finished report for `run_id` (nodes given no stage: none)."""
        found: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + (REPORT_WAIT_S if expect else 1.0)
        while time.monotonic() < deadline:
            for node in self.cluster.nodes:
                for document in node.reports[before[node.index]:]:
                    if (document.get("kind") == "stage_finished"
                            and document.get("run_id") == run_id):
                        found[node.index] = document
            if len(found) == len(self.cluster.nodes):
                break
            await asyncio.sleep(0.1)
        return found

    # -- the checks -------------------------------------------------------------------

    async def _status(self) -> list[dict[str, Any]]:
        """Every node's leak check, asked now (SIGUSR1 -> a `status` line)."""
        marks = [len(node.reports) for node in self.cluster.nodes]
        for node in self.cluster.nodes:
            node.process.send_signal(signal.SIGUSR1)
        found: list[dict[str, Any]] = []
        async with asyncio.timeout(STATUS_WAIT_S):
            for node, mark in zip(self.cluster.nodes, marks, strict=True):
                while True:
                    fresh = [r for r in node.reports[mark:] if r.get("kind") == "status"]
                    if fresh:
                        found.append(fresh[-1])
                        break
                    await asyncio.sleep(0.05)
        return found

    def leases(self, status: list[dict[str, Any]]) -> set[tuple[int, int, int]]:
        return {(int(s["node_id"]), int(edge), int(ring))
                for s in status for edge, ring in s["live_leases"]}

    def settled_status(self) -> list[dict[str, Any]]:
        """Ask until no node holds a new lease or an active run, or `STATUS_WAIT_S`
        passed."""
        async def ask() -> list[dict[str, Any]]:
            deadline = time.monotonic() + STATUS_WAIT_S
            while True:
                status = await self._status()
                idle = (not self.leases(status) - self.held
                        and all(s["active_run"] is None for s in status))
                if idle or time.monotonic() > deadline:
                    return status
                await asyncio.sleep(0.25)

        return self.run(ask())

    def orphans(self) -> int:
        """Worker processes not accounted for: extra children, zombies, re-parented."""
        count = 0
        live_children: set[int] = set()
        for pid in self.node_pids():
            kids = children(pid)
            live = [k for k in kids if process_state(k) not in (None, "Z", "X")]
            count += abs(len(live) - 1) + (len(kids) - len(live))
            live_children.update(live)
        for pid in self.worker_pids - live_children:
            if process_state(pid) is not None:
                count += 1  # a former worker still exists outside its node
        return count

    def clean_run(self, timeouts: RunTimeouts = TIMEOUTS) -> tuple[bool, str]:
        """The next run on the same nodes: Completed, Clean, the model's tokens, and
        every node idle without leases after it."""
        seen = self.session(self.options(timeouts=timeouts))
        report = seen.report
        if report is None:
            return False, f"next run: {seen.error}"
        result = report.result
        problems = [f"next run: {line}" for line in seen.trace]
        if result.outcome is None or result.outcome.value != "Completed" or \
                result.teardown is None or result.teardown.value != "Clean":
            problems.append("; ".join(report.summary_lines()[:2]))
        if result.generated_token_ids != self.expected:
            problems.append(f"tokens {result.generated_token_ids} != {self.expected}")
        status = self.settled_status()
        if self.leases(status) - self.held or any(s["active_run"] is not None for s in status):
            problems.append(f"after the next run: {status}")
        if report.token_leases_left:
            problems.append(f"orchestrator token leases left: {report.token_leases_left}")
        return not problems, " | ".join(problems)

    def node_logs(self, since: list[list[str]]) -> list[str]:
        """Each node's log lines (stderr) written after the snapshot `since` of
        `stderr_tail` (all it keeps when the snapshot has scrolled out), the last
        `LOG_LINES_KEPT` per node."""
        lines: list[str] = []
        for node, before in zip(self.cluster.nodes, since, strict=True):
            tail = node.stderr_tail
            fresh = tail[len(before):] if tail[:len(before)] == before else tail
            lines += [f"node {node.index}: {line}" for line in fresh[-LOG_LINES_KEPT:]]
        return lines

    def row(self, source: str, injected: str, seen: Observed) -> FaultRow:
        """Fill a table row from one faulted session, then run the next clean run."""
        row = FaultRow(source, injected)
        faults = seen.faults()
        if seen.report is not None:
            result = seen.report.result
            row.outcome = result.outcome.value if result.outcome else "none"
            row.teardown = result.teardown.value if result.teardown else "none"
            if result.fault is not None:
                row.reason = result.fault.reason.value
                row.component = result.fault.component.value
        else:
            row.outcome = "no run (SessionError)"
            row.reason = seen.error or "?"
            row.component = "orchestrator (session)"
        if faults and row.reason == "-":
            row.reason, row.component = faults[0].reason.value, faults[0].component.value
        torn = seen.torn_down()
        row.torn_down = len(torn) == 1
        status = self.settled_status()
        left = self.leases(status) - self.held
        token_left = seen.report.token_leases_left if seen.report is not None else 0
        row.leases_left = len(left) + token_left
        if token_left:
            row.notes.append(f"orchestrator token leases left: {token_left}")
        if any(s["active_run"] is not None for s in status):
            row.notes.append(f"active run left: {status}")
        if left:
            row.notes.append(f"leases left (node, edge, ring): {sorted(left)}")
        self.held |= left
        row.notes += seen.trace
        row.orphans = self.orphans()
        row.next_run_ok, detail = self.clean_run()
        if not row.next_run_ok:
            row.notes.append(detail)
            row.notes += self.node_logs(seen.logs)
        return row

    def interrupt_after_tokens(self, tokens: int) -> Callable[[int], Awaitable[None]]:
        """A `during` helper: SIGINT to this process after `tokens` token_received."""

        async def during(run_id: int) -> None:
            follower = JsonlFollower(self.events_dir / "orchestrator.jsonl")
            try:
                since = 0
                for _ in range(tokens):
                    hit = await wait_for_event(follower, 60.0, since=since,
                                               event="token_received", run_id=run_id)
                    since = follower.events.index(hit) + 1
            finally:
                follower.close()
            os.kill(os.getpid(), signal.SIGINT)

        return during
