"""Every exported wire dataclass: valid examples, JSON round trip, strict decoding."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import swactor.wire as wire
from swactor.testing.examples import example, example_types, strategy
from swactor.wire import FieldTypeError, JsonShapeError, WireError, WireStruct

EXPORTED_STRUCTS = sorted(
    (v for v in vars(wire).values() if isinstance(v, type) and issubclass(v, WireStruct)),
    key=lambda t: t.__name__,
)
EXPORTED_STRUCTS.remove(WireStruct)


def test_examples_cover_every_exported_struct() -> None:
    assert set(EXPORTED_STRUCTS) == set(example_types())
    assert len(EXPORTED_STRUCTS) >= 33


def test_every_name_in_all_is_importable() -> None:
    for name in wire.__all__:
        assert hasattr(wire, name), name
    assert len(set(wire.__all__)) == len(wire.__all__)


@pytest.mark.parametrize("tp", EXPORTED_STRUCTS, ids=lambda t: t.__name__)
def test_example_is_deterministic_and_round_trips(tp: type[WireStruct]) -> None:
    value = example(tp)
    assert isinstance(value, tp)
    assert example(tp) == value
    text = json.dumps(value.to_json(), allow_nan=False)
    assert tp.from_json(json.loads(text)) == value


@pytest.mark.parametrize("tp", EXPORTED_STRUCTS, ids=lambda t: t.__name__)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_strategy_values_round_trip_through_json_text(tp: type[WireStruct], data: Any) -> None:
    value = data.draw(strategy(tp))
    assert isinstance(value, tp)
    text = json.dumps(value.to_json(), allow_nan=False)
    decoded = tp.from_json(json.loads(text))
    assert decoded == value
    assert decoded.to_json() == value.to_json()


@pytest.mark.parametrize("tp", EXPORTED_STRUCTS, ids=lambda t: t.__name__)
def test_unknown_and_missing_keys_rejected(tp: type[WireStruct]) -> None:
    document = example(tp).to_json()
    with pytest.raises(JsonShapeError, match=r"unknown keys \['surplus'\]"):
        tp.from_json({**document, "surplus": 1})
    first = next(iter(document))
    partial = {k: v for k, v in document.items() if k != first}
    with pytest.raises(JsonShapeError, match=rf"missing keys \['{first}'\]"):
        tp.from_json(partial)
    with pytest.raises(JsonShapeError, match="expected a JSON object, got list"):
        tp.from_json([document])


@pytest.mark.parametrize("tp", EXPORTED_STRUCTS, ids=lambda t: t.__name__)
def test_wrong_value_kinds_rejected_naming_the_field(tp: type[WireStruct]) -> None:
    document = example(tp).to_json()
    for key in document:
        with pytest.raises(WireError) as info:
            tp.from_json({**document, key: b"\x00bytes"})
        assert key in str(info.value)
        assert "\\x00" not in str(info.value)


def test_enum_value_must_be_a_member_name() -> None:
    document = example(wire.RingSpec).to_json()
    with pytest.raises(wire.InvalidFieldError, match=r"RingSpec\.direction: 'Sideways' is not"):
        wire.RingSpec.from_json({**document, "direction": "Sideways"})
    with pytest.raises(FieldTypeError, match=r"RingSpec\.direction: expected a RingDirection"):
        wire.RingSpec.from_json({**document, "direction": 0})


def test_bool_is_not_an_int_and_floats_are_finite() -> None:
    document = example(wire.RingSpec).to_json()
    with pytest.raises(FieldTypeError, match=r"RingSpec\.data_capacity: expected int, got bool"):
        wire.RingSpec.from_json({**document, "data_capacity": True})
    policy = wire.SamplingPolicy.temperature_sampling(0.5, seed=3).to_json()
    with pytest.raises(wire.InvalidFieldError, match="finite"):
        wire.SamplingPolicy.from_json({**policy, "temperature": float("inf")})
    assert wire.SamplingPolicy.from_json({**policy, "temperature": 1}).temperature == 1.0


def test_nested_errors_name_the_inner_type() -> None:
    document = example(wire.EdgePlan).to_json()
    spec = dict(document["object_spec"])  # type: ignore[arg-type]
    spec["alignment"] = 3
    with pytest.raises(wire.InvalidFieldError, match=r"^ObjectSpec\.alignment"):
        wire.EdgePlan.from_json({**document, "object_spec": spec})


def test_tuple_fields_accept_lists_and_freeze() -> None:
    prompt = wire.PromptSource(wire.PromptKind.TokenIds, token_ids=[1, 2])  # type: ignore[arg-type]
    assert prompt.token_ids == (1, 2)
    hash(example(wire.RunPlan))


@pytest.mark.parametrize("tp", EXPORTED_STRUCTS, ids=lambda t: t.__name__)
def test_pickle_and_deepcopy_keep_types(tp: type[WireStruct]) -> None:
    import copy
    import pickle

    value = example(tp)
    assert pickle.loads(pickle.dumps(value)) == value
    assert copy.deepcopy(value) == value
    edge = pickle.loads(pickle.dumps(wire.EdgeId(5)))
    assert type(edge) is wire.EdgeId


def _paths(node: object, prefix: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    found: list[tuple[object, ...]] = [prefix]
    if isinstance(node, dict):
        for key, child in node.items():
            found += _paths(child, (*prefix, key))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            found += _paths(child, (*prefix, index))
    return found


def _replace_at(node: Any, path: tuple[object, ...], value: object) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(node, dict):
        return {k: (_replace_at(v, rest, value) if k == head else v) for k, v in node.items()}
    return [_replace_at(v, rest, value) if i == head else v for i, v in enumerate(node)]


JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=8)
    | st.lists(st.integers(), max_size=3)
    | st.dictionaries(st.text(max_size=4), st.integers(), max_size=2)
)


@pytest.mark.parametrize("tp", EXPORTED_STRUCTS, ids=lambda t: t.__name__)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_mutated_documents_only_raise_wire_errors(tp: type[WireStruct], data: Any) -> None:
    document = example(tp).to_json()
    path = data.draw(st.sampled_from(_paths(document)))
    mutated = _replace_at(document, path, data.draw(JSON_LEAVES))
    try:
        decoded = tp.from_json(mutated)
    except WireError:
        return
    assert isinstance(decoded, tp)
