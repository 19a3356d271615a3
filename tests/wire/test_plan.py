"""RunPlan and its parts: each validation rule rejected with its field and message."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from swactor.testing.examples import example
from swactor.wire import (
    DTypeFamily,
    EdgeEndpoint,
    EdgeId,
    EdgeKind,
    EdgePlan,
    GgufModelPlan,
    GgufSource,
    GgufSourceKind,
    InvalidFieldError,
    ObjectKind,
    ObjectSpec,
    PlanError,
    PromptKind,
    PromptSource,
    RunId,
    RunPlan,
    SamplingMode,
    SamplingPolicy,
    StageIndex,
    StagePlan,
    TokenizerSource,
    TokenizerSourceKind,
    WireError,
)

PLAN = example(RunPlan)  # 2 stages over 6 layers: edges 1 (in), 2 (act), 3 (out)
S0, S1 = PLAN.stages
E_IN, E_ACT, E_OUT = PLAN.edges
ORCH = E_IN.producer
N0 = E_IN.consumer
N1 = E_OUT.producer


def _stage(stage: StagePlan, **changes: object) -> StagePlan:
    return dataclasses.replace(stage, **changes)  # type: ignore[arg-type]


def _edge(edge: EdgePlan, **changes: object) -> EdgePlan:
    return dataclasses.replace(edge, **changes)  # type: ignore[arg-type]


def _plan(**changes: object) -> RunPlan:
    return dataclasses.replace(PLAN, **changes)  # type: ignore[arg-type]


def test_example_plan_is_valid_and_queryable() -> None:
    assert PLAN.edge(2) is E_ACT
    assert PLAN.orchestrator_node == ORCH.node_id
    with pytest.raises(KeyError):
        PLAN.edge(99)


CASES: list[tuple[str, Callable[[], RunPlan], str, str]] = [
    ("no stages", lambda: _plan(stages=()), "stages", "at least one stage"),
    ("stages out of order", lambda: _plan(stages=(S1, S0)), "stages[0].stage_index", "is 1, not 0"),
    (
        "stage_count mismatch",
        lambda: _plan(stages=(_stage(S0, stage_count=3), S1)),
        "stages[0].stage_count",
        "is 3, not 2",
    ),
    (
        "stage run id",
        lambda: _plan(stages=(_stage(S0, run_id=RunId(1)), S1)),
        "stages[0].run_id",
        "differs from the plan's run_id",
    ),
    (
        "first range not at 0",
        lambda: _plan(stages=(_stage(S0, layer_start=1), S1)),
        "stages[0].layer_start",
        "1 leaves a gap after the previous range ending at 0",
    ),
    (
        "gap",
        lambda: _plan(stages=(S0, _stage(S1, layer_start=4))),
        "stages[1].layer_start",
        "4 leaves a gap after the previous range ending at 3",
    ),
    (
        "overlap",
        lambda: _plan(stages=(S0, _stage(S1, layer_start=2))),
        "stages[1].layer_start",
        "2 overlaps the previous range ending at 3",
    ),
    (
        "not covering",
        lambda: _plan(stages=(S0, _stage(S1, layer_end_exclusive=5))),
        "stages[1].layer_end_exclusive",
        "ranges cover 0..5, not 0..6",
    ),
    (
        "duplicate edge id",
        lambda: _plan(edges=(E_IN, E_ACT, _edge(E_OUT, edge_id=EdgeId(2)))),
        "edges[2].edge_id",
        "2 is not unique",
    ),
    (
        "edge run id",
        lambda: _plan(edges=(E_IN, _edge(E_ACT, run_id=RunId(8)), E_OUT)),
        "edges[1].run_id",
        "differs from the plan's run_id",
    ),
    (
        "token-in from a stage",
        lambda: _plan(edges=(_edge(E_IN, producer=N1), E_ACT, E_OUT)),
        "edges[0].producer",
        "token-in is produced by the orchestrator",
    ),
    (
        "token-in to stage 1",
        lambda: _plan(edges=(_edge(E_IN, consumer=N1), E_ACT, E_OUT)),
        "edges[0].consumer",
        "token-in is consumed by stage 0",
    ),
    (
        "token-out from stage 0",
        lambda: _plan(edges=(E_IN, E_ACT, _edge(E_OUT, producer=N0))),
        "edges[2].producer",
        "token-out is produced by stage N-1",
    ),
    (
        "token-out to a stage",
        lambda: _plan(edges=(E_IN, E_ACT, _edge(E_OUT, consumer=N0))),
        "edges[2].consumer",
        "token-out is consumed by the orchestrator",
    ),
    (
        "activation backwards",
        lambda: _plan(edges=(E_IN, _edge(E_ACT, producer=N1, consumer=N0), E_OUT)),
        "edges[1].consumer",
        "activation edge i runs from stage i to stage i+1",
    ),
    (
        "activation missing",
        lambda: _plan(edges=(E_IN, E_OUT)),
        "edges",
        "needs 1 Activation edges, has 0",
    ),
    (
        "two token-in edges",
        lambda: _plan(edges=(E_IN, _edge(E_IN, edge_id=EdgeId(9)), E_ACT, E_OUT)),
        "edges",
        "needs exactly one TokenIn edge, has 2",
    ),
    (
        "no token-out edge",
        lambda: _plan(edges=(E_IN, E_ACT)),
        "edges",
        "needs exactly one TokenOut edge, has 0",
    ),
    (
        "endpoint on the wrong node",
        lambda: _plan(edges=(E_IN, _edge(E_ACT, consumer=EdgeEndpoint.stage(555, 1)), E_OUT)),
        "edges[1].consumer.node_id",
        "is not that stage's node",
    ),
    (
        "endpoint on a missing stage",
        lambda: _plan(
            edges=(E_IN, E_ACT, _edge(E_OUT, producer=EdgeEndpoint.stage(N1.node_id, 5)))
        ),
        "edges[2].producer",
        "names a stage that does not exist",
    ),
    (
        "two orchestrator nodes",
        lambda: _plan(edges=(E_IN, E_ACT, _edge(E_OUT, consumer=EdgeEndpoint.orchestrator(999)))),
        "edges",
        "token edges must name one orchestrator node",
    ),
    (
        "stage inbound wiring",
        lambda: _plan(stages=(S0, _stage(S1, inbound_edge=EdgeId(9)))),
        "stages[1].inbound_edge",
        "is not edge 2",
    ),
    (
        "stage outbound wiring",
        lambda: _plan(stages=(_stage(S0, outbound_edge=EdgeId(3)), S1)),
        "stages[0].outbound_edge",
        "is not edge 2",
    ),
    (
        "token edge carrying activations",
        lambda: _plan(edges=(_edge(E_IN, object_spec=E_ACT.object_spec), E_ACT, E_OUT)),
        "edges[0].object_spec",
        "a token edge carries TokenIds objects",
    ),
    (
        "token ids not u32",
        lambda: _plan(
            edges=(
                _edge(
                    E_IN,
                    object_spec=dataclasses.replace(E_IN.object_spec, dtype_family=DTypeFamily.Int),
                ),
                E_ACT,
                E_OUT,
            )
        ),
        "edges[0].object_spec",
        "token ids are UInt width 4",
    ),
    (
        "activation edge carrying tokens",
        lambda: _plan(
            edges=(
                E_IN,
                _edge(
                    E_ACT,
                    object_spec=dataclasses.replace(E_ACT.object_spec, kind=ObjectKind.TokenIds),
                ),
                E_OUT,
            )
        ),
        "edges[1].object_spec.kind",
        "activation edges carry Activation",
    ),
    (
        "activation dtype differs from model",
        lambda: _plan(
            edges=(
                E_IN,
                _edge(
                    E_ACT,
                    object_spec=dataclasses.replace(
                        E_ACT.object_spec, dtype_family=DTypeFamily.BFloat
                    ),
                ),
                E_OUT,
            )
        ),
        "edges[1].object_spec.dtype_family",
        "differs from the model's",
    ),
    (
        "activation max extent",
        lambda: _plan(
            edges=(
                E_IN,
                _edge(E_ACT, object_spec=dataclasses.replace(E_ACT.object_spec, max_extent=128)),
                E_OUT,
            )
        ),
        "edges[1].object_spec.max_extent",
        # example model: max_seq_len 128, hidden_dim 64, width 2
        "is not max_seq_len * hidden_dim * width = 16384",
    ),
    ("max_tokens above max_seq_len", lambda: _plan(max_tokens=129), "max_tokens", "exceeds"),
]


@pytest.mark.parametrize(("name", "build", "field", "message"), CASES, ids=[c[0] for c in CASES])
def test_run_plan_rules(name: str, build: Callable[[], RunPlan], field: str, message: str) -> None:
    with pytest.raises(PlanError) as info:
        build()
    assert info.value.field == field, str(info.value)
    assert message in info.value.rule, str(info.value)
    assert str(info.value).startswith(f"RunPlan.{field}: ")


def test_max_tokens_zero_is_a_field_error() -> None:
    with pytest.raises(InvalidFieldError, match=r"RunPlan\.max_tokens: 0 is outside 1\.\."):
        _plan(max_tokens=0)


def test_single_stage_plan() -> None:
    stage = _stage(S0, stage_count=1, layer_end_exclusive=6, outbound_edge=EdgeId(3))
    out = _edge(E_OUT, producer=N0)
    plan = _plan(stages=(stage,), edges=(out, E_IN))
    assert plan.stages == (stage,)


SHA = "ab" * 32


@pytest.mark.parametrize(
    ("kind", "location", "sha", "field"),
    [
        (GgufSourceKind.LocalPath, "relative/model.gguf", None, "location"),
        (GgufSourceKind.HttpUrl, "ftp://host/model.gguf", None, "location"),
        (GgufSourceKind.HttpUrl, "https:///no-host", None, "location"),
        (GgufSourceKind.CacheKey, "a/b", None, "location"),
        (GgufSourceKind.CacheKey, "", None, "location"),
        (GgufSourceKind.CacheKey, ".hidden", None, "location"),
        (GgufSourceKind.CacheKey, "model.gguf", SHA.upper(), "sha256"),
        (GgufSourceKind.CacheKey, "model.gguf", SHA[:-1], "sha256"),
    ],
)
def test_gguf_source_rules(
    kind: GgufSourceKind, location: str, sha: str | None, field: str
) -> None:
    with pytest.raises(InvalidFieldError) as info:
        GgufSource(kind, location, sha)
    assert info.value.field == field


def test_gguf_source_constructors() -> None:
    assert GgufSource.local_path("/m/x.gguf", SHA).kind is GgufSourceKind.LocalPath
    assert GgufSource.http_url("http://10.0.0.1:8080/x.gguf").kind is GgufSourceKind.HttpUrl
    assert GgufSource.cache_key("x.gguf").to_json() == {
        "kind": "CacheKey",
        "location": "x.gguf",
        "sha256": None,
    }


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: SamplingPolicy(SamplingMode.Greedy, temperature=0.7), "temperature"),
        (lambda: SamplingPolicy(SamplingMode.Greedy, seed=1), "seed"),
        (lambda: SamplingPolicy(SamplingMode.Temperature, 0.7, 0, 1.0, None), "seed"),
        (lambda: SamplingPolicy.temperature_sampling(0.0, seed=1), "temperature"),
        (lambda: SamplingPolicy.temperature_sampling(0.7, seed=1, top_p=0.0), "top_p"),
        (lambda: SamplingPolicy.temperature_sampling(0.7, seed=1, top_p=1.5), "top_p"),
        (lambda: SamplingPolicy.temperature_sampling(0.7, seed=1, top_k=-1), "top_k"),
        (lambda: SamplingPolicy.temperature_sampling(0.7, seed=2**64), "seed"),
        (lambda: SamplingPolicy(SamplingMode.Temperature, float("nan"), 0, 1.0, 1), "temperature"),
        (lambda: PromptSource(PromptKind.Text, text=""), "text"),
        (lambda: PromptSource(PromptKind.Text, text="hi", token_ids=(1,)), "token_ids"),
        (lambda: PromptSource(PromptKind.TokenIds, token_ids=()), "token_ids"),
        (lambda: PromptSource.from_token_ids((1, 2**32)), "token_ids"),
        (lambda: PromptSource(PromptKind.TokenIds, text="x", token_ids=(1,)), "text"),
        (lambda: TokenizerSource(TokenizerSourceKind.GgufEmbedded, "/t.json"), "path"),
        (lambda: TokenizerSource(TokenizerSourceKind.LocalPath), "path"),
        (
            lambda: EdgeEndpoint(EdgeEndpoint.orchestrator(1).kind, ORCH.node_id, StageIndex(0)),
            "stage_index",
        ),
        (lambda: EdgeEndpoint(N0.kind, N0.node_id), "stage_index"),
        (lambda: _edge(E_ACT, consumer=E_ACT.producer), "consumer"),
        (lambda: _stage(S0, stage_index=StageIndex(2)), "stage_index"),
        (lambda: _stage(S0, layer_end_exclusive=0), "layer_end_exclusive"),
        (lambda: _stage(S0, outbound_edge=S0.inbound_edge), "outbound_edge"),
        (lambda: _stage(S0, stage_count=0), "stage_count"),
        (lambda: dataclasses.replace(PLAN.model, model_id=""), "model_id"),
        (lambda: dataclasses.replace(PLAN.model, num_layers=0), "num_layers"),
        (lambda: dataclasses.replace(PLAN.model, dtype_width_bytes=3), "dtype_width_bytes"),
        (lambda: dataclasses.replace(PLAN.model, eos_token_id=-1), "eos_token_id"),
        (lambda: dataclasses.replace(PLAN.model, warm_batch_rows=2), "warm_batch_rows"),
        # the prompt holds a slot of its own: one slot leaves no row beside it
        (lambda: dataclasses.replace(PLAN.model, warm_mixed_rows=1), "warm_mixed_rows"),
        (lambda: dataclasses.replace(PLAN.model, slots=4, warm_mixed_rows=4),
         "warm_mixed_rows"),
    ],
)
def test_part_rules(build: Callable[[], object], field: str) -> None:
    with pytest.raises(WireError) as info:
        build()
    assert info.value.field == field, str(info.value)


def test_activation_max_extent() -> None:
    model: GgufModelPlan = PLAN.model
    assert model.activation_max_extent == 128 * 64 * 2


def test_edge_plan_rejects_wrong_nested_type() -> None:
    with pytest.raises(
        WireError, match=r"EdgePlan\.object_spec: expected ObjectSpec, got RingSpec"
    ):
        _edge(E_ACT, object_spec=E_ACT.ring_spec)
    assert isinstance(E_ACT.object_spec, ObjectSpec)
    assert E_ACT.kind is EdgeKind.Activation
