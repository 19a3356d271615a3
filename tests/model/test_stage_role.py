"""Stage roles in tinygrad: agreement with the numpy reference and across every split."""

from __future__ import annotations

import gc
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from gguf import GGMLQuantizationType as Q
from tinygrad.helpers import GlobalCounters

from swactor.model import jit_cache, llama_role
from swactor.model.block_kernels import DeviceQuant, to_device, upload
from swactor.model.dequant import QuantMatrix
from swactor.model.gguf_range import open_reader
from swactor.model.llama_role import SharedEmbedding, StageRole, StepError, _Matrix
from tests.model.conftest import int8_inputs
from tests.model.numpy_reference import NumpyLlama
from tests.model.tiny_gguf import TinyConfig, write_tiny_gguf

PROMPT = [5, 17, 42, 99, 7, 250]
DECODE_STEPS = 3
MAX_SEQ = 16


def _rel(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> float:
    return float(np.abs(np.asarray(a, np.float64) - b).max() / np.abs(b).max())


def _splits(layers: int) -> list[list[tuple[int, int]]]:
    """Every way to cut ``layers`` blocks into 1..layers contiguous stages."""
    result = []
    for cuts in itertools.product([False, True], repeat=layers - 1):
        bounds = [0] + [i + 1 for i, cut in enumerate(cuts) if cut] + [layers]
        result.append(list(itertools.pairwise(bounds)))
    return result


def _roles(path: Path, split: list[tuple[int, int]], dtype: str = "f32") -> list[StageRole]:
    reader = open_reader(path)
    roles = []
    for index, (start, end) in enumerate(split):
        weights = reader.load_stage(
            start, end, is_first=index == 0, is_last=index == len(split) - 1, dtype=dtype
        )
        roles.append(StageRole(weights, max_seq_len=MAX_SEQ))
    return roles


def _run(
    roles: list[StageRole], steps: int = DECODE_STEPS, forced: list[int] | None = None
) -> tuple[list[int], list[npt.NDArray[np.float32]]]:
    """Prefill ``PROMPT`` then decode; feed back greedy tokens (or ``forced`` ones)."""
    tokens: list[int] = []
    logits: list[npt.NDArray[np.float32]] = []
    payload: npt.NDArray[Any] = np.array(PROMPT, dtype=np.int32)
    for sequence in range(steps + 1):
        obj = payload
        for role in roles:
            obj = role.step(sequence, obj)
        assert obj.dtype == np.int32 and obj.shape == (1,)
        tokens.append(int(obj[0]))
        assert roles[-1].last_logits is not None
        logits.append(roles[-1].last_logits.copy())
        if sequence == steps:
            break
        next_id = forced[sequence] if forced else tokens[-1]
        payload = np.array([next_id], dtype=np.int32)
    return tokens, logits


@pytest.mark.parametrize(
    "cfg",
    [
        TinyConfig(blocks=2, seed=3),
        TinyConfig(blocks=2, seed=4, arch="qwen2", tied=False),
        TinyConfig(blocks=2, seed=5, rope_dim=32, heads=4, kv_heads=1, rope_theta=500.0),
        # gate/up (3072 rows) and output (1300 rows) products are split into CPU kernels
        # of fewer than 1024 rows and concatenated: the pieces must come back in order
        TinyConfig(blocks=2, seed=7, hidden=128, heads=2, kv_heads=1, ffn=1536, vocab=1300),
    ],
    ids=["llama", "qwen2", "llama-partial-rope-mqa", "llama-split-wide-products"],
)
def test_one_stage_matches_numpy_reference(tmp_path: Path, cfg: TinyConfig) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf", cfg)
    reference = NumpyLlama(path)
    forced = [11, 3, 200]
    _, logits = _run(_roles(path, [(0, cfg.blocks)]), forced=forced)
    sequence = list(PROMPT)
    for step, got in enumerate(logits):
        assert _rel(got, reference.logits(sequence)) < 2e-5, f"step {step}"
        sequence.append(forced[step] if step < len(forced) else 0)


@pytest.mark.parametrize(
    "qtype", [Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K,
              Q.Q5_K, Q.Q6_K],
    ids=lambda q: q.name,
)
def test_each_tensor_type_matches_reference(tmp_path: Path, qtype: Q) -> None:
    cfg = TinyConfig(blocks=1, seed=6, matrix_type=qtype, embd_type=qtype, tied=False)
    path = write_tiny_gguf(tmp_path / "q.gguf", cfg)
    _, logits = _run(_roles(path, [(0, 1)]), steps=0)
    assert _rel(logits[0], NumpyLlama(path).logits(PROMPT)) < 2e-5


def test_every_split_gives_the_same_logits_and_tokens(tiny_mixed: Path) -> None:
    whole_tokens, whole_logits = _run(_roles(tiny_mixed, [(0, 6)]))
    reference = NumpyLlama(tiny_mixed)
    assert _rel(whole_logits[0], reference.logits(PROMPT)) < 2e-5
    splits = _splits(6)
    assert len(splits) == 32
    for split in splits[1:]:
        tokens, logits = _run(_roles(tiny_mixed, split))
        assert tokens == whole_tokens, split
        for step, (got, want) in enumerate(zip(logits, whole_logits, strict=True)):
            assert _rel(got, want) < 1e-5, (split, step)


def test_f16_plan_splits_give_identical_logits(tiny_llama: Path) -> None:
    """The residual stream is rounded to f16 at every block boundary, inside a stage as
    between two, so every split computes the whole model's logits bit for bit."""
    whole_tokens, whole_logits = _run(_roles(tiny_llama, [(0, 4)], "f16"))
    _f32_tokens, f32_logits = _run(_roles(tiny_llama, [(0, 4)], "f32"))
    assert _rel(whole_logits[0], f32_logits[0]) < 2e-2  # f16 weights and residuals
    for split in ([(0, 1), (1, 4)], [(0, 2), (2, 3), (3, 4)]):
        roles = _roles(tiny_llama, split, "f16")
        tokens, logits = _run(roles)
        assert tokens == whole_tokens
        for got, want in zip(logits, whole_logits, strict=True):
            np.testing.assert_array_equal(got, want)


def test_activation_objects_follow_the_convention(tiny_llama: Path) -> None:
    roles = _roles(tiny_llama, [(0, 2), (2, 4)], "f16")
    act = roles[0].step(0, np.array(PROMPT, dtype=np.int32))
    assert act.dtype == np.float16 and act.shape == (len(PROMPT), 256)
    assert act.flags.c_contiguous and act.nbytes == len(PROMPT) * 256 * 2
    out = roles[1].step(0, act)
    assert out.dtype == np.int32 and out.shape == (1,)
    act = roles[0].step(1, out)
    assert act.shape == (1, 256)


def test_bad_step_inputs_are_typed(tiny_llama: Path) -> None:
    first, last = _roles(tiny_llama, [(0, 2), (2, 4)])
    with pytest.raises(StepError):
        first.step(0, np.array(PROMPT, dtype=np.int64))
    with pytest.raises(StepError):
        first.step(0, np.array([10_000], dtype=np.int32))
    with pytest.raises(StepError):
        last.step(0, np.zeros((2, 255), dtype=np.float32))
    with pytest.raises(StepError):
        last.step(0, np.zeros((2, 256), dtype=np.float16))
    act = first.step(0, np.array(PROMPT, dtype=np.int32))
    with pytest.raises(StepError):
        first.step(2, np.array([1], dtype=np.int32))  # step 1 skipped
    with pytest.raises(StepError):
        first.step(1, np.array([1, 2], dtype=np.int32))  # decode carries one position
    last.step(0, act)
    too_long = np.zeros((MAX_SEQ + 1,), dtype=np.int32)
    with pytest.raises(StepError):
        first.step(0, too_long)


def _block_roles(path: Path, split: list[tuple[int, int]]) -> list[StageRole]:
    reader = open_reader(path)
    return [
        StageRole(
            reader.load_stage(
                a, b, is_first=i == 0, is_last=i == len(split) - 1, dtype="f32",
                keep_blocks=True,
            ),
            max_seq_len=MAX_SEQ,
            quantised=True,
        )
        for i, (a, b) in enumerate(split)
    ]


_Q4_K_M = {"attn_v": Q.Q6_K, "ffn_down": Q.Q6_K}  # the matrices llama.cpp's _M lifts


@pytest.mark.parametrize(
    "cfg",
    [
        TinyConfig(blocks=2, seed=8, matrix_type=Q.Q4_1, embd_type=Q.Q8_0),
        TinyConfig(blocks=2, seed=9, matrix_type=Q.Q4_0, embd_type=Q.Q4_1, tied=False),
        # Q2_K matrices and output, ffn_down Q3_K, a Q8_0 embedding
        TinyConfig(blocks=2, seed=10, arch="qwen2", matrix_type=Q.Q2_K, embd_type=Q.Q8_0,
                   tied=False, types_by_matrix={"ffn_down": Q.Q3_K}),
        # 3072-row gate/up and 1300-row output block products are cut into <800-row kernels
        TinyConfig(blocks=2, seed=11, hidden=128, heads=2, kv_heads=1, ffn=1536, vocab=1300,
                   matrix_type=Q.Q4_1, embd_type=Q.Q8_0),
        TinyConfig(blocks=2, seed=14, matrix_type=Q.Q4_K, embd_type=Q.Q4_K),
        TinyConfig(blocks=2, seed=15, matrix_type=Q.Q5_K, embd_type=Q.Q6_K, tied=False),
        TinyConfig(blocks=2, seed=16, matrix_type=Q.Q6_K, embd_type=Q.Q5_K, tied=False),
        TinyConfig(blocks=2, seed=17, arch="qwen2", matrix_type=Q.Q5_K, embd_type=Q.Q8_0),
        # q, k, gate, up Q4_K; v and down Q6_K; one block Q8_0; the output Q6_K
        TinyConfig(blocks=2, seed=18, matrix_type=Q.Q4_K, embd_type=Q.Q4_K, tied=False,
                   types_by_layer={1: Q.Q8_0}, types_by_matrix=_Q4_K_M),
        TinyConfig(blocks=2, seed=21, matrix_type=Q.Q5_0, embd_type=Q.Q5_0),
        TinyConfig(blocks=2, seed=22, arch="qwen2", matrix_type=Q.Q5_1, embd_type=Q.Q5_1,
                   tied=False),
        # llama.cpp's Q5_K_M of a model whose width is no multiple of 256 (SmolLM2):
        # Q5_1 matrices, attn_v Q8_0 in one block, ffn_down Q5_K/Q6_K, Q8_0 embedding
        TinyConfig(blocks=2, seed=23, matrix_type=Q.Q5_1, embd_type=Q.Q8_0,
                   types_by_layer={1: Q.Q8_0},
                   types_by_matrix={"attn_v": Q.Q5_1, "ffn_down": Q.Q5_K}),
        # one type per file (the kernels themselves: tests/model/test_block_kernels.py);
        # soak for just test's time budget (the Q2_K/Q3_K file above and the F16 layer of
        # test_mixed_block_matrices_are_one_product_per_type cover their kernels here)
        *(pytest.param(cfg, marks=pytest.mark.soak) for cfg in (
            TinyConfig(blocks=2, seed=24, matrix_type=Q.Q2_K, embd_type=Q.Q2_K),
            TinyConfig(blocks=2, seed=25, matrix_type=Q.Q3_K, embd_type=Q.Q6_K, tied=False),
            TinyConfig(blocks=2, seed=27, matrix_type=Q.F16, embd_type=Q.F16),
            TinyConfig(blocks=2, seed=28, matrix_type=Q.BF16, embd_type=Q.F16, tied=False),
        )),
    ],
    ids=["q4_1-tied-q8_0", "q4_0-output-q4_1", "qwen2-q2_k-q3_k",
         "q4_1-split-wide-products", "q4_k-tied", "q5_k-output-q6_k", "q6_k-output-q5_k",
         "qwen2-q5_k", "q4_k_m-mixed", "q5_0-tied", "qwen2-q5_1", "q5_k_m-narrow-mixed",
         "q2_k-tied", "q3_k-output-q6_k", "f16-tied", "bf16-output-f16"],
)
def test_block_decode_matches_reference_and_every_split(tmp_path: Path, cfg: TinyConfig) -> None:
    """Prefill and decode from the file's blocks: the numpy float64 reference (weights by
    gguf-py's dequantisation) within f32 rounding of a different summation order, and one
    stage's tokens and logits for every split."""
    path = write_tiny_gguf(tmp_path / "b.gguf", cfg)
    roles = _block_roles(path, [(0, 2)])
    for block in roles[0].blocks:
        for matrix in (block.w_qkv, block.wo, block.w_gate_up, block.w_down):
            assert all(isinstance(p, DeviceQuant) for p in matrix.parts)
    assert roles[0].output is not None and roles[0].output.quantised
    # tied: the lookup reads the output matrix's blocks; untied: the embedding's own
    assert isinstance(roles[0].token_embd, SharedEmbedding if cfg.tied else QuantMatrix)
    forced = [11, 3, 200]
    tokens, logits = _run(roles, forced=forced)
    reference = NumpyLlama(path, int8_inputs())
    sequence = list(PROMPT)
    for step, got in enumerate(logits):
        assert _rel(got, reference.logits(sequence)) < 1e-4, f"step {step}"
        sequence.append(forced[step] if step < len(forced) else 0)
    for split in ([(0, 1), (1, 2)],):
        split_tokens, split_logits = _run(_block_roles(path, split), forced=forced)
        assert split_tokens == tokens
        for got, want in zip(split_logits, logits, strict=True):
            assert _rel(got, want) < 1e-5


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_k_quant_file_one_and_three_stages_agree_in_blocks_and_dense(
    tmp_path: Path, dtype: str
) -> None:
    """A Q4_K_M-like file (Q4_K, attn_v/ffn_down Q6_K, a Q5_K block, Q6_K output):
    greedy tokens of one stage and of three stages are the same in block mode, and in
    f32 block-mode logits match dense-mode logits (the same weights, bit for bit)."""
    cfg = TinyConfig(blocks=3, seed=20, matrix_type=Q.Q4_K, embd_type=Q.Q6_K, tied=False,
                     types_by_layer={2: Q.Q5_K}, types_by_matrix=_Q4_K_M)
    path = write_tiny_gguf(tmp_path / "k.gguf", cfg)
    reader = open_reader(path)

    def roles(split: list[tuple[int, int]], blocks: bool) -> list[StageRole]:
        return [StageRole(reader.load_stage(a, b, is_first=i == 0, is_last=i == len(split) - 1,
                                            dtype=dtype, keep_blocks=blocks),
                          max_seq_len=MAX_SEQ, quantised=blocks)
                for i, (a, b) in enumerate(split)]

    one_tokens, one_logits = _run(roles([(0, 3)], True), steps=6)
    three_tokens, three_logits = _run(roles([(0, 1), (1, 2), (2, 3)], True), steps=6)
    dense_tokens, dense_logits = _run(roles([(0, 3)], False), steps=6)
    assert three_tokens == one_tokens
    # f16: the f16 residual and KV cache round differently once split (dense f16 splits
    # of this file differ from the whole by up to 2.4e-3 too); f32 agrees to rounding
    tolerance = 1e-5 if dtype == "f32" else 1e-2
    for got, want in zip(three_logits, one_logits, strict=True):
        assert _rel(got, want) < tolerance
    if dtype == "f32":  # f16: dense holds f16-rounded weights, blocks the exact ones
        assert one_tokens == dense_tokens
        for got, want in zip(one_logits, dense_logits, strict=True):
            assert _rel(got, want) < 1e-5


def test_tied_lookup_copies_rows_out_where_device_memory_is_not_host(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tied single stage on a device whose memory numpy cannot view (any but CPU; here
    the CPU with its views refused) still holds the embedding once: the lookup copies
    each row it needs out of the output matrix's device buffers, the same rows as the
    view-based lookup's (the only input of the forward pass that differs)."""
    cfg = TinyConfig(blocks=1, seed=29, matrix_type=Q.F16, embd_type=Q.F16)
    path = write_tiny_gguf(tmp_path / "t.gguf", cfg)
    (viewed,) = _block_roles(path, [(0, 1)])
    monkeypatch.setattr(llama_role, "_zero_copy_view", lambda buffer, tensor: None)
    (copied,) = _block_roles(path, [(0, 1)])
    assert isinstance(viewed.token_embd, SharedEmbedding)
    assert isinstance(copied.token_embd, SharedEmbedding)
    assert viewed.token_embd.views is not None and copied.token_embd.views is None
    assert copied.weight_bytes == viewed.weight_bytes
    ids = np.array([7, 0, cfg.vocab - 1, 7], dtype=np.int32)
    np.testing.assert_array_equal(copied.token_embd.dense_rows(ids, np.float32),
                                  viewed.token_embd.dense_rows(ids, np.float32))


@pytest.mark.parametrize("qtype", [Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0,
                                   Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.F32],
                         ids=lambda q: q.name)
def test_shared_embedding_rows_copied_out_equal_the_files(tmp_path: Path, qtype: Q) -> None:
    """The tied lookup's rows, from host views of the output matrix's buffers and copied
    out of them row by row (the path of devices numpy cannot view), are the file's rows
    dequantised by gguf-py."""
    cfg = TinyConfig(blocks=1, seed=30, matrix_type=qtype, embd_type=qtype, vocab=40)
    path = write_tiny_gguf(tmp_path / "e.gguf", cfg)
    loaded = open_reader(path).load_stage(0, 1, is_first=True, is_last=True, keep_blocks=True)
    quant = loaded.blocks.get("token_embd.weight")
    if quant is None:
        matrix = _Matrix([upload(loaded.tensors["token_embd.weight"], "CPU")])
        want = loaded.tensors["token_embd.weight"]
    else:
        matrix = _Matrix([to_device(quant, "CPU")])
        want = quant.dense(np.float32)
    viewed = SharedEmbedding.of(matrix)
    assert viewed is not None and viewed.views is not None
    copied = SharedEmbedding(viewed.type_id, viewed.cols, viewed.tensors, None)
    ids = np.array([39, 0, 5, 39, 17], dtype=np.int32)
    for lookup in (viewed, copied):
        np.testing.assert_array_equal(lookup.dense_rows(ids, np.float32), want[ids])


def test_mixed_block_matrices_are_one_product_per_type(tmp_path: Path) -> None:
    """q and k (Q4_K) stack into one block matrix, v (Q6_K) is a second; an F16 block
    stacks q, k (F16 values) and v (Q6_K) likewise; block-mode logits match dense-mode
    logits (the tied output Q6_K: no product here quantises its activations)."""
    cfg = TinyConfig(blocks=2, seed=19, matrix_type=Q.Q4_K, embd_type=Q.Q6_K,
                     types_by_layer={1: Q.F16}, types_by_matrix={"attn_v": Q.Q6_K})
    path = write_tiny_gguf(tmp_path / "m.gguf", cfg)
    (role,) = _block_roles(path, [(0, 2)])
    kinds = [[p.type_name if isinstance(p, DeviceQuant) else "dense" for p in m.parts]
             for m in (role.blocks[0].w_qkv, role.blocks[1].w_qkv, role.blocks[1].w_down)]
    assert kinds == [["Q4_K", "Q6_K"], ["F16", "Q6_K"], ["F16"]]
    _, block_logits = _run([role])
    _, dense_logits = _run(_roles(path, [(0, 2)]))
    for got, want in zip(block_logits, dense_logits, strict=True):
        assert _rel(got, want) < 1e-5


def test_block_roles_leave_f32_matrices_dense(tmp_path: Path) -> None:
    """F32 matrices are held as they are (the dense products every dense role runs);
    the Q5_0 embedding stays in its blocks."""
    cfg = TinyConfig(blocks=1, seed=12, matrix_type=Q.F32, embd_type=Q.Q5_0, tied=False)
    path = write_tiny_gguf(tmp_path / "k.gguf", cfg)
    (role,) = _block_roles(path, [(0, 1)])
    for matrix in (role.blocks[0].w_qkv, role.blocks[0].w_down, role.output):
        assert matrix is not None and not matrix.quantised
    assert isinstance(role.token_embd, QuantMatrix)


def test_repeated_prefills_replay_the_bucket_jit_exactly(tiny_llama: Path) -> None:
    """Prefills of different lengths in one bucket (from the third, replayed by the JIT,
    the last real row a bound variable) give a fresh role's logits and decode after them."""
    prompts = [[5, 17, 42, 99, 7], [3, 1, 4, 1, 5, 9, 2], [250, 8], [7, 7, 7, 7, 7, 7, 7, 7]]
    (reused,) = _roles(tiny_llama, [(0, 4)])
    for prompt in prompts:
        (fresh,) = _roles(tiny_llama, [(0, 4)])
        seen = []
        for role in (reused, fresh):
            first = role.step(0, np.array(prompt, dtype=np.int32))
            prefill_logits = np.array(role.last_logits)
            role.step(1, first)
            seen.append((prefill_logits, np.array(role.last_logits)))
        for got, want in zip(seen[0], seen[1], strict=True):
            np.testing.assert_array_equal(got, want)
    assert len(reused._prefill) == 1  # one bucket, one JIT


def test_long_prompts_pad_by_a_sixteenth_of_their_power_of_two() -> None:
    """Buckets: 8-row steps up to PREFILL_ROWS on CPU, 16 up to LONG_PREFILL_ROWS, then a
    sixteenth of the power of two at or above the length: less than an eighth padding,
    44 buckets for a 2048-position context, none past max_seq_len."""
    from types import SimpleNamespace

    def bucket(tokens: int, cpu: bool = True, most: int = 2048) -> int:
        role = SimpleNamespace(_cpu=cpu, max_seq_len=most)
        return StageRole._bucket(role, tokens)  # type: ignore[arg-type]

    assert [bucket(t) for t in (1, 9, 64, 65, 256)] == [8, 16, 64, 80, 256]
    assert [bucket(t) for t in (257, 512, 513, 1024, 1025, 2000)] == [
        288, 512, 576, 1024, 1152, 2048]
    assert bucket(5, cpu=False) == 16
    assert bucket(2000, most=2010) == 2010 and bucket(2010, most=2010) == 2010
    sizes = {bucket(t) for t in range(1, 2049)}
    assert len(sizes) == 44
    assert all(bucket(t) - t < t / 8 for t in range(257, 2049))


def _bucket_bytes(tiny_llama: Path, monkeypatch: pytest.MonkeyPatch) -> dict[int, int]:
    """What a role of `tiny_llama`'s 4 blocks counts for its prefill buckets of 8, 16 and
    24 rows, each the same as the allocator's bytes before and after building it (no
    kernel cache: its warm-up would build the 8-row bucket)."""
    monkeypatch.setenv(jit_cache.CACHE_ENV, "off")
    weights = open_reader(tiny_llama).load_stage(0, 4, is_first=True, is_last=True)
    role = StageRole(weights, max_seq_len=32)
    role.warm_up()  # the decode graph: its buffers (weights, caches) are not a bucket's
    allocated = {}
    for tokens in (3, 12, 21):
        gc.collect()
        before = GlobalCounters.mem_used
        role.step(0, np.array([5, 17, 42] * (tokens // 3), dtype=np.int32))
        gc.collect()
        allocated[role._bucket(tokens)] = GlobalCounters.mem_used - before
    sizes = role.bucket_bytes()
    assert sizes == allocated and 0 < sizes[8] < sizes[16] < sizes[24]
    return sizes


def test_warm_up_takes_only_the_prompt_lengths_whose_buckets_fit(
        tiny_llama: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Warm-up builds the buckets of prompt lengths shortest first while they fit in
    PREFILL_KEEP_BYTES, and says where it stopped: building more would drop them again."""
    sizes = _bucket_bytes(tiny_llama, monkeypatch)
    monkeypatch.setattr(llama_role, "PREFILL_KEEP_BYTES", sizes[8] + sizes[16] + sizes[24] // 2)
    weights = open_reader(tiny_llama).load_stage(0, 4, is_first=True, is_last=True)
    role = StageRole(weights, max_seq_len=32)
    with caplog.at_level("WARNING", logger=llama_role.__name__):
        role.warm_up(prompt_tokens=16)
        assert sorted(role._prefill) == [8, 16]
        assert not caplog.records
        weights = open_reader(tiny_llama).load_stage(0, 4, is_first=True, is_last=True)
        role = StageRole(weights, max_seq_len=32)
        role.warm_up(prompt_tokens=32)
    assert sorted(role._prefill) == sorted(role._prompt_buffers) == [8, 16]  # 24: dropped
    assert role.bucket_bytes() == {8: sizes[8], 16: sizes[16]}
    assert "up to 16 tokens only" in caplog.text


def test_a_role_keeps_at_most_prefill_keep_bytes_of_buckets(
        tiny_llama: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past PREFILL_KEEP_BYTES the least recently used buckets' graphs and inputs are
    dropped; a prompt in a dropped bucket builds it again and computes what it did
    before."""
    sizes = _bucket_bytes(tiny_llama, monkeypatch)
    budget = sizes[8] + sizes[16]  # 8 and 16 fit; 16 and 24 do not
    monkeypatch.setattr(llama_role, "PREFILL_KEEP_BYTES", budget)
    weights = open_reader(tiny_llama).load_stage(0, 4, is_first=True, is_last=True)
    role = StageRole(weights, max_seq_len=32)
    role.warm_up()  # the decode graph, which holds the weights and caches; no bucket
    short, long = [5, 17, 42], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]  # buckets 8 and 16
    first = role.step(0, np.array(short, dtype=np.int32))
    logits = np.array(role.last_logits)
    role.step(0, np.array(long, dtype=np.int32))
    assert sorted(role._prefill) == sorted(role._prompt_buffers) == [8, 16]
    role.step(0, np.array(long + long[:3], dtype=np.int32))  # bucket 16 again: kept
    assert sorted(role._prefill) == [8, 16]
    role.step(0, np.array(long * 2, dtype=np.int32))  # bucket 24: 8, then 16 dropped
    assert sorted(role._prefill) == sorted(role._prompt_buffers) == [24]
    again = role.step(0, np.array(short, dtype=np.int32))  # 8 again: 24 dropped
    np.testing.assert_array_equal(again, first)
    np.testing.assert_array_equal(role.last_logits, logits)
    assert role.bucket_bytes() == {8: sizes[8]}


# Over blocks the six buckets' graphs take about 100 s to build on a 2-core machine
# without AVX-512; `just test` keeps the dense case here and the blocks case on the real
# model (test_smollm2.py's test of the same name: Q4_1 and Q8_0 through the decode kernel).
@pytest.mark.parametrize("quantised", [False, pytest.param(True, marks=pytest.mark.soak)])
def test_short_prompts_compute_the_same_at_8_and_16_row_buckets(
        tiny_mixed: Path, monkeypatch: pytest.MonkeyPatch, quantised: bool) -> None:
    """Prompts of 5, 20 and 50 rows padded to multiples of 8 (the CPU short-prompt
    bucket) and of 16: the logits, every block's keys and values and the decode step
    after the prompt are bit-identical, dense or over blocks (Q4_1 and Q8_0 through the
    decode kernel, the other types through their own products). Each row's products
    are its own; the attention sums over the padded columns, whose kernels tinygrad
    picks by the padded length: one summation order up to 32 columns, another from
    40, so 8 and 16, 24 and 32, 40 and 48, 56 and 64 rows agree."""
    weights = open_reader(tiny_mixed).load_stage(0, 6, is_first=True, is_last=True,
                                                 keep_blocks=quantised)
    role = StageRole(weights, max_seq_len=64, quantised=quantised)
    for length in (5, 20, 50):
        prompt = np.array([(11 * i + 5) % 300 for i in range(length)], dtype=np.int32)
        seen = []
        for bucket in (8, 16):
            monkeypatch.setattr(llama_role, "SHORT_PREFILL_BUCKET", bucket)
            token = role.step(0, prompt)
            logits = np.array(role.last_logits)
            kv = [view[0, :, :length].copy() for pair in role._cache_views for view in pair]
            role.step(1, token)
            seen.append((logits, np.array(role.last_logits), *kv))
        for got, want in zip(seen[1], seen[0], strict=True):
            np.testing.assert_array_equal(got, want)
    assert sorted(role._prefill) == [8, 16, 24, 32, 56, 64]


def test_a_built_prefill_leaves_no_freed_buffers_cached(tiny_llama: Path) -> None:
    """A prefill graph's first (eager) run and its capture allocate every intermediate
    apart; tinygrad's allocator would keep the freed ones for reuse (a real model's
    widened weights: hundreds of MB of RSS), so the role gives them back."""
    import gc

    from tinygrad.device import Device

    (role,) = _roles(tiny_llama, [(0, 4)])
    gc.collect()  # earlier tests' roles: their buffers are freed now, not during the steps
    allocator = Device[role.device].allocator
    getattr(allocator, "free_cache", lambda: None)()
    # what may stay: stray small buffers freed as a step returns (bounded here by four
    # padded buckets of rows); the graph's intermediates are hundreds of times more
    input_bytes = 4 * llama_role.PREFILL_BUCKET * role.facts.hidden_dim * 4
    for _ in range(2):  # eager run, then capture
        role.step(0, np.array([5, 17, 42, 99, 7], dtype=np.int32))
        cache = getattr(allocator, "cache", {})
        cached = sum(size * len(held) for (size, _), held in cache.items())
        assert cached <= input_bytes
