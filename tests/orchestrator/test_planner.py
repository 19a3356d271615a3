"""The planner builds plans that pass RunPlan validation, with sizes stated by the spec."""

from __future__ import annotations

from pathlib import Path

import pytest

from swactor.orchestrator.errors import PlannerError, PlanProblem
from swactor.orchestrator.inventory import NodeResources, PoolInventory, synthetic_pool
from swactor.orchestrator.model_info import model_info_from_gguf
from swactor.orchestrator.planner import (
    ComputeDtype,
    PlanRequest,
    plan_run,
    stage_runtime_facts,
)
from swactor.wire import (
    EdgeKind,
    NodeId,
    ObjectKind,
    PromptSource,
    RunId,
    RunPlan,
    SamplingPolicy,
    provision_rx,
    provision_stage,
    provision_tx,
)
from tests.orchestrator.conftest import TINY, synthetic_model

PROMPT = PromptSource.from_text("hello world")


def request(**overrides: object) -> PlanRequest:
    fields: dict[str, object] = {"run_id": RunId(9), "prompt": PROMPT}
    fields.update(overrides)
    return PlanRequest(**fields)  # type: ignore[arg-type]


def pool(*memory: int, orchestrator: int = 1000) -> PoolInventory:
    return PoolInventory(
        tuple(NodeResources(NodeId(10 + i), m, "cpu") for i, m in enumerate(memory)),
        NodeId(orchestrator),
    )


def test_a_serving_plan_gives_the_stage_with_the_head_fewer_blocks() -> None:
    """Serving stages work on different sequences at once, so the plan balances the
    bytes each decode step reads: the imaginary model's head (6000 params) weighs six
    blocks (1000 each), so 30 blocks over 3 equal nodes are 12, 12 and 6 + the head
    (12 blocks' worth on every stage); a plan that is no serving one keeps 10 each,
    and an explicit split is kept."""
    serving = plan_run(synthetic_pool(3), synthetic_model(), request(serving=True)).plan
    assert [(s.layer_start, s.layer_end_exclusive) for s in serving.stages] == [
        (0, 12), (12, 24), (24, 30)]
    # a node of twice the memory (capacity) takes twice the decode bytes: 30 + 6 units
    # over capacities 1, 2, 1 is 9, 18, 3 + 6
    bigger = plan_run(pool(1 << 30, 2 << 30, 1 << 30), synthetic_model(),
                      request(serving=True)).plan
    assert [s.layer_end_exclusive - s.layer_start for s in bigger.stages] == [9, 18, 3]
    kept = plan_run(synthetic_pool(3), synthetic_model(),
                    request(serving=True, split=(10, 10, 10))).plan
    assert [s.layer_start for s in kept.stages] == [0, 10, 20]
    alone = plan_run(synthetic_pool(1), synthetic_model(), request(serving=True)).plan
    assert [(s.layer_start, s.layer_end_exclusive) for s in alone.stages] == [(0, 30)]


def test_three_equal_nodes_get_ten_blocks_each() -> None:
    planned = plan_run(synthetic_pool(3), synthetic_model(), request(first_edge_id=100))
    plan = planned.plan
    assert [(s.layer_start, s.layer_end_exclusive) for s in plan.stages] == [
        (0, 10), (10, 20), (20, 30)
    ]
    assert [int(s.node_id) for s in plan.stages] == [1, 2, 3]
    # edge ids: token-in, activation 0->1, activation 1->2, token-out, from the base
    assert [(int(e.edge_id), e.kind) for e in plan.edges] == [
        (100, EdgeKind.TokenIn), (101, EdgeKind.Activation), (102, EdgeKind.Activation),
        (103, EdgeKind.TokenOut),
    ]
    assert [(int(s.inbound_edge), int(s.outbound_edge)) for s in plan.stages] == [
        (100, 101), (101, 102), (102, 103)
    ]


