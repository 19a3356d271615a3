"""The run plan (spec §11): model, runtime, stages, edges, and their wiring rules.

Theory of operation
-------------------
The orchestrator builds one `RunPlan` before provisioning. Each part validates its own
fields on construction; `RunPlan` then checks the whole (raising `PlanError` naming the
field and the rule):

- stages: non-empty; `stages[i].stage_index == i`; every `stage_count == len(stages)`;
  every `run_id` is the plan's; layer ranges are non-empty, contiguous, non-overlapping
  and cover `0..model.num_layers` (stage 0 starts at 0, each starts where the previous
  ended, the last ends at `num_layers`);
- edges: every `run_id` is the plan's; edge ids unique; exactly one TokenIn edge,
  orchestrator -> stage 0; exactly one TokenOut edge, stage N-1 -> orchestrator; exactly
  N-1 Activation edges, the i-th from stage i to stage i+1; each Stage endpoint's
  `node_id` is that stage's node; both orchestrator endpoints name one node;
- stage wiring: stage 0's inbound edge is token-in, stage i>0's is activation i-1;
  stage i<N-1's outbound edge is activation i, stage N-1's is token-out;
- objects: token edges carry `TokenIds` objects (`UInt`, width 4); activation edges
  carry `Activation` objects of the model's dtype whose `max_extent` is
  `max_seq_len * hidden_dim * dtype_width_bytes` (spec §17);
- `max_tokens` is 1..u32 and at most `model.max_seq_len`.

`GgufModelPlan.slots` (extension beyond spec §11, default 1: the spec's one sequence) is
how many KV slots each stage holds, one per sequence a serving run carries at once
(sequence tags, `swactor.wire.tags`); 1..`MAX_STAGE_SLOTS`. `GgufModelPlan.warm_prompt_tokens`
(extension beyond spec §11, default 0) asks each stage to build, before it reports ready,
the prefill kernels of every prompt length up to that many tokens, so that a serving
run's first prompt of each length is not held up by a kernel build; 0..`max_seq_len`.
`GgufModelPlan.warm_batch_rows` (extension beyond spec §11, default 0) asks each stage
to build, before it reports ready, the batched decode kernels of every batch size
2..`warm_batch_rows` (batch objects, `swactor.wire.tags`), so that a serving run's
batches read each weight once for all their rows from the first one; 0..`slots`.
`GgufModelPlan.warm_mixed_rows` (extension beyond spec §11, default 0) asks each stage
to build, before it reports ready, the mixed steps' graphs (a short prompt's prefill
with 1..`warm_mixed_rows` decode rows of other slots in its padding rows, mixed step
objects in `swactor.wire.tags`) of every prefill bucket it warmed, so that a run whose
lone prompts ride with the rows in flight (`--mixed-steps on`) is not held up by a
graph build at a mix's first use; 0..`slots - 1` (the prompt holds a slot of its own).

Variant types (`GgufSource`, `TokenizerSource`, `SamplingPolicy`, `PromptSource`,
`EdgeEndpoint`) are one dataclass with a `kind`/`mode` enum and the fields that kind
uses; fields another kind uses must be None. Constructors such as
`EdgeEndpoint.stage(node, 2)` build each kind.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlparse

from swactor.wire.codec import WireStruct
from swactor.wire.enums import (
    DTYPE_WIDTHS,
    DTypeFamily,
    EdgeEndpointKind,
    EdgeKind,
    GgufSourceKind,
    ObjectKind,
    PromptKind,
    SamplingMode,
    TokenizerSourceKind,
    TokenOutputMode,
)
from swactor.wire.errors import PlanError
from swactor.wire.ids import U32_MAX, EdgeId, NodeId, RunId, StageIndex
from swactor.wire.objects import ObjectSpec
from swactor.wire.rings import RingSpec

MAX_STAGE_SLOTS = 64
"""The most KV slots a stage holds (each a KV cache of `max_seq_len` positions)."""

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_CACHE_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,254}")
_POOL_PEER = re.compile(r"[0-9a-f]{16}:[0-9a-f]{64}")
MAX_PROMPT_TOKENS = 1 << 20
MAX_TEXT_LEN = 1 << 20


@dataclass(frozen=True, slots=True)
class GgufSource(WireStruct):
    """Where a GGUF artifact comes from, with an optional lowercase hex sha256.

    `LocalPath`: an absolute path. `HttpUrl`: an http(s) URL with a host. `CacheKey`: a
    file-name-like key (letters, digits, `._+-`, no `/`) into the node's model cache.
    `PoolPeer` (an extension of spec §15): `<peer node id, 16 hex>:<manifest sha256>`, the
    pool member that serves the file over QUIC (`transport.artifact_stream`) and the digest
    of its chunk manifest (`model.fetch`); `sha256`, the whole file's digest, is required.
    """

    kind: GgufSourceKind
    location: str
    sha256: str | None = None

    def _validate(self) -> None:
        if self.kind is GgufSourceKind.LocalPath:
            if not self.location.startswith("/") or "\0" in self.location:
                self._fail("location", "a LocalPath must be an absolute path")
        elif self.kind is GgufSourceKind.HttpUrl:
            parsed = urlparse(self.location)
            if parsed.scheme not in ("http", "https") or not parsed.netloc:
                self._fail("location", "an HttpUrl must be http(s)://host/...")
        elif self.kind is GgufSourceKind.PoolPeer:
            if not _POOL_PEER.fullmatch(self.location):
                self._fail("location", "a PoolPeer is <16 hex node id>:<64 hex manifest sha256>")
            if self.sha256 is None:
                self._fail("sha256", "a PoolPeer source needs the file's sha256")
        elif not _CACHE_KEY.fullmatch(self.location):
            self._fail("location", "a CacheKey is 1-255 of [A-Za-z0-9._+-], not starting . + -")
        if self.sha256 is not None and not _SHA256_HEX.fullmatch(self.sha256):
            self._fail("sha256", "must be 64 lowercase hex digits")

    @classmethod
    def local_path(cls, path: str, sha256: str | None = None) -> GgufSource:
        return cls(GgufSourceKind.LocalPath, path, sha256)

    @classmethod
    def http_url(cls, url: str, sha256: str | None = None) -> GgufSource:
        return cls(GgufSourceKind.HttpUrl, url, sha256)

    @classmethod
    def cache_key(cls, key: str, sha256: str | None = None) -> GgufSource:
        return cls(GgufSourceKind.CacheKey, key, sha256)

    @classmethod
    def pool_peer(cls, peer: int, manifest_sha256: str, sha256: str) -> GgufSource:
        return cls(GgufSourceKind.PoolPeer, f"{peer:016x}:{manifest_sha256}", sha256)


@dataclass(frozen=True, slots=True)
class TokenizerSource(WireStruct):
    """Where the tokenizer comes from: the GGUF itself, or a local file (`path`)."""

    kind: TokenizerSourceKind
    path: str | None = None

    def _validate(self) -> None:
        if self.kind is TokenizerSourceKind.GgufEmbedded:
            if self.path is not None:
                self._fail("path", "must be None for GgufEmbedded")
        elif self.path is None or not self.path.startswith("/"):
            self._fail("path", "a LocalPath tokenizer needs an absolute path")


@dataclass(frozen=True, slots=True)
class GgufModelPlan(WireStruct):
    """The model a run serves (spec §11)."""

    model_id: str
    gguf_source: GgufSource
    num_layers: int
    hidden_dim: int
    dtype_family: DTypeFamily
    dtype_width_bytes: int
    max_seq_len: int
    eos_token_id: int
    tokenizer: TokenizerSource
    slots: int = 1
    """KV slots per stage (module doc; extension beyond spec §11)."""
    warm_prompt_tokens: int = 0
    """Prompt lengths whose prefill kernels each stage builds before it is ready (module
    doc; extension beyond spec §11)."""
    warm_batch_rows: int = 0
    """Batch sizes 2..this whose decode kernels each stage builds before it is ready
    (module doc; extension beyond spec §11)."""
    warm_mixed_rows: int = 0
    """Decode rows 1..this whose mixed-step graphs each stage builds for each warm
    prefill bucket before it is ready (module doc; extension beyond spec §11)."""

    def _validate(self) -> None:
        if not self.model_id or len(self.model_id) > 255:
            self._fail("model_id", "must be 1..255 characters")
        for name in ("num_layers", "hidden_dim", "max_seq_len"):
            self._check_range(name, 1, U32_MAX)
        self._check_range("slots", 1, MAX_STAGE_SLOTS)
        self._check_range("warm_prompt_tokens", 0, self.max_seq_len)
        self._check_range("warm_batch_rows", 0, self.slots)
        self._check_range("warm_mixed_rows", 0, self.slots - 1)
        self._check_u32("dtype_width_bytes")
        self._check_u32("eos_token_id")
        if self.dtype_width_bytes not in DTYPE_WIDTHS[self.dtype_family]:
            self._fail("dtype_width_bytes", f"not a {self.dtype_family.value} width")

    @property
    def activation_max_extent(self) -> int:
        """`max_seq_len * hidden_dim * dtype_width_bytes` (spec §17)."""
        return self.max_seq_len * self.hidden_dim * self.dtype_width_bytes


@dataclass(frozen=True, slots=True)
class SamplingPolicy(WireStruct):
    """How the last stage picks tokens.

    `Greedy`: argmax; temperature, top_k, top_p and seed are None. `Temperature`:
    `temperature > 0`, `top_k >= 0` (0 = off), `0 < top_p <= 1`, `seed` a u64.
    """

    mode: SamplingMode
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None

    def _validate(self) -> None:
        params = ("temperature", "top_k", "top_p", "seed")
        if self.mode is SamplingMode.Greedy:
            for name in params:
                if getattr(self, name) is not None:
                    self._fail(name, "must be None for Greedy sampling")
            return
        for name in params:
            if getattr(self, name) is None:
                self._fail(name, "is required for Temperature sampling")
        assert self.temperature is not None and self.top_p is not None
        if not 0.0 < self.temperature <= 100.0:
            self._fail("temperature", "must be in (0, 100]")
        self._check_u32("top_k")
        if not 0.0 < self.top_p <= 1.0:
            self._fail("top_p", "must be in (0, 1]")
        self._check_u64("seed")

    @classmethod
    def greedy(cls) -> SamplingPolicy:
        return cls(SamplingMode.Greedy)

    @classmethod
    def temperature_sampling(
        cls, temperature: float, seed: int, top_k: int = 0, top_p: float = 1.0
    ) -> SamplingPolicy:
        return cls(SamplingMode.Temperature, temperature, top_k, top_p, seed)


@dataclass(frozen=True, slots=True)
class TokenOutputPolicy(WireStruct):
    """How generated tokens reach the caller and when generation stops early."""

    mode: TokenOutputMode
    stop_on_eos: bool = True


@dataclass(frozen=True, slots=True)
class PromptSource(WireStruct):
    """The prompt: `Text` (tokenized by the orchestrator) or `TokenIds`; never empty."""

    kind: PromptKind
    text: str | None = None
    token_ids: tuple[int, ...] | None = None

    def _validate(self) -> None:
        if self.kind is PromptKind.Text:
            if self.token_ids is not None:
                self._fail("token_ids", "must be None for a Text prompt")
            if not self.text or len(self.text) > MAX_TEXT_LEN:
                self._fail("text", f"a Text prompt needs 1..{MAX_TEXT_LEN} characters")
            return
        if self.text is not None:
            self._fail("text", "must be None for a TokenIds prompt")
        if not self.token_ids or len(self.token_ids) > MAX_PROMPT_TOKENS:
            self._fail("token_ids", f"a TokenIds prompt needs 1..{MAX_PROMPT_TOKENS} ids")
        for token in self.token_ids:
            if not 0 <= token <= U32_MAX:
                self._fail("token_ids", f"token id {token} is not a u32")

    @classmethod
    def from_text(cls, text: str) -> PromptSource:
        return cls(PromptKind.Text, text=text)

    @classmethod
    def from_token_ids(cls, token_ids: tuple[int, ...]) -> PromptSource:
        return cls(PromptKind.TokenIds, token_ids=tuple(token_ids))


@dataclass(frozen=True, slots=True)
class RuntimePlan(WireStruct):
    """Per-run runtime choices (spec §11)."""

    prompt: PromptSource
    sampling: SamplingPolicy
    token_output_policy: TokenOutputPolicy


@dataclass(frozen=True, slots=True)
class StagePlan(WireStruct):
    """One stage's assignment: a contiguous layer range and its two edges (spec §11)."""

    run_id: RunId
    stage_index: StageIndex
    stage_count: int
    node_id: NodeId
    gguf_source: GgufSource
    layer_start: int
    layer_end_exclusive: int
    inbound_edge: EdgeId
    outbound_edge: EdgeId

    def _validate(self) -> None:
        self._check_range("stage_count", 1, U32_MAX)
        self._check_u32("layer_start")
        self._check_u32("layer_end_exclusive")
        if self.stage_index >= self.stage_count:
            self._fail("stage_index", f"{int(self.stage_index)} >= stage_count")
        if self.layer_start >= self.layer_end_exclusive:
            self._fail("layer_end_exclusive", "layer range must be non-empty")
        if self.inbound_edge == self.outbound_edge:
            self._fail("outbound_edge", "must differ from inbound_edge")


