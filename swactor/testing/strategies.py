"""Hypothesis strategies of valid wire values (used through `examples.strategy`).

Theory of operation
-------------------
Each strategy draws values that satisfy the type's rules by construction rather than
by filtering, so that Hypothesis never gives up on a type with many rules. Hypothesis
is imported at module import time here; `examples.strategy` imports this module lazily.
"""

from __future__ import annotations

import enum
import string
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from swactor import wire
from swactor.wire.codec import JsonValue

u32 = st.integers(0, wire.U32_MAX)
u64 = st.integers(0, wire.U64_MAX)


def ident(tp: type[wire.Identifier]) -> st.SearchStrategy[Any]:
    return st.integers(0, tp.MAX).map(tp)


def json_values() -> st.SearchStrategy[JsonValue]:
    scalars: st.SearchStrategy[JsonValue] = (
        st.none()
        | st.booleans()
        | st.integers(-(1 << 63), wire.U64_MAX)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=20)
    )
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=10,
    )


def json_objects() -> st.SearchStrategy[JsonValue]:
    return st.dictionaries(st.text(max_size=8), json_values(), max_size=4)


@st.composite
def object_specs(draw: st.DrawFn, kind: wire.ObjectKind | None = None) -> wire.ObjectSpec:
    family = draw(st.sampled_from(wire.DTypeFamily))
    width = draw(st.sampled_from(sorted(wire.DTYPE_WIDTHS[family])))
    shape = draw(st.sampled_from(wire.ShapeRule))
    alignment = width if shape is wire.ShapeRule.Vector else width * draw(st.integers(1, 4096))
    return wire.ObjectSpec(
        kind=kind if kind is not None else draw(st.sampled_from(wire.ObjectKind)),
        max_extent=alignment * draw(st.integers(1, 1 << 30)),
        dtype_family=family,
        dtype_width_bytes=width,
        shape=shape,
        layout=draw(st.sampled_from(wire.LayoutRule)),
        alignment=alignment,
        sequence_policy=draw(st.sampled_from(wire.SequencePolicy)),
    )


def token_specs() -> st.SearchStrategy[wire.ObjectSpec]:
    return st.builds(
        lambda n, layout, policy: wire.ObjectSpec(
            wire.ObjectKind.TokenIds,
            4 * n,
            wire.DTypeFamily.UInt,
            4,
            wire.ShapeRule.Vector,
            layout,
            4,
            policy,
        ),
        st.integers(1, 1 << 20),
        st.sampled_from(wire.LayoutRule),
        st.sampled_from(wire.SequencePolicy),
    )


@st.composite
def ring_specs(draw: st.DrawFn) -> wire.RingSpec:
    alignment = 1 << draw(st.integers(6, 21))
    return wire.RingSpec(
        data_capacity=alignment * draw(st.integers(1, 1 << 20)),
        alignment=alignment,
        direction=draw(st.sampled_from(wire.RingDirection)),
        host_pinning=draw(st.sampled_from(wire.HostPinning)),
        wake_coalescing=draw(st.sampled_from(wire.WakeCoalescing)),
    )


