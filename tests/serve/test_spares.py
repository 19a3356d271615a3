"""Warm spares' planning rules (`swactor.serve.spares`): which ranges each spare
preloads, and where the next plan puts the survivors and the spares. Pure functions,
no nodes; the end-to-end check is `tests/serve/test_spare_e2e.py` (soak)."""

from __future__ import annotations

from swactor.serve.spares import place, spare_assignment
from swactor.wire import NodeId

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
