"""The llama_stage worker role runs a planned stage in-process on a tiny GGUF (spec §17).

The configs come from a real 2-stage plan of the file (`llama_stage_config` of each
ProvisionStage), the roles from the worker's role registry, and the objects travel
between them as ring bytes (u32 token ids, f32 activation rows). The reference is the
model package's own StageRole fed arrays: one stage over all blocks for the tokens,
and stage 0 alone for the activation bytes.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from tinygrad.device import Device
from tinygrad.tensor import Tensor

from swactor.model.gguf_range import open_reader
from swactor.model.llama_role import StageRole
from swactor.node.role_config import RoleConfigProblem, llama_stage_config
from swactor.node.stage_controller import output_extent
from swactor.node.stage_worker_ports import WorkerStagePorts
from swactor.orchestrator.inventory import synthetic_pool
from swactor.orchestrator.model_info import model_info_from_gguf
from swactor.orchestrator.planner import (
    ComputeDtype,
    PlanRequest,
    plan_run,
    stage_runtime_facts,
)
from swactor.wire import (
    JsonObject,
    ObjectId,
    OutputBinding,
    PortId,
    PromptSource,
    ProvisionStage,
    RingId,
    RunId,
    Sequence,
    provision_stage,
)
from swactor.wire.tags import SequenceTag, batch_flags, prompt_flags
from swactor.worker.llama_stage import LlamaStageRole
from swactor.worker.roles import Role, RoleConfigError, RoleRunError, build_role, role_kinds
from tests.model.tiny_gguf import TinyConfig, write_tiny_gguf

TINY = TinyConfig(blocks=4, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=64, context=32,
                  seed=5)
PROMPT = (3, 17, 42, 9, 51)
DECODE = 3
MAX_SEQ = 16


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("llama-stage") / "tiny.gguf", TINY)


def planned(gguf: Path, dtype: ComputeDtype = ComputeDtype.f32) -> list[ProvisionStage]:
    request = PlanRequest(run_id=RunId(3), prompt=PromptSource.from_token_ids(PROMPT),
                          max_tokens=DECODE + 1, max_seq_len=MAX_SEQ, first_edge_id=300,
                          split=(2, 2), dtype=dtype)
    plan = plan_run(synthetic_pool(2), model_info_from_gguf(gguf, with_stop_ids=False),
                    request).plan
    return [provision_stage(plan, i, stage_runtime_facts(plan, i)) for i in range(2)]


@pytest.fixture(scope="module")
def provisions(gguf: Path) -> list[ProvisionStage]:
    return planned(gguf)


def run_step(role: Role, provision: ProvisionStage, sequence: int,
             data: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """One step as the worker runs it: a uint8 device tensor in, the output's bytes out."""
    runtime = provision.runtime
    binding = OutputBinding(runtime.output_port, RingId(1), ObjectId(sequence + 1),
                            Sequence(sequence), output_extent(provision, data.size))
    inputs = {int(runtime.input_port): Tensor(data, device=Device.DEFAULT)}
    out = role.run(inputs, [binding])
    assert set(out) == {int(runtime.output_port)}
    value = out[int(runtime.output_port)]  # a host array or a tensor: the worker takes both
    array = value if isinstance(value, np.ndarray) else value.numpy()
    raw: npt.NDArray[np.uint8] = array.view(np.uint8).reshape(-1)
    assert raw.size == binding.extent, "the controller's extent is what the role writes"
    return raw


def u32(ids: list[int] | tuple[int, ...]) -> npt.NDArray[np.uint8]:
    return np.asarray(ids, dtype="<u4").view(np.uint8)