@st.composite
def ring_layouts(draw: st.DrawFn, ring_id: wire.RingId | None = None) -> wire.RingLayout:
    alignment = 1 << draw(st.integers(6, 21))
    arena_offset = 64 * draw(st.integers(0, 1 << 30))
    header_offset = arena_offset + 64 * draw(st.integers(0, 64))
    header_end = header_offset + wire.RING_HEADER_BYTES
    data_offset = -(-header_end // alignment) * alignment + alignment * draw(st.integers(0, 4))
    capacity = alignment * draw(st.integers(1, 1 << 16))
    slack = draw(st.integers(0, 1 << 20))
    return wire.RingLayout(
        ring_id=ring_id if ring_id is not None else draw(ident(wire.RingId)),
        arena_offset=arena_offset,
        total_len=data_offset + capacity - arena_offset + slack,
        header_offset=header_offset,
        data_offset=data_offset,
        data_capacity=capacity,
        alignment=alignment,
    )


_SAFE = string.ascii_letters + string.digits + "._-"


@st.composite
def gguf_sources(draw: st.DrawFn) -> wire.GgufSource:
    kind = draw(st.sampled_from(wire.GgufSourceKind))
    name = draw(st.text(_SAFE, min_size=1, max_size=30))
    if kind is wire.GgufSourceKind.LocalPath:
        location = "/models/" + name
    elif kind is wire.GgufSourceKind.HttpUrl:
        location = draw(st.sampled_from(["http", "https"])) + "://host.example:8080/" + name
    elif kind is wire.GgufSourceKind.PoolPeer:
        peer = draw(st.integers(min_value=0, max_value=(1 << 64) - 1))
        location = f"{peer:016x}:" + draw(st.binary(min_size=32, max_size=32)).hex()
    else:
        location = "m" + name
    sha = draw(st.none() | st.binary(min_size=32, max_size=32).map(bytes.hex))
    if kind is wire.GgufSourceKind.PoolPeer and sha is None:
        sha = "0" * 64
    return wire.GgufSource(kind, location, sha)


def tokenizer_sources() -> st.SearchStrategy[wire.TokenizerSource]:
    return st.just(wire.TokenizerSource(wire.TokenizerSourceKind.GgufEmbedded)) | st.text(
        _SAFE, min_size=1, max_size=20
    ).map(lambda p: wire.TokenizerSource(wire.TokenizerSourceKind.LocalPath, "/tok/" + p))


@st.composite
def models(draw: st.DrawFn, num_layers: int | None = None) -> wire.GgufModelPlan:
    family = draw(st.sampled_from([wire.DTypeFamily.Float, wire.DTypeFamily.BFloat]))
    return wire.GgufModelPlan(
        model_id=draw(st.text(_SAFE, min_size=1, max_size=40)),
        gguf_source=draw(gguf_sources()),
        num_layers=num_layers if num_layers is not None else draw(st.integers(1, 512)),
        hidden_dim=draw(st.integers(1, 1 << 14)),
        dtype_family=family,
        dtype_width_bytes=draw(st.sampled_from(sorted(wire.DTYPE_WIDTHS[family]))),
        max_seq_len=draw(st.integers(1, 1 << 17)),
        eos_token_id=draw(u32),
        tokenizer=draw(tokenizer_sources()),
    )


def sampling_policies() -> st.SearchStrategy[wire.SamplingPolicy]:
    return st.just(wire.SamplingPolicy(wire.SamplingMode.Greedy)) | st.builds(
        lambda t, k, p, s: wire.SamplingPolicy(wire.SamplingMode.Temperature, t, k, p, s),
        st.floats(0.01, 100.0),
        u32,
        st.floats(0.01, 1.0),
        u64,
    )


def prompts() -> st.SearchStrategy[wire.PromptSource]:
    return st.text(min_size=1, max_size=50).map(
        lambda t: wire.PromptSource(wire.PromptKind.Text, text=t)
    ) | st.lists(u32, min_size=1, max_size=20).map(
        lambda ids: wire.PromptSource(wire.PromptKind.TokenIds, token_ids=tuple(ids))
    )


def runtimes() -> st.SearchStrategy[wire.RuntimePlan]:
    return st.builds(
        wire.RuntimePlan, prompts(), sampling_policies(), _from(wire.TokenOutputPolicy)
    )


@st.composite
def stage_plans(draw: st.DrawFn) -> wire.StagePlan:
    count = draw(st.integers(1, 64))
    start = draw(st.integers(0, 1000))
    inbound, outbound = draw(st.lists(ident(wire.EdgeId), min_size=2, max_size=2, unique=True))
    return wire.StagePlan(
        run_id=draw(ident(wire.RunId)),
        stage_index=wire.StageIndex(draw(st.integers(0, count - 1))),
        stage_count=count,
        node_id=draw(ident(wire.NodeId)),
        gguf_source=draw(gguf_sources()),
        layer_start=start,
        layer_end_exclusive=start + draw(st.integers(1, 100)),
        inbound_edge=inbound,
        outbound_edge=outbound,
    )


def edge_endpoints() -> st.SearchStrategy[wire.EdgeEndpoint]:
    return st.builds(wire.EdgeEndpoint.orchestrator, u64) | st.builds(
        wire.EdgeEndpoint.stage, u64, u32
    )


@st.composite
def edge_plans(draw: st.DrawFn) -> wire.EdgePlan:
    producer, consumer = draw(st.lists(edge_endpoints(), min_size=2, max_size=2, unique=True))
    return wire.EdgePlan(
        run_id=draw(ident(wire.RunId)),
        edge_id=draw(ident(wire.EdgeId)),
        kind=draw(st.sampled_from(wire.EdgeKind)),
        producer=producer,
        consumer=consumer,
        object_spec=draw(object_specs()),
        ring_spec=draw(ring_specs()),
    )


@st.composite
def run_plans(draw: st.DrawFn) -> wire.RunPlan:
    count = draw(st.integers(1, 4))
    num_layers = draw(st.integers(count, 64))
    cuts = (
        sorted(
            draw(st.sets(st.integers(1, num_layers - 1), min_size=count - 1, max_size=count - 1))
        )
        if count > 1
        else []
    )
    bounds = [0, *cuts, num_layers]
    model = draw(models(num_layers=num_layers))
    run_id = draw(ident(wire.RunId))
    nodes = draw(st.lists(ident(wire.NodeId), min_size=count + 1, max_size=count + 1))
    orch = wire.EdgeEndpoint.orchestrator(nodes[count])
    stages_at = [wire.EdgeEndpoint.stage(nodes[i], i) for i in range(count)]
    edge_ids = draw(
        st.lists(ident(wire.EdgeId), min_size=count + 1, max_size=count + 1, unique=True)
    )
    act_spec = wire.ObjectSpec(
        wire.ObjectKind.Activation,
        model.activation_max_extent,
        model.dtype_family,
        model.dtype_width_bytes,
        wire.ShapeRule.Rows,
        draw(st.sampled_from(wire.LayoutRule)),
        model.hidden_dim * model.dtype_width_bytes,
        draw(st.sampled_from(wire.SequencePolicy)),
    )
    ring = draw(ring_specs())
    edges = [
        wire.EdgePlan(
            run_id,
            edge_ids[0],
            wire.EdgeKind.TokenIn,
            orch,
            stages_at[0],
            draw(token_specs()),
            ring,
        )
    ]
    for i in range(count - 1):
        edges.append(
            wire.EdgePlan(
                run_id,
                edge_ids[i + 1],
                wire.EdgeKind.Activation,
                stages_at[i],
                stages_at[i + 1],
                act_spec,
                ring,
            )
        )
    edges.append(
        wire.EdgePlan(
            run_id,
            edge_ids[count],
            wire.EdgeKind.TokenOut,
            stages_at[-1],
            orch,
            draw(token_specs()),
            ring,
        )
    )
    stages = tuple(
        wire.StagePlan(
            run_id,
            wire.StageIndex(i),
            count,
            nodes[i],
            model.gguf_source,
            bounds[i],
            bounds[i + 1],
            edge_ids[i],
            edge_ids[i + 1],
        )
        for i in range(count)
    )
    edges_drawn = draw(st.permutations(edges))
    return wire.RunPlan(
        run_id=run_id,
        model=model,
        runtime=draw(runtimes()),
        stages=stages,
        edges=tuple(edges_drawn),
        max_tokens=draw(st.integers(1, model.max_seq_len)),
    )


@st.composite
def stage_model_facts(draw: st.DrawFn) -> wire.StageModelFacts:
    model = draw(models(num_layers=1))
    return wire.StageModelFacts(
        model.model_id,
        model.hidden_dim,
        model.dtype_family,
        model.dtype_width_bytes,
        model.max_seq_len,
    )


@st.composite
def stage_runtime_facts(draw: st.DrawFn, sampling: bool | None = None) -> wire.StageRuntimeFacts:
    ports = draw(st.lists(ident(wire.PortId), min_size=2, max_size=2, unique=True))
    wants = draw(st.booleans()) if sampling is None else sampling
    policy = draw(sampling_policies()) if wants else None
    return wire.StageRuntimeFacts(draw(ident(wire.RoleId)), ports[0], ports[1], policy)


def footprints() -> st.SearchStrategy[wire.StageFootprint]:
    u64 = st.integers(0, (1 << 64) - 1)
    return st.builds(wire.StageFootprint, u64, u64, u64, u64)


@st.composite
def provision_stages(draw: st.DrawFn) -> wire.ProvisionStage:
    count = draw(st.integers(1, 16))
    index = draw(st.integers(0, count - 1))
    start = draw(st.integers(0, 1000))
    ids = draw(st.lists(ident(wire.EdgeId), min_size=2, max_size=2, unique=True))
    in_kind = wire.EdgeKind.TokenIn if index == 0 else wire.EdgeKind.Activation
    out_kind = wire.EdgeKind.TokenOut if index == count - 1 else wire.EdgeKind.Activation
    return wire.ProvisionStage(
        run_id=draw(ident(wire.RunId)),
        stage_index=wire.StageIndex(index),
        stage_count=count,
        gguf_source=draw(gguf_sources()),
        layer_start=start,
        layer_end_exclusive=start + draw(st.integers(1, 100)),
        inbound=wire.InboundEdgeProvision(
            ids[0], in_kind, draw(ident(wire.NodeId)), draw(object_specs()), draw(ring_specs())
        ),
        outbound=wire.OutboundEdgeProvision(
            ids[1], out_kind, draw(ident(wire.NodeId)), draw(object_specs()), draw(ring_specs())
        ),
        model=draw(stage_model_facts()),
        runtime=draw(stage_runtime_facts(sampling=index == count - 1)),
    )


def step_records() -> st.SearchStrategy[wire.StepRecord]:
    return st.builds(wire.StepRecord, ident(wire.Sequence), ident(wire.ObjectId), u64,
                     ident(wire.ObjectId), u64, u64, u64, u64, u64)


def handles() -> st.SearchStrategy[wire.DeviceObjectHandle]:
    return st.builds(wire.DeviceObjectHandle, ident(wire.WorkerGeneration), u64)


@st.composite
def install_rings(draw: st.DrawFn) -> wire.InstallRing:
    ring_id = draw(ident(wire.RingId))
    return wire.InstallRing(
        ring_id,
        draw(ident(wire.EdgeId)),
        draw(ident(wire.PortId)),
        draw(st.sampled_from(wire.RingDirection)),
        draw(ring_layouts(ring_id=ring_id)),
        draw(object_specs()),
    )


def _from(tp: type[Any]) -> st.SearchStrategy[Any]:
    return strategy_for(tp)


def _builders() -> dict[type, Callable[[], st.SearchStrategy[Any]]]:
    return {
        wire.DeviceObjectHandle: handles,
        wire.GgufSource: gguf_sources,
        wire.TokenizerSource: tokenizer_sources,
        wire.GgufModelPlan: models,
        wire.SamplingPolicy: sampling_policies,
        wire.TokenOutputPolicy: lambda: st.builds(
            wire.TokenOutputPolicy, st.sampled_from(wire.TokenOutputMode), st.booleans()
        ),
        wire.PromptSource: prompts,
        wire.RuntimePlan: runtimes,
        wire.StagePlan: stage_plans,
        wire.EdgeEndpoint: edge_endpoints,
        wire.EdgePlan: edge_plans,
        wire.RunPlan: run_plans,
        wire.ObjectSpec: object_specs,
        wire.ObjectHeader: lambda: st.builds(
            wire.ObjectHeader, ident(wire.ObjectId), ident(wire.Sequence), u64, u32
        ),
        wire.EdgePreamble: lambda: st.builds(wire.EdgePreamble, ident(wire.EdgeId)),
        wire.RingSpec: ring_specs,
        wire.RingLayout: ring_layouts,
        wire.QuiescenceProof: lambda: st.builds(
            wire.QuiescenceProof, ident(wire.RingId), st.sampled_from(wire.QuiescenceProofKind)
        ),
        wire.InboundEdgeProvision: lambda: st.builds(
            wire.InboundEdgeProvision,
            ident(wire.EdgeId),
            st.sampled_from(wire.EdgeKind),
            ident(wire.NodeId),
            object_specs(),
            ring_specs(),
        ),
        wire.OutboundEdgeProvision: lambda: st.builds(
            wire.OutboundEdgeProvision,
            ident(wire.EdgeId),
            st.sampled_from(wire.EdgeKind),
            ident(wire.NodeId),
            object_specs(),
            ring_specs(),
        ),
        wire.StageModelFacts: stage_model_facts,
        wire.StageRuntimeFacts: stage_runtime_facts,
        wire.ProvisionStage: provision_stages,
        wire.ProvisionTx: lambda: st.builds(
            wire.ProvisionTx, ident(wire.EdgeId), ident(wire.NodeId), object_specs(), ring_specs()
        ),
        wire.ProvisionRx: lambda: st.builds(
            wire.ProvisionRx, ident(wire.EdgeId), ident(wire.NodeId), object_specs(), ring_specs()
        ),
        wire.InitializeWorker: lambda: st.builds(
            wire.InitializeWorker,
            ident(wire.WorkerGeneration),
            st.integers(1, wire.U64_MAX),
            st.integers(0, (1 << 16) - 1),
            json_values(),
        ),
        wire.ConfigureRole: lambda: st.builds(
            wire.ConfigureRole, ident(wire.RoleId), json_values()
        ),
        wire.InstallRing: install_rings,
        wire.UninstallRing: lambda: st.builds(
            wire.UninstallRing, ident(wire.RingId), st.sampled_from(wire.UninstallReason)
        ),
        wire.OutputBinding: lambda: st.builds(
            wire.OutputBinding,
            ident(wire.PortId),
            ident(wire.RingId),
            ident(wire.ObjectId),
            ident(wire.Sequence),
            u64,
            u32,
            st.booleans(),
        ),
        wire.AwaitedInput: lambda: st.builds(
            wire.AwaitedInput,
            ident(wire.PortId),
            ident(wire.RingId),
            ident(wire.Sequence),
            st.integers(1, (1 << 64) - 1),
        ),
        wire.GrantSteps: lambda: st.builds(
            wire.GrantSteps, ident(wire.RoleId), ident(wire.StepId), _from(wire.AwaitedInput),
            _from(wire.OutputBinding),
        ),
        wire.RevokeSteps: lambda: st.builds(wire.RevokeSteps, ident(wire.RoleId)),
        wire.ShutdownWorker: lambda: st.builds(
            wire.ShutdownWorker, st.sampled_from(wire.ShutdownMode)
        ),
        wire.ReleaseDeviceObject: lambda: st.builds(wire.ReleaseDeviceObject, handles()),
        wire.RingReadable: lambda: st.builds(wire.RingReadable, ident(wire.RingId)),
        wire.RingWritable: lambda: st.builds(wire.RingWritable, ident(wire.RingId)),
        wire.WorkerReady: lambda: st.builds(
            wire.WorkerReady,
            st.integers(1, wire.U32_MAX),
            ident(wire.WorkerGeneration),
            st.integers(0, (1 << 16) - 1),
            json_values(),
        ),
        wire.WorkerFatal: lambda: st.builds(
            wire.WorkerFatal, st.sampled_from(wire.WorkerFatalReason)
        ),
        wire.WorkerStopped: lambda: st.builds(
            wire.WorkerStopped, st.sampled_from(wire.WorkerStoppedReason)
        ),
        wire.StageFootprint: footprints,
        wire.RoleConfigured: lambda: st.builds(
            wire.RoleConfigured, ident(wire.RoleId), st.none() | footprints()
        ),
        wire.RoleFailed: lambda: st.builds(
            wire.RoleFailed, ident(wire.RoleId), st.sampled_from(wire.RoleFailure)
        ),
        wire.RingInstalled: lambda: st.builds(
            wire.RingInstalled, ident(wire.RingId), ident(wire.EdgeId), ident(wire.PortId)
        ),
        wire.RingFault: lambda: st.builds(
            wire.RingFault,
            ident(wire.RingId),
            ident(wire.EdgeId),
            ident(wire.PortId),
            st.sampled_from(wire.RingFaultReason),
        ),
        wire.RingQuiesced: lambda: st.builds(wire.RingQuiesced, ident(wire.RingId)),
        wire.ObjectLoaded: lambda: st.builds(
            wire.ObjectLoaded,
            ident(wire.RingId),
            ident(wire.EdgeId),
            ident(wire.PortId),
            ident(wire.ObjectId),
            ident(wire.Sequence),
            u64,
            handles(),
        ),
        wire.ObjectProduced: lambda: st.builds(
            wire.ObjectProduced,
            ident(wire.RingId),
            ident(wire.EdgeId),
            ident(wire.PortId),
            ident(wire.ObjectId),
            ident(wire.Sequence),
            u64,
        ),
        wire.ObjectFailed: lambda: st.builds(
            wire.ObjectFailed,
            ident(wire.RingId),
            ident(wire.EdgeId),
            ident(wire.PortId),
            st.none() | ident(wire.ObjectId),
            st.none() | ident(wire.Sequence),
            st.sampled_from(wire.ObjectFailure),
        ),
        wire.StepRecord: step_records,
        wire.StepCompleted: lambda: st.builds(
            wire.StepCompleted, ident(wire.RoleId), ident(wire.StepId), step_records(),
        ),
        wire.StepFailed: lambda: st.builds(
            wire.StepFailed,
            ident(wire.RoleId),
            ident(wire.StepId),
            st.sampled_from(wire.StepFailure),
        ),
        wire.DeviceObjectReleased: lambda: st.builds(wire.DeviceObjectReleased, handles()),
        wire.ReleaseFailed: lambda: st.builds(
            wire.ReleaseFailed, handles(), st.sampled_from(wire.ReleaseFailure)
        ),
    }


_BUILDERS: dict[type, Callable[[], st.SearchStrategy[Any]]] = {}


def strategy_for(tp: type[Any]) -> st.SearchStrategy[Any]:
    """The strategy of valid instances of `tp` (see `examples.strategy`)."""
    if isinstance(tp, type) and issubclass(tp, wire.Identifier):
        return ident(tp)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return st.sampled_from(tp)
    if not _BUILDERS:
        _BUILDERS.update(_builders())
    build = _BUILDERS.get(tp)
    if build is None:
        raise KeyError(f"no wire strategy for {tp!r}")
    return build()
