"""SmolLM2 (the real model) through three planned llama_stage roles over ring bytes (soak:
the real-node 3-stage tests of `just test` cover the same path end to end).

The plan is the planner's own 3-node split of the file; each stage's role is built from
its ProvisionStage by `llama_stage_config` and the worker's role registry, and objects
travel as u32 token ids and f32 activation rows. The greedy tokens must equal those of
the model package's single StageRole over all 30 blocks.
"""

from __future__ import annotations

import numpy as np
import pytest
from tinygrad.device import Device
from tinygrad.tensor import Tensor

from swactor.model.gguf_range import open_reader
from swactor.model.llama_role import StageRole
from swactor.model.paths import default_model_path
from swactor.model.tokenizer import Tokenizer
from swactor.node.role_config import llama_stage_config
from swactor.node.stage_controller import output_extent
from swactor.orchestrator.inventory import synthetic_pool
from swactor.orchestrator.model_info import model_info_from_gguf
from swactor.orchestrator.planner import PlanRequest, plan_run, stage_runtime_facts
from swactor.wire import (
    ObjectId,
    OutputBinding,
    PromptSource,
    RingId,
    RunId,
    Sequence,
    provision_stage,
)
from swactor.worker.roles import build_role

pytestmark = [pytest.mark.slow, pytest.mark.soak]

TOKENS = 8
MAX_SEQ = 64


def test_three_planned_llama_stage_roles_match_one_stage() -> None:
    path = default_model_path()
    if not path.is_file():
        pytest.fail(f"{path} missing: run scripts/setup.sh")
    prompt = tuple(Tokenizer.from_gguf(path).encode("hello world"))
    request = PlanRequest(run_id=RunId(1), prompt=PromptSource.from_token_ids(prompt),
                          max_tokens=TOKENS, max_seq_len=MAX_SEQ, first_edge_id=10)
    plan = plan_run(synthetic_pool(3), model_info_from_gguf(path), request).plan
    provisions = [provision_stage(plan, i, stage_runtime_facts(plan, i)) for i in range(3)]
    ranges = [(p.layer_start, p.layer_end_exclusive) for p in provisions]
    assert ranges[0][0] == 0 and ranges[-1][1] == 30 and len(ranges) == 3
    roles = [build_role(llama_stage_config(p, path), Device.DEFAULT) for p in provisions]
    whole = StageRole(open_reader(path).load_stage(0, 30, is_first=True, is_last=True),
                      max_seq_len=MAX_SEQ)

    tokens: list[int] = []
    expected: list[int] = []
    ids = prompt
    for step in range(TOKENS):
        data = np.asarray(ids, dtype="<u4").view(np.uint8)
        for role, provision in zip(roles, provisions, strict=True):
            runtime = provision.runtime
            binding = OutputBinding(runtime.output_port, RingId(1), ObjectId(step + 1),
                                    Sequence(step), output_extent(provision, data.size))
            out = role.run({int(runtime.input_port): Tensor(data, device=Device.DEFAULT)},
                           [binding])
            value = out[int(runtime.output_port)]  # a host array or a tensor
            host = value if isinstance(value, np.ndarray) else value.numpy()
            data = host.view(np.uint8).reshape(-1)
            assert data.size == binding.extent
        tokens.append(int(data.view("<u4")[0]))
        expected.append(int(whole.step(step, np.array(ids, dtype=np.int32))[0]))
        ids = (tokens[-1],)
    print(f"\nsplit {ranges} tokens {tokens}")
    assert tokens == expected