@pytest.mark.parametrize(("dtype", "wire_dtype"), [
    (ComputeDtype.f32, "<f4"),
    (ComputeDtype.f16, "<f2"),
])
def test_two_stage_roles_over_ring_bytes_match_one_stage_role(
    gguf: Path, dtype: ComputeDtype, wire_dtype: str
) -> None:
    assert "llama_stage" in role_kinds()
    provisions = planned(gguf, dtype)
    configs = [llama_stage_config(p, gguf) for p in provisions]
    assert [(c["layer_start"], c["layer_end"], c["first"], c["last"], c["dtype"])
            for c in configs] == [(0, 2, True, False, dtype.name), (2, 4, False, True, dtype.name)]
    roles = [build_role(c, Device.DEFAULT) for c in configs]
    reader = open_reader(gguf)
    whole = StageRole(reader.load_stage(0, 4, is_first=True, is_last=True, dtype=dtype.name),
                      max_seq_len=MAX_SEQ)
    head = StageRole(reader.load_stage(0, 2, is_first=True, is_last=False, dtype=dtype.name),
                     max_seq_len=MAX_SEQ)
    width = np.dtype(wire_dtype).itemsize

    tokens: list[int] = []
    expected: list[int] = []
    ids: tuple[int, ...] = PROMPT
    for sequence in range(DECODE + 1):
        activation = run_step(roles[0], provisions[0], sequence, u32(ids))
        reference: npt.NDArray[Any] = head.step(sequence, np.array(ids, dtype=np.int32))
        assert activation.size == len(ids) * TINY.hidden * width
        assert activation.tobytes() == reference.astype(wire_dtype).tobytes()
        token_bytes = run_step(roles[1], provisions[1], sequence, activation)
        assert token_bytes.size == 4
        tokens.append(int(token_bytes.view("<u4")[0]))
        expected.append(int(whole.step(sequence, np.array(ids, dtype=np.int32))[0]))
        ids = (tokens[-1],)
    assert tokens == expected
    assert all(0 <= t < TINY.vocab for t in tokens)


def test_a_batch_crosses_an_activation_edge_as_whole_rows_equal_to_rows_alone(
        gguf: Path) -> None:
    """A batch object of two decode rows through a planned 2-stage pipeline's roles:
    on the activation edge its 8-byte tag table is padded to one row (zeros), so the
    object is 3 whole rows that the edge's ObjectSpec admits; the last stage's answer is
    the table and each row's token as the whole model gives it run alone."""
    request = PlanRequest(run_id=RunId(5), prompt=PromptSource.from_token_ids(PROMPT),
                          max_tokens=DECODE + 1, max_seq_len=MAX_SEQ, split=(2, 2), slots=2,
                          serving=True)
    plan = plan_run(synthetic_pool(2), model_info_from_gguf(gguf, with_stop_ids=False),
                    request).plan
    provisions = [provision_stage(plan, i, stage_runtime_facts(plan, i)) for i in range(2)]
    roles = [build_role(llama_stage_config(p, gguf), Device.DEFAULT) for p in provisions]
    whole = StageRole(open_reader(gguf).load_stage(0, 4, is_first=True, is_last=True),
                      max_seq_len=MAX_SEQ, slots=2)
    prompts = (PROMPT, (7, 8, 9))
    nexts: list[int] = []
    for slot, prompt in enumerate(prompts):  # each prompt into its slot, tagged
        tag = SequenceTag(slot, 0)
        activation = tagged_step(roles[0], provisions[0], tag.pack(), u32(prompt))
        token = tagged_step(roles[1], provisions[1], tag.pack(), activation)
        nexts.append(int(token.view("<u4")[0]))
        assert nexts[-1] == int(whole.run_tagged(tag, np.array(prompt, np.int32))[0])
    tags = [SequenceTag(slot, len(prompt)) for slot, prompt in enumerate(prompts)]
    table = u32([tag.pack() for tag in tags])
    activation = tagged_step(roles[0], provisions[0], batch_flags(2),
                             np.concatenate([table, u32(nexts)]))
    edge = provisions[0].outbound.object_spec
    row = TINY.hidden * 4
    assert edge.alignment == row and activation.size == 3 * row
    assert edge.extent_failure(activation.size) is None
    assert activation[:8].tobytes() == table.tobytes() and not activation[8:row].any()
    padding = activation.copy()
    padding[row - 1] = 1
    with pytest.raises(RoleRunError, match="padding"):  # refused before any row runs
        tagged_step(roles[1], provisions[1], batch_flags(2), padding)
    answer = tagged_step(roles[1], provisions[1], batch_flags(2), activation)
    assert provisions[1].outbound.object_spec.extent_failure(answer.size) is None
    want = [int(whole.run_tagged(tag, np.array([token], np.int32))[0])
            for tag, token in zip(tags, nexts, strict=True)]
    assert answer.view("<u4").tolist() == [tag.pack() for tag in tags] + want


