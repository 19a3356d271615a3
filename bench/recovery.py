"""Recovery: per fault kind, how soon the orchestrator knows a stage is lost.

Theory of operation
-------------------
Each trial boots three real `swactor node` processes on SmolLM2 (loopback
`LocalCluster` joined to SWIM through this process's `PoolDiscovery`, as `swactor run`
does; or, for the link, three network namespaces as `tests/multihost`), starts a long
greedy run, waits for a few tokens, injects one fault on stage 1 (the middle stage)
and times, on one wall clock (every process of the machine shares it), the interval
from the fault to the orchestrator's `run_faulted` event, which carries the run's
reason. Fault kinds:

* node kill: SIGKILL of stage 1's node process. Nothing is sent by a killed process,
  so only SWIM notices (MembershipLost), within its detection bound
  (`swactor.membership.detection_bound_s` for the 4 members of the view);
* worker kill: SIGKILL of stage 1's worker process; its node sees the exit at once
  (WorkerCrashed over the control connection);
* worker kill past budget: the worker killed `max_restarts + 1` times, each once its
  next generation is up; the first kill faults the run (WorkerCrashed, as above), the
  last leaves the node's worker Failed and the node unavailable, which reaches the
  orchestrator through SWIM metadata. Its column is the time from the last kill to the
  orchestrator's SWIM view showing the node not Available (the node a re-plan must
  leave out);
* stream reset: stage 0's send pump resets its stream to stage 1 (fault injection,
  `driver.send` reset, armed while the run decodes: it fires on the next activation,
  so the figure includes up to one token period); the receiving stage reports
  StreamFault, which the orchestrator holds for its settle window
  (`RunTimeouts.fault_settle_s`, 0.25 s) in case a root cause follows;
* link down: stage 1's host cut off by its bridge port going down (network
  namespaces; needs root): only SWIM notices (MembershipLost).

* serve node kill: `swactor serve --nodes 4 --stages 3` (one spare node) and
  SERVE_STREAMS concurrent greedy streams through the `openai` client, first on the
  healthy server (the reference), then again with stage 1's node SIGKILLed once every
  stream has TOKENS_BEFORE_FAULT chunks. `swactor serve` started that node process
  itself, so it learns of the exit at once (MembershipLost, no SWIM verdict needed).
  The serving session re-plans on the three
  survivors and migrates every stream; the row also gives the kill -> the new run
  ready (`serve_recovery_completed`), the kill -> each stream's next chunk (the
  slowest), and the tokens lost and duplicated against the reference (both must be 0).
  A second table splits each serving recovery into phases (`PHASES`), read from the
  orchestrator's and the nodes' event logs.
* serve spare kill: the same with `--spares 1`: the fourth node is a warm spare that
  preloads every stage's role (weights and kernels) while the run serves; the fault is
  injected once it answered (`spare_preloaded` for every stage), so the new run finds
  the spare and the survivors holding their roles and loads nothing. The two serve rows
  run one after the other in one invocation (`--kinds serve_node_kill,serve_spare_kill`),
  so their figures are side by side under the same load; `detect -> next token` is
  the part a spare can shorten (the detection is SWIM's either way).
* serve worker budget: as serve node kill (no spare kept warm), but stage 1's worker
  is SIGKILLed instead of its node, then each next generation of that worker once it
  had GENERATION_UP_S to come up, as the worker budget row does, until the node's
  worker is Failed (node_faulted, WorkerFatal) and the node not Available: after
  `max_restarts + 1` kills, or sooner when a kill lands while the worker loads its
  stage (an init failure is not restarted). The first kill faults the run. The
  session re-plans as it decides (with or without that node; the row's
  `faulted_node_in_new_run` says which, `faults` counts the runs that faulted since
  the first kill, `node_faulted_s` times the last kill -> the node's node_faulted);
  detection, new run ready and the phases are the first recovery's, the next token
  the longest pause of any stream across all of them.
* serve link down: `swactor orchestrator --serve --spares 1` over four stage hosts in
  network namespaces (as `tests/multihost/test_serve_link_down.py`; needs root), the
  streams from a client inside the orchestrator host's namespace; once the spare
  preloaded every stage, stage 1's host's bridge port goes down mid-stream: only SWIM
  notices (MembershipLost, within its bound for the 5 members). One trial per run,
  as the link row. A spare whose preload failed (spare_preload_failed) does not stop
  the trial: the row's `spare_preloaded` counts the stages it holds warm (of 3).

How long: the seven other kinds take about 3 minutes together at `--repeat 1` on an
idle 2-core machine (about 20 to 40 s a trial); serve worker budget about 40 s a
trial; serve link down one trial of 1.5 to 6 minutes (four hosts load the model, and
the first run after a build compiles its kernels; with other work on the machine the
first pipeline may take up to NETNS_BOOT_S to serve). The default run (every kind,
`--repeat 2`, the link rows once) takes about 10 to 15 minutes; `--kinds` picks some.

A serving trial whose streams fail (the session gave up, a sequence was not migrated)
fails its row but still gives its detection and the tokens lost (a stream that ended
early lost the rest), so the report's lost-token goal counts them.

Each row also gives run_faulted -> run_torn_down: the teardown a serving session waits
for before it provisions again. The "to new run ready", "to next token" and tokens
lost / duplicated columns are measured by the serving row; the single-run rows print
"n/a" there (a `swactor run` has no next run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import itertools
import json
import os
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from bench._lifecycle import Spread
from swactor.cliargs import at_least
from swactor.events.schema import RunFaulted, RunTornDown, TokenReceived
from swactor.faults import arm
from swactor.membership import (
    BootHealth,
    MemberChanged,
    MembershipEvent,
    SwimConfig,
    detection_bound_s,
)
from swactor.model.paths import default_model_path
from swactor.node.worker_ctl import WorkerCtlConfig
from swactor.orchestrator.run import RunTimeouts
from swactor.testing.netns_pool import NetnsStreams
from swactor.testing.swim_pool import SwimPool

KINDS = ("node_kill", "worker_kill", "worker_budget", "stream_reset", "link_down",
         "serve_node_kill", "serve_spare_kill", "serve_worker_budget", "serve_link_down")
LABELS = {
    "node_kill": "node kill (SIGKILL stage 1's node)",
    "worker_kill": "worker kill (SIGKILL stage 1's worker)",
    "worker_budget": "worker kill past its restart budget",
    "stream_reset": "QUIC stream reset (stage 0 -> 1)",
    "link_down": "host cut off (netns link down)",
    "serve_node_kill": "swactor serve: node kill, 3 streams migrated (cold spare)",
    "serve_spare_kill": "swactor serve --spares 1: node kill, 3 streams migrated (warm spare)",
    "serve_worker_budget": "swactor serve: worker kill past its restart budget, 3 streams "
                           "migrated (cold spare)",
    "serve_link_down": "swactor orchestrator --serve --spares 1: host cut off (netns link "
                       "down), 3 streams migrated (warm spare)",
}
SERVE_FAULTS = {"serve_node_kill": ("node kill", 0), "serve_spare_kill": ("node kill", 1),
                "serve_worker_budget": ("worker kill past budget", 0),
                "serve_link_down": ("link down", 1)}
"""The serving kinds: {kind: (the fault in words, spares kept warm)}."""
PROMPT = "hello world"
TOKENS = 300
MAX_SEQ = 512
TOKENS_BEFORE_FAULT = 3
STAGES = 3
MEMBERS = STAGES + 1
"""The SWIM view: the stage nodes and the orchestrator."""
PENDING = "n/a (single run)"
SERVE_STREAMS = 3
SERVE_TOKENS = 24
SERVE_PROMPTS = ("The capital of France is", "Once upon a time, in a small village,",
                 "The three primary colors are")
BOOT_S = 300.0
FAULT_WAIT_S = 120.0
NETNS_BOOT_S = 900.0
"""How long four namespaced hosts are given to load a pipeline and serve (as the
multihost serving tests): with other work on a 2-core machine it has taken 5 minutes."""
STAYS_DOWN_S = 10.0
"""How long a node whose worker budget is spent is watched for coming back (it must not)."""
GENERATION_UP_S = 3.0
"""How long a restarted worker is given to come up before the next kill."""


@dataclass
class Trial:
    kind: str
    reason: str
    component: str
    detect_s: float
    extra: dict[str, float] = field(default_factory=dict)


class Failed(Exception):
    """A trial did not produce its figure; the message says why."""


class Unrecovered(Failed):
    """A serving trial whose streams failed: `trial` holds what was still measured (the
    detection, the tokens lost and duplicated)."""

    def __init__(self, message: str, trial: Trial) -> None:
        super().__init__(message)
        self.trial = trial


# -- the loopback pool ------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as listing:
            found += [int(word) for word in listing.read().split()]
    return found


def _running(pid: int) -> bool:
    """Not gone and not a zombie waiting for its reaper."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _worker_pid(node_pid: int, other_than: int | None = None,
                timeout_s: float = 120.0) -> int:
    """The node's running worker process other than `other_than`, once there is one."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [pid for pid in _children(node_pid) if pid != other_than and _running(pid)]
        if found:
            return found[0]
        time.sleep(0.02)
    raise Failed(f"node {node_pid}: no worker process after {timeout_s:.0f}s")


async def _run(pool: SwimPool, inject: Callable[[], Awaitable[int]]) -> int:
    """A long run over the pool; `inject()` once TOKENS_BEFORE_FAULT tokens arrived (it
    returns the fault's wall time in ns, which this returns once the run ended)."""
    options = replace(pool.options(default_model_path()), prompt=PROMPT, max_tokens=TOKENS,
                      max_seq_len=MAX_SEQ, timeouts=RunTimeouts(
                          readiness_s=BOOT_S, step_s=FAULT_WAIT_S, teardown_s=30.0))
    session = pool.session(options)
    deadline = time.monotonic() + BOOT_S
    while sum(isinstance(e.event, TokenReceived) for e in pool.events.events) \
            < TOKENS_BEFORE_FAULT:
        if session.done():
            raise Failed(f"the run ended before the fault: {session.result().result.outcome}")
        if time.monotonic() > deadline:
            session.cancel()
            raise Failed(f"no {TOKENS_BEFORE_FAULT} tokens in {BOOT_S:.0f}s")
        await asyncio.sleep(0.02)
    fault_ns = await inject()
    await asyncio.wait_for(session, FAULT_WAIT_S)
    return fault_ns


def _faulted(pool: SwimPool, kind: str, fault_ns: int) -> Trial:
    found = [e for e in pool.events.events if isinstance(e.event, RunFaulted)]
    torn = [e.wall for e in pool.events.events if isinstance(e.event, RunTornDown)]
    if len(found) != 1 or len(torn) != 1:
        raise Failed(f"{len(found)} run_faulted and {len(torn)} run_torn_down events, "
                     "expected one each")
    event = found[0].event
    assert isinstance(event, RunFaulted)
    return Trial(kind, event.reason.value, event.component.value,
                 (found[0].wall - fault_ns) / 1e9, {"teardown_s": (torn[0] - found[0].wall) / 1e9})


async def _loopback_trial(kind: str, root: Path) -> Trial:
    async with SwimPool(root, STAGES) as pool:
        node = pool.node_pid(1)
        killed: list[int] = []

        async def inject() -> int:
            now = time.time_ns()
            if kind == "node_kill":
                os.kill(node, signal.SIGKILL)
            elif kind in ("worker_kill", "worker_budget"):
                killed.append(_worker_pid(node))
                now = time.time_ns()
                os.kill(killed[-1], signal.SIGKILL)
            else:  # stream_reset: stage 0's node resets its stream on its next send
                arm(pool.fault_file, {"point": "driver.send", "mode": "reset",
                                      "node": int(pool.members[0].node_id)})
            return now

        fault_ns = await _run(pool, inject)
        arm(pool.fault_file)
        trial = _faulted(pool, kind, fault_ns)
        if kind == "worker_budget":
            trial.extra["unavailable_s"] = await _exhaust_budget(pool, node, killed[0])
        return trial


async def _exhaust_budget(pool: SwimPool, node: int, first: int) -> float:
    """Kill the node's worker until its restart budget is spent (`first`, killed in the
    run, was the first); seconds from the last kill to the orchestrator's SWIM view
    showing the node not Available."""
    assert pool.pool is not None
    events = pool.pool.events
    target = int(pool.members[1].node_id)
    budget = WorkerCtlConfig(arena_fd=-1, arena_bytes=0).max_restarts
    last = first
    for _ in range(budget):  # each restarted generation, once it had time to come up
        last = await asyncio.to_thread(_worker_pid, node, last)
        await asyncio.sleep(GENERATION_UP_S)
        while not events.empty():  # what SWIM said before this kill
            events.get_nowait()
        at = time.monotonic()
        os.kill(last, signal.SIGKILL)
    seen = await _health_change(events, target, at + FAULT_WAIT_S, available=False)
    if seen is None:
        raise Failed(f"the node was still Available {FAULT_WAIT_S:.0f}s after its last kill")
    # a spent budget is for good: the node must not come back (a restart would)
    back = await _health_change(events, target, time.monotonic() + STAYS_DOWN_S,
                                available=True)
    if back is not None:
        raise Failed("the node came back Available: its restart budget was not spent")
    return seen - at


async def _health_change(events: asyncio.Queue[MembershipEvent], target: int,
                         deadline: float, available: bool) -> float | None:
    """When the orchestrator's view first shows `target` (not) Available, by `deadline`."""
    while time.monotonic() < deadline:
        with contextlib.suppress(TimeoutError):
            event = await asyncio.wait_for(events.get(), deadline - time.monotonic())
            if (isinstance(event, MemberChanged) and int(event.node_id) == target
                    and event.meta is not None
                    and (event.meta.boot_health is BootHealth.Available) is available):
                return time.monotonic()
    return None


# -- the link (network namespaces) ------------------------------------------------------


def _link_trial(root: Path) -> Trial | str:
    """Stage 1's host cut off mid-run, as `tests/multihost/test_link_down.py`; or why not."""
    from swactor.cluster import netns
    from swactor.cluster.netns import NetnsTopology
    from swactor.testing.netns_pool import STAGES as HOSTS
    from swactor.testing.netns_pool import start_node, wait_available
    from swactor.transport.identity import NodeIdentity
    from tests.multihost.pool import final_report, start_orchestrator

    reason = netns.available()
    if reason is not None:
        return f"not run: {reason}"
    netns.sweep_stale()
    pid = os.getpid()
    subnet = ipaddress.IPv4Network(f"10.{100 + pid % 50}.{(pid + 2) % 250}.0/24")
    keys, events = root / "keys", root / "events"
    keys.mkdir(mode=0o700, parents=True)
    events.mkdir()
    orchestrator_id = NodeIdentity.load_or_create(keys / "orchestrator.key").node_id
    with NetnsTopology(["orch", *HOSTS], subnet) as hosts:
        nodes = {name: start_node(hosts, name, keys, events, orchestrator_id)
                 for name in HOSTS}
        try:
            wait_available(list(nodes.values()))
            orchestrator = start_orchestrator(hosts, 1, keys, events, TOKENS, MAX_SEQ)
            log = events / "orchestrator-1.jsonl"
            deadline = time.monotonic() + BOOT_S
            while _count(log, "token_received") < TOKENS_BEFORE_FAULT:
                if orchestrator.process.poll() is not None or time.monotonic() > deadline:
                    raise Failed(f"no tokens before the cut: {orchestrator.describe()}")
                time.sleep(0.05)
            hosts.set_link(HOSTS[1], up=False)
            cut_ns = time.time_ns()
            final_report(orchestrator, FAULT_WAIT_S)
            faulted = [r for r in _records(log) if r["event"] == "run_faulted"]
            torn = [r["wall"] for r in _records(log) if r["event"] == "run_torn_down"]
            if len(faulted) != 1 or len(torn) != 1:
                raise Failed(f"{len(faulted)} run_faulted and {len(torn)} run_torn_down "
                             "events, expected one each")
            return Trial("link_down", faulted[0]["reason"], faulted[0]["component"],
                         (faulted[0]["wall"] - cut_ns) / 1e9,
                         {"teardown_s": (torn[0] - faulted[0]["wall"]) / 1e9})
        finally:
            for node in nodes.values():
                node.stop(30)


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _count(path: Path, event: str) -> int:
    return sum(1 for record in _records(path) if record["event"] == event)


# -- swactor serve ----------------------------------------------------------------------


def _stream_all(url: str) -> list[tuple[list[str], list[float], list[BaseException]]]:
    """SERVE_STREAMS streaming completions started at once, each filled by its thread
    (chunk texts, arrival times, errors); the threads are returned running."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                           timeout=BOOT_S)
    results: list[tuple[list[str], list[float], list[BaseException]]] = []

    def read(prompt: str, chunks: list[str], times: list[float],
             errors: list[BaseException]) -> None:
        try:
            for chunk in client.completions.create(model="swactor", prompt=prompt,
                                                   max_tokens=SERVE_TOKENS, temperature=0.0,
                                                   stream=True):
                if chunk.choices[0].text:
                    chunks.append(chunk.choices[0].text)
                    times.append(time.monotonic())
        except Exception as error:
            errors.append(error)

    for prompt in SERVE_PROMPTS[:SERVE_STREAMS]:
        result: tuple[list[str], list[float], list[BaseException]] = ([], [], [])
        results.append(result)
        threading.Thread(target=read, args=(prompt, *result), daemon=True).start()
    return results


def _wait(results: list[tuple[list[str], list[float], list[BaseException]]],
          done: Callable[[list[str]], bool]) -> None:
    deadline = time.monotonic() + BOOT_S
    while not all(done(chunks) or errors for chunks, _, errors in results):
        if time.monotonic() > deadline:
            raise Failed(f"streams stuck at {[len(c) for c, _, _ in results]} chunks")
        time.sleep(0.01)
    errors = [e for _, _, errs in results for e in errs]
    if errors:
        raise Failed(f"a stream failed: {errors[0]!r}")


def _serve_trial(root: Path, kind: str) -> Trial:
    """One `swactor serve` trial of a serving fault kind on loopback (module doc)."""
    import subprocess
    import sys

    spares = SERVE_FAULTS[kind][1]
    events_dir = root / "events"
    out, err = root / "serve.out", root / "serve.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        serve = subprocess.Popen(
            [sys.executable, "-m", "swactor.cli", "serve", "--nodes", str(STAGES + 1),
             "--stages", str(STAGES), "--spares", str(spares), "--port", "0",
             "--retry-delay", "0.5",
             "--keys-dir", str(root / "keys"), "--events-dir", str(events_dir)],
            stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
            start_new_session=True)
    try:
        deadline = time.monotonic() + BOOT_S
        while not (url := next((line.split()[-1] for line in out.read_text().splitlines()
                                if line.startswith("serving on ")), "")):
            if serve.poll() is not None or time.monotonic() > deadline:
                raise Failed(f"swactor serve did not serve: {err.read_text()[-400:]}")
            time.sleep(0.1)
        reference = _stream_all(url)
        _wait(reference, lambda chunks: len(chunks) == SERVE_TOKENS)
        log = events_dir / "orchestrator.jsonl"
        _wait_spare(log, spares)
        first = next(r for r in _records(log) if r["event"] == "serve_started")["run_id"]
        pid = next(r["pid"] for path in sorted(events_dir.glob("node-*.jsonl"))
                   for r in _records(path)
                   if r.get("run_id") == first and r.get("stage_index") == 1)
        faulted = _stream_all(url)
        _wait(faulted, lambda chunks: len(chunks) >= TOKENS_BEFORE_FAULT)
        killer: _BudgetKiller | None = None
        if kind == "serve_worker_budget":
            worker = _worker_pid(pid)
            killed, killed_ns = time.monotonic(), time.time_ns()
            os.kill(worker, signal.SIGKILL)
            killer = _BudgetKiller(pid, worker, events_dir)
            killer.start()
        else:
            os.kill(pid, signal.SIGKILL)
            killed, killed_ns = time.monotonic(), time.time_ns()
        try:
            _wait(faulted, lambda chunks: len(chunks) == SERVE_TOKENS)
        except Failed as error:
            why = f"{error}{_gave_up(log, killed_ns, killer)}"
            partial = lost_trial(kind, [chunks for chunks, _, _ in reference],
                                 [chunks for chunks, _, _ in faulted], killed_ns, _records(log))
            raise (Failed(why) if partial is None else Unrecovered(why, partial)) from None
        if killer is not None:
            killer.join(BOOT_S)
        time.sleep(0.5)  # a duplicated token would arrive after the last expected one
        extra = {} if killer is None else killer.figures()
        nodes = [r for path in sorted(events_dir.glob("node-*.jsonl")) for r in _records(path)]
        trial = serve_figures(kind, [chunks for chunks, _, _ in reference],
                              [(chunks, times) for chunks, times, _ in faulted],
                              killed, killed_ns, _records(log), nodes)
        trial.extra |= extra
        return trial
    finally:
        if serve.poll() is None:
            serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(serve.pid, signal.SIGKILL)
            serve.wait()


def _gave_up(log: Path, killed_ns: int, killer: _BudgetKiller | None) -> str:
    """What the orchestrator's log says about a failed recovery, for the row's note: the
    runs that faulted since the fault and the reason it gave up, if it did."""
    records = [r for r in _records(log) if r["wall"] > killed_ns]
    faults = sum(r["event"] == "run_faulted" for r in records)
    gave_up = next((r for r in records if r["event"] == "serve_failed"), None)
    return "".join([
        f"; {faults} run_faulted since the fault",
        "" if killer is None else f", {killer.kills} worker kill(s)",
        "" if gave_up is None else
        f"; serve_failed {(gave_up['wall'] - killed_ns) / 1e9:.2f}s after the fault: "
        f"{gave_up['detail']['reason']}"])


def _wait_spare(log: Path, spares: int, strict: bool = True) -> int:
    """With a spare, until it preloaded every stage's role (the fault waits for it); the
    stages it preloaded. A failed preload is Failed, or with `strict` off, waited out
    (every stage answered, preloaded or failed) and counted out."""
    deadline = time.monotonic() + BOOT_S
    while spares and (done := _count(log, "spare_preloaded")) < STAGES:
        failed = _count(log, "spare_preload_failed")
        if (failed and strict) or time.monotonic() > deadline:
            why = [r["detail"] for r in _records(log) if r["event"] == "spare_preload_failed"]
            raise Failed(f"the spare preloaded {done} of {STAGES} stages: "
                         f"{why[-1] if why else 'no answer'}")
        if done + failed == STAGES:
            return done
        time.sleep(0.1)
    return STAGES if spares else 0


class _BudgetKiller(threading.Thread):
    """Kills each next generation of a node's worker (`first`, the one the trial killed,
    was generation 1) once it had GENERATION_UP_S to come up, as the `worker_budget` row
    does, until the node gave up on its worker: its node_faulted (WorkerFatal, the node
    no longer Available) in `events_dir`, which `max_restarts + 1` crashes bring, or a
    kill while the worker loads its stage (an init failure) brings sooner. `error` says
    why it stopped before that."""

    def __init__(self, node: int, first: int, events_dir: Path) -> None:
        super().__init__(daemon=True)
        self.node, self.last, self.events_dir = node, first, events_dir
        self.kills, self.last_ns = 1, time.time_ns()
        self.error: str | None = None

    def node_faulted(self) -> list[int]:
        """The walls of the node's node_faulted events since the last kill."""
        return [r["wall"] for path in sorted(self.events_dir.glob("node-*.jsonl"))
                for r in _records(path) if r["event"] == "node_faulted"
                and r.get("pid") == self.node and r["wall"] > self.last_ns]

    def run(self) -> None:
        budget = WorkerCtlConfig(arena_fd=-1, arena_bytes=0).max_restarts
        try:
            while self.kills <= budget:
                deadline = time.monotonic() + FAULT_WAIT_S
                while not (found := [pid for pid in _children(self.node)
                                     if pid != self.last and _running(pid)]):
                    if self.node_faulted():
                        return
                    if time.monotonic() > deadline:
                        raise Failed(f"no next worker generation in {FAULT_WAIT_S:.0f}s "
                                     "and no node_faulted")
                    time.sleep(0.02)
                self.last = found[0]
                time.sleep(GENERATION_UP_S)
                if self.node_faulted():
                    return
                self.last_ns = time.time_ns()
                os.kill(self.last, signal.SIGKILL)
                self.kills += 1
        except (Failed, OSError) as error:
            self.error = str(error)

    def figures(self) -> dict[str, float]:
        """`kills` made and `node_faulted_s`: the last kill -> the node's node_faulted
        (waited for up to FAULT_WAIT_S)."""
        deadline = time.monotonic() + FAULT_WAIT_S
        while not (faulted := self.node_faulted()) and self.error is None \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        if not faulted:
            raise Failed(f"{self.kills} worker kill(s) and the node did not fault: "
                         f"{self.error or 'no node_faulted'}")
        return {"kills": float(self.kills), "node_faulted_s": (min(faulted) - self.last_ns) / 1e9}


