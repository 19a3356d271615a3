"""Warm spares' planning rules (`swactor.serve.spares`): which ranges each spare
preloads, where the next plan puts the survivors and the spares, and what the warmer
tells a spare (over a fake pool). No nodes; the end-to-end check is
`tests/serve/test_spare_e2e.py` (soak)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, ClassVar, cast

import pytest

from swactor.model.fetch import OfferedFile
from swactor.orchestrator import session
from swactor.orchestrator.ports import RunFault
from swactor.orchestrator.session import PoolMember, SessionOptions, plan_for
from swactor.serve.pipeline import NodeHolds
from swactor.serve.spares import SpareWarmer, place, spare_assignment
from swactor.transport.identity import NodeIdentity
from swactor.transport.run_control import PreloadStage, StagePreloaded
from swactor.wire import NodeId, RunId, StageIndex
from swactor.wire.codec import WireStruct
from swactor.wire.enums import Component, RunFaultReason
from tests.model.tiny_gguf import TinyConfig, write_tiny_gguf

if TYPE_CHECKING:
    from swactor.serve.pipeline import RunEngine

A, B, C, D, E = (NodeId(n) for n in (10, 20, 30, 40, 50))


def test_one_spare_holds_every_range_largest_first() -> None:
    assert spare_assignment([10, 12, 8], 1) == [[1, 0, 2]]


def test_as_many_spares_as_stages_hold_one_distinct_range_each() -> None:
    assert spare_assignment([10, 10, 10], 3) == [[0], [1], [2]]


def test_fewer_spares_share_the_ranges_and_more_spares_double_the_largest() -> None:
    assert spare_assignment([10, 12, 8], 2) == [[1, 2], [0]]
    assert spare_assignment([10, 12], 3) == [[1], [0], [1]]
    assert spare_assignment([10, 12], 0) == []


def test_survivors_keep_their_stage_and_a_warm_spare_takes_the_lost_one() -> None:
    # stage 1's node (B) is lost; E is warm for stage 1 of a 3-stage plan, D for stage 0
    warm = {D: frozenset({(0, 3)}), E: frozenset({(1, 3)})}
    nodes, words = place((A, B, C), (A, C, D, E), warm, 3)
    assert nodes == (A, E, C)
    assert words == [f"stage 1 on spare {int(E):#x}, preloaded"]


def test_a_spare_warm_for_another_range_or_another_plan_size_loads_and_says_so() -> None:
    warm = {D: frozenset({(0, 3), (1, 4)})}
    nodes, words = place((A, B, C), (A, C, D), warm, 3)
    assert nodes == (A, D, C)
    assert words == [f"stage 1 on spare {int(D):#x}, not preloaded for its range: loaded"]


def test_too_few_nodes_for_the_old_shape_or_no_previous_run_plan_afresh() -> None:
    assert place((A, B, C), (C, A), {}, 3) == ((A, C), [])
    assert place((), (E, A, C, B), {}, 3) == ((A, B, C), [])
    assert place((A, B, C), (A, B, C, D), {}, 3) == ((A, B, C), [])  # nothing lost


class _Control:
    """The preload pool's control channel: answers each PreloadStage ok, noting whether
    the pool had sent its AddressBook first."""

    def __init__(self, pool: _PreloadPool) -> None:
        self._pool = pool

    async def request(self, node: int, message: WireStruct, *, timeout: float) -> WireStruct:
        assert isinstance(message, PreloadStage)
        self._pool.asked.append((node, self._pool.introduced))
        return StagePreloaded(message.provision.runtime.role_id, True)


class _PreloadPool:
    """`Pool` as the warmer opens it (one component's fake: no endpoint, no node)."""

    opened: ClassVar[list[_PreloadPool]] = []

    def __init__(self, offered: OfferedFile | None) -> None:
        self.offered = offered
        self.introduced = False
        self.asked: list[tuple[int, bool]] = []
        self.control = _Control(self)

    @classmethod
    async def open(cls, options: SessionOptions, run_id: RunId,
                   offered: OfferedFile | None) -> _PreloadPool:
        pool = cls(offered)
        cls.opened.append(pool)
        return pool

    async def introduce(self) -> None:
        self.introduced = True

    async def close(self) -> None:
        pass


def test_a_spare_preloading_an_offered_model_is_told_where_it_is_served(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With `--offer-model` the stages fetch their ranges from the orchestrator: a spare
    outside the run learns the orchestrator's address only from an AddressBook, so the
    warmer's pool serves the offered file and introduces itself before any PreloadStage
    (as a run's greeting does before provisioning)."""
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", TinyConfig(blocks=2))
    options = SessionOptions(identity=NodeIdentity.generate(), model=gguf, offer_model=True,
                             nodes=(PoolMember(A, "127.0.0.1", 1),
                                    PoolMember(B, "127.0.0.1", 2)), max_seq_len=64)
    planned, offered = plan_for(options, RunId(7), (1, 2, 3), with_stop_ids=False,
                                serving=True)
    assert offered is not None
    spare = PoolMember(C, "127.0.0.1", 3)
    run = SimpleNamespace(plan=planned.plan, stage_nodes=(A, B))
    monkeypatch.setattr(session, "Pool", _PreloadPool)
    warmer = SpareWarmer(1, options, lambda _busy: (spare,))

    ready, wanted = asyncio.run(warmer(cast("RunEngine", run)))

    assert (ready, wanted) == (2, 2)
    [pool] = _PreloadPool.opened
    assert pool.offered is not None and pool.offered.sha256 == offered.sha256
    assert pool.asked == [(int(C), True), (int(C), True)]


def test_a_node_that_faulted_a_run_yields_its_stage_to_an_idle_node() -> None:
    # B's worker crashed (the run's fault named it) but B is still usable; D is idle
    assert place((A, B, C), (A, B, C, D), {}, 3, frozenset({B})) == (
        (A, D, C), ["stage 1 on spare 0x28, not preloaded for its range: loaded"])
    # a spare warm for the stage is preferred; the faulted node is never "warm" for it
    warm = {B: frozenset({(1, 3)}), E: frozenset({(1, 3)})}
    assert place((A, B, C), (A, B, C, D, E), warm, 3, frozenset({B}))[0] == (A, E, C)


def test_a_faulted_node_is_tried_again_only_without_an_alternative() -> None:
    assert place((A, B, C), (A, B, C), {}, 3, frozenset({B})) == ((A, B, C), [])
    # two faulted nodes, one idle node: the lower stage's node moves, the other stays
    assert place((A, B, C), (A, B, C, D), {}, 3, frozenset({B, C}))[0] == (A, D, C)
    # a new shape (no previous run) takes the nodes that did not fault first
    assert place((), (A, B, C, D), {}, 3, frozenset({B})) == ((A, C, D), [])


def test_the_session_ledger_records_the_node_a_run_fault_names() -> None:
    holds = NodeHolds()
    # the worker of stage 1 crashed: the fault names the stage, not the node
    holds.fault((A, B, C), RunFault(RunFaultReason.WorkerCrashed, Component.StageController,
                                    stage_index=StageIndex(1)))
    assert holds.faulted == frozenset({B})
    holds.fault((A, D, C), RunFault(RunFaultReason.WorkerCrashed, Component.Orchestrator,
                                    node_id=C))
    assert holds.faulted == frozenset({B, C})
    holds.fault((A, D, C), RunFault(RunFaultReason.WorkerCrashed, Component.Orchestrator))
    assert holds.faulted == frozenset({B, C})  # names no node: nothing to avoid
    assert place((A, B, C), (A, B, C, D), {}, 3, holds.faulted)[0] == (A, D, C)