def test_a_prompt_batch_crosses_an_activation_edge_each_prompt_as_alone(gguf: Path) -> None:
    """Two prompts as one prompt batch through a planned 2-stage pipeline's roles: its
    table of (slot, row count) is padded to one activation row on the edge, the rows
    follow, and the last stage answers the table and each prompt's next token as the
    whole model gives it for that prompt alone; each slot then decodes on as alone."""
    request = PlanRequest(run_id=RunId(6), prompt=PromptSource.from_token_ids(PROMPT),
                          max_tokens=DECODE + 1, max_seq_len=MAX_SEQ, split=(2, 2), slots=2,
                          serving=True)
    plan = plan_run(synthetic_pool(2), model_info_from_gguf(gguf, with_stop_ids=False),
                    request).plan
    provisions = [provision_stage(plan, i, stage_runtime_facts(plan, i)) for i in range(2)]
    roles = [build_role(llama_stage_config(p, gguf), Device.DEFAULT) for p in provisions]
    whole = StageRole(open_reader(gguf).load_stage(0, 4, is_first=True, is_last=True),
                      max_seq_len=MAX_SEQ, slots=2)
    prompts = (PROMPT, (7, 8, 9))
    want = [int(whole.run_tagged(SequenceTag(slot, 0), np.array(prompt, np.int32))[0])
            for slot, prompt in enumerate(prompts)]
    tags = [SequenceTag(slot, len(prompt)) for slot, prompt in enumerate(prompts)]
    table = u32([tag.pack() for tag in tags])
    ids = u32([token for prompt in prompts for token in prompt])
    activation = tagged_step(roles[0], provisions[0], prompt_flags(2),
                             np.concatenate([table, ids]))
    edge = provisions[0].outbound.object_spec
    row = TINY.hidden * 4
    assert activation.size == (1 + len(PROMPT) + 3) * row
    assert edge.extent_failure(activation.size) is None
    assert activation[:8].tobytes() == table.tobytes() and not activation[8:row].any()
    answer = tagged_step(roles[1], provisions[1], prompt_flags(2), activation)
    assert provisions[1].outbound.object_spec.extent_failure(answer.size) is None
    assert answer.view("<u4").tolist() == [tag.pack() for tag in tags] + want
    for slot, (prompt, token) in enumerate(zip(prompts, want, strict=True)):
        tag = SequenceTag(slot, len(prompt))  # the slot's cache holds its prompt
        step = tagged_step(roles[1], provisions[1], tag.pack(),
                           tagged_step(roles[0], provisions[0], tag.pack(), u32((token,))))
        assert int(step.view("<u4")[0]) == int(whole.run_tagged(
            tag, np.array([token], np.int32))[0])


