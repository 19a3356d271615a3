"""The run planner (spec §11, §13): pool inventory + GGUF facts -> one valid `RunPlan`.

Theory of operation. `plan_run(pool, model, request)` is a pure function (apart from
drawing a random edge-id base when none is given):

1. Check the request: a non-empty pool of distinct nodes with positive usable memory,
   none of them the orchestrator; `1 <= max_tokens <= max_seq_len <= context_length`;
   a known prompt length leaves room for the `max_tokens - 1` tokens fed back.
2. Split the blocks: the explicit `split` if given (it must have one entry per node,
   each at least 1, summing to the block count), else in proportion to each node's
   usable memory (`split.proportional_split`). A serving plan instead balances the
   decode work (`decode_split`): its stages work on different sequences at once, so it
   runs at the pace of its slowest stage, and a decode step reads every weight of its
   stage, the last stage's output head too, so that stage gets fewer blocks. Stage `i`
   runs on the pool's `i`-th node.
3. Check memory: each stage's predicted footprint (`ModelInfo.memory_costs`: its
   weights as the stage role holds them in the request's weight mode, plus `slots` KV
   caches of `max_seq_len` positions) must fit its node's usable memory. When the proportional
   split leaves a stage over its node, the blocks are re-split by the prediction
   (`fitted_split`: the contiguous split with the smallest worst bytes/memory ratio,
   which accounts for the embedding on the first stage and the output head on the last);
   an explicit split is only checked.
4. Assign edge ids, here and nowhere else (spec §11: stages never derive them): from a
   base, token-in gets `base`, activation edge `i` (stage `i` -> `i + 1`) gets
   `base + 1 + i`, token-out gets `base + N`. The default base is random (48 bits), so
   a late stream of an earlier run on the same nodes never matches a new run's edge.
5. Object specs (spec §17): token-in carries the prompt at step 0, so up to
   `max_seq_len` u32 ids; token-out carries one sampled id per step; activations carry
   `[tokens, hidden]` rows of the compute dtype, `max_extent = max_seq_len * hidden *
   width`, one row per granule. Every edge enforces the Contiguous sequence policy.
6. Ring specs (spec §18): the data capacity is the smallest power of two that holds one
   whole maximal record (40-byte header + `max_extent`), at least 64 KiB; alignment 64
   (one cache line); pageable; pending-bit wake coalescing. The plan stores the
   consumer (Ingress) direction; `provision_tx` flips it for the producer.
7. Build `RunPlan` (its constructor enforces every §11 wiring rule; a violation there
   would be a planner bug, reported as `PlannerError(PlanRejected)`).

The result is a `PlannedRun`: the plan, the node of each stage with its memory
estimate, and the stop token ids (EOS plus the tokenizer's end-of-generation ids; a
plan states one `eos_token_id`, the run policy stops on any of them).
`stage_runtime_facts(plan, i)` gives the role/port/sampling facts `provision_stage`
needs for stage `i`.
"""

from __future__ import annotations

import enum
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from swactor.orchestrator.errors import PlannerError, PlanProblem
from swactor.orchestrator.inventory import NodeResources, PoolInventory
from swactor.orchestrator.model_info import MemoryCosts, ModelInfo, StageMemory
from swactor.orchestrator.split import explicit_split, proportional_split, ranges
from swactor.wire import (
    OBJECT_HEADER_LEN,
    DTypeFamily,
    EdgeEndpoint,
    EdgeId,
    EdgeKind,
    EdgePlan,
    GgufModelPlan,
    GgufSource,
    HostPinning,
    LayoutRule,
    NodeId,
    ObjectKind,
    ObjectSpec,
    PortId,
    PromptSource,
    RingDirection,
    RingSpec,
    RoleId,
    RunId,
    RunPlan,
    RuntimePlan,
    SamplingPolicy,
    SequencePolicy,
    ShapeRule,
    StageIndex,
    StagePlan,
    StageRuntimeFacts,
    TokenizerSource,
    TokenizerSourceKind,
    TokenOutputMode,
    TokenOutputPolicy,
    WakeCoalescing,
)
from swactor.wire.errors import WireError
from swactor.wire.ids import U64_MAX
from swactor.wire.plan import MAX_STAGE_SLOTS
from swactor.wire.tags import max_batch_answer_words