@dataclass(frozen=True, slots=True)
class EdgeEndpoint(WireStruct):
    """Who produces or consumes an edge: the orchestrator, or one stage (spec §11)."""

    kind: EdgeEndpointKind
    node_id: NodeId
    stage_index: StageIndex | None = None

    def _validate(self) -> None:
        if self.kind is EdgeEndpointKind.Orchestrator and self.stage_index is not None:
            self._fail("stage_index", "must be None for an Orchestrator endpoint")
        if self.kind is EdgeEndpointKind.Stage and self.stage_index is None:
            self._fail("stage_index", "is required for a Stage endpoint")

    @classmethod
    def orchestrator(cls, node_id: int) -> EdgeEndpoint:
        return cls(EdgeEndpointKind.Orchestrator, NodeId(node_id))

    @classmethod
    def stage(cls, node_id: int, stage_index: int) -> EdgeEndpoint:
        return cls(EdgeEndpointKind.Stage, NodeId(node_id), StageIndex(stage_index))

    def is_stage(self, stage_index: int) -> bool:
        """Whether this endpoint is the stage `stage_index`."""
        return self.kind is EdgeEndpointKind.Stage and self.stage_index == stage_index


@dataclass(frozen=True, slots=True)
class EdgePlan(WireStruct):
    """One edge: one producer, one consumer, its object and ring specs (spec §11)."""

    run_id: RunId
    edge_id: EdgeId
    kind: EdgeKind
    producer: EdgeEndpoint
    consumer: EdgeEndpoint
    object_spec: ObjectSpec
    ring_spec: RingSpec

    def _validate(self) -> None:
        if self.producer == self.consumer:
            self._fail("consumer", "an edge's producer and consumer must differ")


