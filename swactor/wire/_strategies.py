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

from swactor.wire.codec import JsonValue
from swactor.wire.enums import (
    DTYPE_WIDTHS,
    DTypeFamily,
    EdgeKind,
    GgufSourceKind,
    HostPinning,
    LayoutRule,
    ObjectFailure,
    ObjectKind,
    PromptKind,
    QuiescenceProofKind,
    ReleaseFailure,
    RingDirection,
    RingFaultReason,
    RoleFailure,
    SamplingMode,
    SequencePolicy,
    ShapeRule,
    ShutdownMode,
    StepFailure,
    TokenizerSourceKind,
    TokenOutputMode,
    UninstallReason,
    WakeCoalescing,
    WorkerFatalReason,
    WorkerStoppedReason,
)
from swactor.wire.ids import (
    U32_MAX,
    U64_MAX,
    DeviceObjectHandle,
    EdgeId,
    Identifier,
    NodeId,
    ObjectId,
    PortId,
    RingId,
    RoleId,
    RunId,
    Sequence,
    StageIndex,
    StepId,
    WorkerGeneration,
)
from swactor.wire.objects import EdgePreamble, ObjectHeader, ObjectSpec
from swactor.wire.plan import (
    EdgeEndpoint,
    EdgePlan,
    GgufModelPlan,
    GgufSource,
    PromptSource,
    RunPlan,
    RuntimePlan,
    SamplingPolicy,
    StagePlan,
    TokenizerSource,
    TokenOutputPolicy,
)
from swactor.wire.provision import (
    InboundEdgeProvision,
    OutboundEdgeProvision,
    ProvisionRx,
    ProvisionStage,
    ProvisionTx,
    StageModelFacts,
    StageRuntimeFacts,
)
from swactor.wire.rings import RING_HEADER_BYTES, QuiescenceProof, RingLayout, RingSpec
from swactor.wire.worker import (
    ConfigureRole,
    ExecuteStep,
    InitializeWorker,
    InputBinding,
    InstallRing,
    OutputBinding,
    ReleaseDeviceObject,
    RingReadable,
    RingWritable,
    ShutdownWorker,
    UninstallRing,
)
from swactor.wire.worker_events import (
    DeviceObjectReleased,
    ObjectFailed,
    ObjectLoaded,
    ObjectProduced,
    ReleaseFailed,
    RingFault,
    RingInstalled,
    RingQuiesced,
    RoleConfigured,
    RoleFailed,
    StepCompleted,
    StepFailed,
    WorkerFatal,
    WorkerReady,
    WorkerStopped,
)

u32 = st.integers(0, U32_MAX)
u64 = st.integers(0, U64_MAX)


def ident(tp: type[Identifier]) -> st.SearchStrategy[Any]:
    return st.integers(0, tp.MAX).map(tp)


