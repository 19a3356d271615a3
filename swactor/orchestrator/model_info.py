"""The GGUF facts the planner needs, read from the model file's header (no tensor bytes).

Theory of operation. `model_info_from_gguf(path)` opens the file with the model
package's range reader (header, metadata and tensor table only) and keeps:

- the numbers a plan states (block count, hidden size, context length, EOS id);
- the stop set: EOS plus every end-of-generation id the tokenizer knows (`eog_ids`:
  `<|im_end|>`, `<|endoftext|>`, ...), so a chat model stops at the end of its turn;
  a file without a tokenizer vocabulary stops on EOS alone;
- every tensor's name, type, element count and file bytes (`TensorInfo`), from which
  `stage_memory` predicts what one stage holds, exactly as the stage role computes it
  (`StageRole.memory_bytes`): weights, apart from the KV caches (one per slot) of
  `max_seq_len` positions. With weights in blocks (`--weights blocks`) a matrix of a
  block type (Q2_K-Q6_K, Q4_0-Q8_0, F16, BF16) costs its file bytes (Q3_K/Q4_K/Q5_K:
  plus 4 bytes per 256 weights, their 6-bit scales unpacked), every other tensor its
  elements at the compute width; dense, every tensor costs its elements at the compute
  width. The stage's first-stage embedding lives on the host, the last stage's output
  projection on the device; a single stage of a model with tied embeddings holds the
  embedding once, the lookup reading the output matrix's buffers (host views on a CPU
  device, rows copied out of the device's buffers on another). The estimate leaves
  out rings and the runtime itself (Python and tinygrad, ~0.3-0.5 GiB per worker).

Unsupported input is refused here, before any node loads anything (`PlannerError`
naming the exact value and the supported list): an architecture other than llama and
qwen2 (`UnsupportedArchitecture`), a tensor type the stages cannot read
(`UnsupportedTensorType`), a tokenizer model other than gpt2 and llama
(`UnsupportedTokenizer`; a file with no tokenizer metadata is accepted and stops on EOS
alone). A missing, truncated or otherwise unreadable file is a
`PlannerError(ModelUnreadable)` carrying the reader's one-line reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from gguf import GGMLQuantizationType

from swactor.orchestrator.errors import PlannerError, PlanProblem

if TYPE_CHECKING:
    from swactor.model.gguf_range import GgufRangeReader

SUPPORTED_TOKENIZER_MODELS = ("gpt2", "llama")
"""`tokenizer.ggml.model` values `swactor.model.tokenizer.Tokenizer` builds."""
WEIGHT_MODES = ("dense", "blocks")
"""How a stage holds its matrices (`swactor node --weights`)."""


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor of the file: name, GGML type id, shape (numpy order), file bytes."""

    name: str
    type_id: int
    shape: tuple[int, ...]
    file_bytes: int

    def held_bytes(self, width: int, weights: str) -> int:
        """Bytes a stage holds for this tensor (see the module doc)."""
        from swactor.model.dequant import BLOCK_TYPES, block_bytes

        if weights == "blocks" and self.type_id in BLOCK_TYPES and len(self.shape) == 2:
            return block_bytes(self.type_id, self.shape)
        return _elements(self.shape) * width

    def host_bytes(self, width: int, weights: str) -> int:
        """Bytes of the first stage's embedding, held on the host: in blocks mode a block
        type stays the file's bytes as they are (rows are gathered, then dequantised)."""
        from swactor.model.dequant import BLOCK_TYPES

        if weights == "blocks" and self.type_id in BLOCK_TYPES and len(self.shape) == 2:
            return self.file_bytes
        return _elements(self.shape) * width


