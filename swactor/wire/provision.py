"""Provisioning messages (spec §12, §26): what the orchestrator sends to a stage node.

Theory of operation
-------------------
`ProvisionStage` carries one stage's layer range, its inbound and outbound edge
provisions and the model/runtime facts it needs. Its rules: `stage_index <
stage_count`; a non-empty layer range; distinct inbound and outbound edge ids; inbound
kind is TokenIn exactly for stage 0 (Activation otherwise); outbound kind is TokenOut
exactly for the last stage (Activation otherwise); the last stage has a sampling policy
and no other stage has one. `ProvisionTx`/`ProvisionRx` are the per-edge messages the
EdgeEstablisher receives (spec §26).

Derivation from a validated `RunPlan` (pure functions, for the orchestrator):
`provision_stage(plan, i, runtime)`, `provision_tx(edge)`, `provision_rx(edge)`. An
`EdgePlan` holds one `RingSpec` for both ends; each derived message carries it with the
direction of its own end (`Egress` at the producer, `Ingress` at the consumer).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from swactor.wire.codec import WireStruct
from swactor.wire.enums import DTYPE_WIDTHS, DTypeFamily, EdgeKind, RingDirection
from swactor.wire.errors import PlanError
from swactor.wire.ids import U32_MAX, EdgeId, NodeId, PortId, RoleId, RunId, StageIndex
from swactor.wire.objects import ObjectSpec
from swactor.wire.plan import MAX_STAGE_SLOTS, EdgePlan, GgufSource, RunPlan, SamplingPolicy
from swactor.wire.rings import RingSpec


@dataclass(frozen=True, slots=True)
class InboundEdgeProvision(WireStruct):
    """The edge a stage receives on, from `producer_node_id` (spec §12; the producer is
    an extension: spec §4 has a node reject edge data that does not match its plan, so
    the stream is accepted from that node only)."""

    edge_id: EdgeId
    kind: EdgeKind
    producer_node_id: NodeId
    object_spec: ObjectSpec
    ring_spec: RingSpec


@dataclass(frozen=True, slots=True)
class OutboundEdgeProvision(WireStruct):
    """The edge a stage sends on, to `consumer_node_id` (spec §12)."""

    edge_id: EdgeId
    kind: EdgeKind
    consumer_node_id: NodeId
    object_spec: ObjectSpec
    ring_spec: RingSpec


@dataclass(frozen=True, slots=True)
class StageModelFacts(WireStruct):
    """Model facts a stage needs (spec §12)."""

    model_id: str
    hidden_dim: int
    dtype_family: DTypeFamily
    dtype_width_bytes: int
    max_seq_len: int
    slots: int = 1
    """KV slots the stage holds (the plan's `model.slots`; extension beyond spec §12)."""
    warm_prompt_tokens: int = 0
    """Prompt lengths whose prefill kernels the stage builds before it is ready (the plan's
    `model.warm_prompt_tokens`; extension beyond spec §12)."""
    warm_batch_rows: int = 0
    """Batch sizes 2..this whose decode kernels the stage builds before it is ready (the
    plan's `model.warm_batch_rows`; extension beyond spec §12)."""
    warm_mixed_rows: int = 0
    """Decode rows 1..this whose mixed-step graphs the stage builds before it is ready
    (the plan's `model.warm_mixed_rows`; extension beyond spec §12)."""

    def _validate(self) -> None:
        if not self.model_id or len(self.model_id) > 255:
            self._fail("model_id", "must be 1..255 characters")
        self._check_range("hidden_dim", 1, U32_MAX)
        self._check_range("max_seq_len", 1, U32_MAX)
        self._check_range("slots", 1, MAX_STAGE_SLOTS)
        self._check_range("warm_prompt_tokens", 0, self.max_seq_len)
        self._check_range("warm_batch_rows", 0, self.slots)
        self._check_range("warm_mixed_rows", 0, self.slots - 1)
        if self.dtype_width_bytes not in DTYPE_WIDTHS[self.dtype_family]:
            self._fail("dtype_width_bytes", f"not a {self.dtype_family.value} width")


@dataclass(frozen=True, slots=True)
class StageRuntimeFacts(WireStruct):
    """Runtime facts of a stage's role (spec §12); `sampling` only on the last stage."""

    role_id: RoleId
    input_port: PortId
    output_port: PortId
    sampling: SamplingPolicy | None = None

    def _validate(self) -> None:
        if self.input_port == self.output_port:
            self._fail("output_port", "must differ from input_port")


@dataclass(frozen=True, slots=True)
class ProvisionStage(WireStruct):
    """One stage's provisioning message (spec §12); see the module doc for its rules."""

    run_id: RunId
    stage_index: StageIndex
    stage_count: int
    gguf_source: GgufSource
    layer_start: int
    layer_end_exclusive: int
    inbound: InboundEdgeProvision
    outbound: OutboundEdgeProvision
    model: StageModelFacts
    runtime: StageRuntimeFacts

    def _rule(self, field: str, rule: str) -> None:
        raise PlanError("ProvisionStage", field, rule)

    def _validate(self) -> None:
        self._check_range("stage_count", 1, U32_MAX)
        self._check_u32("layer_start")
        self._check_u32("layer_end_exclusive")
        if self.stage_index >= self.stage_count:
            self._rule("stage_index", f"{int(self.stage_index)} >= stage_count")
        if self.layer_start >= self.layer_end_exclusive:
            self._rule("layer_end_exclusive", "layer range must be non-empty")
        if self.inbound.edge_id == self.outbound.edge_id:
            self._rule("outbound.edge_id", "must differ from inbound.edge_id")
        first = self.stage_index == 0
        last = self.stage_index == self.stage_count - 1
        want_in = EdgeKind.TokenIn if first else EdgeKind.Activation
        want_out = EdgeKind.TokenOut if last else EdgeKind.Activation
        if self.inbound.kind is not want_in:
            self._rule("inbound.kind", f"stage {int(self.stage_index)} receives {want_in.value}")
        if self.outbound.kind is not want_out:
            self._rule("outbound.kind", f"stage {int(self.stage_index)} sends {want_out.value}")
        if last and self.runtime.sampling is None:
            self._rule("runtime.sampling", "the last stage needs a sampling policy")
        if not last and self.runtime.sampling is not None:
            self._rule("runtime.sampling", "only the last stage samples")


@dataclass(frozen=True, slots=True)
class ProvisionTx(WireStruct):
    """Provision the producer end of an edge: send to `rx_node_id` (spec §26)."""

    edge_id: EdgeId
    rx_node_id: NodeId
    object_spec: ObjectSpec
    ring_spec: RingSpec


@dataclass(frozen=True, slots=True)
class ProvisionRx(WireStruct):
    """Provision the consumer end of an edge, produced by `tx_node_id` (spec §26; the
    producer is an extension, see `InboundEdgeProvision`)."""

    edge_id: EdgeId
    tx_node_id: NodeId
    object_spec: ObjectSpec
    ring_spec: RingSpec


def _ring_for(edge: EdgePlan, direction: RingDirection) -> RingSpec:
    spec = edge.ring_spec
    return spec if spec.direction is direction else replace(spec, direction=direction)


def provision_tx(edge: EdgePlan) -> ProvisionTx:
    """The producer-side message for `edge`: send to the consumer's node (Egress ring)."""
    return ProvisionTx(
        edge.edge_id, edge.consumer.node_id, edge.object_spec, _ring_for(edge, RingDirection.Egress)
    )


def provision_rx(edge: EdgePlan) -> ProvisionRx:
    """The consumer-side message for `edge` (Ingress ring)."""
    return ProvisionRx(
        edge.edge_id,
        edge.producer.node_id,
        edge.object_spec,
        _ring_for(edge, RingDirection.Ingress),
    )


def provision_stage(plan: RunPlan, stage_index: int, runtime: StageRuntimeFacts) -> ProvisionStage:
    """Stage `stage_index`'s ProvisionStage from a validated plan and its runtime facts."""
    stage = plan.stages[stage_index]
    inbound = plan.edge(stage.inbound_edge)
    outbound = plan.edge(stage.outbound_edge)
    model = plan.model
    return ProvisionStage(
        run_id=plan.run_id,
        stage_index=stage.stage_index,
        stage_count=stage.stage_count,
        gguf_source=stage.gguf_source,
        layer_start=stage.layer_start,
        layer_end_exclusive=stage.layer_end_exclusive,
        inbound=InboundEdgeProvision(
            inbound.edge_id,
            inbound.kind,
            inbound.producer.node_id,
            inbound.object_spec,
            _ring_for(inbound, RingDirection.Ingress),
        ),
        outbound=OutboundEdgeProvision(
            outbound.edge_id,
            outbound.kind,
            outbound.consumer.node_id,
            outbound.object_spec,
            _ring_for(outbound, RingDirection.Egress),
        ),
        model=StageModelFacts(
            model.model_id,
            model.hidden_dim,
            model.dtype_family,
            model.dtype_width_bytes,
            model.max_seq_len,
            model.slots,
            model.warm_prompt_tokens,
            model.warm_batch_rows,
            model.warm_mixed_rows,
        ),
        runtime=runtime,
    )
