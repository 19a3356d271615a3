"""`LocalCluster`: start N `swactor node` processes on loopback and stop them again.

Theory of operation. The launcher owns a directory of node keys (created on first use),
an orchestrator identity every node is told to trust, and the node processes
(`python -m swactor.cli node ...`, each in its own process group, so a Ctrl-C at the
launcher's terminal reaches the launcher alone and `stop()` decides). Each node dies
with the launcher: it is spawned with `PR_SET_PDEATHSIG` SIGKILL (`die_with_parent`),
so a launcher that is killed (a test run killed mid-way) leaves no node behind, and
each node's worker dies with its node the same way. `start()` spawns them
all at once and reads each one's first stdout line, `{"kind": "available", "node_id",
"quic"}`, to learn its id and bound address (a node that exits or stays silent past the
boot timeout fails the start with its stderr tail). Later stdout lines (`stage_finished`
with the node's leak check) are collected per node in `NodeProcess.reports`. `stop()`
sends SIGTERM, waits, and kills what is left; it is idempotent.

With `events_dir`, node i writes its lifecycle events to `events_dir/node-<i>.jsonl`.

The pool is always pinned: `write_pool()` (called by `start()` when nobody did)
creates every node's key and writes `keys_dir/pool.txt` (the orchestrator's and the
nodes' public keys), `admission` is its `Admission`, and each node is started with
`--pool pool.txt`, so its QUIC endpoint pins the orchestrator's and its peers' full
keys, not their 64-bit ids. With `swim`, the cluster is a pinned SWIM pool on loopback,
as on several machines: each node also gets `--swim 127.0.0.1:0 --seed SEED`, where
`seed` is the orchestrator's SWIM address (its `PoolDiscovery` binds before the nodes
start), and prints its `available` line only once its SWIM join was acknowledged.
Without `swim` the nodes run without membership and the orchestrator is handed their
addresses (pass it `admission` so that it pins the nodes' keys too).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swactor.actors.deathsig import die_with_parent
from swactor.membership.admission import Admission, PoolEntry, public_key_bytes
from swactor.orchestrator.session import PoolMember
from swactor.transport.identity import NodeIdentity
from swactor.wire import NodeId

BOOT_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 20.0


class ClusterError(Exception):
    """The local cluster could not start; the message names the node and the cause."""


@dataclass
class NodeProcess:
    index: int
    process: asyncio.subprocess.Process
    member: PoolMember | None = None
    reports: list[dict[str, Any]] = field(default_factory=list)
    stderr_tail: list[str] = field(default_factory=list)
    report_event: asyncio.Event = field(default_factory=asyncio.Event)


class LocalCluster:
    """N local nodes trusting one orchestrator identity (module doc)."""

    def __init__(
        self,
        count: int,
        keys_dir: Path,
        events_dir: Path | None = None,
        arena_ceiling: str = "256MiB",
        log_level: str = "WARNING",
        extra_env: dict[str, str] | None = None,
        weights: str = "blocks",
        swim: bool = False,
        models_dirs: list[Path] | None = None,
        threads: int | None = None,
        device: str | None = None,
    ) -> None:
        if count < 1:
            raise ClusterError("a cluster needs at least one node")
        self.count = count
        self.keys_dir = keys_dir
        self.events_dir = events_dir
        self.arena_ceiling = arena_ceiling
        self.log_level = log_level
        self.extra_env = extra_env or {}
        self.weights = weights
        self.swim = swim
        self.models_dirs = models_dirs
        """One `--models-dir` per node (None: the nodes' default model cache)."""
        self.threads = threads
        """Each node's `--threads` (None: the nodes' default)."""
        self.device = device
        """Each node's `--device` (None: the nodes' default, tinygrad's best)."""
        self.seed: tuple[str, int] | None = None
        """With `swim`: the SWIM address the nodes join through (set before `start`)."""
        keys_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.orchestrator = NodeIdentity.load_or_create(keys_dir / "orchestrator.key")
        self.pool_file = keys_dir / "pool.txt"
        self.admission: Admission | None = None
        """The pinned pool `write_pool()` wrote (None until then)."""
        self.nodes: list[NodeProcess] = []
        self._readers: list[asyncio.Task[None]] = []

    @property
    def members(self) -> tuple[PoolMember, ...]:
        return tuple(n.member for n in self.nodes if n.member is not None)

    def write_pool(self) -> Admission:
        """Create the node keys and pin them, with the orchestrator's, in `pool_file`."""
        entries = [PoolEntry("orchestrator", public_key_bytes(self.orchestrator),
                             "orchestrator")]
        for index in range(self.count):
            identity = NodeIdentity.load_or_create(self.keys_dir / f"node-{index}.key")
            entries.append(PoolEntry("node", public_key_bytes(identity), f"node-{index}"))
        admission = Admission.of(entries, str(self.pool_file))
        self.pool_file.write_text("".join(entry.line() + "\n" for entry in entries))
        self.admission = admission
        return admission

    def _argv(self, index: int) -> list[str]:
        argv = [sys.executable, "-m", "swactor.cli", "node",
                "--key", str(self.keys_dir / f"node-{index}.key"),
                "--trust-orchestrator", str(self.orchestrator.node_id),
                "--arena-ceiling", self.arena_ceiling, "--log-level", self.log_level,
                "--event-verbosity", "-1", "--weights", self.weights,
                "--pool", str(self.pool_file)]
        if self.events_dir is not None:
            argv += ["--events-file", str(self.events_dir / f"node-{index}.jsonl")]
        if self.models_dirs is not None:
            argv += ["--models-dir", str(self.models_dirs[index])]
        if self.threads is not None:
            argv += ["--threads", str(self.threads)]
        if self.device is not None:
            argv += ["--device", self.device]
        if self.swim:
            if self.seed is None:
                raise ClusterError("a SWIM cluster needs its seed address before it starts")
            argv += ["--swim", "127.0.0.1:0", "--seed", f"{self.seed[0]}:{self.seed[1]}"]
        return argv

    async def start(self) -> tuple[PoolMember, ...]:
        env = {**os.environ, **self.extra_env}
        if self.admission is None:
            self.write_pool()
        for index in range(self.count):
            # spawned from the event-loop thread: the death signal follows that thread
            process = await asyncio.create_subprocess_exec(
                *self._argv(index), stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env=env, start_new_session=True, preexec_fn=die_with_parent(os.getpid()))
            self.nodes.append(NodeProcess(index, process))
        try:
            async with asyncio.timeout(BOOT_TIMEOUT_S):
                await asyncio.gather(*(self._await_available(node) for node in self.nodes))
        except TimeoutError:
            await self.stop()
            raise ClusterError(f"nodes did not boot within {BOOT_TIMEOUT_S:.0f}s") from None
        except BaseException:  # ClusterError, or cancelled (Ctrl-C) while booting
            await asyncio.shield(self.stop())
            raise
        return self.members

    async def _await_available(self, node: NodeProcess) -> None:
        stdout, stderr = node.process.stdout, node.process.stderr
        assert stdout is not None and stderr is not None
        self._readers.append(asyncio.create_task(self._read_stderr(node, stderr)))
        line = await stdout.readline()
        try:
            document = json.loads(line)
            host, port = document["quic"]
            node.member = PoolMember(NodeId(int(document["node_id"])), str(host), int(port))
        except (ValueError, KeyError, TypeError):
            await asyncio.sleep(0.2)
            tail = " | ".join(node.stderr_tail[-5:])
            raise ClusterError(f"node {node.index} did not boot: {tail or 'no output'}") from None
        self._readers.append(asyncio.create_task(self._read_reports(node, stdout)))

    async def _read_reports(self, node: NodeProcess, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            with contextlib.suppress(ValueError):
                node.reports.append(json.loads(line))
                node.report_event.set()

    async def _read_stderr(self, node: NodeProcess, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            text = line.decode(errors="replace").rstrip()
            node.stderr_tail.append(text)
            del node.stderr_tail[:-50]
            if os.environ.get("SWACTOR_CLUSTER_ECHO"):
                print(f"[node {node.index}] {text}", file=sys.stderr)

    async def wait_reports(self, count: int, timeout_s: float = 30.0) -> None:
        """Wait until every node printed `count` stage_finished reports."""
        async with asyncio.timeout(timeout_s):
            for node in self.nodes:
                while len([r for r in node.reports if r.get("kind") == "stage_finished"]) < count:
                    node.report_event.clear()
                    await node.report_event.wait()

    async def stop(self) -> list[int | None]:
        """SIGTERM every node, wait, kill stragglers; their exit codes (None for a node
        whose exit was not seen even after SIGKILL)."""
        for node in self.nodes:
            if node.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    node.process.send_signal(signal.SIGTERM)
        for node in self.nodes:
            try:
                await asyncio.wait_for(node.process.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.process.pid, signal.SIGKILL)
                try:  # bounded too: stop() never hangs, whatever asyncio heard
                    await asyncio.wait_for(node.process.wait(), STOP_TIMEOUT_S)
                except TimeoutError:
                    print(f"[swactor] node {node.index} (pid {node.process.pid}) did not "
                          f"report its exit {STOP_TIMEOUT_S:.0f}s after SIGKILL; "
                          "leaving it", file=sys.stderr, flush=True)
        for reader in self._readers:
            reader.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)
        self._readers.clear()
        return [node.process.returncode for node in self.nodes]