def _lost(reference: list[list[str]], got: list[list[str]]) -> tuple[int, int]:
    """Chunks missing from and added to each stream against its reference, summed."""
    import difflib

    lost = duplicated = 0
    for want, have in zip(reference, got, strict=True):
        for op, a0, a1, b0, b1 in difflib.SequenceMatcher(a=want, b=have).get_opcodes():
            lost += (a1 - a0) if op in ("delete", "replace") else 0
            duplicated += (b1 - b0) if op in ("insert", "replace") else 0
    return lost, duplicated


def lost_trial(kind: str, reference: list[list[str]], got: list[list[str]], killed_ns: int,
               records: list[dict[str, Any]]) -> Trial | None:
    """A serving trial whose streams failed: its detection (the first run_faulted after
    the fault), `faults` (every run_faulted since), the chunks each stream got against
    its reference (a stream that ended early lost the rest) and `failed_streams`; no
    recovery figure. None if no run faulted."""
    records = [r for r in records if r["wall"] > killed_ns]
    faults = [r for r in records if r["event"] == "run_faulted"]
    lost, duplicated = _lost(reference, got)
    extra = {"lost": float(lost), "duplicated": float(duplicated),
             "faults": float(len(faults)),
             "failed_streams": float(sum(len(have) < len(want)
                                         for want, have in zip(reference, got, strict=True)))}
    if not faults:
        return None
    return Trial(kind, faults[0]["reason"], faults[0]["component"],
                 (faults[0]["wall"] - killed_ns) / 1e9, extra)