def tagged_step(role: Role, provision: ProvisionStage, flags: int,
                data: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """One step of an object whose header flags are `flags`: the output's bytes."""
    runtime = provision.runtime
    binding = OutputBinding(runtime.output_port, RingId(1), ObjectId(1), Sequence(0), 0,
                            flags)
    out = role.run({int(runtime.input_port): Tensor(data, device=Device.DEFAULT)}, [binding])
    value = out[int(runtime.output_port)]
    array = value if isinstance(value, np.ndarray) else value.numpy()
    raw: npt.NDArray[np.uint8] = array.view(np.uint8).reshape(-1)
    return raw


@pytest.mark.parametrize(("change", "phrase"), [
    ({"gguf": None}, "'gguf'"),
    ({"first": 1}, "'first'"),
    ({"dtype": "q4"}, "dtype 'q4'"),
    ({"layer_end": 9}, "LayerRangeInvalid"),
    ({"hidden_dim": 65}, "PlanMismatch"),
    ({"gguf": "/nonexistent/model.gguf"}, "llama_stage weights"),
    ({"sampling": {"mode": "Sometimes"}}, "sampling"),
    ({"slots": 0}, "slots 0 is outside 1..64"),
    ({"warm_prompt_tokens": 10_000}, "warm_prompt_tokens 10000 is outside 0..max_seq_len"),
    ({"slots": True}, "'slots'"),
    ({"slots": 2, "batch_rows": [3]}, "rows per step, each in 2..2 "),
    ({"slots": 4, "batch_rows": [1]}, "each in 2..4 "),
    ({"slots": 4, "batch_rows": [2, True]}, "batch_rows"),
    ({"batch_rows": 2}, "'batch_rows'"),
    ({"slots": 2, "mixed_rows": [2]}, "decode rows beside a prompt, each in 1..1 "),
    ({"slots": 4, "mixed_rows": [0]}, "each in 1..3 "),
    ({"slots": 2, "mixed_rows": [1, 1]}, r"mixed_rows \[1, 1\]"),
    ({"slots": 4, "mixed_rows": [1, True]}, "mixed_rows"),
    ({"mixed_rows": 1}, "'mixed_rows'"),
])
def test_bad_configs_are_role_config_errors_naming_the_problem(
    gguf: Path, provisions: list[ProvisionStage], change: JsonObject, phrase: str
) -> None:
    config = dict(llama_stage_config(provisions[1], gguf))
    config.update(change)
    with pytest.raises(RoleConfigError, match=phrase.replace("(", r"\(")):
        build_role(config, Device.DEFAULT)


def test_unreadable_objects_and_out_of_order_steps_are_role_run_errors(
    gguf: Path, provisions: list[ProvisionStage]
) -> None:
    last = build_role(llama_stage_config(provisions[1], gguf), Device.DEFAULT)
    with pytest.raises(RoleRunError, match="not whole rows"):
        run_step(last, provisions[1], 0, np.zeros(10, dtype=np.uint8))
    first = build_role(llama_stage_config(provisions[0], gguf), Device.DEFAULT)
    with pytest.raises(RoleRunError, match="int32"):
        run_step(first, provisions[0], 0, u32([2**31]))
    run_step(first, provisions[0], 0, u32(PROMPT))
    with pytest.raises(RoleRunError, match="out of order"):
        run_step(first, provisions[0], 2, u32([5]))
    binding = OutputBinding(PortId(1), RingId(1), ObjectId(1), Sequence(1), 4)
    with pytest.raises(RoleRunError, match="one input and one output"):
        first.run({}, [binding])


def test_a_role_is_rearmed_only_for_the_same_stage_of_the_unchanged_file(
    gguf: Path, provisions: list[ProvisionStage], tmp_path: Path
) -> None:
    """The worker asks the configured role first (`reconfigure`) so a node's next run of
    the same stage skips the weight load; a second run on the re-armed role must give
    what a fresh role gives, and anything else about the stage or the file rebuilds."""
    config = dict(llama_stage_config(provisions[0], gguf))
    role = build_role(config, Device.DEFAULT)
    assert isinstance(role, LlamaStageRole)
    first_run = [run_step(role, provisions[0], 0, u32(PROMPT)).tobytes()]
    first_run.append(run_step(role, provisions[0], 1, u32([7])).tobytes())
    assert role.reconfigure(config, Device.DEFAULT)
    again = [run_step(role, provisions[0], 0, u32(PROMPT)).tobytes(),
             run_step(role, provisions[0], 1, u32([7])).tobytes()]
    assert again == first_run
    sampled = {**config, "sampling": {"mode": "Temperature", "seed": 3, "temperature": 0.7,
                                      "top_k": 5, "top_p": 0.9}}
    assert role.reconfigure(sampled, Device.DEFAULT)
    assert role.stage.sampling.seed == 3
    assert not role.reconfigure({**config, "layer_end": 1}, Device.DEFAULT)
    assert not role.reconfigure(config, "OTHER")
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(gguf.read_bytes())
    assert not role.reconfigure({**config, "gguf": str(copy)}, Device.DEFAULT)
    info = gguf.stat()
    os.utime(gguf, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000))
    assert not role.reconfigure(config, Device.DEFAULT), "a rewritten file is loaded anew"


