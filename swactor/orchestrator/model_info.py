"""The GGUF facts the planner needs, read from the model file's header (no tensor bytes).

Theory of operation. `model_info_from_gguf(path)` opens the file with the model
package's range reader (header, metadata and tensor table only) and keeps:

- the numbers a plan states (block count, hidden size, context length, EOS id);
- the stop set: EOS plus every end-of-generation id the tokenizer knows (`eog_ids`:
  `<|im_end|>`, `<|endoftext|>`, ...), so a chat model stops at the end of its turn;
  a file without a tokenizer vocabulary stops on EOS alone;
- parameter counts (elements per block, of the embedding, of the output head), from
  which `stage_memory_bytes` estimates what one stage holds after dequantising to the
  compute dtype: its tensors plus its KV cache of `max_seq_len` positions. The estimate
  is what the planner compares with a node's usable memory; it leaves out rings and the
  runtime itself, which are small beside the weights.

A missing, truncated or unsupported file is a `PlannerError(ModelUnreadable)` carrying
the reader's one-line reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from swactor.orchestrator.errors import PlannerError, PlanProblem


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """Planning facts of one GGUF model."""

    model_id: str
    path: Path | None
    architecture: str
    block_count: int
    hidden_dim: int
    context_length: int
    head_count_kv: int
    head_dim: int
    eos_token_id: int
    stop_token_ids: frozenset[int]
    block_params: tuple[int, ...]
    """Elements of every tensor of block `i` (weights and norms)."""
    embedding_params: int
    """Elements of `token_embd.weight`."""
    head_params: int
    """Elements of `output_norm.weight` plus `output.weight` (the embedding if tied)."""

    def stage_params(self, start: int, end: int) -> int:
        """Elements stage `[start, end)` holds: its blocks, plus embedding / head."""
        params = sum(self.block_params[start:end])
        if start == 0:
            params += self.embedding_params
        if end == self.block_count:
            params += self.head_params
        return params

    def stage_memory_bytes(self, start: int, end: int, width: int, max_seq_len: int) -> int:
        """Estimated bytes stage `[start, end)` holds: tensors plus KV cache, at `width`."""
        kv_cache = 2 * max_seq_len * self.head_count_kv * self.head_dim * width * (end - start)
        return self.stage_params(start, end) * width + kv_cache


def _elements(shape: tuple[int, ...]) -> int:
    return math.prod(shape) if shape else 1


def _stop_ids(path: Path, eos: int) -> frozenset[int]:
    from swactor.model.tokenizer import Tokenizer
    from swactor.model.tokenizer_errors import TokenizerError

    try:
        eog = Tokenizer.from_gguf(path).eog_ids
    except TokenizerError:
        eog = frozenset()
    return frozenset({eos, *eog})


def model_info_from_gguf(path: str | Path, *, with_stop_ids: bool = True) -> ModelInfo:
    """Read the planning facts of the GGUF at `path` (header only)."""
    from swactor.model.errors import WeightsError
    from swactor.model.gguf_range import open_reader

    file = Path(path)
    try:
        reader = open_reader(file)
    except WeightsError as error:
        raise PlannerError(PlanProblem.ModelUnreadable, str(error)) from None
    facts = reader.facts
    eos = facts.eos_token_id
    if eos is None:
        raise PlannerError(
            PlanProblem.ModelUnreadable, f"{file}: metadata names no EOS token id"
        )
    blocks = [0] * facts.block_count
    for name, entry in reader.tensors.items():
        if name.startswith("blk."):
            index = int(name.split(".", 2)[1])
            if 0 <= index < facts.block_count:
                blocks[index] += _elements(entry.shape)
    embedding = reader.tensors.get("token_embd.weight")
    embedding_params = _elements(embedding.shape) if embedding is not None else 0
    head = reader.tensors.get("output.weight")
    norm = reader.tensors.get("output_norm.weight")
    head_params = (_elements(head.shape) if head is not None else embedding_params) + (
        _elements(norm.shape) if norm is not None else 0
    )
    return ModelInfo(
        model_id=file.name.removesuffix(".gguf")[:255] or "model",
        path=file,
        architecture=facts.architecture,
        block_count=facts.block_count,
        hidden_dim=facts.hidden_dim,
        context_length=facts.context_length,
        head_count_kv=facts.head_count_kv,
        head_dim=facts.head_dim,
        eos_token_id=eos,
        stop_token_ids=_stop_ids(file, eos) if with_stop_ids else frozenset({eos}),
        block_params=tuple(blocks),
        embedding_params=embedding_params,
        head_params=head_params,
    )