def serve_figures(kind: str, reference: list[list[str]],
                  faulted: list[tuple[list[str], list[float]]], killed: float, killed_ns: int,
                  records: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> Trial:
    """A serving trial's figures: `reference`, each stream's chunks on the healthy
    pipeline; `faulted`, each stream's chunks and arrival times (monotonic) in the
    faulted pass; the fault at `killed` (monotonic) and `killed_ns` (wall); `records`,
    the orchestrator's events; `nodes`, every node's events. Detection is the first
    run_faulted after the fault, the new run the first serve_recovery_completed; next
    token, the largest gap across the fault in any stream; lost and duplicated, the
    chunks missing from / added to each stream against its reference; `faults`, the
    run_faulted events after the fault (a fault that hits the new run too counts);
    `faulted_node_in_new_run`, whether the node that held stage 1 holds a stage of the
    new run (1) or was left out (0)."""
    records = [r for r in records if r["wall"] > killed_ns]

    def after(name: str) -> dict[str, Any]:
        found = next((r for r in records if r["event"] == name), None)
        if found is None:
            raise Failed(f"no {name} after the fault")
        return found

    fault = after("run_faulted")
    new_run = after("serve_recovery_completed")["run_id"]
    ready = [r for r in nodes if r["event"] == "stage_ready" and r.get("run_id") == new_run]
    reused = sum(1 for r in ready if r.get("role_reused"))
    holder = {r.get("node_id") for r in nodes if r.get("run_id") == fault["run_id"]
              and r.get("stage_index") == 1}
    lost, duplicated = _lost(reference, [chunks for chunks, _ in faulted])
    gaps = [t - max(prev, killed) for _, times in faulted
            for prev, t in itertools.pairwise(times) if t > killed]
    if not gaps:
        raise Failed("no stream received a chunk after the fault")
    next_s = max(gaps)
    detect_s = (fault["wall"] - killed_ns) / 1e9
    phases = _phases(records, [r for r in nodes if r.get("run_id") == new_run], killed_ns,
                     new_run)
    if len(phases) == len(PHASES):  # the slowest stream's chunk after its first token
        phases["phase_deliver_s"] = next_s - sum(phases.values())
    return Trial(kind, fault["reason"], fault["component"], detect_s, {
        "teardown_s": (after("run_torn_down")["wall"] - fault["wall"]) / 1e9,
        "ready_s": (after("serve_recovery_completed")["wall"] - killed_ns) / 1e9,
        "next_token_s": next_s,
        "detect_to_next_s": next_s - detect_s,
        "stages_reused": float(reused),
        "lost": float(lost), "duplicated": float(duplicated),
        "migrated": float(sum(r["event"] == "sequence_migrated" for r in records)),
        "faults": float(sum(r["event"] == "run_faulted" for r in records)),
        "faulted_node_in_new_run": float(any(r.get("node_id") in holder for r in ready)),
    } | phases)


def _netns_chunks(streams: NetnsStreams) -> list[list[str]]:
    """Each stream's chunks of a `NetnsStreams`, once every stream completed without an
    error."""
    try:
        results = streams.finish(BOOT_S)
    except AssertionError as error:
        raise Failed(str(error)) from None
    errors = [r["error"] for r in results if r["error"] is not None]
    if errors:
        raise Failed(f"a stream failed: {errors[0]}")
    return [list(r["chunks"]) for r in results]


def _serve_link_trial(root: Path) -> Trial | str:
    """`swactor orchestrator --serve --spares 1` over four hosts in network namespaces
    (`swactor.testing.netns_pool.ServingPool`, as `tests/multihost/test_serve_link_down.py`),
    stage 1's host cut off mid-stream; or why not run."""
    from swactor.cluster import netns
    from swactor.testing.netns_pool import STAGES as STAGE_HOSTS
    from swactor.testing.netns_pool import ServingPool

    reason = netns.available()
    if reason is not None:
        return f"not run: {reason}"
    hosts_named = (*STAGE_HOSTS, "n3")
    prompts = SERVE_PROMPTS[:SERVE_STREAMS]
    with ServingPool(root, hosts_named, subnet_base=150) as pool:
        try:
            url = pool.serve(["--spares", "1", "--split", "10,10,10",
                              "--max-seq-len", str(MAX_SEQ), "--retry-delay", "0.5"],
                             NETNS_BOOT_S)
        except AssertionError:
            serve = pool.serving
            raise Failed(f"swactor orchestrator --serve did not serve within "
                         f"{NETNS_BOOT_S:.0f}s" + ("" if serve is None else
                         f" (exit {serve.process.poll()}): {' | '.join(serve.stderr[-3:])}")
                         ) from None
        log = pool.log
        reference = _netns_chunks(NetnsStreams(pool.orch, url, SERVE_TOKENS, prompts))
        preloaded = _wait_spare(log, 1, strict=False)
        first = next(r for r in _records(log) if r["event"] == "serve_started")["run_id"]
        cut = pool.stage_hosts(first)[1]
        streams = NetnsStreams(pool.orch, url, SERVE_TOKENS, prompts)
        try:
            streams.wait_chunks(TOKENS_BEFORE_FAULT, BOOT_S)
        except AssertionError as error:
            raise Failed(f"streams stuck at {streams.chunks} chunks: {error}") from None
        pool.topology.set_link(cut, up=False)
        killed, killed_ns = time.monotonic(), time.time_ns()
        faulted = _netns_chunks(streams)
        pool.topology.set_link(cut, up=True)
        records = [r for name in hosts_named
                   for r in _records(pool.events_dir / f"{name}.jsonl")]
        trial = serve_figures("serve_link_down", reference,
                              list(zip(faulted, streams.times, strict=True)), killed,
                              killed_ns, _records(log), records)
        trial.extra["spare_preloaded"] = float(preloaded)
        return trial


PHASES = (
    ("detect", "kill -> run_faulted"),
    ("teardown", "run_faulted -> run_torn_down"),
    ("replan", "-> the new run's run_planned (plan, pool greeting)"),
    ("provision", "-> every new stage_ready"),
    ("barrier", "-> readiness_barrier_passed"),
    ("resubmit", "-> every migrated sequence_started"),
    ("prefill", "-> every migrated sequence_first_token"),
)
"""The serving rows' recovery broken into phases, each from the end of the one before
(one wall clock: the orchestrator's and the nodes' event logs)."""


def _node_records(events_dir: Path, run_id: int) -> list[dict[str, Any]]:
    return [r for path in sorted(events_dir.glob("node-*.jsonl")) for r in _records(path)
            if r.get("run_id") == run_id]


def _phases(records: list[dict[str, Any]], nodes: list[dict[str, Any]], killed_ns: int,
            new_run: int) -> dict[str, float]:
    """`phase_NAME_s` for each of PHASES (`records`: the orchestrator's events after the
    kill; `nodes`: the nodes' events of the new run); a phase whose end is not in the
    logs is left out."""
    def last(name: str, source: list[dict[str, Any]], run: int | None = new_run) -> int | None:
        walls = [r["wall"] for r in source if r["event"] == name
                 and (run is None or r.get("run_id") == run)]
        return max(walls) if walls else None

    old = next((r["run_id"] for r in records if r["event"] == "run_faulted"), None)
    migrated = {r["detail"]["sequence_id"] for r in records
                if r["event"] == "sequence_migrated"}
    ends = [
        last("run_faulted", records, old),
        last("run_torn_down", records, old),
        last("run_planned", records),
        last("stage_ready", nodes),
        last("readiness_barrier_passed", records),
        max((r["wall"] for r in records if r["event"] == "sequence_started"
             and r.get("run_id") == new_run), default=None) if migrated else None,
        last("sequence_first_token", records),
    ]
    phases: dict[str, float] = {}
    previous: int | None = killed_ns
    for (name, _), end in zip(PHASES, ends, strict=True):
        if end is not None and previous is not None:
            phases[f"phase_{name}_s"] = (end - previous) / 1e9
        previous = end
    return phases


# -- the table ---------------------------------------------------------------------------


def _bound(kind: str, settle_s: float) -> str:
    swim = detection_bound_s(SwimConfig(), MEMBERS)
    if kind in ("node_kill", "link_down"):
        return f"SWIM bound {swim:.2f}s"
    if kind in ("serve_node_kill", "serve_spare_kill"):
        return ("its exit (a child of swactor serve); SWIM bound "
                f"{detection_bound_s(SwimConfig(), MEMBERS + 1):.2f}s otherwise")
    if kind == "serve_link_down":
        return f"SWIM bound {detection_bound_s(SwimConfig(), MEMBERS + 1):.2f}s"
    if kind == "serve_worker_budget":
        return "first kill: control round trip"
    if kind == "stream_reset":
        return f"settle {settle_s:g}s + 1 token"
    if kind == "worker_budget":
        return "run: as worker kill; unavailable: gossip"
    return "control round trip"


def bound_s(kind: str) -> float | None:
    """`kind`'s detection bound in seconds where `_bound` states a number: SWIM's for a
    fault only SWIM sees (the serving link row's view has one member more: the spare),
    and for the serving node kill rows, whose node's exit is seen at once, SWIM's as the
    fallback that bounds it; None where the bound is not a number (a control round
    trip, gossip, a settle window plus one token period)."""
    if kind in ("node_kill", "link_down"):
        return detection_bound_s(SwimConfig(), MEMBERS)
    if kind in ("serve_node_kill", "serve_spare_kill", "serve_link_down"):
        return detection_bound_s(SwimConfig(), MEMBERS + 1)
    return None


def as_json(kinds: list[str], trials: dict[str, list[Trial]], notes: dict[str, str],
            settle_s: float) -> dict[str, Any]:
    """What `--json` writes: per fault kind, its trials as measured and, in `figures`,
    each figure's min / median / max over them (`detect_s`, `teardown_s` and, where
    measured, `unavailable_s`, the serving columns `ready_s`, `next_token_s`,
    `detect_to_next_s`, `stages_reused`, `migrated`, `lost`, `duplicated` and each
    phase's `phase_NAME_s`); its bound in words and, where it is a number, `bound_s`;
    `note` when the kind failed or was not run; `spares` for the serving rows."""
    rows = []
    for kind in kinds:
        found = trials[kind]
        values: dict[str, list[float]] = {"detect_s": [t.detect_s for t in found]}
        for trial in found:
            for name, value in trial.extra.items():
                values.setdefault(name, []).append(value)
        rows.append({
            "kind": kind, "label": LABELS[kind], "bound": _bound(kind, settle_s),
            "bound_s": bound_s(kind), "note": notes.get(kind),
            "spares": SERVE_FAULTS[kind][1] if kind in SERVE_FAULTS else None,
            "fault": SERVE_FAULTS[kind][0] if kind in SERVE_FAULTS else None,
            "reasons": sorted({f"{t.reason} ({t.component})" for t in found}),
            "figures": {name: Spread.of(v).to_json() for name, v in values.items() if v},
            "trials": [asdict(t) for t in found]})
    return {"stages": STAGES, "members": MEMBERS, "tokens_before_fault": TOKENS_BEFORE_FAULT,
            "serve_streams": SERVE_STREAMS, "serve_tokens": SERVE_TOKENS,
            "swim_bound_s": detection_bound_s(SwimConfig(), MEMBERS), "settle_s": settle_s,
            "phases": [name for name, _ in PHASES] + ["deliver"], "rows": rows}


def _serving(found: list[Trial]) -> str:
    """The serving columns: new run ready, next token, detection -> next token, stages
    reused, tokens lost, duplicated."""
    if not found or "lost" not in found[0].extra:
        return " | ".join([PENDING] * 6)
    if any("ready_s" not in t.extra for t in found):  # streams failed: no recovery
        return " | ".join(["-"] * 4 + [str(sum(int(t.extra[count]) for t in found))
                                       for count in ("lost", "duplicated")])
    return " | ".join([_spread([t.extra["ready_s"] for t in found]),
                       _spread([t.extra["next_token_s"] for t in found]),
                       _spread([t.extra["detect_to_next_s"] for t in found]),
                       "/".join(str(int(t.extra["stages_reused"])) for t in found)
                       + f" of {STAGES}",
                       str(sum(int(t.extra["lost"]) for t in found)),
                       str(sum(int(t.extra["duplicated"]) for t in found))])


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.2f}s"
    return (f"{statistics.median(values):.2f}s "
            f"({min(values):.2f}..{max(values):.2f}, n={len(values)})")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench recovery", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"comma-separated fault kinds (default all: {','.join(KINDS)}; "
                        "the timings above say how long each takes)")
    parser.add_argument("--repeat", type=at_least(1), default=2,
                        help="trials per loopback fault kind (default 2; the link: 1)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH",
                        help="also write, as JSON to PATH, each fault kind's trials, its "
                        "figures (min/median/max over the trials) and its detection bound")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="keep each trial's keys and event logs in DIR/KIND-N "
                        "(default: a temporary directory, removed)")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        parser.error(f"unknown fault kind(s) {', '.join(unknown)}; have {', '.join(KINDS)}")
    if not default_model_path().is_file():
        print(f"recovery: {default_model_path()} missing: run scripts/setup.sh")
        return 1
    settle_s = RunTimeouts().fault_settle_s
    print(f"SmolLM2, {STAGES} stages on real node processes; fault on stage 1 after "
          f"{TOKENS_BEFORE_FAULT} tokens; SWIM defaults, bound "
          f"{detection_bound_s(SwimConfig(), MEMBERS):.2f}s for {MEMBERS} members",
          flush=True)
    trials: dict[str, list[Trial]] = {kind: [] for kind in kinds}
    notes: dict[str, str] = {}
    status = 0
    for kind in kinds:
        for attempt in range(1 if kind in ("link_down", "serve_link_down") else args.repeat):
            with contextlib.ExitStack() as stack:
                if args.keep is not None:
                    root = args.keep / f"{kind}-{attempt + 1}"
                    root.mkdir(parents=True)
                else:
                    root = Path(stack.enter_context(tempfile.TemporaryDirectory(
                        prefix=f"swactor-recovery-{kind}-")))
                try:
                    outcome = (_link_trial(root) if kind == "link_down"
                               else _serve_link_trial(root) if kind == "serve_link_down"
                               else _serve_trial(root, kind) if kind in SERVE_FAULTS
                               else asyncio.run(_loopback_trial(kind, root)))
                except Exception as error:
                    notes[kind] = f"failed: {type(error).__name__}: {error}"
                    if isinstance(error, Unrecovered):
                        trials[kind].append(error.trial)
                    status = 1
                    break
            if isinstance(outcome, str):
                notes[kind] = outcome
                break
            trials[kind].append(outcome)
            extra = "".join(f", {k} {v:.2f}s" if k.endswith("_s") else f", {k} {v:g}"
                            for k, v in outcome.extra.items())
            print(f"  {kind} #{attempt + 1}: {outcome.reason} ({outcome.component}) "
                  f"{outcome.detect_s:.3f}s after the fault{extra}", flush=True)
    header = ("| fault | run_faulted reason (component) | fault -> detection | bound | "
              "run_faulted -> run_torn_down | -> new run ready | -> next token | "
              "detection -> next token | stages reused | tokens lost | tokens duplicated |")
    print()
    print(header)
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for kind in kinds:
        found = trials[kind]
        reasons = sorted({f"{t.reason} ({t.component})" for t in found})
        detect = _spread([t.detect_s for t in found])
        if any("unavailable_s" in t.extra for t in found):
            detect += ("; node not Available "
                       f"{_spread([t.extra['unavailable_s'] for t in found])}")
        if kind in notes:
            detect = notes[kind] if not found else f"{detect}; {notes[kind]}"
        print(f"| {LABELS[kind]} | {', '.join(reasons) or '-'} | {detect} | "
              f"{_bound(kind, settle_s)} | "
              f"{_spread([t.extra['teardown_s'] for t in found if 'teardown_s' in t.extra])}"
              f" | {_serving(found)} |")
    print("detection: fault injected -> the orchestrator's run_faulted event (one wall "
          "clock); median (min..max, trials).")
    served = [kind for kind in kinds if any("phase_detect_s" in t.extra for t in trials[kind])]
    if served:
        print()
        print("| recovery phase (serving rows, each from the end of the one before) | "
              + " | ".join(LABELS[kind] for kind in served) + " |")
        print("| --- |" + " --- |" * len(served))
        for name, words in (*PHASES, ("deliver", "-> the client's next chunk")):
            cells = [_spread([t.extra[f"phase_{name}_s"] for t in trials[kind]
                              if f"phase_{name}_s" in t.extra]) for kind in served]
            print(f"| {name}: {words} | " + " | ".join(cells) + " |")
    if args.json is not None:
        args.json.write_text(json.dumps(as_json(kinds, trials, notes, settle_s), indent=1))
    return status