def test_a_role_from_the_fetched_cache_is_rearmed_by_its_digest(
    gguf: Path, provisions: list[ProvisionStage], tmp_path: Path
) -> None:
    """A warm spare preloads several stages from one fetched file, which gains chunks
    (a new mtime) with each: a role read from the node's cache of fetched chunks is
    re-armed while the plan's digest is the same, whatever the file's mtime."""
    fetched = tmp_path / "fetched" / ("ab" * 32) / "data"
    fetched.parent.mkdir(parents=True)
    fetched.write_bytes(gguf.read_bytes())
    ports = WorkerStagePorts(None, None, models_dir=tmp_path)  # type: ignore[arg-type]
    assert ports._fetched(str(fetched)) and not ports._fetched(str(gguf))
    config = dict(llama_stage_config(provisions[0], fetched, content_addressed=True))
    config["sha256"] = "ab" * 32
    role = build_role(config, Device.DEFAULT)
    assert isinstance(role, LlamaStageRole)
    info = fetched.stat()
    os.utime(fetched, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000))  # another range
    assert role.reconfigure(config, Device.DEFAULT)
    assert not role.reconfigure({**config, "sha256": "cd" * 32}, Device.DEFAULT)
    plain = {k: v for k, v in config.items() if k != "content_addressed"}
    assert not role.reconfigure(plain, Device.DEFAULT)  # by stat: the mtime moved
    unpinned = {**config, "sha256": None}
    assert not build_role(unpinned, Device.DEFAULT).reconfigure(  # type: ignore[attr-defined]
        unpinned, Device.DEFAULT)  # no digest: never re-armed


def test_the_nodes_weight_mode_reaches_the_role(gguf: Path,
                                                provisions: list[ProvisionStage]) -> None:
    """`swactor node --weights` travels in the role config; a mode nobody knows is a
    RoleConfigProblem naming it, on the node, before the worker is asked."""
    assert llama_stage_config(provisions[0], gguf)["weights"] == "blocks"  # the default
    role = build_role(llama_stage_config(provisions[0], gguf), Device.DEFAULT)
    assert isinstance(role, LlamaStageRole) and role.stage.quantised
    config = llama_stage_config(provisions[0], gguf, weights="dense")
    assert config["weights"] == "dense"
    dense = build_role(config, Device.DEFAULT)
    assert isinstance(dense, LlamaStageRole) and not dense.stage.quantised
    with pytest.raises(RoleConfigProblem, match="weights 'int4'"):
        llama_stage_config(provisions[0], gguf, weights="int4")


def test_the_plans_slots_reach_the_role(gguf: Path) -> None:
    """`PlanRequest.slots` -> the plan's model -> each ProvisionStage -> the ConfigureRole
    config -> the StageRole's KV slots (a run that asks for none gets one)."""
    request = PlanRequest(run_id=RunId(4), prompt=PromptSource.from_token_ids(PROMPT),
                          max_tokens=DECODE + 1, max_seq_len=MAX_SEQ, split=(2, 2), slots=3)
    plan = plan_run(synthetic_pool(2), model_info_from_gguf(gguf, with_stop_ids=False),
                    request).plan
    provision = provision_stage(plan, 1, stage_runtime_facts(plan, 1))
    config = llama_stage_config(provision, gguf)
    assert config["slots"] == 3
    role = build_role(config, Device.DEFAULT)
    assert isinstance(role, LlamaStageRole) and role.stage.slots == 3
    assert llama_stage_config(planned(gguf)[0], gguf)["slots"] == 1
    assert config["warm_prompt_tokens"] == 0  # a run that asks for none: the cache's
    assert config["batch_rows"] == []  # likewise: no batched decode kernels built
    # a plan's warm batch rows (at most its slots) -> the batch sizes the role builds
    warm = plan_run(synthetic_pool(2), model_info_from_gguf(gguf, with_stop_ids=False),
                    replace(request, warm_batch_rows=5)).plan
    assert warm.model.warm_batch_rows == 3
    provision = provision_stage(warm, 0, stage_runtime_facts(warm, 0))
    assert provision.model.warm_batch_rows == 3
    assert llama_stage_config(provision, gguf)["batch_rows"] == [2, 3]
    assert config["mixed_rows"] == []  # no mixed-step graphs built unless asked
    # a plan's warm mixed rows (at most its slots - 1) -> the row counts the role builds
    mixed = plan_run(synthetic_pool(2), model_info_from_gguf(gguf, with_stop_ids=False),
                     replace(request, warm_mixed_rows=5)).plan
    assert mixed.model.warm_mixed_rows == 2
    provision = provision_stage(mixed, 1, stage_runtime_facts(mixed, 1))
    assert provision.model.warm_mixed_rows == 2
    assert llama_stage_config(provision, gguf)["mixed_rows"] == [1, 2]
