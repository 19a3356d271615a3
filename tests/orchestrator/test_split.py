"""Layer splits: explicit splits are checked, proportional splits follow node memory."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swactor.orchestrator.errors import PlannerError, PlanProblem
from swactor.orchestrator.split import explicit_split, proportional_split, ranges


def test_equal_memory_splits_evenly() -> None:
    assert proportional_split([8, 8, 8], 30) == (10, 10, 10)


def test_double_memory_gets_double_blocks() -> None:
    # quotas 15, 7.5, 7.5: the half block left over goes to the lower index
    assert proportional_split([2, 1, 1], 30) == (15, 8, 7)


def test_tiny_node_still_gets_one_block() -> None:
    # quotas 0.001.., 4.99..: the tiny node is raised to 1, the big one gives it up
    assert proportional_split([1, 4999], 6) == (1, 5)


def test_more_stages_than_blocks_is_rejected() -> None:
    with pytest.raises(PlannerError) as info:
        proportional_split([1] * 7, 6)
    assert info.value.reason is PlanProblem.TooManyStages
    assert "7 stages" in str(info.value) and "6 blocks" in str(info.value)


def test_zero_weight_is_rejected() -> None:
    with pytest.raises(PlannerError) as info:
        proportional_split([4, 0], 6)
    assert info.value.reason is PlanProblem.ZeroMemoryNode


@given(
    weights=st.lists(st.integers(1, 1 << 40), min_size=1, max_size=12),
    extra=st.integers(0, 200),
)
def test_proportional_split_properties(weights: list[int], extra: int) -> None:
    blocks = len(weights) + extra
    counts = proportional_split(weights, blocks)
    assert len(counts) == len(weights)
    assert sum(counts) == blocks
    assert min(counts) >= 1
    total = sum(weights)
    quotas = [Fraction(blocks * w, total) for w in weights]
    if all(q >= 1 for q in quotas):
        # largest remainder: nobody is more than one block from its exact share
        assert all(abs(c - q) < 1 for c, q in zip(counts, quotas, strict=True))
    # more memory never means fewer blocks
    for i in range(len(weights)):
        for j in range(len(weights)):
            if weights[i] > weights[j]:
                assert counts[i] >= counts[j]


def test_ranges_are_contiguous() -> None:
    assert ranges((3, 1, 2)) == ((0, 3), (3, 4), (4, 6))


def test_explicit_split_accepted() -> None:
    assert explicit_split([10, 10, 10], 30, 3) == (10, 10, 10)


@pytest.mark.parametrize(
    ("counts", "nodes", "problem", "words"),
    [
        ([10, 10, 11], 3, PlanProblem.SplitSumMismatch, "sums to 31"),
        ([10, 20], 3, PlanProblem.SplitNodeCountMismatch, "2 stages but the pool has 3"),
        ([30, 0, 0], 3, PlanProblem.SplitInvalid, "at least 1"),
        ([], 0, PlanProblem.SplitInvalid, "empty"),
    ],
)
def test_explicit_split_rejected(
    counts: list[int], nodes: int, problem: PlanProblem, words: str
) -> None:
    with pytest.raises(PlannerError) as info:
        explicit_split(counts, 30, nodes)
    assert info.value.reason is problem
    assert words in str(info.value)
