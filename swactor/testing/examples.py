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

from swactor import wire

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

T = TypeVar("T")

# --- deterministic examples ------------------------------------------------------------

RUN = wire.RunId(7)
ORCH_NODE = wire.NodeId(100)
STAGE_NODES = (wire.NodeId(101), wire.NodeId(102))
HIDDEN = 64
MAX_SEQ = 128
NUM_LAYERS = 6


def _token_spec() -> wire.ObjectSpec:
    return wire.ObjectSpec(
        kind=wire.ObjectKind.TokenIds,
        max_extent=4 * MAX_SEQ,
        dtype_family=wire.DTypeFamily.UInt,
        dtype_width_bytes=4,
        shape=wire.ShapeRule.Vector,
        layout=wire.LayoutRule.RowMajor,
        alignment=4,
        sequence_policy=wire.SequencePolicy.Contiguous,
    )


def _activation_spec() -> wire.ObjectSpec:
    return wire.ObjectSpec(
        kind=wire.ObjectKind.Activation,
        max_extent=MAX_SEQ * HIDDEN * 2,
        dtype_family=wire.DTypeFamily.Float,
        dtype_width_bytes=2,
        shape=wire.ShapeRule.Rows,
        layout=wire.LayoutRule.RowMajor,
        alignment=HIDDEN * 2,
        sequence_policy=wire.SequencePolicy.Contiguous,
    )


def _ring_spec(direction: wire.RingDirection = wire.RingDirection.Ingress) -> wire.RingSpec:
    return wire.RingSpec(
        data_capacity=1 << 16,
        alignment=64,
        direction=direction,
        host_pinning=wire.HostPinning.Pageable,
        wake_coalescing=wire.WakeCoalescing.PendingBit,
    )


def _source() -> wire.GgufSource:
    return wire.GgufSource.cache_key("SmolLM2-135M-Instruct.Q4_1.gguf")


def _model() -> wire.GgufModelPlan:
    return wire.GgufModelPlan(
        model_id="smollm2-135m-instruct",
        gguf_source=_source(),
        num_layers=NUM_LAYERS,
        hidden_dim=HIDDEN,
        dtype_family=wire.DTypeFamily.Float,
        dtype_width_bytes=2,
        max_seq_len=MAX_SEQ,
        eos_token_id=2,
        tokenizer=wire.TokenizerSource(wire.TokenizerSourceKind.GgufEmbedded),
    )


def _runtime() -> wire.RuntimePlan:
    return wire.RuntimePlan(
        prompt=wire.PromptSource.from_text("Hello"),
        sampling=wire.SamplingPolicy.greedy(),
        token_output_policy=wire.TokenOutputPolicy(wire.TokenOutputMode.Collect),
    )


def _edges() -> tuple[wire.EdgePlan, ...]:
    s0 = wire.EdgeEndpoint.stage(STAGE_NODES[0], 0)
    s1 = wire.EdgeEndpoint.stage(STAGE_NODES[1], 1)
    orch = wire.EdgeEndpoint.orchestrator(ORCH_NODE)
    ring = _ring_spec()
    return (
        wire.EdgePlan(RUN, wire.EdgeId(1), wire.EdgeKind.TokenIn, orch, s0, _token_spec(), ring),
        wire.EdgePlan(
            RUN, wire.EdgeId(2), wire.EdgeKind.Activation, s0, s1, _activation_spec(), ring
        ),
        wire.EdgePlan(RUN, wire.EdgeId(3), wire.EdgeKind.TokenOut, s1, orch, _token_spec(), ring),
    )


def _stages() -> tuple[wire.StagePlan, ...]:
    return (
        wire.StagePlan(
            RUN,
            wire.StageIndex(0),
            2,
            STAGE_NODES[0],
            _source(),
            0,
            3,
            wire.EdgeId(1),
            wire.EdgeId(2),
        ),
        wire.StagePlan(
            RUN,
            wire.StageIndex(1),
            2,
            STAGE_NODES[1],
            _source(),
            3,
            6,
            wire.EdgeId(2),
            wire.EdgeId(3),
        ),
    )


def _run_plan() -> wire.RunPlan:
    return wire.RunPlan(RUN, _model(), _runtime(), _stages(), _edges(), max_tokens=16)


def _layout() -> wire.RingLayout:
    return wire.RingLayout(
        ring_id=wire.RingId(11),
        arena_offset=4096,
        total_len=(1 << 16) + 4096,
        header_offset=4096,
        data_offset=8192,
        data_capacity=1 << 16,
        alignment=64,
    )


def _handle() -> wire.DeviceObjectHandle:
    return wire.DeviceObjectHandle(wire.WorkerGeneration(1), 5)