DEFAULT_MAX_SEQ_LEN = 2048
DEFAULT_MAX_TOKENS = 64
MIN_RING_BYTES = 64 << 10
RING_ALIGNMENT = 64
TOKEN_WIDTH = 4
EDGE_BASE_BITS = 48
INPUT_PORT = PortId(0)
OUTPUT_PORT = PortId(1)


class ComputeDtype(enum.Enum):
    """The activation/compute dtype of a run: `(family, width in bytes)`."""

    f32 = (DTypeFamily.Float, 4)
    f16 = (DTypeFamily.Float, 2)

    @property
    def family(self) -> DTypeFamily:
        return self.value[0]

    @property
    def width(self) -> int:
        return int(self.value[1])


@dataclass(frozen=True, slots=True)
class PlanRequest:
    """What the caller wants planned; everything but `run_id` and `prompt` has a default."""

    run_id: RunId
    prompt: PromptSource
    max_tokens: int = DEFAULT_MAX_TOKENS
    max_seq_len: int | None = None
    """Default: the smaller of the model's context length and DEFAULT_MAX_SEQ_LEN."""
    split: tuple[int, ...] | None = None
    sampling: SamplingPolicy = field(default_factory=SamplingPolicy.greedy)
    dtype: ComputeDtype = ComputeDtype.f32
    gguf_source: GgufSource | None = None
    """Default: the model file's absolute local path."""
    first_edge_id: int | None = None
    """Default: a random 48-bit base."""
    prompt_token_count: int | None = None
    """When known (the orchestrator tokenized the prompt), checked against max_seq_len."""
    stream_tokens: bool = True
    stop_on_eos: bool = True
    weights: str = "blocks"
    """The nodes' weight mode (`swactor node --weights`, default blocks), for the memory
    prediction."""
    serving: bool = False
    """A serving run (many tagged sequences): its token-out objects may be a sampled
    step's candidates, `2 * CANDIDATES_K` u32s (swactor/wire/tags.py), not one id, or
    a batch of up to `slots` rows: its tag table and each row's answer."""
    slots: int = 1
    """KV slots per stage, 1..MAX_STAGE_SLOTS: sequences a serving run carries at once
    (each stage holds one KV cache of `max_seq_len` positions per slot)."""
    warm_prompt_tokens: int = 0
    """Each stage builds the prefill kernels of every prompt length up to this many
    tokens before it is ready (a serving run's warm prompt lengths); at most max_seq_len."""
    warm_batch_rows: int = 0
    """Each stage builds the batched decode kernels of every batch size 2..this before it
    is ready (a serving run's rows per batch object); at most `slots`."""
    warm_mixed_rows: int = 0
    """Each stage builds the mixed-step graphs of 1..this decode rows for its warm prefill
    buckets before it is ready (a serving run with mixed steps on); at most `slots - 1`."""


@dataclass(frozen=True, slots=True)
class PlannedRun:
    """A valid plan, the node of each stage, its memory estimate and the stop ids."""

    plan: RunPlan
    nodes: tuple[NodeResources, ...]
    stage_memory_bytes: tuple[int, ...]
    stop_token_ids: frozenset[int]
    stage_memory: tuple[StageMemory, ...] = ()
    """Per stage: predicted weight bytes, KV cache bytes and its tensors' file bytes."""
    weights: str = "blocks"
    """The weight mode the prediction assumed."""


def next_power_of_two(value: int) -> int:
    """The smallest power of two >= `value` (1 for `value <= 1`)."""
    return 1 << max(0, value - 1).bit_length()


def ring_capacity_for(max_extent: int) -> int:
    """A ring that holds one whole maximal record: a power of two, at least 64 KiB."""
    return max(MIN_RING_BYTES, next_power_of_two(OBJECT_HEADER_LEN + max_extent))


def ring_spec_for(spec: ObjectSpec) -> RingSpec:
    """The ring of an edge carrying `spec` objects (consumer direction)."""
    return RingSpec(
        data_capacity=ring_capacity_for(spec.max_extent),
        alignment=RING_ALIGNMENT,
        direction=RingDirection.Ingress,
        host_pinning=HostPinning.Pageable,
        wake_coalescing=WakeCoalescing.PendingBit,
    )


