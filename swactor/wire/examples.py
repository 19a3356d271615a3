"""Deterministic example values and Hypothesis strategies for every exported wire type.

Theory of operation
-------------------
`example(tp)` returns one valid, deterministic instance of `tp` (an identifier, an
enum, or a wire dataclass exported by `swactor.wire`): generated conformance tests use
it to fill typed event fields. The examples are consistent with one another: the
`RunPlan` example is a two-stage plan whose stages, edges and specs are the other
examples' building blocks.

`strategy(tp)` returns a Hypothesis strategy of valid instances. Hypothesis is a dev
dependency, so it is imported inside the function. Identifiers draw their whole range,
enums any member, and each dataclass draws values that satisfy its rules by
construction (no filtering), `RunPlan` included (1-4 stages over any layer count).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from swactor.wire.enums import (
    DTypeFamily,
    EdgeKind,
    HostPinning,
    LayoutRule,
    ObjectFailure,
    ObjectKind,
    QuiescenceProofKind,
    ReleaseFailure,
    RingDirection,
    RingFaultReason,
    RoleFailure,
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
from swactor.wire.rings import QuiescenceProof, RingLayout, RingSpec
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

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

T = TypeVar("T")

# --- deterministic examples ------------------------------------------------------------

RUN = RunId(7)
ORCH_NODE = NodeId(100)
STAGE_NODES = (NodeId(101), NodeId(102))
HIDDEN = 64
MAX_SEQ = 128
NUM_LAYERS = 6


def _token_spec() -> ObjectSpec:
    return ObjectSpec(
        kind=ObjectKind.TokenIds,
        max_extent=4 * MAX_SEQ,
        dtype_family=DTypeFamily.UInt,
        dtype_width_bytes=4,
        shape=ShapeRule.Vector,
        layout=LayoutRule.RowMajor,
        alignment=4,
        sequence_policy=SequencePolicy.Contiguous,
    )


def _activation_spec() -> ObjectSpec:
    return ObjectSpec(
        kind=ObjectKind.Activation,
        max_extent=MAX_SEQ * HIDDEN * 2,
        dtype_family=DTypeFamily.Float,
        dtype_width_bytes=2,
        shape=ShapeRule.Rows,
        layout=LayoutRule.RowMajor,
        alignment=HIDDEN * 2,
        sequence_policy=SequencePolicy.Contiguous,
    )


def _ring_spec(direction: RingDirection = RingDirection.Ingress) -> RingSpec:
    return RingSpec(
        data_capacity=1 << 16,
        alignment=64,
        direction=direction,
        host_pinning=HostPinning.Pageable,
        wake_coalescing=WakeCoalescing.PendingBit,
    )


def _source() -> GgufSource:
    return GgufSource.cache_key("SmolLM2-135M-Instruct.Q4_1.gguf")


def _model() -> GgufModelPlan:
    return GgufModelPlan(
        model_id="smollm2-135m-instruct",
        gguf_source=_source(),
        num_layers=NUM_LAYERS,
        hidden_dim=HIDDEN,
        dtype_family=DTypeFamily.Float,
        dtype_width_bytes=2,
        max_seq_len=MAX_SEQ,
        eos_token_id=2,
        tokenizer=TokenizerSource(TokenizerSourceKind.GgufEmbedded),
    )


def _runtime() -> RuntimePlan:
    return RuntimePlan(
        prompt=PromptSource.from_text("Hello"),
        sampling=SamplingPolicy.greedy(),
        token_output_policy=TokenOutputPolicy(TokenOutputMode.Collect),
    )


def _edges() -> tuple[EdgePlan, ...]:
    s0 = EdgeEndpoint.stage(STAGE_NODES[0], 0)
    s1 = EdgeEndpoint.stage(STAGE_NODES[1], 1)
    orch = EdgeEndpoint.orchestrator(ORCH_NODE)
    ring = _ring_spec()
    return (
        EdgePlan(RUN, EdgeId(1), EdgeKind.TokenIn, orch, s0, _token_spec(), ring),
        EdgePlan(RUN, EdgeId(2), EdgeKind.Activation, s0, s1, _activation_spec(), ring),
        EdgePlan(RUN, EdgeId(3), EdgeKind.TokenOut, s1, orch, _token_spec(), ring),
    )


def _stages() -> tuple[StagePlan, ...]:
    return (
        StagePlan(RUN, StageIndex(0), 2, STAGE_NODES[0], _source(), 0, 3, EdgeId(1), EdgeId(2)),
        StagePlan(RUN, StageIndex(1), 2, STAGE_NODES[1], _source(), 3, 6, EdgeId(2), EdgeId(3)),
    )


def _run_plan() -> RunPlan:
    return RunPlan(RUN, _model(), _runtime(), _stages(), _edges(), max_tokens=16)


def _layout() -> RingLayout:
    return RingLayout(
        ring_id=RingId(11),
        arena_offset=4096,
        total_len=(1 << 16) + 4096,
        header_offset=4096,
        data_offset=8192,
        data_capacity=1 << 16,
        alignment=64,
    )


def _handle() -> DeviceObjectHandle:
    return DeviceObjectHandle(WorkerGeneration(1), 5)


def _provision_stage() -> ProvisionStage:
    return ProvisionStage(
        run_id=RUN,
        stage_index=StageIndex(1),
        stage_count=2,
        gguf_source=_source(),
        layer_start=3,
        layer_end_exclusive=6,
        inbound=InboundEdgeProvision(
            EdgeId(2), EdgeKind.Activation, _activation_spec(), _ring_spec()
        ),
        outbound=OutboundEdgeProvision(
            EdgeId(3), EdgeKind.TokenOut, ORCH_NODE, _token_spec(), _ring_spec(RingDirection.Egress)
        ),
        model=StageModelFacts("smollm2-135m-instruct", HIDDEN, DTypeFamily.Float, 2, MAX_SEQ),
        runtime=StageRuntimeFacts(RoleId(1), PortId(0), PortId(1), SamplingPolicy.greedy()),
    )


_EXAMPLES: dict[type, Callable[[], object]] = {
    DeviceObjectHandle: _handle,
    GgufSource: _source,
    TokenizerSource: lambda: TokenizerSource(TokenizerSourceKind.GgufEmbedded),
    GgufModelPlan: _model,
    SamplingPolicy: SamplingPolicy.greedy,
    TokenOutputPolicy: lambda: TokenOutputPolicy(TokenOutputMode.Collect),
    PromptSource: lambda: PromptSource.from_text("Hello"),
    RuntimePlan: _runtime,
    StagePlan: lambda: _stages()[0],
    EdgeEndpoint: lambda: EdgeEndpoint.stage(STAGE_NODES[0], 0),
    EdgePlan: lambda: _edges()[1],
    RunPlan: _run_plan,
    ObjectSpec: _activation_spec,
    ObjectHeader: lambda: ObjectHeader(ObjectId(3), Sequence(0), extent=HIDDEN * 2),
    EdgePreamble: lambda: EdgePreamble(EdgeId(2)),
    RingSpec: _ring_spec,
    RingLayout: _layout,
    QuiescenceProof: lambda: QuiescenceProof(
        RingId(11), QuiescenceProofKind.PumpStoppedAndRingQuiesced
    ),
    InboundEdgeProvision: lambda: _provision_stage().inbound,
    OutboundEdgeProvision: lambda: _provision_stage().outbound,
    StageModelFacts: lambda: _provision_stage().model,
    StageRuntimeFacts: lambda: _provision_stage().runtime,
    ProvisionStage: _provision_stage,
    ProvisionTx: lambda: ProvisionTx(EdgeId(2), STAGE_NODES[1], _activation_spec(), _ring_spec()),
    ProvisionRx: lambda: ProvisionRx(EdgeId(2), _activation_spec(), _ring_spec()),
    InitializeWorker: lambda: InitializeWorker(WorkerGeneration(1), 1 << 30, 1, {"device": "CPU"}),
    ConfigureRole: lambda: ConfigureRole(RoleId(1), {"layer_start": 3, "layer_end": 6}),
    InstallRing: lambda: InstallRing(
        RingId(11), EdgeId(2), PortId(0), RingDirection.Ingress, _layout(), _activation_spec()
    ),
    UninstallRing: lambda: UninstallRing(RingId(11), UninstallReason.EdgeStopped),
    InputBinding: lambda: InputBinding(PortId(0), ObjectId(3), Sequence(0), _handle()),
    OutputBinding: lambda: OutputBinding(PortId(1), RingId(12), ObjectId(4), Sequence(0), 4),
    ExecuteStep: lambda: ExecuteStep(
        RoleId(1),
        StepId(1),
        (InputBinding(PortId(0), ObjectId(3), Sequence(0), _handle()),),
        (OutputBinding(PortId(1), RingId(12), ObjectId(4), Sequence(0), 4),),
        {},
        True,
    ),
    ShutdownWorker: lambda: ShutdownWorker(ShutdownMode.Graceful),
    ReleaseDeviceObject: lambda: ReleaseDeviceObject(_handle()),
    RingReadable: lambda: RingReadable(RingId(11)),
    RingWritable: lambda: RingWritable(RingId(11)),
    WorkerReady: lambda: WorkerReady(4242, WorkerGeneration(1), 1, {"device": "CPU"}),
    WorkerFatal: lambda: WorkerFatal(WorkerFatalReason.ArenaMapFailed),
    WorkerStopped: lambda: WorkerStopped(WorkerStoppedReason.Graceful),
    RoleConfigured: lambda: RoleConfigured(RoleId(1)),
    RoleFailed: lambda: RoleFailed(RoleId(1), RoleFailure.ConfigInvalid),
    RingInstalled: lambda: RingInstalled(RingId(11), EdgeId(2), PortId(0)),
    RingFault: lambda: RingFault(RingId(11), EdgeId(2), PortId(0), RingFaultReason.HeaderMalformed),
    RingQuiesced: lambda: RingQuiesced(RingId(11)),
    ObjectLoaded: lambda: ObjectLoaded(
        RingId(11), EdgeId(2), PortId(0), ObjectId(3), Sequence(0), HIDDEN * 2, _handle()
    ),
    ObjectProduced: lambda: ObjectProduced(
        RingId(12), EdgeId(3), PortId(1), ObjectId(4), Sequence(0), 4
    ),
    ObjectFailed: lambda: ObjectFailed(
        RingId(11), EdgeId(2), PortId(0), None, None, ObjectFailure.HeaderMalformed
    ),
    StepCompleted: lambda: StepCompleted(RoleId(1), StepId(1)),
    StepFailed: lambda: StepFailed(RoleId(1), StepId(1), StepFailure.TinygradError),
    DeviceObjectReleased: lambda: DeviceObjectReleased(_handle()),
    ReleaseFailed: lambda: ReleaseFailed(_handle(), ReleaseFailure.UnknownHandle),
}

_ID_EXAMPLES: dict[type, int] = {
    RunId: 7,
    NodeId: 101,
    RoleId: 1,
    StageIndex: 0,
    EdgeId: 2,
    RingId: 11,
    ObjectId: 3,
    Sequence: 0,
    StepId: 1,
    WorkerGeneration: 1,
    PortId: 0,
}


def example(tp: type[T]) -> T:
    """A valid, deterministic instance of the exported wire type `tp`."""
    if isinstance(tp, type) and issubclass(tp, Identifier):
        return cast(T, tp(_ID_EXAMPLES.get(tp, 1)))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return cast(T, next(iter(tp)))
    make = _EXAMPLES.get(tp)
    if make is None:
        raise KeyError(f"no wire example for {tp!r}")
    return cast(T, make())


def example_types() -> tuple[type, ...]:
    """Every dataclass type `example` knows (identifiers and enums are generic)."""
    return tuple(_EXAMPLES)


def strategy(tp: type[T]) -> SearchStrategy[T]:
    """A Hypothesis strategy of valid instances of the exported wire type `tp`."""
    from swactor.wire import _strategies

    return cast("SearchStrategy[T]", _strategies.strategy_for(cast(Any, tp)))
