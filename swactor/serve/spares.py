"""Warm spares for a serving session (`--spares N`): which roles a spare preloads, how
the next plan uses it, and the preloading itself.

Theory of operation. Recovery after a stage node's loss is mostly the new run's
loading: every node that gets a stage it does not hold reads its layer range and builds
its kernels. Two things make that load unnecessary:

1. Stable placement (`place`): the next plan keeps each surviving node at the stage it
   had, so its worker re-arms the role it holds (same stage of the same file: the
   worker's `reconfigure`), and only the lost stage needs a node;
2. warm spares (`SpareWarmer`): idle nodes that already hold the lost stage's role,
   preloaded while the run serves (`PreloadStage`, answered once the spare's worker
   configured the role, kernels included). `place` puts a spare warm for the lost
   stage in its place; a spare warm for another range, or a cold one, still takes it,
   and loads as before (the fallback; `placement` words say which happened).

Which stage a spare preloads: any stage's node may fail, so the spares cover distinct
ranges (`spare_assignment`): stages ordered largest layer range first (the slowest to
load), stage k of that order to spare k mod N. With as many spares as stages each
spare holds one range; fewer spares hold several ranges each (one worker role per
range, so memory must allow it: a spare that cannot hold one reports the failure and
stays cold for it); more spares than stages double up on the largest ranges. The warm
map is what the spares answered, for a plan of the current stage count; a run that
changes the stage count (a pool too small for it) gets a normal load.

Each preload goes over a control channel of its own (`Pool.open` on the spares, the
orchestrator's identity, the run's admission), so the serving run's channel never
carries it; events `spare_preloaded` and `spare_preload_failed` (extensions beyond
spec §40) name the spare, the stage and the time or the reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from swactor.events.schema import SparePreloaded, SparePreloadFailed
from swactor.wire import NodeId

if TYPE_CHECKING:
    from swactor.events.emitter import Emitter
    from swactor.model.fetch import OfferedFile
    from swactor.orchestrator.session import Pool, PoolMember, SessionOptions
    from swactor.serve.pipeline import RunEngine
    from swactor.wire.plan import RunPlan

log = logging.getLogger("swactor.serve.spares")

PRELOAD_TIMEOUT_S = 600.0
"""Bound on one spare's preload of one role (weights read, kernels built)."""

WarmKey = tuple[int, int]
"""(stage index, stage count): a role preloaded for that stage of a plan that size."""


def spare_assignment(stage_sizes: Sequence[int], spares: int) -> list[list[int]]:
    """The stage indices each of `spares` spares preloads (module doc)."""
    order = sorted(range(len(stage_sizes)), key=lambda i: (-stage_sizes[i], i))
    if spares <= 0 or not order:
        return []
    if spares >= len(order):
        return [[order[j % len(order)]] for j in range(spares)]
    return [[stage for k, stage in enumerate(order) if k % spares == j] for j in range(spares)]


def place(previous: Sequence[NodeId], usable: Sequence[NodeId],
          warm: Mapping[NodeId, frozenset[WarmKey]], count: int,
          avoid: frozenset[NodeId] = frozenset()
          ) -> tuple[tuple[NodeId, ...], list[str]]:
    """The next plan's nodes in stage order, and words for each stage given a new node.

    Survivors of `previous` keep their stage; each lost stage gets a usable node warm
    for it when there is one, else any free one (lowest id first). A node in `avoid`
    (one that faulted a run of the session) counts as lost while a free node outside
    `avoid` can take its stage, and is a free node's last choice: a worker that crashed
    is not re-planned onto while the pool has a spare. When fewer usable nodes than
    `previous` stages are left (or there is no previous run), the first `count` usable
    nodes by id, those in `avoid` last: a new shape, loaded as usual."""
    ordered = sorted(usable, key=lambda n: (n in avoid, n))
    stages = len(previous)
    if not previous or len(ordered) < stages:
        return tuple(sorted(ordered[:count])), []
    chosen: list[NodeId | None] = [n if n in ordered else None for n in previous]
    spare = [n for n in ordered if n not in chosen and n not in avoid]
    for index, node in enumerate(chosen):
        if node is not None and node in avoid and spare:
            chosen[index] = None
            spare.pop()
    free = [n for n in ordered if n not in chosen]
    words: list[str] = []
    for index, node in enumerate(chosen):
        if node is not None:
            continue
        ready = [n for n in free if (index, stages) in warm.get(n, frozenset())
                 and n not in avoid]
        pick = (ready or free)[0]
        free.remove(pick)
        chosen[index] = pick
        words.append(f"stage {index} on spare {int(pick):#x}, "
                     + ("preloaded" if ready else "not preloaded for its range: loaded"))
    return tuple(n for n in chosen if n is not None), words