@dataclass(frozen=True, slots=True)
class StageMemory:
    """What one stage is predicted to hold, and the bytes of its tensors in the file."""

    weights: int
    kv_cache: int
    file_bytes: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache

    @property
    def ratio(self) -> float:
        """Held weight bytes over the file bytes of the stage's tensors."""
        return self.weights / self.file_bytes if self.file_bytes else 0.0


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """Planning facts of one GGUF model."""

    model_id: str
    path: Path | str | None
    """The local file, or the http(s) URL (a str) it was read from."""
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
    tensors: tuple[TensorInfo, ...] = ()
    """Every tensor of the file (empty for facts built without a file: then the
    prediction is every parameter at the compute width)."""
    rope_dim: int = 0
    url_sha256: str | None = None
    """For a URL: the file's SHA-256 when its server names it (a 64-hex ETag)."""

    def stage_params(self, start: int, end: int) -> int:
        """Elements stage `[start, end)` holds: its blocks, plus embedding / head."""
        params = sum(self.block_params[start:end])
        if start == 0:
            params += self.embedding_params
        if end == self.block_count:
            params += self.head_params
        return params

    def stage_memory_bytes(self, start: int, end: int, width: int, max_seq_len: int,
                           weights: str = "dense", slots: int = 1) -> int:
        """Estimated bytes stage `[start, end)` holds: tensors plus KV caches, at `width`."""
        return self.stage_memory(start, end, width, max_seq_len, weights, slots).total

    def stage_memory(self, start: int, end: int, width: int, max_seq_len: int,
                     weights: str = "dense", slots: int = 1) -> StageMemory:
        """What stage `[start, end)` holds (module doc) and its tensors' file bytes."""
        return self.memory_costs(width, weights).stage(start, end, max_seq_len, slots)

    def memory_costs(self, width: int, weights: str = "dense") -> MemoryCosts:
        """Per-block, embedding and head bytes (held and in the file), for many ranges."""
        kv_row = 2 * self.head_count_kv * self.head_dim * width
        rope_row = 2 * (self.rope_dim // 2) * 4  # rope cos/sin tables, f32, per position
        if not self.tensors:
            blocks = tuple((p * width, p * width) for p in self.block_params)
            embd = (self.embedding_params * width,) * 2
            head = (self.head_params * width,) * 2
            return MemoryCosts(self.block_count, blocks, embd, head, kv_row, 0)
        held = [0] * self.block_count
        in_file = [0] * self.block_count
        by_name = {t.name: t for t in self.tensors}
        for tensor in self.tensors:
            index = _block_of(tensor.name) if tensor.name.startswith("blk.") else -1
            if 0 <= index < self.block_count:
                held[index] += tensor.held_bytes(width, weights)
                in_file[index] += tensor.file_bytes
        embd_tensor = by_name.get("token_embd.weight")
        embd = (0, 0) if embd_tensor is None else (
            embd_tensor.host_bytes(width, weights), embd_tensor.file_bytes)
        head_held = head_file = 0
        out = "output.weight" if "output.weight" in by_name else "token_embd.weight"
        for name in ("output_norm.weight", out):
            if name in by_name:
                head_held += by_name[name].held_bytes(width, weights)
                head_file += by_name[name].file_bytes
        return MemoryCosts(self.block_count, tuple(zip(held, in_file, strict=True)), embd,
                           (head_held, head_file), kv_row, rope_row,
                           tied=out == "token_embd.weight")


@dataclass(frozen=True, slots=True)
class MemoryCosts:
    """Bytes of a model's parts at one width and weight mode: ``(held, in the file)``."""

    block_count: int
    blocks: tuple[tuple[int, int], ...]
    embedding: tuple[int, int]
    head: tuple[int, int]
    kv_per_position_block: int
    rope_per_position: int
    tied: bool = False

    def stage(self, start: int, end: int, max_seq_len: int, slots: int = 1) -> StageMemory:
        """Stage `[start, end)`: weights, rope tables and `slots` KV caches of
        `max_seq_len` positions."""
        held = sum(b[0] for b in self.blocks[start:end])
        in_file = sum(b[1] for b in self.blocks[start:end])
        first, last = start == 0, end == self.block_count
        if first:
            held += self.embedding[0]
            in_file += self.embedding[1]
        if last:
            held += self.head[0]
            in_file += self.head[1]
            if first and self.tied:  # one tensor in the file, held once: the lookup
                in_file -= self.embedding[1]  # reads the output matrix
                held -= self.embedding[0]
        held += self.rope_per_position * max_seq_len
        kv_cache = self.kv_per_position_block * max_seq_len * (end - start) * slots
        return StageMemory(held, kv_cache, in_file)

    def decode_bytes(self, start: int, end: int) -> int:
        """Weight bytes one decode step of stage `[start, end)` reads: every block's, and
        on the last stage the output head's (the embedding lookup reads one row)."""
        read = sum(b[0] for b in self.blocks[start:end])
        return read + (self.head[0] if end == self.block_count else 0)


def _elements(shape: tuple[int, ...]) -> int:
    return math.prod(shape) if shape else 1


def _block_of(name: str) -> int:
    try:
        return int(name.split(".", 2)[1])
    except (IndexError, ValueError):
        return -1


def _stop_ids(path: Path | str, eos: int) -> frozenset[int]:
    from swactor.model.tokenizer import Tokenizer
    from swactor.model.tokenizer_errors import TokenizerError

    try:
        eog = Tokenizer.from_gguf(path).eog_ids
    except TokenizerError:
        eog = frozenset()
    return frozenset({eos, *eog})


def _refuse_unsupported(file: Path | str, reader: GgufRangeReader) -> None:
    """PlannerError for a tensor type or tokenizer model no stage or tokenizer reads."""
    from swactor.model.dequant import SUPPORTED_TYPES

    bad = [t for t in reader.tensors.values()
           if t.type_id not in SUPPORTED_TYPES or t.n_bytes < 0]
    if bad:
        names = sorted({t.type_name for t in bad})
        supported = ", ".join(GGMLQuantizationType(t).name for t in sorted(SUPPORTED_TYPES))
        others = f" and {len(bad) - 1} more tensors" if len(bad) > 1 else ""
        raise PlannerError(
            PlanProblem.UnsupportedTensorType,
            f"{file}: quantisation type {', '.join(names)} (tensor {bad[0].name}{others}) is "
            f"not supported (supported: {supported})",
        )
    model = reader.metadata.get("tokenizer.ggml.model")
    if model is not None and model not in SUPPORTED_TOKENIZER_MODELS:
        raise PlannerError(
            PlanProblem.UnsupportedTokenizer,
            f"{file}: tokenizer model {model!r} is not supported (supported: "
            f"{', '.join(SUPPORTED_TOKENIZER_MODELS)})",
        )


def model_info_from_gguf(path: str | Path, *, with_stop_ids: bool = True) -> ModelInfo:
    """Read the planning facts of the GGUF at `path` (header only); refuse what no stage
    can run (module doc)."""
    from swactor.model.errors import WeightsError, WeightsFault
    from swactor.model.gguf_range import open_reader
    from swactor.model.source import is_url

    file: Path | str = str(path) if is_url(path) else Path(path)
    file_name = urlparse(file).path.rsplit("/", 1)[-1] if isinstance(file, str) else file.name
    try:
        reader = open_reader(file)
    except WeightsError as error:
        if error.reason is WeightsFault.UnsupportedArchitecture:
            raise PlannerError(PlanProblem.UnsupportedArchitecture, error.detail) from None
        raise PlannerError(PlanProblem.ModelUnreadable, str(error)) from None
    _refuse_unsupported(file, reader)
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
        model_id=file_name.removesuffix(".gguf")[:255] or "model",
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
        tensors=tuple(TensorInfo(t.name, t.type_id, t.shape, t.n_bytes)
                      for t in reader.tensors.values()),
        rope_dim=facts.rope_dim,
        url_sha256=_url_sha256(reader),
    )


def _url_sha256(reader: GgufRangeReader) -> str | None:
    from swactor.model.source import HttpRangeSource

    source = reader.source
    return source.content_sha256() if isinstance(source, HttpRangeSource) else None