def test_plan_survives_a_json_round_trip() -> None:
    plan = plan_run(synthetic_pool(2), synthetic_model(), request()).plan
    assert RunPlan.from_json(plan.to_json()) == plan


def test_split_follows_memory() -> None:
    planned = plan_run(pool(8 << 30, 4 << 30, 4 << 30), synthetic_model(), request())
    assert [s.layer_end_exclusive - s.layer_start for s in planned.plan.stages] == [15, 8, 7]


def test_explicit_split_overrides_memory() -> None:
    planned = plan_run(pool(8 << 30, 1 << 30), synthetic_model(), request(split=(5, 25)))
    assert [(s.layer_start, s.layer_end_exclusive) for s in planned.plan.stages] == [
        (0, 5), (5, 30)
    ]


def test_object_and_ring_sizes() -> None:
    # SmolLM2 numbers: hidden 576, max_seq_len 2048, f32 -> 2048 * 576 * 4 bytes
    planned = plan_run(synthetic_pool(3), synthetic_model(), request(max_seq_len=2048))
    edges = {e.kind: e for e in planned.plan.edges}
    activation = edges[EdgeKind.Activation].object_spec
    assert activation.kind is ObjectKind.Activation
    assert activation.max_extent == 4_718_592
    assert activation.alignment == 576 * 4  # one row
    assert edges[EdgeKind.TokenIn].object_spec.max_extent == 2048 * 4  # a whole prompt
    assert edges[EdgeKind.TokenOut].object_spec.max_extent == 4  # one sampled id
    for edge in planned.plan.edges:
        capacity = edge.ring_spec.data_capacity
        assert capacity & (capacity - 1) == 0, "ring capacity is a power of two"
        assert capacity >= 40 + edge.object_spec.max_extent, "one whole record fits"
        assert capacity < 2 * max(64 << 10, 40 + edge.object_spec.max_extent)
    assert edges[EdgeKind.Activation].ring_spec.data_capacity == 8 << 20


def test_f16_halves_activation_extent() -> None:
    planned = plan_run(
        synthetic_pool(2), synthetic_model(), request(max_seq_len=100, dtype=ComputeDtype.f16)
    )
    spec = next(e for e in planned.plan.edges if e.kind is EdgeKind.Activation).object_spec
    assert (spec.dtype_width_bytes, spec.max_extent) == (2, 100 * 576 * 2)


def test_default_max_seq_len_is_capped_by_context() -> None:
    small = synthetic_model(context=512)
    assert plan_run(synthetic_pool(1), small, request()).plan.model.max_seq_len == 512
    big = synthetic_model(context=8192)
    assert plan_run(synthetic_pool(1), big, request()).plan.model.max_seq_len == 2048


def test_random_edge_bases_differ_between_plans() -> None:
    first = plan_run(synthetic_pool(2), synthetic_model(), request()).plan
    second = plan_run(synthetic_pool(2), synthetic_model(), request()).plan
    assert {e.edge_id for e in first.edges}.isdisjoint({e.edge_id for e in second.edges})


def test_every_stage_provision_message_is_valid() -> None:
    sampling = SamplingPolicy.temperature_sampling(0.7, seed=3)
    plan = plan_run(synthetic_pool(3), synthetic_model(), request(sampling=sampling)).plan
    messages = [provision_stage(plan, i, stage_runtime_facts(plan, i)) for i in range(3)]
    assert [m.runtime.sampling for m in messages] == [None, None, sampling]
    assert messages[2].outbound.consumer_node_id == plan.orchestrator_node
    token_in = next(e for e in plan.edges if e.kind is EdgeKind.TokenIn)
    assert provision_tx(token_in).rx_node_id == plan.stages[0].node_id
    provision_rx(next(e for e in plan.edges if e.kind is EdgeKind.TokenOut))


def test_prompt_and_generation_may_fill_the_context_exactly() -> None:
    # 40 prompt positions + 24 fed-back tokens = 64 positions; the 25th token is not fed
    planned = plan_run(
        synthetic_pool(1), synthetic_model(),
        request(max_seq_len=64, max_tokens=25, prompt_token_count=40),
    )
    assert planned.plan.max_tokens == 25


