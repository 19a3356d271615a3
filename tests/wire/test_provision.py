"""ProvisionStage rules (spec §12) and the per-edge provision messages (spec §26)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from swactor.testing.examples import example
from swactor.wire import (
    EdgeId,
    EdgeKind,
    InvalidFieldError,
    PlanError,
    PortId,
    ProvisionStage,
    RingDirection,
    RoleId,
    RunPlan,
    SamplingPolicy,
    StageIndex,
    StageModelFacts,
    StageRuntimeFacts,
    WireError,
    provision_rx,
    provision_stage,
    provision_tx,
)

LAST = example(ProvisionStage)  # stage 1 of 2: Activation in, TokenOut out, greedy sampling


def _replace(**changes: object) -> ProvisionStage:
    return dataclasses.replace(LAST, **changes)  # type: ignore[arg-type]


def _first_stage() -> ProvisionStage:
    return _replace(
        stage_index=StageIndex(0),
        inbound=dataclasses.replace(LAST.inbound, kind=EdgeKind.TokenIn),
        outbound=dataclasses.replace(LAST.outbound, kind=EdgeKind.Activation),
        runtime=dataclasses.replace(LAST.runtime, sampling=None),
    )


def test_first_stage_variant_is_valid() -> None:
    stage = _first_stage()
    assert stage.inbound.kind is EdgeKind.TokenIn
    assert ProvisionStage.from_json(stage.to_json()) == stage


CASES: list[tuple[str, Callable[[], ProvisionStage], str, str]] = [
    (
        "index past count",
        lambda: _replace(stage_index=StageIndex(2)),
        "stage_index",
        "2 >= stage_count",
    ),
    ("empty range", lambda: _replace(layer_end_exclusive=3), "layer_end_exclusive", "non-empty"),
    (
        "same edge both ways",
        lambda: _replace(outbound=dataclasses.replace(LAST.outbound, edge_id=EdgeId(2))),
        "outbound.edge_id",
        "must differ from inbound.edge_id",
    ),
    (
        "last stage sends activations",
        lambda: _replace(outbound=dataclasses.replace(LAST.outbound, kind=EdgeKind.Activation)),
        "outbound.kind",
        "stage 1 sends TokenOut",
    ),
    (
        "later stage receives tokens",
        lambda: _replace(inbound=dataclasses.replace(LAST.inbound, kind=EdgeKind.TokenIn)),
        "inbound.kind",
        "stage 1 receives Activation",
    ),
    (
        "last stage without sampling",
        lambda: _replace(runtime=dataclasses.replace(LAST.runtime, sampling=None)),
        "runtime.sampling",
        "the last stage needs a sampling policy",
    ),
    (
        "middle stage samples",
        lambda: dataclasses.replace(
            _first_stage(),
            runtime=dataclasses.replace(LAST.runtime, sampling=SamplingPolicy.greedy()),
        ),
        "runtime.sampling",
        "only the last stage samples",
    ),
]


@pytest.mark.parametrize(("name", "build", "field", "message"), CASES, ids=[c[0] for c in CASES])
def test_provision_stage_rules(
    name: str, build: Callable[[], ProvisionStage], field: str, message: str
) -> None:
    with pytest.raises(PlanError) as info:
        build()
    assert info.value.field == field
    assert message in info.value.rule


def test_facts_rules() -> None:
    with pytest.raises(InvalidFieldError, match=r"StageRuntimeFacts\.output_port"):
        StageRuntimeFacts(LAST.runtime.role_id, PortId(1), PortId(1))
    model: StageModelFacts = LAST.model
    with pytest.raises(WireError, match=r"StageModelFacts\.hidden_dim"):
        dataclasses.replace(model, hidden_dim=0)
    with pytest.raises(WireError, match=r"StageModelFacts\.dtype_width_bytes"):
        dataclasses.replace(model, dtype_width_bytes=5)


def test_derived_messages_from_the_example_plan() -> None:
    plan = example(RunPlan)
    runtime0 = StageRuntimeFacts(RoleId(1), PortId(0), PortId(1))
    first = provision_stage(plan, 0, runtime0)
    assert (first.inbound.kind, first.outbound.kind) == (EdgeKind.TokenIn, EdgeKind.Activation)
    assert (int(first.inbound.edge_id), int(first.outbound.edge_id)) == (1, 2)
    assert first.outbound.consumer_node_id == plan.stages[1].node_id
    assert first.inbound.ring_spec.direction is RingDirection.Ingress
    assert first.outbound.ring_spec.direction is RingDirection.Egress
    assert (first.layer_start, first.layer_end_exclusive) == (0, 3)
    last = provision_stage(
        plan, 1, StageRuntimeFacts(RoleId(2), PortId(0), PortId(1), SamplingPolicy.greedy())
    )
    assert last.outbound.kind is EdgeKind.TokenOut
    assert last.outbound.consumer_node_id == plan.orchestrator_node
    with pytest.raises(PlanError, match="the last stage needs a sampling policy"):
        provision_stage(plan, 1, runtime0)

    activation = plan.edge(2)
    tx, rx = provision_tx(activation), provision_rx(activation)
    assert tx.rx_node_id == plan.stages[1].node_id
    assert tx.ring_spec.direction is RingDirection.Egress
    assert rx.ring_spec.direction is RingDirection.Ingress
    assert (
        tx.ring_spec.data_capacity
        == rx.ring_spec.data_capacity
        == activation.ring_spec.data_capacity
    )
    assert tx.object_spec == rx.object_spec == activation.object_spec
