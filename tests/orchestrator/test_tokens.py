"""Token object payloads: u32 little endian, checked against the edge's ObjectSpec."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swactor.orchestrator.planner import token_object_spec
from swactor.orchestrator.tokens import TokenObjectError, decode_token_ids, encode_token_ids
from swactor.testing.examples import example
from swactor.wire import DTypeFamily, ObjectFailure, ObjectKind, ObjectSpec, RunPlan

PROMPT_SPEC = token_object_spec(8)


def test_known_bytes() -> None:
    assert encode_token_ids([1, 0x01020304], PROMPT_SPEC) == b"\x01\x00\x00\x00\x04\x03\x02\x01"
    assert decode_token_ids(b"\xff\xff\xff\xff", PROMPT_SPEC) == (0xFFFFFFFF,)


@given(st.lists(st.integers(0, 0xFFFFFFFF), max_size=8))
def test_round_trip(ids: list[int]) -> None:
    assert decode_token_ids(encode_token_ids(ids, PROMPT_SPEC), PROMPT_SPEC) == tuple(ids)


def test_too_many_ids() -> None:
    with pytest.raises(TokenObjectError) as info:
        encode_token_ids(list(range(9)), PROMPT_SPEC)
    assert info.value.reason is ObjectFailure.ExtentExceedsMax
    with pytest.raises(TokenObjectError) as info:
        decode_token_ids(bytes(36), PROMPT_SPEC)
    assert info.value.reason is ObjectFailure.ExtentExceedsMax


def test_partial_id_is_an_alignment_failure() -> None:
    with pytest.raises(TokenObjectError) as info:
        decode_token_ids(bytes(6), PROMPT_SPEC)
    assert info.value.reason is ObjectFailure.ExtentAlignmentInvalid
    assert "6 bytes" in str(info.value)


@pytest.mark.parametrize("bad", [-1, 1 << 32])
def test_id_outside_u32(bad: int) -> None:
    with pytest.raises(TokenObjectError, match="position 1 is not a u32"):
        encode_token_ids([5, bad], PROMPT_SPEC)


def test_activation_edge_is_refused() -> None:
    plan = example(RunPlan)
    activation: ObjectSpec = next(
        e.object_spec for e in plan.edges if e.object_spec.kind is ObjectKind.Activation
    )
    assert activation.dtype_family is DTypeFamily.Float
    with pytest.raises(TokenObjectError, match="not u32 token ids"):
        encode_token_ids([1], activation)