def token_object_spec(max_ids: int) -> ObjectSpec:
    """Token objects: a vector of up to `max_ids` u32 token ids."""
    return ObjectSpec(
        kind=ObjectKind.TokenIds,
        max_extent=TOKEN_WIDTH * max_ids,
        dtype_family=DTypeFamily.UInt,
        dtype_width_bytes=TOKEN_WIDTH,
        shape=ShapeRule.Vector,
        layout=LayoutRule.RowMajor,
        alignment=TOKEN_WIDTH,
        sequence_policy=SequencePolicy.Contiguous,
    )


def activation_object_spec(model: GgufModelPlan) -> ObjectSpec:
    """Activation objects: `[tokens, hidden]` rows, up to `max_seq_len` rows (spec §17)."""
    row = model.hidden_dim * model.dtype_width_bytes
    return ObjectSpec(
        kind=ObjectKind.Activation,
        max_extent=model.activation_max_extent,
        dtype_family=model.dtype_family,
        dtype_width_bytes=model.dtype_width_bytes,
        shape=ShapeRule.Rows,
        layout=LayoutRule.RowMajor,
        alignment=row,
        sequence_policy=SequencePolicy.Contiguous,
    )


def stage_runtime_facts(plan: RunPlan, stage_index: int) -> StageRuntimeFacts:
    """Role, ports and (last stage only) sampling of stage `stage_index`."""
    last = stage_index == len(plan.stages) - 1
    return StageRuntimeFacts(
        role_id=RoleId(stage_index + 1),
        input_port=INPUT_PORT,
        output_port=OUTPUT_PORT,
        sampling=plan.runtime.sampling if last else None,
    )


def _check_pool(pool: PoolInventory) -> None:
    if not pool.nodes:
        raise PlannerError(PlanProblem.EmptyPool, "the pool has no stage nodes")
    seen: set[int] = set()
    for node in pool.nodes:
        if node.node_id in seen:
            raise PlannerError(
                PlanProblem.DuplicateNode, f"node {node.node_id} appears twice in the pool"
            )
        seen.add(node.node_id)
        if node.node_id == pool.orchestrator_node_id:
            raise PlannerError(
                PlanProblem.NodeInvalid,
                f"node {node.node_id} is the orchestrator's own id; stages run on other nodes",
            )
        if node.usable_memory_bytes <= 0:
            raise PlannerError(
                PlanProblem.ZeroMemoryNode,
                f"node {node.node_id} reports {node.usable_memory_bytes} usable memory bytes",
            )


def _max_seq_len(model: ModelInfo, request: PlanRequest) -> int:
    wanted = request.max_seq_len
    if wanted is None:
        wanted = min(model.context_length, DEFAULT_MAX_SEQ_LEN)
    if not 1 <= wanted <= model.context_length:
        raise PlannerError(
            PlanProblem.MaxSeqLenInvalid,
            f"max_seq_len {wanted} is outside 1..{model.context_length} (the model's context)",
        )
    if not 1 <= request.max_tokens <= wanted:
        raise PlannerError(
            PlanProblem.MaxTokensInvalid,
            f"max_tokens {request.max_tokens} is outside 1..{wanted} (max_seq_len)",
        )
    count = request.prompt_token_count
    # the prompt and every generated token but the last are fed in: one position each
    if count is not None and count + request.max_tokens - 1 > wanted:
        raise PlannerError(
            PlanProblem.PromptTooLong,
            f"a {count}-token prompt plus max_tokens {request.max_tokens} needs "
            f"{count + request.max_tokens - 1} positions, max_seq_len is {wanted}",
        )
    return wanted


def _split(pool: PoolInventory, model: ModelInfo, request: PlanRequest) -> tuple[int, ...]:
    nodes = len(pool.nodes)
    if request.split is not None:
        return explicit_split(request.split, model.block_count, nodes)
    if nodes > model.block_count:
        raise PlannerError(
            PlanProblem.TooManyStages,
            f"{nodes} nodes but the model has only {model.block_count} blocks (at most one "
            "stage per block: use fewer nodes)",
        )
    return proportional_split([n.usable_memory_bytes for n in pool.nodes], model.block_count)


def _edge_base(request: PlanRequest, stages: int) -> int:
    base = request.first_edge_id
    if base is None:
        base = 1 + secrets.randbelow(1 << EDGE_BASE_BITS)
    if base < 0 or base + stages > U64_MAX:
        raise PlannerError(
            PlanProblem.EdgeIdRange, f"edge ids {base}..{base + stages} do not fit in a u64"
        )
    return base