def _provision_stage() -> wire.ProvisionStage:
    return wire.ProvisionStage(
        run_id=RUN,
        stage_index=wire.StageIndex(1),
        stage_count=2,
        gguf_source=_source(),
        layer_start=3,
        layer_end_exclusive=6,
        inbound=wire.InboundEdgeProvision(
            wire.EdgeId(2),
            wire.EdgeKind.Activation,
            STAGE_NODES[0],
            _activation_spec(),
            _ring_spec(),
        ),
        outbound=wire.OutboundEdgeProvision(
            wire.EdgeId(3),
            wire.EdgeKind.TokenOut,
            ORCH_NODE,
            _token_spec(),
            _ring_spec(wire.RingDirection.Egress),
        ),
        model=wire.StageModelFacts(
            "smollm2-135m-instruct", HIDDEN, wire.DTypeFamily.Float, 2, MAX_SEQ
        ),
        runtime=wire.StageRuntimeFacts(
            wire.RoleId(1), wire.PortId(0), wire.PortId(1), wire.SamplingPolicy.greedy()
        ),
    )


def _step_record() -> wire.StepRecord:
    return wire.StepRecord(wire.Sequence(0), wire.ObjectId(1), 4, wire.ObjectId(1), HIDDEN * 2,
                           1_000_000, 1_000_500, 2_000_000, 2_000_100)


_EXAMPLES: dict[type, Callable[[], object]] = {
    wire.DeviceObjectHandle: _handle,
    wire.GgufSource: _source,
    wire.TokenizerSource: lambda: wire.TokenizerSource(wire.TokenizerSourceKind.GgufEmbedded),
    wire.GgufModelPlan: _model,
    wire.SamplingPolicy: wire.SamplingPolicy.greedy,
    wire.TokenOutputPolicy: lambda: wire.TokenOutputPolicy(wire.TokenOutputMode.Collect),
    wire.PromptSource: lambda: wire.PromptSource.from_text("Hello"),
    wire.RuntimePlan: _runtime,
    wire.StagePlan: lambda: _stages()[0],
    wire.EdgeEndpoint: lambda: wire.EdgeEndpoint.stage(STAGE_NODES[0], 0),
    wire.EdgePlan: lambda: _edges()[1],
    wire.RunPlan: _run_plan,
    wire.ObjectSpec: _activation_spec,
    wire.ObjectHeader: lambda: wire.ObjectHeader(
        wire.ObjectId(3), wire.Sequence(0), extent=HIDDEN * 2
    ),
    wire.EdgePreamble: lambda: wire.EdgePreamble(wire.EdgeId(2)),
    wire.RingSpec: _ring_spec,
    wire.RingLayout: _layout,
    wire.QuiescenceProof: lambda: wire.QuiescenceProof(
        wire.RingId(11), wire.QuiescenceProofKind.PumpStoppedAndRingQuiesced
    ),
    wire.InboundEdgeProvision: lambda: _provision_stage().inbound,
    wire.OutboundEdgeProvision: lambda: _provision_stage().outbound,
    wire.StageModelFacts: lambda: _provision_stage().model,
    wire.StageRuntimeFacts: lambda: _provision_stage().runtime,
    wire.ProvisionStage: _provision_stage,
    wire.ProvisionTx: lambda: wire.ProvisionTx(
        wire.EdgeId(2), STAGE_NODES[1], _activation_spec(), _ring_spec()
    ),
    wire.ProvisionRx: lambda: wire.ProvisionRx(
        wire.EdgeId(2), STAGE_NODES[0], _activation_spec(), _ring_spec()
    ),
    wire.InitializeWorker: lambda: wire.InitializeWorker(
        wire.WorkerGeneration(1), 1 << 30, 1, {"device": "CPU"}
    ),
    wire.ConfigureRole: lambda: wire.ConfigureRole(
        wire.RoleId(1), {"layer_start": 3, "layer_end": 6}
    ),
    wire.InstallRing: lambda: wire.InstallRing(
        wire.RingId(11),
        wire.EdgeId(2),
        wire.PortId(0),
        wire.RingDirection.Ingress,
        _layout(),
        _activation_spec(),
    ),
    wire.UninstallRing: lambda: wire.UninstallRing(
        wire.RingId(11), wire.UninstallReason.EdgeStopped
    ),
    wire.AwaitedInput: lambda: wire.AwaitedInput(
        wire.PortId(0), wire.RingId(11), wire.Sequence(1), 2304
    ),
    wire.OutputBinding: lambda: wire.OutputBinding(
        wire.PortId(1), wire.RingId(12), wire.ObjectId(4), wire.Sequence(0), 4
    ),
    wire.GrantSteps: lambda: wire.GrantSteps(
        wire.RoleId(1),
        wire.StepId(1),
        wire.AwaitedInput(wire.PortId(0), wire.RingId(11), wire.Sequence(0), 2304),
        wire.OutputBinding(wire.PortId(1), wire.RingId(12), wire.ObjectId(1), wire.Sequence(0),
                           2304, per_input_row=True),
    ),
    wire.RevokeSteps: lambda: wire.RevokeSteps(wire.RoleId(1)),
    wire.ShutdownWorker: lambda: wire.ShutdownWorker(wire.ShutdownMode.Graceful),
    wire.ReleaseDeviceObject: lambda: wire.ReleaseDeviceObject(_handle()),
    wire.RingReadable: lambda: wire.RingReadable(wire.RingId(11)),
    wire.RingWritable: lambda: wire.RingWritable(wire.RingId(11)),
    wire.WorkerReady: lambda: wire.WorkerReady(
        4242, wire.WorkerGeneration(1), 1, {"device": "CPU"}
    ),
    wire.WorkerFatal: lambda: wire.WorkerFatal(wire.WorkerFatalReason.ArenaMapFailed),
    wire.WorkerStopped: lambda: wire.WorkerStopped(wire.WorkerStoppedReason.Graceful),
    wire.StageFootprint: lambda: wire.StageFootprint(81 << 20, 10 << 20, 400 << 20, 80 << 20),
    wire.RoleConfigured: lambda: wire.RoleConfigured(
        wire.RoleId(1), wire.StageFootprint(81 << 20, 10 << 20, 400 << 20, 80 << 20)
    ),
    wire.RoleFailed: lambda: wire.RoleFailed(wire.RoleId(1), wire.RoleFailure.ConfigInvalid),
    wire.RingInstalled: lambda: wire.RingInstalled(wire.RingId(11), wire.EdgeId(2), wire.PortId(0)),
    wire.RingFault: lambda: wire.RingFault(
        wire.RingId(11), wire.EdgeId(2), wire.PortId(0), wire.RingFaultReason.HeaderMalformed
    ),
    wire.RingQuiesced: lambda: wire.RingQuiesced(wire.RingId(11)),
    wire.ObjectLoaded: lambda: wire.ObjectLoaded(
        wire.RingId(11),
        wire.EdgeId(2),
        wire.PortId(0),
        wire.ObjectId(3),
        wire.Sequence(0),
        HIDDEN * 2,
        _handle(),
    ),
    wire.ObjectProduced: lambda: wire.ObjectProduced(
        wire.RingId(12), wire.EdgeId(3), wire.PortId(1), wire.ObjectId(4), wire.Sequence(0), 4
    ),
    wire.ObjectFailed: lambda: wire.ObjectFailed(
        wire.RingId(11),
        wire.EdgeId(2),
        wire.PortId(0),
        None,
        None,
        wire.ObjectFailure.HeaderMalformed,
    ),
    wire.StepRecord: _step_record,
    wire.StepCompleted: lambda: wire.StepCompleted(wire.RoleId(1), wire.StepId(1),
                                                   _step_record()),
    wire.StepFailed: lambda: wire.StepFailed(
        wire.RoleId(1), wire.StepId(1), wire.StepFailure.TinygradError
    ),
    wire.DeviceObjectReleased: lambda: wire.DeviceObjectReleased(_handle()),
    wire.ReleaseFailed: lambda: wire.ReleaseFailed(_handle(), wire.ReleaseFailure.UnknownHandle),
}