def _token_spec_rule(spec: ObjectSpec) -> str | None:
    if spec.kind is not ObjectKind.TokenIds:
        return "a token edge carries TokenIds objects"
    if spec.dtype_family is not DTypeFamily.UInt or spec.dtype_width_bytes != 4:
        return "token ids are UInt width 4"
    return None


@dataclass(frozen=True, slots=True)
class RunPlan(WireStruct):
    """The whole plan of one run (spec §11); see the module doc for its rules."""

    run_id: RunId
    model: GgufModelPlan
    runtime: RuntimePlan
    stages: tuple[StagePlan, ...]
    edges: tuple[EdgePlan, ...]
    max_tokens: int

    def _plan_fail(self, field: str, rule: str) -> None:
        raise PlanError("RunPlan", field, rule)

    def _validate(self) -> None:
        self._check_range("max_tokens", 1, U32_MAX)
        if self.max_tokens > self.model.max_seq_len:
            self._plan_fail("max_tokens", "exceeds model.max_seq_len")
        self._validate_stages()
        self._validate_edges()

    def _validate_stages(self) -> None:
        count = len(self.stages)
        if count == 0:
            self._plan_fail("stages", "a plan needs at least one stage")
        expected_start = 0
        for i, stage in enumerate(self.stages):
            where = f"stages[{i}]"
            if stage.run_id != self.run_id:
                self._plan_fail(f"{where}.run_id", "differs from the plan's run_id")
            if stage.stage_index != i:
                self._plan_fail(f"{where}.stage_index", f"is {int(stage.stage_index)}, not {i}")
            if stage.stage_count != count:
                self._plan_fail(f"{where}.stage_count", f"is {stage.stage_count}, not {count}")
            if stage.layer_start != expected_start:
                rule = "overlaps" if stage.layer_start < expected_start else "leaves a gap after"
                self._plan_fail(
                    f"{where}.layer_start",
                    f"{stage.layer_start} {rule} the previous range ending at {expected_start}",
                )
            expected_start = stage.layer_end_exclusive
        if expected_start != self.model.num_layers:
            self._plan_fail(
                f"stages[{count - 1}].layer_end_exclusive",
                f"ranges cover 0..{expected_start}, not 0..{self.model.num_layers}",
            )

    def _validate_edges(self) -> None:
        count = len(self.stages)
        seen: set[int] = set()
        token_in: list[EdgePlan] = []
        token_out: list[EdgePlan] = []
        activations: dict[int, EdgePlan] = {}
        orchestrator_nodes: set[int] = set()
        for i, edge in enumerate(self.edges):
            where = f"edges[{i}]"
            if edge.run_id != self.run_id:
                self._plan_fail(f"{where}.run_id", "differs from the plan's run_id")
            if edge.edge_id in seen:
                self._plan_fail(f"{where}.edge_id", f"{int(edge.edge_id)} is not unique")
            seen.add(edge.edge_id)
            for side in ("producer", "consumer"):
                endpoint: EdgeEndpoint = getattr(edge, side)
                if endpoint.kind is EdgeEndpointKind.Orchestrator:
                    orchestrator_nodes.add(endpoint.node_id)
                    continue
                assert endpoint.stage_index is not None
                if endpoint.stage_index >= count:
                    self._plan_fail(f"{where}.{side}", "names a stage that does not exist")
                if endpoint.node_id != self.stages[endpoint.stage_index].node_id:
                    self._plan_fail(f"{where}.{side}.node_id", "is not that stage's node")
            self._check_edge_objects(where, edge)
            if edge.kind is EdgeKind.TokenIn:
                token_in.append(edge)
                if edge.producer.kind is not EdgeEndpointKind.Orchestrator:
                    self._plan_fail(f"{where}.producer", "token-in is produced by the orchestrator")
                if not edge.consumer.is_stage(0):
                    self._plan_fail(f"{where}.consumer", "token-in is consumed by stage 0")
            elif edge.kind is EdgeKind.TokenOut:
                token_out.append(edge)
                if not edge.producer.is_stage(count - 1):
                    self._plan_fail(f"{where}.producer", "token-out is produced by stage N-1")
                if edge.consumer.kind is not EdgeEndpointKind.Orchestrator:
                    self._plan_fail(
                        f"{where}.consumer", "token-out is consumed by the orchestrator"
                    )
            else:
                producer = edge.producer.stage_index
                if producer is None or not edge.consumer.is_stage(producer + 1):
                    self._plan_fail(
                        f"{where}.consumer", "activation edge i runs from stage i to stage i+1"
                    )
                assert producer is not None
                if producer in activations:
                    self._plan_fail(f"{where}.producer", f"stage {producer} has two activations")
                activations[producer] = edge
        if len(token_in) != 1:
            self._plan_fail("edges", f"needs exactly one TokenIn edge, has {len(token_in)}")
        if len(token_out) != 1:
            self._plan_fail("edges", f"needs exactly one TokenOut edge, has {len(token_out)}")
        if len(activations) != count - 1:
            self._plan_fail("edges", f"needs {count - 1} Activation edges, has {len(activations)}")
        if len(orchestrator_nodes) != 1:
            self._plan_fail("edges", "token edges must name one orchestrator node")
        for i, stage in enumerate(self.stages):
            inbound = token_in[0] if i == 0 else activations[i - 1]
            outbound = token_out[0] if i == count - 1 else activations[i]
            if stage.inbound_edge != inbound.edge_id:
                self._plan_fail(f"stages[{i}].inbound_edge", f"is not edge {int(inbound.edge_id)}")
            if stage.outbound_edge != outbound.edge_id:
                self._plan_fail(
                    f"stages[{i}].outbound_edge", f"is not edge {int(outbound.edge_id)}"
                )

    def _check_edge_objects(self, where: str, edge: EdgePlan) -> None:
        spec = edge.object_spec
        if edge.kind is EdgeKind.Activation:
            model = self.model
            if spec.kind is not ObjectKind.Activation:
                self._plan_fail(f"{where}.object_spec.kind", "activation edges carry Activation")
            if (spec.dtype_family, spec.dtype_width_bytes) != (
                model.dtype_family,
                model.dtype_width_bytes,
            ):
                self._plan_fail(f"{where}.object_spec.dtype_family", "differs from the model's")
            if spec.max_extent != model.activation_max_extent:
                self._plan_fail(
                    f"{where}.object_spec.max_extent",
                    f"is not max_seq_len * hidden_dim * width = {model.activation_max_extent}",
                )
            return
        rule = _token_spec_rule(spec)
        if rule is not None:
            self._plan_fail(f"{where}.object_spec", rule)

    def edge(self, edge_id: int) -> EdgePlan:
        """The edge with id `edge_id` (KeyError if absent)."""
        for edge in self.edges:
            if edge.edge_id == edge_id:
                return edge
        raise KeyError(edge_id)

    @property
    def orchestrator_node(self) -> NodeId:
        """The node of the orchestrator endpoints."""
        for edge in self.edges:
            if edge.kind is EdgeKind.TokenIn:
                return edge.producer.node_id
        raise AssertionError("a validated plan has a token-in edge")