def plan_run(pool: PoolInventory, model: ModelInfo, request: PlanRequest) -> PlannedRun:
    """Build and validate one RunPlan; a broken rule raises `PlannerError`."""
    _check_pool(pool)
    max_seq_len = _max_seq_len(model, request)
    slots = request.slots
    if not 1 <= slots <= MAX_STAGE_SLOTS:
        raise PlannerError(PlanProblem.PlanRejected,
                           f"slots {slots} is outside 1..{MAX_STAGE_SLOTS}")
    counts = _split(pool, model, request)
    costs = model.memory_costs(request.dtype.width, request.weights)
    if request.split is None and request.serving and len(pool.nodes) > 1:
        counts = decode_split(costs, [n.usable_memory_bytes for n in pool.nodes])
    memory = _memory(costs, ranges(counts), max_seq_len, slots)
    if request.split is None and _overflow(pool, memory) is not None:
        # the memory-proportional split leaves a stage over its node: size the ranges by
        # the predicted bytes instead (the embedding and output head weigh on the ends)
        counts = fitted_split(costs, [n.usable_memory_bytes for n in pool.nodes],
                              max_seq_len, slots)
        memory = _memory(costs, ranges(counts), max_seq_len, slots)
    layer_ranges = ranges(counts)
    over = _overflow(pool, memory)
    if over is not None:
        node, need = pool.nodes[over], memory[over]
        start, end = layer_ranges[over]
        raise PlannerError(
            PlanProblem.NodeMemoryTooSmall,
            f"stage {over} (blocks {start}..{end}) needs about {need.total} bytes "
            f"(weights {need.weights}, KV cache {need.kv_cache}) but node "
            f"{node.node_id} has {node.usable_memory_bytes} usable",
        )
    try:
        plan = _build(pool, model, request, max_seq_len, layer_ranges)
    except WireError as error:
        raise PlannerError(PlanProblem.PlanRejected, str(error)) from None
    estimates = tuple(m.total for m in memory)
    return PlannedRun(plan, pool.nodes, estimates, model.stop_token_ids, memory,
                      request.weights)


def _memory(
    costs: MemoryCosts, layer_ranges: tuple[tuple[int, int], ...], max_seq_len: int,
    slots: int,
) -> tuple[StageMemory, ...]:
    return tuple(costs.stage(start, end, max_seq_len, slots) for start, end in layer_ranges)


def _overflow(pool: PoolInventory, memory: tuple[StageMemory, ...]) -> int | None:
    """The first stage whose predicted bytes exceed its node's usable memory."""
    for index, (node, need) in enumerate(zip(pool.nodes, memory, strict=True)):
        if need.total > node.usable_memory_bytes:
            return index
    return None


def fitted_split(costs: MemoryCosts, memory: list[int], max_seq_len: int, slots: int = 1
                 ) -> tuple[int, ...]:
    """Block counts (each >= 1) that minimise the largest predicted-bytes / node-memory
    ratio over the stages; ties keep the earlier cut (a deterministic result)."""
    return _min_max_split(costs.block_count, len(memory), lambda a, b, k: (
        costs.stage(a, b, max_seq_len, slots).total / memory[k]))


def decode_split(costs: MemoryCosts, capacity: list[int]) -> tuple[int, ...]:
    """Block counts (each >= 1) that minimise the largest decode-bytes / node-capacity
    ratio over the stages (`MemoryCosts.decode_bytes`: the blocks' weights, and the
    output head's on the last stage; a node's usable memory stands for its capacity, as
    in the proportional split); ties keep the earlier cut."""
    return _min_max_split(costs.block_count, len(capacity), lambda a, b, k: (
        costs.decode_bytes(a, b) / capacity[k]))