def test_stop_ids_and_memory_estimates_are_reported() -> None:
    model = synthetic_model(blocks=4, block_params=1000)
    planned = plan_run(synthetic_pool(2), model, request(max_seq_len=10, max_tokens=4))
    assert planned.stop_token_ids == frozenset({0, 2})
    kv = 2 * 10 * 3 * 64 * 4 * 2  # k and v, positions, kv heads, head dim, f32, 2 blocks
    assert planned.stage_memory_bytes == (
        (2000 + 5000) * 4 + kv,  # two blocks + embedding
        (2000 + 6000) * 4 + kv,  # two blocks + output head
    )


def test_slots_reach_every_stage_and_multiply_the_kv_cache() -> None:
    model = synthetic_model(blocks=4, block_params=1000)
    one = plan_run(synthetic_pool(2), model, request(max_seq_len=10, max_tokens=4))
    four = plan_run(synthetic_pool(2), model, request(max_seq_len=10, max_tokens=4, slots=4))
    assert (one.plan.model.slots, four.plan.model.slots) == (1, 4)
    for a, b in zip(one.stage_memory, four.stage_memory, strict=True):
        assert (b.weights, b.kv_cache) == (a.weights, 4 * a.kv_cache)
    assert RunPlan.from_json(four.plan.to_json()) == four.plan
    provisions = [provision_stage(four.plan, i, stage_runtime_facts(four.plan, i))
                  for i in range(2)]
    assert [p.model.slots for p in provisions] == [4, 4]
    assert [p.model.warm_prompt_tokens for p in provisions] == [0, 0]
    warm = plan_run(synthetic_pool(2), model,
                    request(max_seq_len=10, max_tokens=4, warm_prompt_tokens=64)).plan
    assert warm.model.warm_prompt_tokens == 10  # at most max_seq_len
    assert RunPlan.from_json(warm.to_json()) == warm
    assert provision_stage(warm, 1, stage_runtime_facts(warm, 1)).model.warm_prompt_tokens == 10


@pytest.mark.parametrize(
    ("the_pool", "overrides", "problem", "words"),
    [
        (pool(), {}, PlanProblem.EmptyPool, "no stage nodes"),
        (pool(1 << 30, 0), {}, PlanProblem.ZeroMemoryNode, "node 11 reports 0"),
        (PoolInventory((NodeResources(NodeId(5), 1 << 30),) * 2), {},
         PlanProblem.DuplicateNode, "node 5 appears twice"),
        (pool(1 << 30, orchestrator=10), {}, PlanProblem.NodeInvalid, "orchestrator"),
        (synthetic_pool(31), {}, PlanProblem.TooManyStages, "only 30 blocks"),
        (synthetic_pool(3), {"split": (10, 10, 11)}, PlanProblem.SplitSumMismatch, "sums to 31"),
        (synthetic_pool(2), {"split": (10, 10, 10)}, PlanProblem.SplitNodeCountMismatch,
         "3 stages"),
        (synthetic_pool(1), {"max_tokens": 0}, PlanProblem.MaxTokensInvalid, "max_tokens 0"),
        (synthetic_pool(1), {"max_seq_len": 16, "max_tokens": 17}, PlanProblem.MaxTokensInvalid,
         "outside 1..16"),
        (synthetic_pool(1), {"max_seq_len": 9000}, PlanProblem.MaxSeqLenInvalid, "context"),
        (synthetic_pool(1), {"max_seq_len": 64, "max_tokens": 26, "prompt_token_count": 40},
         PlanProblem.PromptTooLong, "needs 65 positions, max_seq_len is 64"),
        (pool(1 << 30, 1000), {}, PlanProblem.NodeMemoryTooSmall, "node 11 has 1000 usable"),
        (synthetic_pool(2), {"first_edge_id": (1 << 64) - 2}, PlanProblem.EdgeIdRange, "u64"),
        (synthetic_pool(2), {"slots": 0}, PlanProblem.PlanRejected, "slots 0 is outside 1..64"),
        (synthetic_pool(2), {"slots": 65}, PlanProblem.PlanRejected, "slots 65 is outside"),
    ],
)
def test_bad_requests_are_planner_errors(
    the_pool: PoolInventory, overrides: dict[str, object], problem: PlanProblem, words: str
) -> None:
    with pytest.raises(PlannerError) as info:
        plan_run(the_pool, synthetic_model(), request(**overrides))
    assert info.value.reason is problem
    assert words in str(info.value)