class SpareWarmer:
    """Preloads a run's stage roles on the pool's idle nodes and remembers what is warm
    where (module doc); the serving session's warmer."""

    def __init__(self, spares: int, options: SessionOptions,
                 idle: Callable[[frozenset[NodeId]], tuple[PoolMember, ...]],
                 emitter: Emitter | None = None) -> None:
        self.spares = spares
        self._options = options
        self._idle = idle
        self._emitter = emitter
        self.warm: dict[NodeId, frozenset[WarmKey]] = {}
        """Roles each spare answered it holds (stage index, stage count)."""
        self._inflight: set[tuple[NodeId, int, int]] = set()

    async def __call__(self, run: RunEngine) -> tuple[int, int]:
        """Preload `run`'s roles on up to `spares` idle nodes; (ready, wanted)."""
        from swactor.orchestrator.session import Pool

        plan = run.plan
        in_run = frozenset(run.stage_nodes)
        for node in in_run:
            self.warm.pop(node, None)  # a node in the run holds its own stage
        spares = self._idle(in_run)[:self.spares]
        sizes = [s.layer_end_exclusive - s.layer_start for s in plan.stages]
        count = len(plan.stages)
        pairs = [(member, index) for member, stages
                 in zip(spares, spare_assignment(sizes, len(spares)), strict=False)
                 for index in stages]
        wanted = len(pairs)
        ready = sum((index, count) in self.warm.get(m.node_id, frozenset())
                    for m, index in pairs)
        # roles warm already, or being preloaded by another call (a spare joined while
        # a warming was under way), are not asked for again
        todo = [(m, index) for m, index in pairs
                if (index, count) not in self.warm.get(m.node_id, frozenset())
                and (m.node_id, index, count) not in self._inflight]
        if not todo:
            return ready, wanted
        me = NodeId(self._options.identity.node_id)
        pool = await Pool.open(replace(self._options, nodes=tuple(
            {m.node_id: m for m, _ in todo}.values())), plan.run_id, self._offered(plan))
        try:
            await pool.introduce()  # the spares learn where the offered model is served
        except Exception as error:
            await pool.close()
            for member, index in todo:
                self._failed(me, member, plan, index, str(error))
            return ready, wanted

        async def preload(member: PoolMember, index: int) -> int:
            key = (member.node_id, index, count)
            self._inflight.add(key)
            try:
                return await self._preload_one(pool, me, plan, member, index)
            finally:
                self._inflight.discard(key)

        async def each(member: PoolMember, indices: list[int]) -> int:
            done = 0
            for index in indices:  # one spare's roles one after another
                done += await preload(member, index)
            return done

        by_spare: dict[NodeId, tuple[PoolMember, list[int]]] = {}
        for member, index in todo:
            by_spare.setdefault(member.node_id, (member, []))[1].append(index)
        try:
            done = await asyncio.gather(*(each(m, indices)
                                          for m, indices in by_spare.values()))
        finally:
            await pool.close()
        return ready + sum(done), wanted

    def _offered(self, plan: RunPlan) -> OfferedFile | None:
        """The model file when the plan's stages fetch it from this orchestrator (a
        PoolPeer source, `--offer-model`): the preload's endpoint serves it as the run's
        does (`offer_file` hashed it once already for the run's plan)."""
        from swactor.model.fetch import offer_file
        from swactor.wire.enums import GgufSourceKind

        if not any(s.gguf_source.kind is GgufSourceKind.PoolPeer for s in plan.stages):
            return None
        return offer_file(Path(self._options.model))

    def _failed(self, me: NodeId, member: PoolMember, plan: RunPlan, index: int,
                why: str) -> None:
        stage = plan.stages[index]
        layers = f"{stage.layer_start}-{stage.layer_end_exclusive - 1}"
        log.warning("spare %#x: stage %d not preloaded: %s", int(member.node_id), index, why)
        self._emit(SparePreloadFailed(node_id=me, detail={
            "spare": int(member.node_id), "stage_index": index, "layers": layers,
            "why": why}))

    async def _preload_one(self, pool: Pool, me: NodeId, plan: RunPlan, member: PoolMember,
                           index: int) -> int:
        """Ask `member` to preload stage `index` of the run's plan; 1 when it did."""
        from swactor.orchestrator.planner import stage_runtime_facts
        from swactor.transport.run_control import PreloadStage, StagePreloaded
        from swactor.wire.provision import provision_stage

        count = len(plan.stages)
        provision = provision_stage(plan, index, stage_runtime_facts(plan, index))
        stage = plan.stages[index]
        layers = f"{stage.layer_start}-{stage.layer_end_exclusive - 1}"
        started = time.monotonic()
        try:
            answer = await pool.control.request(
                int(member.node_id), PreloadStage(provision), timeout=PRELOAD_TIMEOUT_S)
            if not isinstance(answer, StagePreloaded):
                raise RuntimeError(f"answered {type(answer).__name__}")
            if not answer.ok:
                raise RuntimeError(answer.detail or "refused")
        except asyncio.CancelledError:
            raise
        except Exception as error:
            self._failed(me, member, plan, index, str(error).strip() or type(error).__name__)
            return 0
        self.warm[member.node_id] = self.warm.get(member.node_id, frozenset()) | {
            (index, count)}
        self._emit(SparePreloaded(node_id=me, run_id=plan.run_id, detail={
            "spare": int(member.node_id), "stage_index": index, "layers": layers,
            "seconds": round(time.monotonic() - started, 3),
            "reused": bool(answer.footprint is not None and answer.footprint.reused)}))
        return 1

    def _emit(self, event: SparePreloaded | SparePreloadFailed) -> None:
        if self._emitter is not None:
            self._emitter.emit(event)
