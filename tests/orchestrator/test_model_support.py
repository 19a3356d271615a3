"""Plan-time refusal of what no stage can run, and the per-stage memory prediction."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from swactor.cli import main
from swactor.model.gguf_range import open_reader
from swactor.model.llama_role import StageRole
from swactor.orchestrator import orchestrate_cmd
from swactor.orchestrator.errors import PlannerError, PlanProblem
from swactor.orchestrator.inventory import NodeResources, PoolInventory
from swactor.orchestrator.model_info import model_info_from_gguf
from swactor.orchestrator.planner import ComputeDtype, PlanRequest, fitted_split, plan_run
from swactor.wire import NodeId, PromptSource, RunId
from tests.model.tiny_gguf import TinyConfig, write_tiny_gguf

SMALL = {"hidden": 256, "heads": 4, "kv_heads": 2, "ffn": 512, "vocab": 300, "context": 64}


def _write(tmp_path: Path, name: str, **fields: object) -> Path:
    cfg = TinyConfig(**{"blocks": 2, **SMALL, **fields})  # type: ignore[arg-type]
    return write_tiny_gguf(tmp_path / f"{name}.gguf", cfg)


UNSUPPORTED = [
    ({"arch": "gemma"}, PlanProblem.UnsupportedArchitecture,
     ["architecture 'gemma'", "supported: llama, qwen2"]),
    ({"types_by_matrix": {"ffn_down": Q.IQ4_NL}}, PlanProblem.UnsupportedTensorType,
     ["quantisation type IQ4_NL", "tensor blk.0.ffn_down.weight and 1 more",
      "supported: F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, "
      "BF16"]),
    ({"tokenizer_model": "bert"}, PlanProblem.UnsupportedTokenizer,
     ["tokenizer model 'bert'", "supported: gpt2, llama"]),
]


@pytest.mark.parametrize(("fields", "problem", "words"), UNSUPPORTED,
                         ids=["architecture", "tensor-type", "tokenizer"])
def test_unsupported_input_is_refused_by_name(
    tmp_path: Path, fields: dict[str, object], problem: PlanProblem, words: list[str]
) -> None:
    path = _write(tmp_path, "bad", **fields)
    with pytest.raises(PlannerError) as info:
        model_info_from_gguf(path)
    assert info.value.reason is problem
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize(("fields", "problem", "words"), UNSUPPORTED,
                         ids=["architecture", "tensor-type", "tokenizer"])
def test_plan_run_serve_and_orchestrator_refuse_before_any_node_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    fields: dict[str, object], problem: PlanProblem, words: list[str],
) -> None:
    from swactor.cluster.launcher import LocalCluster

    path = _write(tmp_path, "bad", **fields)
    assert main(["plan", "--model", str(path), "--nodes", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"swactor plan: {problem.value}: ") and words[0] in err
    assert words[-1] in err  # the supported list
    assert len(err.strip().splitlines()) == 1

    async def no_start(self: LocalCluster) -> None:
        raise AssertionError("a node was started for a model the plan refuses")

    monkeypatch.setattr(LocalCluster, "start", no_start)
    assert main(["run", "--model", str(path), "--nodes", "2",
                 "--keys-dir", str(tmp_path / "keys")]) == 2
    err = capsys.readouterr().err
    assert "swactor run:" in err and problem.value in err and words[0] in err
    assert words[-1] in err

    def no_session(*_: object) -> int:
        raise AssertionError("a session was started for a model the plan refuses")

    assert main(["serve", "--model", str(path), "--nodes", "2", "--port", "0",
                 "--keys-dir", str(tmp_path / "serve-keys")]) == 2
    err = capsys.readouterr().err
    assert f"swactor serve: {problem.value}: " in err and words[0] in err
    assert words[-1] in err

    monkeypatch.setattr(orchestrate_cmd, "execute", no_session)
    assert main(["orchestrator", "--key", str(tmp_path / "orchestrator.key"), "--open-pool",
                 "--node", "1@127.0.0.1:9", "--model", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"swactor orchestrator: {problem.value}: " in err and words[0] in err
    assert words[-1] in err


def test_supported_tokenizer_models_pass(tmp_path: Path) -> None:
    for model in ("gpt2", "llama"):
        info = model_info_from_gguf(_write(tmp_path, model, tokenizer_model=model),
                                    with_stop_ids=False)
        assert info.block_count == 2


MEMORY_CASES = {
    "q4_k-tied": TinyConfig(blocks=3, seed=21, matrix_type=Q.Q4_K, embd_type=Q.Q4_K,
                            **SMALL),  # type: ignore[arg-type]
    "q4_k_m-mixed-f16-layer": TinyConfig(
        blocks=3, seed=22, matrix_type=Q.Q4_K, embd_type=Q.Q6_K, tied=False,
        types_by_layer={1: Q.F16}, types_by_matrix={"attn_v": Q.Q6_K, "ffn_down": Q.Q6_K},
        **SMALL),  # type: ignore[arg-type]
    "qwen2-q8_0-q5_0": TinyConfig(
        blocks=3, seed=23, arch="qwen2", matrix_type=Q.Q8_0, embd_type=Q.Q5_0, tied=False,
        types_by_layer={1: Q.Q2_K, 2: Q.Q5_K}, types_by_matrix={"ffn_down": Q.Q3_K},
        **SMALL),  # type: ignore[arg-type]
    # llama.cpp's Q5_K_M of a model whose width is no multiple of 256: mostly Q5_1
    "q5_k_m-narrow": TinyConfig(
        blocks=3, seed=25, matrix_type=Q.Q5_1, embd_type=Q.Q8_0, tied=False,
        types_by_layer={1: Q.Q8_0}, types_by_matrix={"ffn_down": Q.Q6_K},
        **SMALL),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("name", sorted(MEMORY_CASES))
def test_predicted_stage_memory_is_what_the_role_holds(tmp_path: Path, name: str) -> None:
    """The planner's prediction equals the bytes the built role holds (weights, KV cache)
    and the file bytes the stage reads, for both weight modes, both dtypes, every stage."""
    path = write_tiny_gguf(tmp_path / "m.gguf", MEMORY_CASES[name])
    info = model_info_from_gguf(path, with_stop_ids=False)
    reader = open_reader(path)
    for weights in ("dense", "blocks"):
        for dtype, width in (("f32", 4), ("f16", 2)):
            for start, end in ((0, 3), (0, 1), (1, 2), (2, 3)):
                loaded = reader.load_stage(start, end, is_first=start == 0, is_last=end == 3,
                                           dtype=dtype, keep_blocks=weights == "blocks")
                file_bytes = loaded.tensor_bytes
                slots = 1 + start  # 1, 1, 2, 3 KV slots
                role = StageRole(loaded, max_seq_len=24, quantised=weights == "blocks",
                                 slots=slots)
                want = info.stage_memory(start, end, width, 24, weights, slots)
                where = (weights, dtype, start, end, slots)
                assert (role.weight_bytes, role.kv_cache_bytes) == (want.weights,
                                                                    want.kv_cache), where
                assert want.file_bytes == file_bytes == role.file_bytes, where
                # every matrix in blocks (F16 ones as the file's 16-bit values): near the
                # file bytes (a whole tied stage too: its lookup reads the output matrix,
                # the embedding is held once)
                if weights == "blocks":
                    assert want.weights <= 1.25 * want.file_bytes, where


def test_planner_resizes_ranges_by_the_prediction(tmp_path: Path) -> None:
    """Equal nodes, a heavy output head: the proportional split puts the last stage over
    its node; the fitted split moves blocks to the first stages and every stage fits."""
    cfg = TinyConfig(blocks=6, seed=24, matrix_type=Q.Q8_0, embd_type=Q.Q4_0, tied=False,
                     hidden=256, heads=4, kv_heads=2, ffn=512, vocab=4000, context=64)
    info = model_info_from_gguf(write_tiny_gguf(tmp_path / "h.gguf", cfg),
                                with_stop_ids=False)
    costs = info.memory_costs(4, "blocks")
    even = max(costs.stage(a, b, 16).total for a, b in ((0, 2), (2, 4), (4, 6)))
    fitted = fitted_split(costs, [1, 1, 1], 16)
    starts = [0, fitted[0], fitted[0] + fitted[1], 6]
    memory = max(costs.stage(starts[i], starts[i + 1], 16).total for i in range(3))
    assert memory < even  # the even split does not fit; the fitted one does
    nodes = PoolInventory(tuple(NodeResources(NodeId(1 + i), memory) for i in range(3)))
    request = PlanRequest(run_id=RunId(1), prompt=PromptSource.from_text("hi"),
                          max_tokens=4, max_seq_len=16, dtype=ComputeDtype.f32,
                          weights="blocks")
    planned = plan_run(nodes, info, request)
    counts = [s.layer_end_exclusive - s.layer_start for s in planned.plan.stages]
    assert counts != [2, 2, 2] and counts[-1] < 2 and sum(counts) == 6
    assert all(m.total <= memory for m in planned.stage_memory)
    assert tuple(counts) == fitted_split(costs, [memory] * 3, 16)
    with pytest.raises(PlannerError) as error:
        plan_run(PoolInventory(tuple(NodeResources(NodeId(1 + i), memory // 3)
                                     for i in range(3))), info, request)
    assert error.value.reason is PlanProblem.NodeMemoryTooSmall
    assert "KV cache" in str(error.value)


def test_plan_prints_predicted_memory(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    path = write_tiny_gguf(tmp_path / "p.gguf", MEMORY_CASES["q4_k-tied"])
    assert main(["plan", "--model", str(path), "--nodes", "3", "--weights", "blocks",
                 "--max-seq-len", "32", "--max-tokens", "8"]) == 0
    out = capsys.readouterr().out
    info = model_info_from_gguf(path, with_stop_ids=False)
    rows = [line.split() for line in out.splitlines() if line[:1].isdigit() and "cpu" in line]
    ratios = [float(t[:-1]) for row in rows for t in row if re.fullmatch(r"\d+\.\d\dx", t)]
    assert len(rows) == len(ratios) == 3
    want = [info.stage_memory(i, i + 1, 4, 32, "blocks").ratio for i in range(3)]
    assert ratios == [round(r, 2) for r in want]
    assert "--weights blocks" in out
    assert np.all(np.array(ratios) < 1.25)


def test_the_stage_logs_its_memory_at_ready(tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """What the worker says when its stage is built (the node relays the worker's log):
    the weights held and their ratio to the file bytes, the KV cache apart, the RSS; the
    figures are the planner's prediction for the stage."""
    path = write_tiny_gguf(tmp_path / "r.gguf", MEMORY_CASES["q5_k_m-narrow"])
    loaded = open_reader(path).load_stage(1, 3, is_first=False, is_last=True,
                                          keep_blocks=True)
    with caplog.at_level("INFO", logger="swactor.model.llama_role"):
        StageRole(loaded, max_seq_len=24, quantised=True)
    (line,) = [r.getMessage() for r in caplog.records if "ready on" in r.getMessage()]
    found = re.search(r"blocks 1\.\.3 ready .*\(blocks weights\): weights ([\d.]+) MiB = "
                      r"([\d.]+)x its ([\d.]+) MiB in the file, KV cache ([\d.]+) MiB for "
                      r"1 slot\(s\) of max_seq_len 24, process RSS ([\d.]+) MiB", line)
    assert found, line
    want = model_info_from_gguf(path, with_stop_ids=False).stage_memory(1, 3, 4, 24, "blocks")
    mib = 1 << 20
    weights, ratio, file_mib, kv, rss = (float(g) for g in found.groups())
    assert (weights, file_mib, kv) == (round(want.weights / mib, 1),
                                       round(want.file_bytes / mib, 1),
                                       round(want.kv_cache / mib, 1))
    assert ratio == round(want.weights / want.file_bytes, 2) and ratio <= 1.25
    assert rss > 0
