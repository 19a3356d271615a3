"""GGUF range reader: parse header, metadata and tensor table; load only one stage's tensors.

Theory of operation: a stage owns blocks ``[layer_start, layer_end)`` and, when it is the
first stage, the token embedding; when it is the last, the output norm and the output
projection (or the tied token embedding). :class:`GgufRangeReader` learns where those tensors
lie without reading tensor data:

1. Header. :func:`~swactor.model.gguf_header.parse_header` parses a growing prefix of the
   file: when it needs a byte beyond the prefix it says so (with an estimate of where the
   header ends), and the reader fetches more and parses again. The tensor table becomes
   ``(name, type, shape, offset, n_bytes)`` entries. The prefix therefore covers the header
   and little else (at most an eighth past it, or the estimate's slack), whatever the
   source (local, HTTP Range, cache). A header that would need more than
   ``MAX_HEADER_BYTES`` is refused before that much is read (the file's header says how
   long its strings and arrays are, and a remote file's header comes from a server).
2. Facts. :class:`ModelFacts` gathers the architecture numbers from metadata.
3. Validation. :meth:`GgufRangeReader.validate_stage` checks a stage plan against the file
   (layer range, layer count, hidden size, dtype family, max sequence length) and that every
   tensor the stage needs exists, has a supported type and lies inside the file.
4. Load. :meth:`GgufRangeReader.load_stage` reads the stage's tensors as few coalesced byte
   ranges, dequantises each once into the compute dtype (:mod:`swactor.model.dequant`) and
   returns :class:`StageWeights` with the byte counts.

Every failure is a :class:`~swactor.model.errors.WeightsError`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from swactor.model.dequant import SUPPORTED_TYPES, QuantMatrix, dequantize, quant_matrix
from swactor.model.errors import WeightsError, WeightsFault
from swactor.model.gguf_header import (
    FIRST_READ_BYTES,
    GgufHeader,
    GgufHeaderError,
    NeedMoreBytes,
    TensorInfo,
    grow_to,
    parse_header,
)
from swactor.model.source import ByteSource

SUPPORTED_ARCHITECTURES = ("llama", "qwen2")
COMPUTE_DTYPES: dict[str, type[np.floating[Any]]] = {"f32": np.float32, "f16": np.float16}
_COALESCE_GAP_BYTES = 4096
MAX_HEADER_BYTES = 256 << 20
"""The most a GGUF header may span (real ones: 1-20 MB, mostly the tokenizer)."""
# the vocabulary stays with the tokenizer; the loader keeps only these tokenizer keys
_TOKENIZER_KEYS_KEPT = (
    "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.model"
)


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lies in the file. ``shape`` is numpy order (outermost first)."""

    name: str
    type_id: int
    shape: tuple[int, ...]
    offset: int
    n_bytes: int

    @property
    def type_name(self) -> str:
        try:
            return GGMLQuantizationType(self.type_id).name
        except ValueError:
            return f"type#{self.type_id}"


def _entry(info: TensorInfo, data_offset: int) -> TensorEntry:
    """Where a tensor table entry's bytes lie; ``n_bytes`` -1 for a type without a size."""
    n_elems = 1
    for dim in info.dims:
        n_elems *= dim
    try:
        block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(info.type_id)]
        n_bytes = n_elems * type_size // block_size
    except (ValueError, KeyError):
        n_bytes = -1
    return TensorEntry(
        name=info.name,
        type_id=info.type_id,
        shape=tuple(reversed(info.dims)),
        offset=data_offset + info.offset,
        n_bytes=n_bytes,
    )


@dataclass(frozen=True)
class ModelFacts:
    """Architecture numbers of a llama-family GGUF, from its metadata."""

    architecture: str
    block_count: int
    hidden_dim: int
    ffn_dim: int
    head_count: int
    head_count_kv: int
    head_dim: int
    rope_theta: float
    rope_dim: int
    norm_eps: float
    context_length: int
    vocab_size: int
    bos_token_id: int | None
    eos_token_id: int | None
    tied_embeddings: bool


@dataclass
class StageWeights:
    """One stage's dequantised tensors (numpy, compute dtype) and what loading them cost."""

    facts: ModelFacts
    layer_start: int
    layer_end: int
    is_first: bool
    is_last: bool
    dtype: str
    tensors: dict[str, npt.NDArray[Any]]
    header_bytes: int
    tensor_bytes: int
    bytes_read: int
    file_size: int
    ranges: list[tuple[int, int]] = field(default_factory=list)
    # with ``keep_blocks``: the 2-D tensors of block types (``dequant.BLOCK_TYPES``) in
    # their file blocks, instead of in ``tensors``
    blocks: dict[str, QuantMatrix] = field(default_factory=dict)