def json_values() -> st.SearchStrategy[JsonValue]:
    scalars: st.SearchStrategy[JsonValue] = (
        st.none()
        | st.booleans()
        | st.integers(-(1 << 63), U64_MAX)
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
def object_specs(draw: st.DrawFn, kind: ObjectKind | None = None) -> ObjectSpec:
    family = draw(st.sampled_from(DTypeFamily))
    width = draw(st.sampled_from(sorted(DTYPE_WIDTHS[family])))
    shape = draw(st.sampled_from(ShapeRule))
    alignment = width if shape is ShapeRule.Vector else width * draw(st.integers(1, 4096))
    return ObjectSpec(
        kind=kind if kind is not None else draw(st.sampled_from(ObjectKind)),
        max_extent=alignment * draw(st.integers(1, 1 << 30)),
        dtype_family=family,
        dtype_width_bytes=width,
        shape=shape,
        layout=draw(st.sampled_from(LayoutRule)),
        alignment=alignment,
        sequence_policy=draw(st.sampled_from(SequencePolicy)),
    )


def token_specs() -> st.SearchStrategy[ObjectSpec]:
    return st.builds(
        lambda n, layout, policy: ObjectSpec(
            ObjectKind.TokenIds, 4 * n, DTypeFamily.UInt, 4, ShapeRule.Vector, layout, 4, policy
        ),
        st.integers(1, 1 << 20),
        st.sampled_from(LayoutRule),
        st.sampled_from(SequencePolicy),
    )


@st.composite
def ring_specs(draw: st.DrawFn) -> RingSpec:
    alignment = 1 << draw(st.integers(6, 21))
    return RingSpec(
        data_capacity=alignment * draw(st.integers(1, 1 << 20)),
        alignment=alignment,
        direction=draw(st.sampled_from(RingDirection)),
        host_pinning=draw(st.sampled_from(HostPinning)),
        wake_coalescing=draw(st.sampled_from(WakeCoalescing)),
    )


@st.composite
def ring_layouts(draw: st.DrawFn, ring_id: RingId | None = None) -> RingLayout:
    alignment = 1 << draw(st.integers(6, 21))
    arena_offset = 64 * draw(st.integers(0, 1 << 30))
    header_offset = arena_offset + 64 * draw(st.integers(0, 64))
    header_end = header_offset + RING_HEADER_BYTES
    data_offset = -(-header_end // alignment) * alignment + alignment * draw(st.integers(0, 4))
    capacity = alignment * draw(st.integers(1, 1 << 16))
    slack = draw(st.integers(0, 1 << 20))
    return RingLayout(
        ring_id=ring_id if ring_id is not None else draw(ident(RingId)),
        arena_offset=arena_offset,
        total_len=data_offset + capacity - arena_offset + slack,
        header_offset=header_offset,
        data_offset=data_offset,
        data_capacity=capacity,
        alignment=alignment,
    )


_SAFE = string.ascii_letters + string.digits + "._-"


@st.composite
def gguf_sources(draw: st.DrawFn) -> GgufSource:
    kind = draw(st.sampled_from(GgufSourceKind))
    name = draw(st.text(_SAFE, min_size=1, max_size=30))
    if kind is GgufSourceKind.LocalPath:
        location = "/models/" + name
    elif kind is GgufSourceKind.HttpUrl:
        location = draw(st.sampled_from(["http", "https"])) + "://host.example:8080/" + name
    else:
        location = "m" + name
    sha = draw(st.none() | st.binary(min_size=32, max_size=32).map(bytes.hex))
    return GgufSource(kind, location, sha)


def tokenizer_sources() -> st.SearchStrategy[TokenizerSource]:
    return st.just(TokenizerSource(TokenizerSourceKind.GgufEmbedded)) | st.text(
        _SAFE, min_size=1, max_size=20
    ).map(lambda p: TokenizerSource(TokenizerSourceKind.LocalPath, "/tok/" + p))


@st.composite
def models(draw: st.DrawFn, num_layers: int | None = None) -> GgufModelPlan:
    family = draw(st.sampled_from([DTypeFamily.Float, DTypeFamily.BFloat]))
    return GgufModelPlan(
        model_id=draw(st.text(_SAFE, min_size=1, max_size=40)),
        gguf_source=draw(gguf_sources()),
        num_layers=num_layers if num_layers is not None else draw(st.integers(1, 512)),
        hidden_dim=draw(st.integers(1, 1 << 14)),
        dtype_family=family,
        dtype_width_bytes=draw(st.sampled_from(sorted(DTYPE_WIDTHS[family]))),
        max_seq_len=draw(st.integers(1, 1 << 17)),
        eos_token_id=draw(u32),
        tokenizer=draw(tokenizer_sources()),
    )


def sampling_policies() -> st.SearchStrategy[SamplingPolicy]:
    return st.just(SamplingPolicy(SamplingMode.Greedy)) | st.builds(
        lambda t, k, p, s: SamplingPolicy(SamplingMode.Temperature, t, k, p, s),
        st.floats(0.01, 100.0),
        u32,
        st.floats(0.01, 1.0),
        u64,
    )


def prompts() -> st.SearchStrategy[PromptSource]:
    return st.text(min_size=1, max_size=50).map(
        lambda t: PromptSource(PromptKind.Text, text=t)
    ) | st.lists(u32, min_size=1, max_size=20).map(
        lambda ids: PromptSource(PromptKind.TokenIds, token_ids=tuple(ids))
    )


def runtimes() -> st.SearchStrategy[RuntimePlan]:
    return st.builds(RuntimePlan, prompts(), sampling_policies(), _from(TokenOutputPolicy))


@st.composite
def stage_plans(draw: st.DrawFn) -> StagePlan:
    count = draw(st.integers(1, 64))
    start = draw(st.integers(0, 1000))
    inbound, outbound = draw(st.lists(ident(EdgeId), min_size=2, max_size=2, unique=True))
    return StagePlan(
        run_id=draw(ident(RunId)),
        stage_index=StageIndex(draw(st.integers(0, count - 1))),
        stage_count=count,
        node_id=draw(ident(NodeId)),
        gguf_source=draw(gguf_sources()),
        layer_start=start,
        layer_end_exclusive=start + draw(st.integers(1, 100)),
        inbound_edge=inbound,
        outbound_edge=outbound,
    )


def edge_endpoints() -> st.SearchStrategy[EdgeEndpoint]:
    return st.builds(EdgeEndpoint.orchestrator, u64) | st.builds(EdgeEndpoint.stage, u64, u32)


@st.composite
def edge_plans(draw: st.DrawFn) -> EdgePlan:
    producer, consumer = draw(st.lists(edge_endpoints(), min_size=2, max_size=2, unique=True))
    return EdgePlan(
        run_id=draw(ident(RunId)),
        edge_id=draw(ident(EdgeId)),
        kind=draw(st.sampled_from(EdgeKind)),
        producer=producer,
        consumer=consumer,
        object_spec=draw(object_specs()),
        ring_spec=draw(ring_specs()),
    )


@st.composite
def run_plans(draw: st.DrawFn) -> RunPlan:
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
    run_id = draw(ident(RunId))
    nodes = draw(st.lists(ident(NodeId), min_size=count + 1, max_size=count + 1))
    orch = EdgeEndpoint.orchestrator(nodes[count])
    stages_at = [EdgeEndpoint.stage(nodes[i], i) for i in range(count)]
    edge_ids = draw(st.lists(ident(EdgeId), min_size=count + 1, max_size=count + 1, unique=True))
    act_spec = ObjectSpec(
        ObjectKind.Activation,
        model.activation_max_extent,
        model.dtype_family,
        model.dtype_width_bytes,
        ShapeRule.Rows,
        draw(st.sampled_from(LayoutRule)),
        model.hidden_dim * model.dtype_width_bytes,
        draw(st.sampled_from(SequencePolicy)),
    )
    ring = draw(ring_specs())
    edges = [
        EdgePlan(
            run_id, edge_ids[0], EdgeKind.TokenIn, orch, stages_at[0], draw(token_specs()), ring
        )
    ]
    for i in range(count - 1):
        edges.append(
            EdgePlan(
                run_id,
                edge_ids[i + 1],
                EdgeKind.Activation,
                stages_at[i],
                stages_at[i + 1],
                act_spec,
                ring,
            )
        )
    edges.append(
        EdgePlan(
            run_id,
            edge_ids[count],
            EdgeKind.TokenOut,
            stages_at[-1],
            orch,
            draw(token_specs()),
            ring,
        )
    )
    stages = tuple(
        StagePlan(
            run_id,
            StageIndex(i),
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
    return RunPlan(
        run_id=run_id,
        model=model,
        runtime=draw(runtimes()),
        stages=stages,
        edges=tuple(edges_drawn),
        max_tokens=draw(st.integers(1, model.max_seq_len)),
    )


@st.composite
def stage_model_facts(draw: st.DrawFn) -> StageModelFacts:
    model = draw(models(num_layers=1))
    return StageModelFacts(
        model.model_id,
        model.hidden_dim,
        model.dtype_family,
        model.dtype_width_bytes,
        model.max_seq_len,
    )


@st.composite
def stage_runtime_facts(draw: st.DrawFn, sampling: bool | None = None) -> StageRuntimeFacts:
    ports = draw(st.lists(ident(PortId), min_size=2, max_size=2, unique=True))
    wants = draw(st.booleans()) if sampling is None else sampling
    policy = draw(sampling_policies()) if wants else None
    return StageRuntimeFacts(draw(ident(RoleId)), ports[0], ports[1], policy)


@st.composite
def provision_stages(draw: st.DrawFn) -> ProvisionStage:
    count = draw(st.integers(1, 16))
    index = draw(st.integers(0, count - 1))
    start = draw(st.integers(0, 1000))
    ids = draw(st.lists(ident(EdgeId), min_size=2, max_size=2, unique=True))
    in_kind = EdgeKind.TokenIn if index == 0 else EdgeKind.Activation
    out_kind = EdgeKind.TokenOut if index == count - 1 else EdgeKind.Activation
    return ProvisionStage(
        run_id=draw(ident(RunId)),
        stage_index=StageIndex(index),
        stage_count=count,
        gguf_source=draw(gguf_sources()),
        layer_start=start,
        layer_end_exclusive=start + draw(st.integers(1, 100)),
        inbound=InboundEdgeProvision(ids[0], in_kind, draw(object_specs()), draw(ring_specs())),
        outbound=OutboundEdgeProvision(
            ids[1], out_kind, draw(ident(NodeId)), draw(object_specs()), draw(ring_specs())
        ),
        model=draw(stage_model_facts()),
        runtime=draw(stage_runtime_facts(sampling=index == count - 1)),
    )


def handles() -> st.SearchStrategy[DeviceObjectHandle]:
    return st.builds(DeviceObjectHandle, ident(WorkerGeneration), u64)


@st.composite
def execute_steps(draw: st.DrawFn) -> ExecuteStep:
    generation = draw(ident(WorkerGeneration))
    in_ports = draw(st.lists(ident(PortId), max_size=3, unique=True))
    out_ports = draw(st.lists(ident(PortId), max_size=3, unique=True))
    inputs = tuple(
        InputBinding(
            port,
            draw(ident(ObjectId)),
            draw(ident(Sequence)),
            DeviceObjectHandle(generation, draw(u64)),
        )
        for port in in_ports
    )
    outputs = tuple(
        OutputBinding(
            port,
            draw(ident(RingId)),
            draw(ident(ObjectId)),
            draw(ident(Sequence)),
            draw(u64),
            draw(u32),
        )
        for port in out_ports
    )
    return ExecuteStep(
        draw(ident(RoleId)),
        draw(ident(StepId)),
        inputs,
        outputs,
        draw(json_objects()),
        draw(st.booleans()),
    )


@st.composite
def install_rings(draw: st.DrawFn) -> InstallRing:
    ring_id = draw(ident(RingId))
    return InstallRing(
        ring_id,
        draw(ident(EdgeId)),
        draw(ident(PortId)),
        draw(st.sampled_from(RingDirection)),
        draw(ring_layouts(ring_id=ring_id)),
        draw(object_specs()),
    )


def _from(tp: type[Any]) -> st.SearchStrategy[Any]:
    return strategy_for(tp)


def _builders() -> dict[type, Callable[[], st.SearchStrategy[Any]]]:
    return {
        DeviceObjectHandle: handles,
        GgufSource: gguf_sources,
        TokenizerSource: tokenizer_sources,
        GgufModelPlan: models,
        SamplingPolicy: sampling_policies,
        TokenOutputPolicy: lambda: st.builds(
            TokenOutputPolicy, st.sampled_from(TokenOutputMode), st.booleans()
        ),
        PromptSource: prompts,
        RuntimePlan: runtimes,
        StagePlan: stage_plans,
        EdgeEndpoint: edge_endpoints,
        EdgePlan: edge_plans,
        RunPlan: run_plans,
        ObjectSpec: object_specs,
        ObjectHeader: lambda: st.builds(ObjectHeader, ident(ObjectId), ident(Sequence), u64, u32),
        EdgePreamble: lambda: st.builds(EdgePreamble, ident(EdgeId)),
        RingSpec: ring_specs,
        RingLayout: ring_layouts,
        QuiescenceProof: lambda: st.builds(
            QuiescenceProof, ident(RingId), st.sampled_from(QuiescenceProofKind)
        ),
        InboundEdgeProvision: lambda: st.builds(
            InboundEdgeProvision,
            ident(EdgeId),
            st.sampled_from(EdgeKind),
            object_specs(),
            ring_specs(),
        ),
        OutboundEdgeProvision: lambda: st.builds(
            OutboundEdgeProvision,
            ident(EdgeId),
            st.sampled_from(EdgeKind),
            ident(NodeId),
            object_specs(),
            ring_specs(),
        ),
        StageModelFacts: stage_model_facts,
        StageRuntimeFacts: stage_runtime_facts,
        ProvisionStage: provision_stages,
        ProvisionTx: lambda: st.builds(
            ProvisionTx, ident(EdgeId), ident(NodeId), object_specs(), ring_specs()
        ),
        ProvisionRx: lambda: st.builds(ProvisionRx, ident(EdgeId), object_specs(), ring_specs()),
        InitializeWorker: lambda: st.builds(
            InitializeWorker,
            ident(WorkerGeneration),
            st.integers(1, U64_MAX),
            st.integers(0, (1 << 16) - 1),
            json_values(),
        ),
        ConfigureRole: lambda: st.builds(ConfigureRole, ident(RoleId), json_values()),
        InstallRing: install_rings,
        UninstallRing: lambda: st.builds(
            UninstallRing, ident(RingId), st.sampled_from(UninstallReason)
        ),
        InputBinding: lambda: st.builds(
            InputBinding, ident(PortId), ident(ObjectId), ident(Sequence), handles()
        ),
        OutputBinding: lambda: st.builds(
            OutputBinding, ident(PortId), ident(RingId), ident(ObjectId), ident(Sequence), u64, u32
        ),
        ExecuteStep: execute_steps,
        ShutdownWorker: lambda: st.builds(ShutdownWorker, st.sampled_from(ShutdownMode)),
        ReleaseDeviceObject: lambda: st.builds(ReleaseDeviceObject, handles()),
        RingReadable: lambda: st.builds(RingReadable, ident(RingId)),
        RingWritable: lambda: st.builds(RingWritable, ident(RingId)),
        WorkerReady: lambda: st.builds(
            WorkerReady,
            st.integers(1, U32_MAX),
            ident(WorkerGeneration),
            st.integers(0, (1 << 16) - 1),
            json_values(),
        ),
        WorkerFatal: lambda: st.builds(WorkerFatal, st.sampled_from(WorkerFatalReason)),
        WorkerStopped: lambda: st.builds(WorkerStopped, st.sampled_from(WorkerStoppedReason)),
        RoleConfigured: lambda: st.builds(RoleConfigured, ident(RoleId)),
        RoleFailed: lambda: st.builds(RoleFailed, ident(RoleId), st.sampled_from(RoleFailure)),
        RingInstalled: lambda: st.builds(
            RingInstalled, ident(RingId), ident(EdgeId), ident(PortId)
        ),
        RingFault: lambda: st.builds(
            RingFault,
            ident(RingId),
            ident(EdgeId),
            ident(PortId),
            st.sampled_from(RingFaultReason),
        ),
        RingQuiesced: lambda: st.builds(RingQuiesced, ident(RingId)),
        ObjectLoaded: lambda: st.builds(
            ObjectLoaded,
            ident(RingId),
            ident(EdgeId),
            ident(PortId),
            ident(ObjectId),
            ident(Sequence),
            u64,
            handles(),
        ),
        ObjectProduced: lambda: st.builds(
            ObjectProduced,
            ident(RingId),
            ident(EdgeId),
            ident(PortId),
            ident(ObjectId),
            ident(Sequence),
            u64,
        ),
        ObjectFailed: lambda: st.builds(
            ObjectFailed,
            ident(RingId),
            ident(EdgeId),
            ident(PortId),
            st.none() | ident(ObjectId),
            st.none() | ident(Sequence),
            st.sampled_from(ObjectFailure),
        ),
        StepCompleted: lambda: st.builds(StepCompleted, ident(RoleId), ident(StepId)),
        StepFailed: lambda: st.builds(
            StepFailed, ident(RoleId), ident(StepId), st.sampled_from(StepFailure)
        ),
        DeviceObjectReleased: lambda: st.builds(DeviceObjectReleased, handles()),
        ReleaseFailed: lambda: st.builds(ReleaseFailed, handles(), st.sampled_from(ReleaseFailure)),
    }


_BUILDERS: dict[type, Callable[[], st.SearchStrategy[Any]]] = {}


def strategy_for(tp: type[Any]) -> st.SearchStrategy[Any]:
    """The strategy of valid instances of `tp` (see `examples.strategy`)."""
    if isinstance(tp, type) and issubclass(tp, Identifier):
        return ident(tp)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return st.sampled_from(tp)
    if not _BUILDERS:
        _BUILDERS.update(_builders())
    build = _BUILDERS.get(tp)
    if build is None:
        raise KeyError(f"no wire strategy for {tp!r}")
    return build()
