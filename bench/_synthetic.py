"""Synthetic llama GGUF files for the benchmarks: random weights, any shape, any block type.

Theory of operation: :func:`synthetic_gguf` writes a llama-architecture file with
``gguf``'s ``GGUFWriter``, streaming one tensor at a time (a 1B-class file never sits in
memory whole). Block-quantised matrices are random bytes whose f16 scale fields are set
to small finite values: every such block is a valid tensor (the codes and 6-bit scales
take every pattern), and the weights have the file sizes of a real quantisation, which
is what memory and decode-rate figures depend on. Norms are F32 ones (plus noise). The
files carry no tokenizer: benchmarks feed token ids. :func:`cached` generates a file
into the model cache on first use (``$SWACTOR_MODEL_CACHE``, not the repository) and
reuses it afterwards.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFWriter
from gguf import GGMLQuantizationType as Q

from swactor.model.paths import model_cache_dir

# byte offsets of the f16 scale fields inside one block
_SCALE_FIELDS: dict[Q, tuple[int, ...]] = {
    Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,),
    Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,),
    Q.F16: (0,),  # blocks of one weight: every value
}


@dataclass(frozen=True)
class Shape:
    """A llama model's shape and the block type of each matrix."""

    name: str
    blocks: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    context: int = 4096
    matrix_type: Q = Q.Q4_K
    embd_type: Q = Q.Q6_K
    # per matrix name within a block, over matrix_type (llama.cpp's _M lifts attn_v and
    # ffn_down to Q6_K)
    types_by_matrix: dict[str, Q] = field(default_factory=dict)

    @property
    def file_name(self) -> str:
        return f"synthetic-{self.name}.gguf"


# Llama-3.2-1B's shape (tied embeddings), Q4_K_M-like types
LLAMA_1B = Shape("llama-1b-q4_k_m", blocks=16, hidden=2048, heads=32, kv_heads=8, ffn=8192,
                 vocab=128256, types_by_matrix={"attn_v": Q.Q6_K, "ffn_down": Q.Q6_K})
# the same shape cut to 4 of its 16 blocks (a block and the head measured in minutes)
LLAMA_1B_CUT = replace(LLAMA_1B, name="llama-1b-4of16-q4_k_m", blocks=4)


def _blocks(rng: np.random.Generator, qtype: Q, rows: int, cols: int) -> np.ndarray:
    block, size = GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
    for offset in _SCALE_FIELDS[qtype]:
        scale = np.asarray(rng.uniform(1e-4, 4e-4, size=data.shape[0]), dtype=np.float16)
        data[:, offset : offset + 2] = scale.view(np.uint8).reshape(-1, 2)
    return data.reshape(rows, cols // block * size)


def synthetic_gguf(path: Path, shape: Shape, seed: int = 0) -> Path:
    """Write ``shape`` with random weights to ``path`` (via a temporary file)."""
    rng = np.random.default_rng(seed)
    head_dim = shape.hidden // shape.heads
    tmp = path.with_suffix(".partial")
    writer = GGUFWriter(str(tmp), "llama")
    writer.add_block_count(shape.blocks)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(500000.0)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(shape.vocab)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    plan: list[tuple[str, Q, int, int]] = [("token_embd.weight", shape.embd_type, shape.vocab,
                                            shape.hidden)]
    for layer in range(shape.blocks):
        p = f"blk.{layer}."
        matrices = [("attn_q", shape.heads * head_dim, shape.hidden),
                    ("attn_k", shape.kv_heads * head_dim, shape.hidden),
                    ("attn_v", shape.kv_heads * head_dim, shape.hidden),
                    ("attn_output", shape.hidden, shape.heads * head_dim),
                    ("ffn_gate", shape.ffn, shape.hidden), ("ffn_up", shape.ffn, shape.hidden),
                    ("ffn_down", shape.hidden, shape.ffn)]
        plan.append((p + "attn_norm.weight", Q.F32, shape.hidden, 0))
        plan.append((p + "ffn_norm.weight", Q.F32, shape.hidden, 0))
        for name, rows, cols in matrices:
            qtype = shape.types_by_matrix.get(name, shape.matrix_type)
            plan.append((f"{p}{name}.weight", qtype, rows, cols))
    plan.append(("output_norm.weight", Q.F32, shape.hidden, 0))
    for name, qtype, rows, cols in plan:
        if qtype == Q.F32:
            writer.add_tensor_info(name, (rows,), np.dtype(np.float32), rows * 4)
        else:
            block, size = GGML_QUANT_SIZES[qtype]
            row_bytes = cols // block * size
            writer.add_tensor_info(name, (rows, row_bytes), np.dtype(np.uint8),
                                   rows * row_bytes, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _name, qtype, rows, cols in plan:
        if qtype == Q.F32:
            writer.write_tensor_data((1.0 + 0.1 * rng.standard_normal(rows)).astype(np.float32))
        else:
            writer.write_tensor_data(_blocks(rng, qtype, rows, cols))
    writer.close()
    os.replace(tmp, path)
    return path


def cached(shape: Shape, folder: Path | None = None) -> Path:
    """``shape``'s file in the model cache, generated on first use."""
    path = (folder or model_cache_dir()) / shape.file_name
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"  generating {path} (random weights, once) ...", flush=True)
        synthetic_gguf(path, shape)
    return path