def _min_max_split(blocks: int, stages: int, cost: Callable[[int, int, int], float]
                   ) -> tuple[int, ...]:
    """Contiguous block counts (each >= 1) minimising the largest `cost(start, end,
    stage)` over the stages (dynamic programming over the cuts)."""
    if stages > blocks:
        raise PlannerError(PlanProblem.TooManyStages,
                           f"{stages} nodes but the model has only {blocks} blocks")
    # best[k][b]: the smallest worst ratio of stages 0..k-1 covering blocks 0..b-1
    inf = float("inf")
    best = [[inf] * (blocks + 1) for _ in range(stages + 1)]
    cut = [[0] * (blocks + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for b in range(k, blocks - (stages - k) + 1):
            for a in range(k - 1, b):
                if best[k - 1][a] == inf:
                    continue
                worst = max(best[k - 1][a], cost(a, b, k - 1))
                if worst < best[k][b]:
                    best[k][b], cut[k][b] = worst, a
    counts: list[int] = []
    end = blocks
    for k in range(stages, 0, -1):
        start = cut[k][end]
        counts.append(end - start)
        end = start
    return tuple(reversed(counts))


def _build(
    pool: PoolInventory,
    model: ModelInfo,
    request: PlanRequest,
    max_seq_len: int,
    layer_ranges: tuple[tuple[int, int], ...],
) -> RunPlan:
    run_id = request.run_id
    count = len(layer_ranges)
    source = request.gguf_source
    if source is None:
        if model.path is None:
            raise PlannerError(PlanProblem.ModelUnreadable, "no GGUF source and no model path")
        if isinstance(model.path, str):  # an http(s) URL: each node reads its ranges there
            source = GgufSource.http_url(model.path, sha256=model.url_sha256)
        else:
            source = GgufSource.local_path(str(model.path.resolve()))
    model_plan = GgufModelPlan(
        model_id=model.model_id,
        gguf_source=source,
        num_layers=model.block_count,
        hidden_dim=model.hidden_dim,
        dtype_family=request.dtype.family,
        dtype_width_bytes=request.dtype.width,
        max_seq_len=max_seq_len,
        eos_token_id=model.eos_token_id,
        tokenizer=TokenizerSource(TokenizerSourceKind.GgufEmbedded),
        slots=request.slots,
        warm_prompt_tokens=min(request.warm_prompt_tokens, max_seq_len),
        warm_batch_rows=max(0, min(request.warm_batch_rows, request.slots)),
        warm_mixed_rows=max(0, min(request.warm_mixed_rows, request.slots - 1)),
    )
    mode = TokenOutputMode.Stream if request.stream_tokens else TokenOutputMode.Collect
    runtime = RuntimePlan(
        prompt=request.prompt,
        sampling=request.sampling,
        token_output_policy=TokenOutputPolicy(mode, stop_on_eos=request.stop_on_eos),
    )
    base = _edge_base(request, count)
    token_in_id = EdgeId(base)
    activation_ids = [EdgeId(base + 1 + i) for i in range(count - 1)]
    token_out_id = EdgeId(base + count)
    orchestrator = EdgeEndpoint.orchestrator(pool.orchestrator_node_id)
    endpoints = [EdgeEndpoint.stage(pool.nodes[i].node_id, i) for i in range(count)]
    token_in_spec = token_object_spec(max_seq_len)
    token_out_spec = token_object_spec(
        max_batch_answer_words(max(request.slots, 1)) if request.serving else 1)
    activation_spec = activation_object_spec(model_plan)
    edges = [
        EdgePlan(run_id, token_in_id, EdgeKind.TokenIn, orchestrator, endpoints[0],
                 token_in_spec, ring_spec_for(token_in_spec)),
        *(
            EdgePlan(run_id, edge_id, EdgeKind.Activation, endpoints[i], endpoints[i + 1],
                     activation_spec, ring_spec_for(activation_spec))
            for i, edge_id in enumerate(activation_ids)
        ),
        EdgePlan(run_id, token_out_id, EdgeKind.TokenOut, endpoints[-1], orchestrator,
                 token_out_spec, ring_spec_for(token_out_spec)),
    ]
    inbound = [token_in_id, *activation_ids]
    outbound = [*activation_ids, token_out_id]
    stages = [
        StagePlan(
            run_id=run_id,
            stage_index=StageIndex(i),
            stage_count=count,
            node_id=NodeId(pool.nodes[i].node_id),
            gguf_source=source,
            layer_start=start,
            layer_end_exclusive=end,
            inbound_edge=inbound[i],
            outbound_edge=outbound[i],
        )
        for i, (start, end) in enumerate(layer_ranges)
    ]
    return RunPlan(run_id, model_plan, runtime, tuple(stages), tuple(edges), request.max_tokens)