class GgufRangeReader:
    """Header, metadata and tensor table of one GGUF, read through a :class:`ByteSource`."""

    def __init__(self, source: ByteSource, table: Mapping[str, Any] | None = None) -> None:
        """Parse the header from `source`, or take `table` (:meth:`stage_table` of a reader
        that parsed this file) instead and read no header bytes."""
        self.source = source
        self.file_size = source.size()
        if table is not None:
            self._adopt_table(table)
            return
        header = self._parse_header()
        self.data_offset = header.data_offset
        self.tensors: dict[str, TensorEntry] = {}
        for info in header.tensors:
            entry = _entry(info, header.data_offset)
            self.tensors[entry.name] = entry
        self.metadata: dict[str, Any] = {
            key: value
            for key, value in header.metadata.items()
            if not key.startswith("tokenizer.ggml.") or key in _TOKENIZER_KEYS_KEPT
        }
        tokens = header.metadata.get("tokenizer.ggml.tokens")
        self._token_count = len(tokens) if isinstance(tokens, list) else None
        self.facts = self._facts()

    # -- stage table ----------------------------------------------------------------------
    def stage_table(self, entries: list[TensorEntry]) -> dict[str, Any]:
        """What a second reader of this file needs to load a stage without its header: the
        file's size, the model facts and the stage's tensor entries (JSON)."""
        return {
            "file_size": self.file_size,
            "facts": dataclasses.asdict(self.facts),
            "tensors": [[e.name, e.type_id, list(e.shape), e.offset, e.n_bytes]
                        for e in entries],
        }

    def _adopt_table(self, table: Mapping[str, Any]) -> None:
        problem = f"{self.source.name}: stage table"
        try:
            if int(table["file_size"]) != self.file_size:
                raise WeightsError(
                    WeightsFault.SourceInvalid,
                    f"{problem} is for a {table['file_size']}-byte file, this one has "
                    f"{self.file_size} bytes (the file changed)",
                )
            self.facts = ModelFacts(**table["facts"])
            self.tensors = {}
            for name, type_id, shape, offset, n_bytes in table["tensors"]:
                entry = TensorEntry(str(name), int(type_id), tuple(int(d) for d in shape),
                                    int(offset), int(n_bytes))
                self.tensors[entry.name] = entry
        except (KeyError, TypeError, ValueError) as error:
            raise WeightsError(WeightsFault.CorruptHeader,
                               f"{problem} unreadable ({error!r})") from None
        self.header_bytes = 0
        self.data_offset = min((e.offset for e in self.tensors.values()), default=0)
        self.metadata = {}
        self._token_count = None

    # -- header ---------------------------------------------------------------------------
    def _parse_header(self) -> GgufHeader:
        """Parse the header from a prefix of the source that grows until it holds it."""
        header, self.header_bytes = read_header(self.source, self.file_size)
        return header

    # -- facts ----------------------------------------------------------------------------
    def _meta(self, key: str, default: Any = None) -> Any:
        value = self.metadata.get(key, default)
        if value is None:
            raise WeightsError(
                WeightsFault.CorruptHeader, f"{self.source.name}: metadata {key!r} missing"
            )
        return value

    def _facts(self) -> ModelFacts:
        arch = str(self._meta("general.architecture"))
        if arch not in SUPPORTED_ARCHITECTURES:
            raise WeightsError(
                WeightsFault.UnsupportedArchitecture,
                f"{self.source.name}: architecture {arch!r} (supported: "
                f"{', '.join(SUPPORTED_ARCHITECTURES)})",
            )
        if "rope_freqs.weight" in self.tensors:
            raise WeightsError(
                WeightsFault.UnsupportedArchitecture,
                f"{self.source.name}: rope frequency factors (rope_freqs.weight) not supported",
            )
        try:
            return self._checked_facts(arch)
        except (TypeError, ValueError, OverflowError) as exc:  # a count that is no number
            raise WeightsError(
                WeightsFault.CorruptHeader,
                f"{self.source.name}: {arch} metadata holds a value of the wrong type "
                f"({type(exc).__name__})",
            ) from None

    def _checked_facts(self, arch: str) -> ModelFacts:
        hidden = int(self._meta(f"{arch}.embedding_length"))
        heads = int(self._meta(f"{arch}.attention.head_count"))
        kv_heads = int(self.metadata.get(f"{arch}.attention.head_count_kv", heads))
        if heads <= 0 or kv_heads <= 0:
            raise WeightsError(
                WeightsFault.CorruptHeader,
                f"{self.source.name}: attention head counts must be positive "
                f"(head_count {heads}, head_count_kv {kv_heads})",
            )
        head_dim = int(self.metadata.get(f"{arch}.attention.key_length", hidden // heads))
        embd = self.tensors.get("token_embd.weight")
        vocab = self.metadata.get(f"{arch}.vocab_size", self._token_count)
        if vocab is None and embd is not None:
            vocab = embd.shape[0]
        bos = self.metadata.get("tokenizer.ggml.bos_token_id")
        eos = self.metadata.get("tokenizer.ggml.eos_token_id")
        facts = ModelFacts(
            architecture=arch,
            block_count=int(self._meta(f"{arch}.block_count")),
            hidden_dim=hidden,
            ffn_dim=int(self._meta(f"{arch}.feed_forward_length")),
            head_count=heads,
            head_count_kv=kv_heads,
            head_dim=head_dim,
            rope_theta=float(self.metadata.get(f"{arch}.rope.freq_base", 10000.0)),
            rope_dim=int(self.metadata.get(f"{arch}.rope.dimension_count", head_dim)),
            norm_eps=float(self._meta(f"{arch}.attention.layer_norm_rms_epsilon")),
            context_length=int(self._meta(f"{arch}.context_length")),
            vocab_size=int(self._meta("vocab_size", vocab)),
            bos_token_id=None if bos is None else int(bos),
            eos_token_id=None if eos is None else int(eos),
            tied_embeddings="output.weight" not in self.tensors,
        )
        if facts.head_count % facts.head_count_kv or facts.rope_dim > facts.head_dim:
            raise WeightsError(
                WeightsFault.CorruptHeader,
                f"{self.source.name}: inconsistent head counts/rope dim in metadata",
            )
        return facts

    # -- plan -----------------------------------------------------------------------------
    def stage_tensor_names(
        self, layer_start: int, layer_end: int, *, is_first: bool, is_last: bool
    ) -> list[str]:
        """The tensors a stage needs, in file order."""
        self._check_range(layer_start, layer_end)
        names: list[str] = []
        required = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output"]
        required += ["ffn_norm", "ffn_gate", "ffn_up", "ffn_down"]
        for layer in range(layer_start, layer_end):
            prefix = f"blk.{layer}."
            present = [n for n in self.tensors if n.startswith(prefix)]
            for part in required:
                if f"{prefix}{part}.weight" not in present:
                    raise WeightsError(
                        WeightsFault.MissingTensor,
                        f"{self.source.name}: tensor {prefix}{part}.weight missing",
                    )
            names += present
        if is_first:
            names.append("token_embd.weight")
        if is_last:
            names.append("output_norm.weight")
            names.append("token_embd.weight" if self.facts.tied_embeddings else "output.weight")
        for name in names:
            if name not in self.tensors:
                raise WeightsError(
                    WeightsFault.MissingTensor, f"{self.source.name}: tensor {name} missing"
                )
        return sorted(set(names), key=lambda n: self.tensors[n].offset)

    def _check_range(self, layer_start: int, layer_end: int) -> None:
        blocks = self.facts.block_count
        if not 0 <= layer_start < layer_end <= blocks:
            raise WeightsError(
                WeightsFault.LayerRangeInvalid,
                f"layer range [{layer_start}, {layer_end}) is not a non-empty part of the "
                f"file's {blocks} blocks",
            )

    def validate_stage(
        self,
        layer_start: int,
        layer_end: int,
        *,
        is_first: bool,
        is_last: bool,
        num_layers: int | None = None,
        hidden_dim: int | None = None,
        dtype_family: str | None = None,
        max_seq_len: int | None = None,
    ) -> list[TensorEntry]:
        """Check a stage plan against the file; return the entries the stage will read."""
        facts = self.facts
        if num_layers is not None and num_layers != facts.block_count:
            raise WeightsError(
                WeightsFault.PlanMismatch,
                f"plan says {num_layers} layers, file has {facts.block_count}",
            )
        if hidden_dim is not None and hidden_dim != facts.hidden_dim:
            raise WeightsError(
                WeightsFault.PlanMismatch,
                f"plan says hidden size {hidden_dim}, file has {facts.hidden_dim}",
            )
        if dtype_family is not None and dtype_family not in COMPUTE_DTYPES:
            raise WeightsError(
                WeightsFault.PlanMismatch,
                f"plan dtype family {dtype_family!r} (supported: {', '.join(COMPUTE_DTYPES)})",
            )
        if max_seq_len is not None and not 0 < max_seq_len <= facts.context_length:
            raise WeightsError(
                WeightsFault.PlanMismatch,
                f"plan max_seq_len {max_seq_len} outside the file's context length "
                f"{facts.context_length}",
            )
        entries = []
        for name in self.stage_tensor_names(
            layer_start, layer_end, is_first=is_first, is_last=is_last
        ):
            entry = self.tensors[name]
            if entry.n_bytes < 0 or entry.type_id not in SUPPORTED_TYPES:
                raise WeightsError(
                    WeightsFault.UnsupportedTensorType,
                    f"tensor {name} has type {entry.type_name}",
                )
            if entry.offset + entry.n_bytes > self.file_size:
                raise WeightsError(
                    WeightsFault.Truncated,
                    f"{self.source.name}: tensor {name} ends at byte "
                    f"{entry.offset + entry.n_bytes}, file has {self.file_size}",
                )
            entries.append(entry)
        return entries

    # -- load -----------------------------------------------------------------------------
    def load_stage(
        self,
        layer_start: int,
        layer_end: int,
        *,
        is_first: bool,
        is_last: bool,
        dtype: str = "f32",
        max_seq_len: int | None = None,
        num_layers: int | None = None,
        hidden_dim: int | None = None,
        keep_blocks: bool = False,
    ) -> StageWeights:
        """Validate, read the stage's byte ranges and dequantise them once into ``dtype``.

        ``keep_blocks`` keeps every 2-D tensor of a block type (``dequant.BLOCK_TYPES``:
        Q2_K-Q6_K, Q4_0-Q8_0, F16/BF16) in its file blocks (:class:`QuantMatrix`)
        instead of dequantising it, for roles that compute from the quantised weights.
        """
        entries = self.validate_stage(
            layer_start,
            layer_end,
            is_first=is_first,
            is_last=is_last,
            num_layers=num_layers,
            hidden_dim=hidden_dim,
            dtype_family=dtype,
            max_seq_len=max_seq_len,
        )
        before = self.source.bytes_read
        ranges = coalesce_ranges([(e.offset, e.n_bytes) for e in entries])
        tensors: dict[str, npt.NDArray[Any]] = {}
        kept: dict[str, QuantMatrix] = {}
        target = COMPUTE_DTYPES[dtype]
        pending = list(entries)
        for start, length in ranges:
            block = self.source.read(start, length)
            while pending and pending[0].offset < start + length:
                entry = pending.pop(0)
                lo = entry.offset - start
                raw = np.frombuffer(block, dtype=np.uint8, count=entry.n_bytes, offset=lo)
                found = quant_matrix(raw, entry.type_id, entry.shape) if keep_blocks else None
                if found is not None:
                    kept[entry.name] = found
                else:
                    tensors[entry.name] = dequantize(raw, entry.type_id, entry.shape, target)
        return StageWeights(
            facts=self.facts,
            layer_start=layer_start,
            layer_end=layer_end,
            is_first=is_first,
            is_last=is_last,
            dtype=dtype,
            tensors=tensors,
            header_bytes=self.header_bytes,
            tensor_bytes=sum(e.n_bytes for e in entries),
            bytes_read=self.source.bytes_read - before,
            file_size=self.file_size,
            ranges=ranges,
            blocks=kept,
        )


def read_header(source: ByteSource, file_size: int) -> tuple[GgufHeader, int]:
    """Parse the header of `source` from a prefix that grows until it holds it (module
    doc); (header, bytes read)."""
    prefix = b""
    want = min(file_size, FIRST_READ_BYTES)
    while True:
        if want > len(prefix):
            prefix += source.read(len(prefix), want - len(prefix))
        if len(prefix) < 4:
            raise WeightsError(WeightsFault.Truncated, f"{source.name}: file too short")
        try:
            return parse_header(prefix), len(prefix)
        except NeedMoreBytes as more:
            if more.end > file_size:
                raise WeightsError(
                    WeightsFault.Truncated,
                    f"{source.name}: header needs byte {more.end} but the file has "
                    f"{file_size} bytes (truncated or corrupt header)",
                ) from None
            if more.end > MAX_HEADER_BYTES:
                raise WeightsError(
                    WeightsFault.CorruptHeader,
                    f"{source.name}: header needs byte {more.end}, over the "
                    f"{MAX_HEADER_BYTES}-byte bound on a GGUF header",
                ) from None
            want = min(grow_to(len(prefix), more, file_size),
                       MAX_HEADER_BYTES)
        except GgufHeaderError as exc:
            raise WeightsError(
                WeightsFault.CorruptHeader, f"{source.name}: {exc}"
            ) from None


def coalesce_ranges(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge ``(offset, length)`` spans that touch or sit within a small gap, in file order."""
    merged: list[tuple[int, int]] = []
    for offset, length in sorted(spans):
        if merged:
            last_offset, last_length = merged[-1]
            if offset <= last_offset + last_length + _COALESCE_GAP_BYTES:
                end = max(last_offset + last_length, offset + length)
                merged[-1] = (last_offset, end - last_offset)
                continue
        merged.append((offset, length))
    return merged


def open_reader(
    location: str | os.PathLike[str],
    *,
    digest: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    table: Mapping[str, Any] | None = None,
) -> GgufRangeReader:
    """Open a GGUF by path or URL (optionally through the content-addressed cache); with
    `table` (:meth:`GgufRangeReader.stage_table`) its header is not read again."""
    from swactor.model.source import open_source

    return GgufRangeReader(open_source(location, digest=digest, cache_dir=cache_dir), table)