_ALIASES: dict[object, Callable[[], object]] = {
    wire.WorkerEvent: _EXAMPLES[wire.RingQuiesced],
    wire.JsonValue: lambda: {"device": "CPU"},
}
"""Examples of the exported type aliases a table field may name (unions, not classes)."""

_ID_EXAMPLES: dict[type, int] = {
    wire.RunId: 7,
    wire.NodeId: 101,
    wire.RoleId: 1,
    wire.StageIndex: 0,
    wire.EdgeId: 2,
    wire.RingId: 11,
    wire.ObjectId: 3,
    wire.Sequence: 0,
    wire.StepId: 1,
    wire.WorkerGeneration: 1,
    wire.PortId: 0,
}


def example(tp: type[T]) -> T:
    """A valid, deterministic instance of the exported wire type `tp`."""
    if isinstance(tp, type) and issubclass(tp, wire.Identifier):
        return cast(T, tp(_ID_EXAMPLES.get(tp, 1)))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return cast(T, next(iter(tp)))
    make = _EXAMPLES.get(tp) or _ALIASES.get(tp)
    if make is None:
        raise KeyError(f"no wire example for {tp!r}")
    return cast(T, make())


def example_types() -> tuple[type, ...]:
    """Every dataclass type `example` knows (identifiers and enums are generic)."""
    return tuple(_EXAMPLES)


def strategy(tp: type[T]) -> SearchStrategy[T]:
    """A Hypothesis strategy of valid instances of the exported wire type `tp`."""
    from swactor.testing import strategies

    return cast("SearchStrategy[T]", strategies.strategy_for(cast(Any, tp)))
