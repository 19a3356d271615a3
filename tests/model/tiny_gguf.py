"""Write tiny random llama/qwen2 GGUF files for the model tests (``gguf.GGUFWriter``).

Block-quantised tensors come from ``gguf.quants.quantize`` where it exists (F16, BF16,
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0). The K-quants have no quantiser there, so their blocks are
random bytes with the f16 scale fields overwritten by small finite values: any such block
is a valid tensor whose values ``gguf.quants.dequantize`` defines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from gguf import GGML_QUANT_SIZES, GGUFWriter, quants
from gguf import GGMLQuantizationType as Q

# byte offsets of the f16 scale fields inside one K-quant block
_K_SCALE_FIELDS: dict[Q, tuple[int, ...]] = {
    Q.Q2_K: (80, 82),
    Q.Q3_K: (108,),
    Q.Q4_K: (0, 2),
    Q.Q5_K: (0, 2),
    Q.Q6_K: (208,),
    Q.IQ4_NL: (0,),  # no stage reads it: for the unsupported-type tests
}


@dataclass
class TinyConfig:
    arch: str = "llama"
    blocks: int = 4
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 512
    vocab: int = 300
    context: int = 64
    rope_theta: float = 10000.0
    rope_dim: int | None = None
    eps: float = 1e-5
    tied: bool = True
    seed: int = 0
    matrix_type: Q = Q.F32
    embd_type: Q = Q.F32
    types_by_layer: dict[int, Q] = field(default_factory=dict)
    # per matrix name within a block ("attn_v", "ffn_down", ...), over types_by_layer:
    # a file that mixes types inside a block, like llama.cpp's _M variants
    types_by_matrix: dict[str, Q] = field(default_factory=dict)
    tokenizer_model: str | None = None  # tokenizer.ggml.model, with no vocabulary


def _encode(
    rng: np.random.Generator, values: npt.NDArray[np.float32], qtype: Q
) -> npt.NDArray[Any]:
    if qtype == Q.F32:
        return values.astype(np.float32)
    if qtype in _K_SCALE_FIELDS:
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        rows, cols = values.shape
        blocks = rng.integers(0, 256, size=(rows * cols // block_size, type_size), dtype=np.uint8)
        for offset in _K_SCALE_FIELDS[qtype]:
            scale = np.asarray(rng.uniform(2e-4, 6e-4, size=blocks.shape[0]), dtype=np.float16)
            blocks[:, offset : offset + 2] = scale.view(np.uint8).reshape(-1, 2)
        return blocks.reshape(rows, cols // block_size * type_size)
    return quants.quantize(values, qtype)


def write_tiny_gguf(path: Path, cfg: TinyConfig) -> Path:
    """Write a random model with ``cfg`` to ``path`` and return the path."""
    rng = np.random.default_rng(cfg.seed)
    head_dim = cfg.hidden // cfg.heads
    writer = GGUFWriter(str(path), cfg.arch)
    writer.add_block_count(cfg.blocks)
    writer.add_context_length(cfg.context)
    writer.add_embedding_length(cfg.hidden)
    writer.add_feed_forward_length(cfg.ffn)
    writer.add_head_count(cfg.heads)
    writer.add_head_count_kv(cfg.kv_heads)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_rope_dimension_count(cfg.rope_dim or head_dim)
    writer.add_layer_norm_rms_eps(cfg.eps)
    writer.add_vocab_size(cfg.vocab)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    if cfg.tokenizer_model is not None:
        writer.add_tokenizer_model(cfg.tokenizer_model)

    def matrix(name: str, rows: int, cols: int, qtype: Q) -> None:
        if name.startswith("blk."):
            qtype = cfg.types_by_matrix.get(name.split(".")[2], qtype)
        values = (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)
        data = _encode(rng, values, qtype)
        writer.add_tensor(name, data, raw_dtype=None if qtype == Q.F32 else qtype)

    def vector(name: str, size: int, around: float = 1.0, spread: float = 0.1) -> None:
        values = (around + spread * rng.standard_normal(size)).astype(np.float32)
        writer.add_tensor(name, values)

    embd = (rng.standard_normal((cfg.vocab, cfg.hidden))).astype(np.float32)
    data = _encode(rng, embd, cfg.embd_type)
    writer.add_tensor(
        "token_embd.weight", data, raw_dtype=None if cfg.embd_type == Q.F32 else cfg.embd_type
    )
    for layer in range(cfg.blocks):
        qtype = cfg.types_by_layer.get(layer, cfg.matrix_type)
        p = f"blk.{layer}."
        vector(p + "attn_norm.weight", cfg.hidden)
        matrix(p + "attn_q.weight", cfg.heads * head_dim, cfg.hidden, qtype)
        matrix(p + "attn_k.weight", cfg.kv_heads * head_dim, cfg.hidden, qtype)
        matrix(p + "attn_v.weight", cfg.kv_heads * head_dim, cfg.hidden, qtype)
        if cfg.arch == "qwen2":
            vector(p + "attn_q.bias", cfg.heads * head_dim, 0.0, 0.5)
            vector(p + "attn_k.bias", cfg.kv_heads * head_dim, 0.0, 0.5)
            vector(p + "attn_v.bias", cfg.kv_heads * head_dim, 0.0, 0.5)
        matrix(p + "attn_output.weight", cfg.hidden, cfg.heads * head_dim, qtype)
        vector(p + "ffn_norm.weight", cfg.hidden)
        matrix(p + "ffn_gate.weight", cfg.ffn, cfg.hidden, qtype)
        matrix(p + "ffn_up.weight", cfg.ffn, cfg.hidden, qtype)
        matrix(p + "ffn_down.weight", cfg.hidden, cfg.ffn, qtype)
    vector("output_norm.weight", cfg.hidden)
    if not cfg.tied:
        matrix("output.weight", cfg.vocab, cfg.hidden, cfg.matrix_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