def test_model_info_from_a_tiny_gguf(tiny_gguf: Path) -> None:
    info = model_info_from_gguf(tiny_gguf)
    head_dim = TINY.hidden // TINY.heads
    attention = TINY.hidden * TINY.heads * head_dim * 2 + TINY.hidden * TINY.kv_heads * head_dim * 2
    mlp = 3 * TINY.hidden * TINY.ffn
    norms = 2 * TINY.hidden
    assert info.block_count == TINY.blocks and info.hidden_dim == TINY.hidden
    assert info.context_length == TINY.context
    assert info.block_params == (attention + mlp + norms,) * TINY.blocks
    assert info.embedding_params == TINY.vocab * TINY.hidden
    assert info.head_params == TINY.vocab * TINY.hidden + TINY.hidden  # tied + output norm
    assert info.eos_token_id == 2 and info.stop_token_ids == frozenset({2})
    planned = plan_run(synthetic_pool(3), info, request(max_tokens=8))
    assert [(s.layer_start, s.layer_end_exclusive) for s in planned.plan.stages] == [
        (0, 2), (2, 4), (4, 6)
    ]
    assert planned.plan.model.gguf_source.location == str(tiny_gguf.resolve())


def test_unreadable_model_is_a_planner_error(tmp_path: Path) -> None:
    with pytest.raises(PlannerError) as info:
        model_info_from_gguf(tmp_path / "missing.gguf")
    assert info.value.reason is PlanProblem.ModelUnreadable
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 7)
    with pytest.raises(PlannerError) as info:
        model_info_from_gguf(broken)
    assert info.value.reason is PlanProblem.ModelUnreadable


def test_inventory_from_a_membership_view() -> None:
    from swactor.membership import BootHealth, MemberMeta, MemberState
    from swactor.membership.core import MemberView
    from swactor.orchestrator.inventory import inventory_from_view

    def member(node: int, state: MemberState = MemberState.Alive,
               health: BootHealth = BootHealth.Available, role: str = "node",
               memory: int = 4 << 30) -> MemberView:
        meta = MemberMeta("10.0.0.1", 7946, "10.0.0.1", 4433, health, "cuda", memory, role)
        return MemberView(NodeId(node), state, 1, meta)

    members = [
        member(30), member(10, memory=8 << 30), member(20),
        member(40, state=MemberState.Suspect), member(50, health=BootHealth.Booting),
        member(60, role="orchestrator"), member(70),
    ]
    view = {m.node_id: m for m in members}
    inventory = inventory_from_view(view, NodeId(60), candidates=[NodeId(i) for i in (10, 20, 30)])
    assert [(int(n.node_id), n.usable_memory_bytes, n.device_kind) for n in inventory.nodes] == [
        (10, 8 << 30, "cuda"), (20, 4 << 30, "cuda"), (30, 4 << 30, "cuda")
    ]
    assert inventory.orchestrator_node_id == 60
    assert len(inventory_from_view(view, NodeId(60)).nodes) == 4  # 70 too, without candidates
    planned = plan_run(inventory, synthetic_model(blocks=8), request(max_tokens=4))
    assert [s.layer_end_exclusive - s.layer_start for s in planned.plan.stages] == [4, 2, 2]
