"""`SwimPool`: a loopback `LocalCluster` joined to SWIM through this process's own
orchestrator participant, for the tests and benchmarks that fault a stage mid-run.

Theory of operation. As `swactor run` does (`swactor.cluster.run_cmd`), the pool pins
its nodes' and the orchestrator's keys (`LocalCluster.write_pool`), binds the
orchestrator's `PoolDiscovery` first, starts the nodes with it as their SWIM seed and
waits for `pool_readiness`'s PoolReady. Every node's environment names the fault file
(`fault_file`, `swactor.faults`; empty until a caller arms it), so a fault can be
injected into a running node. The orchestrator's lifecycle events go to `events` (in
memory, for the caller to read) and to `root/orchestrator.jsonl`; each node's to
`root/events/node-<i>.jsonl`. `session(options)` runs one orchestrator session over
the pool with `Pool.watch` beside it, so a chosen node that SWIM declares dead (or
unavailable) is the run's MembershipLost. `node_pid(stage)` is the process holding a
stage (stages go in node-id order, as planned), for a caller that kills it.
"""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from types import TracebackType

from swactor.cluster.launcher import LocalCluster
from swactor.cluster.run_cmd import LOCAL_CONVERGENCE_WINDOW_S
from swactor.events.emitter import Emitter
from swactor.events.sinks import JsonlSink, MemorySink
from swactor.faults import ENV_FILE, arm
from swactor.orchestrator.discovery import Pool, PoolDiscovery
from swactor.orchestrator.session import PoolMember, SessionOptions, SessionReport, run_session

POOL_TIMEOUT_S = 60.0


class SwimPool:
    """`stages` SWIM-joined loopback nodes and this process's orchestrator (module doc)."""

    def __init__(self, root: Path, stages: int, arena_ceiling: str = "256MiB") -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.stages = stages
        self.events = MemorySink()
        self.fault_file = root / "faults.json"
        arm(self.fault_file)
        self.cluster = LocalCluster(stages, root / "keys", root / "events", arena_ceiling,
                                    extra_env={ENV_FILE: str(self.fault_file)}, swim=True)
        self.emitter = Emitter("orchestrator-pool",
                               [self.events, JsonlSink(str(root / "orchestrator.jsonl"))])
        self.pool: Pool | None = None
        self._discovery: PoolDiscovery | None = None

    async def __aenter__(self) -> SwimPool:
        try:
            admission = self.cluster.write_pool()
            self._discovery = PoolDiscovery(
                self.cluster.orchestrator, ("127.0.0.1", 0), (), self.stages,
                admission=admission, settle_s=LOCAL_CONVERGENCE_WINDOW_S,
                emitter=self.emitter)
            self.cluster.seed = self._discovery.address
            self._discovery.start()
            await self.cluster.start()
            self.pool = await self._discovery.wait(POOL_TIMEOUT_S)
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop the orchestrator's participant and the nodes (idempotent)."""
        try:
            if self.pool is not None:
                await self.pool.stop()
            elif self._discovery is not None:
                await self._discovery.close()
            self.pool = self._discovery = None
        finally:
            await self.cluster.stop()
            self.emitter.close()

    @property
    def members(self) -> tuple[PoolMember, ...]:
        """The chosen nodes in stage order."""
        assert self.pool is not None, "the pool is not ready"
        return self.pool.members

    def node_pid(self, stage: int) -> int:
        """The pid of the node process that holds `stage`."""
        wanted = self.members[stage].node_id
        for node in self.cluster.nodes:
            if node.member is not None and node.member.node_id == wanted:
                return node.process.pid
        raise LookupError(f"no node process for stage {stage}")

    def options(self, model: Path | str) -> SessionOptions:
        """Session options over the pool (its identity, nodes and pool file) for `model`;
        the caller `dataclasses.replace`s the rest."""
        return SessionOptions(identity=self.cluster.orchestrator, nodes=self.members,
                              model=model, pool_gated=True, admission=self.cluster.admission)

    def session(self, options: SessionOptions) -> asyncio.Task[SessionReport]:
        """One orchestrator session over the pool, SWIM watching its nodes (module doc)."""
        assert self.pool is not None, "the pool is not ready"
        return asyncio.ensure_future(run_session(options, self.emitter, io.StringIO(),
                                                 io.StringIO(), watch=self.pool.watch))
