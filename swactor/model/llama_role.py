"""Llama-family stage role in tinygrad: one contiguous layer range of a GGUF model.

Theory of operation. A :class:`StageRole` owns blocks ``[layer_start, layer_end)`` of a
llama (or qwen2) model, plus the token embedding when it is the first stage and the final
norm, output projection and sampler when it is the last. Weights arrive dequantised once at
load (:class:`~swactor.model.gguf_range.StageWeights`) and are moved to the tinygrad device
once, each copied straight into its device buffer
(:func:`~swactor.model.block_kernels.upload`: no schedule per tensor). Each block keeps a
KV cache ``[slots, kv_heads, max_seq_len, head_dim]`` in the compute dtype: one slot per
sequence in flight (``slots``, default 1).

Object convention (agreed with the worker; spec §17):

* token object (stage 0 input, last-stage output): ``int32`` ids, shape ``[tokens]``;
  the last stage emits exactly one id per step (the next token).
* activation object (between stages): the plan dtype (``float32`` or ``float16``),
  shape ``[tokens, hidden]``, C order, little endian;
  ``extent = tokens * hidden * dtype_width_bytes``.

``step(sequence, payload)``: ``sequence`` is the inference step of the one sequence
(slot 0). Step 0 is the prefill (every prompt position at once, positions ``0..T-1``)
and resets the position counter; step ``k > 0`` carries one position. Steps must arrive
in order (``k`` then ``k + 1``).

``run_tagged(tag, payload)``: an object tagged with a
:class:`~swactor.wire.tags.SequenceTag` (a serving run's many sequences): position 0 is
a prompt in slot ``tag.slot`` (resetting it), position ``p > 0`` one decode row that
must be the slot's next position. The last stage answers one greedy id, or with
``tag.candidates`` the top ``CANDIDATES_K`` ids and their logits (:func:`candidates`);
sampling is then the orchestrator's, so a stage keeps no per-sequence sampling state.

``run_prompts(tags, payload)``: a prompt batch: several prompts, each in its own slot
(``tags[i].position`` is prompt ``i``'s row count), one object on the wire; each prompt
is prefilled as ``run_tagged`` prefills it alone, so its rows, logits, answer and KV
entries are bit-identical to the prompt alone (see "Prompt batches" below).

``run_batch(tags, payload)``: ``B`` decode rows of different sequences (distinct slots,
each at its slot's next position) as one step, answers in table order (the ``[B,
hidden]`` rows, or on the last stage each row's ``run_tagged`` answer joined). Each
row's result is bit-identical to the row run alone (see "Batched decode" below).

Math (llama.cpp semantics): ``x += Wo·attn(rope(Wq·n(x)), rope(Wk·n(x)), Wv·n(x))`` then
``x += Wd·(silu(Wg·n(x)) * Wu·n(x))`` with ``n`` the RMSNorm (``eps`` from the file) times
its weight; grouped-query attention shares each KV head among ``heads / kv_heads`` query
heads; the causal mask applies during prefill. llama GGUF files store Q and K rows permuted
for rotary embedding on adjacent pairs (llama.cpp's "normal" rope); at load we un-permute
the first ``rope_dim`` rows of every head into the half-split layout so rope is two slices;
qwen2 files are already half-split (NEOX) and carry Q/K/V biases. Sums run in float32; the
residual stream is rounded to the plan dtype at every block boundary, so a model split at
any block boundary computes the same numbers as the whole (below float32 each block's
output is materialised: fused into its readers, tinygrad would fold the round trip away).

Decode (one position) runs through one :class:`TinyJit` per role: the start position and
(with more than one slot) the slot are bound symbolic variables, the KV cache is written
with ``assign`` into ``cache[slot, :, pos:pos+1]`` and attention reads
``cache[slot, :, 0:pos+1]``, so kernels are built on the first decode steps and replayed
afterwards for every position and slot (``beam > 0`` lets tinygrad's BEAM search
pick those kernels once; its results are cached on disk). Prefill pads the prompt to a
multiple of ``PREFILL_BUCKET`` rows (a short prompt on CPU: of ``SHORT_PREFILL_BUCKET``,
see "CPU prefill graph") and runs through one TinyJit per padded length (the
last real row, whose logits are sampled, and the slot are bound variables). With one
slot the slot is the constant 0: a single-sequence role's graphs are what they were
before slots existed (measured: the same decode ms/token with 1 and 4 slots). On a CPU
device a prefill's products (dense or block weights) widen each weight once into
transient panels and run a tiled C kernel (:mod:`swactor.model.prefill_gemm`), 4-5x
faster than tinygrad's own CPU matrix product on SmolLM2's shapes, cut into slices of
whole output columns that the replay pool runs on several threads (over Q4_1 and Q8_0
blocks each slice widens its own panels, no panels buffer); a prefill product over
Q4_1/Q8_0 blocks goes through the decode kernel instead
(:func:`~swactor.model.decode_gemv.prefill_usable`: on x86-64's integer path at any
length, elsewhere up to :data:`~swactor.model.decode_gemv.PREFILL_ROWS` rows), faster
there than widening every weight into panels.

CPU prefill graph. On a CPU device a prefill is :meth:`StageRole._forward_prompt`:
the prompt's rows followed by its padding rows (the bucket as above), with three more
inputs the host computes: each row's rotary cosines and sines (read from the role's
tables) and a ``[T, T]`` mask letting each row attend to the prompt's rows up to itself
(a padding row only to itself). With the clang renderer (where decode attention is the
C kernel) a block's attention is instead one C kernel that reads no mask
(:func:`~swactor.model.decode_attention.attend_prompt`): row ``b`` attends to rows
``0..b`` by the statements a decode row at position ``b`` runs, only the causal half of
the scores is computed, and padding rows, which attend to the prompt too, change
nothing before them (measured on SmolLM2 Q4_1, one stage, 2 cores: a 1024-token
prefill 3.2 s instead of 7.0 s with tinygrad's attention expression, 2048 tokens 9.9 s
instead of 27 s). Each block's keys and values come back as outputs and
the host copies the prompt's rows into its slot's cache (positions ``0..n-1``), so the
graph has no slot in it and one JIT per bucket (kernel cache kind ``prefill-P``) serves
every slot; the last stage computes the logits of the last row (a bound variable). The
host writes a bucket's inputs into buffers the role keeps (through numpy views, no
upload) and reads the outputs through views of the JIT's output buffers (a
``numpy()`` per output cost a schedule and a copy kernel each: 60 of them made up about
half of a short prompt's prefill on SmolLM2); once the JIT has replayed, it runs from
its :class:`~swactor.model.cpu_graph.DirectReplay`.

A prompt of at most :data:`~swactor.model.decode_gemv.PREFILL_ROWS` rows is padded to
a multiple of ``SHORT_PREFILL_BUCKET`` (8, the decode kernel's rows per pass), longer
ones to a multiple of ``PREFILL_BUCKET`` up to ``LONG_PREFILL_ROWS`` rows, past it of a
step that grows with the length (``LONG_PREFILL_ROWS`` says why); a role keeps at most
``PREFILL_KEEP_BYTES`` of buckets built, the least recently used dropped first.
Short prompts' 8-row steps, measured on SmolLM2 Q4_1 (one stage, 2
cores): a 5-token prompt 16 ms padded to 8 rows against 20 ms padded to 16, the
prompts of ``bench serve`` 45 against 51 ms on average. It costs eight buckets up to
64 rows instead of four, each built at its first prompt (or a serving stage's warm-up)
where the kernel cache does not hold it. A prompt computes the same at either padding:
each row's products are its own, and so is its attention in the C kernel (rows
``0..b``). With tinygrad's attention expression tinygrad picks the kernels' summation
order over the padded columns by their count, one order up to 32 columns and another
from 40 (SmolLM2 and the tests' models), so there 8 and 16, 24 and 32, 40 and 48, 56
and 64 rows give the same logits, keys and values bit for bit (the tests hold them to
it).

Prompt batches (:meth:`StageRole.run_prompts`). The prompts of one batch are prefilled
one after another, each through its own bucket's JIT, the one it would run alone: its
outputs are those of the prompt alone by construction, bit for bit, which a migrated
sequence needs to continue exactly and greedy output needs to match the prompt run
alone. Packing several prompts into one prefill (their rows one after another, a
block-diagonal mask) was measured not to give that with tinygrad's attention
expression: a prompt's attention reductions then run over the packed object's padded
columns, whose count, the prompt's column
offset and the kernels tinygrad picks for that shape all change the order of the sums
(SmolLM2: logits up to 5e-5 apart from the prompt alone).

Mixed steps (:meth:`StageRole.run_mixed`). A prompt and decode rows of other sequences
run as one step: while a prompt is prefilled, the sequences already decoding would
otherwise wait a whole prefill and then pay a decode step of their own. On the CPU path
with the C attention, when every block product is the decode kernel
(:mod:`swactor.model.decode_gemv`, Q4_1/Q8_0 blocks) and the decode rows fit in the
padding rows of a short prompt's bucket (a 5-token prompt is padded to 8 rows: up to 3
decode rows take the places of padding rows), the step is one graph: the prompt's CPU
prefill graph (:meth:`StageRole._forward_prompt`) with the decode rows after the
prompt's rows and what padding is left. The graph's products take every row at once;
the prompt's rows attend as in its prefill, the decode rows through the decode step's
attention kernel (their positions and slots an input the host writes; their keys and
values into their slots' caches). Each row's arithmetic is the same in either graph:
the decode kernel's rows are the one-row product's whatever their count, norms and
elementwise steps are row-wise, and both attention kernels are the decode row's
statements, so every answer, activation row and KV entry is bit-identical to the prompt
alone and each row alone (the tests hold them to it, in f32 and f16).
Measured side by side on SmolLM2 Q4_1 (one stage, f32, 2 cores; ``bench mixed``), a
prompt and its decode rows apart against one step: 5 tokens and 3 rows 21.9 -> 15.6 ms,
25 tokens and 3 rows 43.7 -> 38.3, 53 tokens and 3 rows 67.8 -> 62.2. Rows that would
open the next bucket cost its padding rows too, about a decode step of their own (8
tokens and 1 row 20.0 against 21.8 ms in one graph), so then, and elsewhere (a dense or
other block-type product, whose prefill is a matrix product with its own order of sums;
the portable path; BEAM; a prompt past the short buckets), the step runs apart: the
prompt prefilled, then the rows batched, with the same results. One JIT per bucket and
decode row count (kernel cache kind ``mixed-T-D``), built at its first step or by
:meth:`StageRole.warm_up`; its graph and inputs count toward its bucket's bytes in
``PREFILL_KEEP_BYTES`` and are dropped with the bucket.

Decode is a chain of matrix-vector products over every weight, so its speed is the rate at
which kernels stream weights. Two measured choices (SmolLM2, 2 CPU cores): products are
written as 16 running sums along the contiguous input axis then one short sum (2-2.5x
the bandwidth of ``matmul``), and on CPU f16 weights are widened to f32 with integer bit
moves, which clang vectorises, instead of its scalar ``__fp16`` conversions (2x).
Two more: every RMSNorm output is materialised (``contiguous``): fused into the
following product, the normalisation (a reciprocal square root per element) would be
recomputed for every output row, which makes the Q/K/V, gate/up and output products 2-10x
slower. And on
CPU a product with 1024 or more output rows is cut into kernels of fewer rows
(:func:`_matvec_chunk`): from 1024 rows tinygrad's heuristics unroll three rows at once,
a kernel that streams weights at about a third of the speed of the unsplit ones.
And on CPU the decode JIT is replayed through
:class:`~swactor.model.cpu_graph.CpuGraph` (one C loop over the ~730 kernels instead of
~15 us of Python each: 33 -> 17 ms/token), and the step's input and output go through
numpy views of a kept input buffer and the JIT's output buffer (a fresh Tensor and
``numpy()`` cost a schedule each). Once the decode JIT has replayed, its batches run
straight from :class:`~swactor.model.cpu_graph.DirectReplay` (the position and slot
written into the kernel table, then the C loop), without TinyJit's ~1 ms of Python per call.

Batched decode (``run_batch``, :meth:`StageRole._decode_rows`): one TinyJit per batch
size ``B`` (kernel cache kind ``decode-rows-B``) whose ``2 B`` bound variables are the
rows' positions and slots. Every product takes the ``B`` rows at once. On CPU a Q4_1 or
Q8_0 block product (up to 8 rows) is the hand-written kernel of
:mod:`swactor.model.decode_gemv`, the one-row decode's too: each block is unpacked once
for all rows (on x86-64 into integer dot products with the rows quantised per block, to
8 bits for Q4_1 as llama.cpp does, 16 for Q8_0, the output projection's too), each
row's sums are the same arithmetic whatever ``B``, and
the product is cut into slices of output rows that the replay pool runs on several
threads. Any
other product is the one-row product's expression plus a row axis (``[B, out, in / 16,
16]`` summed over the groups, then the 16 lanes): tinygrad gives it the one-row kernel's
reduction opts (the same unrolled groups and lane order per row) and upcasts the row
axis, so each row's sums are those of the one-row kernel, bit for bit. Norms and
elementwise steps are row-wise. On a CPU with the clang renderer every row's KV write
and attention are one C kernel per block (:mod:`swactor.model.decode_attention`, the
one-row decode's kernel too; the rows' positions and slots reach it as a small input
computed once per step from the bound variables); elsewhere each row's are the one-row
graph over its own slot and position variables (``B`` copies of the small attention
kernels). Either way no row attends over padding. There the gated activation
``silu(g) * u`` of every row, in decode and prefill alike, is a C kernel with a slice
per row (:mod:`swactor.model.gated`: the same vector code for each row, where
tinygrad's kernel for several rows computes its exponentials in scalar code). With ``beam > 0`` the
rows run one after another instead (BEAM picks each kernel's loop order, hence its
summation order). Building a batch size's JIT takes minutes on a small CPU, so only
:meth:`StageRole.warm_up` builds them (``rows``) or loads them (every size the kernel
cache holds for the role); a batch of a size not ready runs in chunks of the largest
ready size that fits (4 rows as 2 + 2 with only the 2-row JIT), the rest row by row.

Weights in blocks (``quantised``, weights loaded with ``keep_blocks``): every matrix of a
:data:`~swactor.model.dequant.BLOCK_TYPES` type (Q2_K to Q6_K, Q4_0 to Q8_0, and F16/BF16
values as blocks of one) stays in the file's bytes on the device and nothing dense is
kept; both decode and prefill products widen the codes inside their kernels
(:mod:`swactor.model.block_kernels`), so a stage holds about its file bytes (SmolLM2
Q4_1: 97 MB of weights instead of 538 MB at f32; decode reads those 97 MB per token,
about 3x less CPU per token than f32 dense). A matrix is a list of row-stacked parts
(:class:`_Matrix`): a file that mixes types inside a block (llama.cpp's ``_M`` variants)
gives one product per run of one type, outputs joined. F32 matrices and every 1-D tensor
are held dense in the compute dtype. The embedding lookup dequantises only
the rows it gathers; a stage that is first and last of a model with tied embeddings
reads them from the output projection's buffers (:class:`SharedEmbedding`: numpy views
on CPU, rows copied out of the device buffers elsewhere), so it holds the embedding
once. On CPU, Q4_1 and Q8_0 decode products run through
:mod:`swactor.model.decode_gemv` (see "Batched decode"); the other block types' decode
products are cut below 800 rows: tinygrad split a 960-row block product into two thread
slices that ran at a sixth of the speed of one 480-row kernel.

Devices other than a CPU (a GPU) run the *portable path*: tinygrad's own kernels for
every product and for attention, no C kernel and no CPU replay. A decode JIT's input is
still one buffer kept for the role's life: each step copies its rows in and its output
out through the device's allocator, one copy each way and no schedule (tinygrad's NULL
device, whose kernels cost nothing, shows what that leaves of a step: the host side a
GPU's step pays). ``portable=True`` runs the same path on a CPU device, so tests check
it and benchmarks measure it on a machine without a GPU; it is part of the kernel
cache's key.
"""

from __future__ import annotations

import gc
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar, cast

import numpy as np
import numpy.typing as npt
from gguf import GGMLQuantizationType as Q
from gguf import quants
from tinygrad.device import Buffer, Device
from tinygrad.dtype import DType, dtypes
from tinygrad.engine.jit import CapturedJit, TinyJit, _TinyJit
from tinygrad.helpers import Context
from tinygrad.tensor import Tensor
from tinygrad.uop import Ops
from tinygrad.uop.ops import UOp

from swactor import heap
from swactor.model import decode_attention, decode_gemv, gated, prefill_gemm
from swactor.model.block_kernels import (
    DeviceQuant,
    block_matmul,
    dequant_expr,
    synchronize,
    to_device,
    upload,
    widen_f16,
)
from swactor.model.cpu_graph import DirectReplay, use_cpu_graph
from swactor.model.dequant import QuantMatrix, raw_from_fields
from swactor.model.errors import WeightsError, WeightsFault
from swactor.model.gguf_range import ModelFacts, StageWeights
from swactor.model.jit_cache import KernelCache
from swactor.model.sampling import SamplingPolicy, sample_token
from swactor.wire.tags import CANDIDATES_K, MAX_PROMPTS, MAX_SLOTS, SequenceTag

_TG_DTYPES = {"f32": dtypes.float32, "f16": dtypes.float16}
NP_DTYPES: dict[str, type[np.floating[Any]]] = {"f32": np.float32, "f16": np.float16}
_NP_OF_TG: dict[Any, type[np.generic]] = {
    dtypes.float32: np.float32,
    dtypes.float16: np.float16,
    dtypes.int32: np.int32,
    dtypes.bool: np.bool_,
}
_REDUCE_LANES = 16
MIB = 1 << 20
log = logging.getLogger(__name__)
# block products of 960 rows came out as two 480-row thread slices at a sixth of the
# speed of one 480-row kernel (146 vs 2 x 16 us): cut them below 800 rows
_BLOCK_ROWS_LIMIT = 800
PREFILL_BUCKET = 16
LONG_PREFILL_ROWS = 256
"""Past this many rows a prefill's bucket step grows with the prompt: a sixteenth of the
power of two at or above its length (32 rows up to 512, 64 up to 1024, 128 up to 2048),
so padding adds less than an eighth of the rows (about a sixteenth on average) and a
context of 2048 positions has 44 buckets instead of 132. Each bucket is a graph built at
its first prompt (measured on SmolLM2 Q4_1, one stage, 2 cores: 9 s at 256 rows, 20 s
at 1024, 38 s at 2048) and an entry of the kernel cache
(:data:`~swactor.model.jit_cache.KEEP_ENTRIES`)."""
PREFILL_KEEP_BYTES = 320 << 20
"""The most device memory the prefill buckets a role keeps built may hold at once: past
it the least recently used buckets' graphs and inputs are dropped (rebuilt, or loaded
from the kernel cache, at their next prompt). A kept bucket holds its graph's own
buffers (intermediates and outputs) and its inputs, which grow with its rows and with
the model's widths: prompts of many lengths would otherwise grow a serving stage without
bound, and a budget in rows would hold ten times the memory on a model ten times as
wide. :meth:`StageRole.bucket_bytes` counts them (the same bytes as the allocator's
before and after building a bucket); a new bucket counts once its graph is captured, so
while it builds, the buckets held pass the budget by it. On SmolLM2 (one stage, blocks,
f32): 9.1 MB for the 112-row bucket, 51 MB for 640 rows (about 80 KB per row, 46 KB of
it the keys and values a CPU prefill returns), so this keeps about 4100 rows."""
SHORT_PREFILL_BUCKET = decode_gemv.MAX_ROWS
"""A CPU prefill of at most :data:`~swactor.model.decode_gemv.PREFILL_ROWS` rows is padded
to a multiple of this: each padding row costs a row's products (on the float path, a
padding row beyond the last 8-row pass a whole pass per product)."""


def process_rss_bytes() -> int:
    """This process's resident set now (Linux ``/proc/self/status``), else its peak."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _matvec_chunk(out_features: int, limit: int = 1024) -> int:
    """Rows per CPU matrix-vector kernel: the largest even divisor below 1024.

    tinygrad's heuristics upcast the output axis of a kernel with 1024 or more outputs (by 3
    here), which clang turns into slow code; below that they keep one row per iteration.
    """
    if out_features < limit:
        return out_features
    for rows in range(limit - 2, 1, -2):
        if out_features % rows == 0:
            return rows
    return out_features


def _graph_buffers(linear: UOp) -> dict[int, int]:
    """The buffers a captured JIT graph (its ``linear``) reads or writes: ``id`` -> bytes."""
    return {id(buffer): buffer.nbytes for buffer in (
        cast(Buffer, u.buffer) for u in linear.toposort() if u.op is Ops.BUFFER)}


def _host_view(tensor: Tensor) -> npt.NDArray[np.generic]:
    """A numpy view of a realized CPU tensor's memory (no copy; valid while it lives)."""
    buffer = cast(Buffer, tensor.uop.buffer)
    memory = buffer.as_memoryview(force_zero_copy=True)
    np_dtype = _NP_OF_TG[tensor.dtype]
    return np.frombuffer(memory, dtype=np_dtype).reshape(tensor.shape)


def _copy_in(tensor: Tensor, array: npt.NDArray[np.generic]) -> None:
    """Write ``array`` (its shape and dtype) into a realized device tensor's buffer through
    the device's allocator: one host-to-device copy, no schedule. The caller makes sure no
    queued kernel still reads the buffer (a decode step's output was copied out, which
    waits for every kernel before it)."""
    buffer = cast(Buffer, tensor.uop.buffer)
    buffer.allocator._copyin(buffer._buf, array.reshape(-1).view(np.uint8).data)


def _copy_out(tensor: Tensor) -> npt.NDArray[np.generic]:
    """A new numpy array holding a realized device tensor's values, copied out through the
    device's allocator (which waits for the kernels queued before): ``numpy()`` would
    schedule and run a copy to the host first."""
    buffer = cast(Buffer, tensor.uop.buffer)
    result = np.empty(tensor.shape, dtype=_NP_OF_TG[tensor.dtype])
    assert result.nbytes == buffer.nbytes, (tensor.shape, buffer)
    buffer.allocator._copyout(result.reshape(-1).view(np.uint8).data, buffer._buf)
    return result


_Scalar = TypeVar("_Scalar", bound=np.generic)
_Rope = tuple[Tensor, Tensor]
"""A graph's rotary cosines and sines for its rows (``StageRole._rope_at``)."""
_Ret = TypeVar("_Ret")
_PrefillJit = _TinyJit[tuple[Tensor, ...]]
"""A prefill JIT: on CPU it returns the activation rows or logits, then each block's
keys and values (`StageRole._forward_prompt`); elsewhere one tensor, cast at its call."""


class StepError(Exception):
    """A step input the role cannot accept (spec §37 ``StepFailure.InvalidInputHandle``)."""


def candidates(logits: npt.NDArray[np.float32], k: int = CANDIDATES_K) -> npt.NDArray[np.int32]:
    """The top ``k`` ids of ``logits`` (most likely first, lowest id first on ties, as
    :func:`~swactor.model.sampling.sample_token` orders them) then their float32 logits'
    bit patterns: one int32 array of ``2 * k`` (the wire's candidates object)."""
    k = min(k, logits.shape[0])
    # the k-th largest value; every larger one is in, then the lowest ids equal to it
    kth = logits[np.argpartition(-logits, k - 1)[k - 1]]
    above = np.flatnonzero(logits > kth)
    top = np.concatenate([above, np.flatnonzero(logits == kth)[: k - above.size]])
    top = top[np.lexsort((top, -logits[top]))]
    values = np.ascontiguousarray(logits[top], dtype=np.float32)
    return np.concatenate([top.astype(np.int32), values.view(np.int32)])


def _unpermute_rope_rows(
    weight: npt.NDArray[_Scalar], heads: int, head_dim: int, rope_dim: int
) -> npt.NDArray[_Scalar]:
    """Rows of each head from llama.cpp's adjacent-pair order to half-split order."""
    rows = weight.reshape(heads, head_dim, *weight.shape[1:])
    rot = rows[:, :rope_dim].reshape(heads, rope_dim // 2, 2, *weight.shape[1:])
    rot = rot.swapaxes(1, 2).reshape(heads, rope_dim, *weight.shape[1:])
    return np.ascontiguousarray(np.concatenate([rot, rows[:, rope_dim:]], axis=1)).reshape(
        weight.shape
    )


@dataclass
class _Matrix:
    """A weight matrix on the device as row-stacked parts, each dense (compute dtype) or
    in the file's blocks; a product is one kernel set per part, outputs joined."""

    parts: list[Tensor | DeviceQuant]

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes if isinstance(p, DeviceQuant) else p.nbytes() for p in self.parts)

    @property
    def quantised(self) -> bool:
        return any(isinstance(p, DeviceQuant) for p in self.parts)


_NP_OF_FIELD: dict[DType, type[np.generic]] = {
    **_NP_OF_TG, dtypes.uint8: np.uint8, dtypes.int8: np.int8, dtypes.uint16: np.uint16}


def _zero_copy_view(buffer: Buffer, tensor: Tensor) -> npt.NDArray[np.generic] | None:
    """A numpy view of ``tensor``'s device memory (no copy) where the device's memory is
    the host's (CPU); None elsewhere."""
    try:
        memory = buffer.as_memoryview(force_zero_copy=True)
    except (AssertionError, RuntimeError, NotImplementedError):
        return None
    return np.frombuffer(memory, dtype=_NP_OF_FIELD[tensor.dtype]).reshape(tensor.shape)


@dataclass
class SharedEmbedding:
    """The embedding table read from a tied output matrix's device buffers, so a stage that
    is first and last holds the embedding once: ``tensors`` are the matrix's arrays, the
    block arrays of :func:`~swactor.model.dequant.block_fields` (``type_id`` set) or the
    dense matrix in the compute dtype (``type_id`` None, array ``w``). Where the device's
    memory is the host's (CPU), ``views`` are numpy views of them and a lookup indexes
    those; elsewhere (``views`` None) each row a lookup needs is copied out of its device
    buffer (a view of the buffer at the row's offset: no kernel, a row's bytes each)."""

    type_id: int | None
    cols: int
    tensors: dict[str, Tensor]
    views: dict[str, npt.NDArray[np.generic]] | None

    nbytes = 0  # the output matrix holds the bytes

    @staticmethod
    def of(matrix: _Matrix) -> SharedEmbedding | None:
        """``matrix``'s arrays when it is one part (host views where there are some)."""
        if len(matrix.parts) != 1:
            return None
        part = matrix.parts[0]
        tensors = part.fields if isinstance(part, DeviceQuant) else {"w": part}
        views: dict[str, npt.NDArray[np.generic]] | None = {}
        for name, tensor in tensors.items():
            buffer = tensor.uop.buffer
            if not isinstance(buffer, Buffer) or tensor.dtype not in _NP_OF_FIELD:
                return None
            view = _zero_copy_view(buffer, tensor) if views is not None else None
            if view is None:
                views = None
            else:
                assert views is not None
                views[name] = view
        type_id = part.type_id if isinstance(part, DeviceQuant) else None
        return SharedEmbedding(type_id, _cols(part), tensors, views)

    def _rows(self, name: str, ids: npt.NDArray[np.intp]) -> npt.NDArray[np.generic]:
        """Rows ``ids`` of array ``name``, ``[len(ids), ...]``."""
        if self.views is not None:
            return self.views[name][ids]
        tensor = self.tensors[name]
        buffer = cast(Buffer, tensor.uop.buffer)
        np_dtype = _NP_OF_FIELD[tensor.dtype]
        tail = tuple(int(n) for n in tensor.shape[1:])
        row = math.prod(tail)
        out = np.empty((len(ids), *tail), dtype=np_dtype)
        for i, index in enumerate(ids):
            piece = buffer.view(row, tensor.dtype, int(index) * row * tensor.dtype.itemsize)
            piece.ensure_allocated()
            piece.allocator._copyout(out[i].reshape(-1).view(np.uint8).data, piece._buf)
        return out

    def dense_rows(self, ids: npt.NDArray[np.int32], target: type[np.generic]
                   ) -> npt.NDArray[np.generic]:
        """Rows ``ids`` as ``[len(ids), cols]`` of ``target``, as the file's would be."""
        wanted, back = np.unique(np.asarray(ids, dtype=np.intp), return_inverse=True)
        picked = {name: self._rows(name, wanted) for name in self.tensors}
        if self.type_id is None:
            return np.ascontiguousarray(picked["w"][back], dtype=target)
        raw = raw_from_fields(self.type_id, picked)
        values = quants.dequantize(raw, Q(self.type_id)).reshape(len(raw), self.cols)
        return np.ascontiguousarray(values[back], dtype=target)


def _cols(part: Tensor | DeviceQuant) -> int:
    return part.shape[1] if isinstance(part, DeviceQuant) else int(part.shape[1])


@dataclass
class _DecodeRunner:
    """A decode JIT (``kind`` in the kernel cache) with its bound ``variables``, its kept
    input buffer, and on CPU numpy views of that input and of the output and, once the
    JIT has replayed, the :class:`~swactor.model.cpu_graph.DirectReplay` of it."""

    jit: _TinyJit[Tensor]
    kind: str
    variables: tuple[UOp, ...]
    data: Tensor | None = None
    data_view: npt.NDArray[np.generic] = field(default_factory=lambda: np.zeros(0))
    out_view: npt.NDArray[np.generic] = field(default_factory=lambda: np.zeros(0))
    replay: DirectReplay | None = None


@dataclass
class _PrefillInputs:
    """A CPU prefill bucket's inputs (:meth:`StageRole._forward_prompt`), kept for the
    role's life so that every call passes the JIT the same buffers: the rows, the rotary
    cosines and sines and the mask, with numpy views of each (written in place, no
    upload); once the JIT has replayed, views of its outputs and its
    :class:`~swactor.model.cpu_graph.DirectReplay`."""

    tensors: tuple[Tensor, ...]
    views: tuple[npt.NDArray[np.generic], ...]
    outputs: tuple[npt.NDArray[np.generic], ...] = ()
    replay: DirectReplay | None = None


@dataclass
class _Block:
    attn_norm: Tensor
    w_qkv: _Matrix  # rows: q (heads*hd), k (kv*hd), v (kv*hd); one matrix-vector per step
    b_qkv: Tensor | None
    wo: _Matrix
    ffn_norm: Tensor
    w_gate_up: _Matrix  # rows: gate (ffn), up (ffn)
    w_down: _Matrix
    cache_k: Tensor
    cache_v: Tensor


class StageRole:
    """Execute one stage's layer range; see the module docstring for the object convention."""

    def __init__(
        self,
        weights: StageWeights,
        *,
        max_seq_len: int,
        sampling: SamplingPolicy | None = None,
        device: str | None = None,
        beam: int = 0,
        cpu_graph: bool = True,
        quantised: bool = False,
        slots: int = 1,
        portable: bool = False,
    ) -> None:
        facts = weights.facts
        if not 0 < max_seq_len <= facts.context_length:
            raise WeightsError(
                WeightsFault.PlanMismatch,
                f"max_seq_len {max_seq_len} outside (0, {facts.context_length}]",
            )
        if not 1 <= slots <= MAX_SLOTS:
            raise WeightsError(WeightsFault.PlanMismatch,
                               f"slots {slots} outside 1..{MAX_SLOTS}")
        self.facts: ModelFacts = facts
        self.layer_start = weights.layer_start
        self.layer_end = weights.layer_end
        self.is_first = weights.is_first
        self.is_last = weights.is_last
        self.dtype = weights.dtype
        self.np_dtype = NP_DTYPES[weights.dtype]
        self.max_seq_len = max_seq_len
        self.sampling = sampling or SamplingPolicy.greedy()
        self.device = device or Device.DEFAULT
        self.beam = beam
        self.cpu_graph = cpu_graph
        self.quantised = quantised
        self.slots = slots
        self.last_logits: npt.NDArray[np.float32] | None = None
        self._next_sequence = 0
        self._positions = [0] * slots  # each slot's next position
        self._tg_dtype = _TG_DTYPES[weights.dtype]
        # clang renders f16->f32 as scalar converts; integer bit moves vectorise (about 2x)
        self._cpu = self.device.startswith("CPU") and not portable
        self._f16_bits = self._tg_dtype == dtypes.float16 and self._cpu
        # decode attention: one C kernel per block for every row (swactor.model.decode_attention)
        self._c_attention = self._cpu and decode_attention.usable(
            self.device, facts.head_dim, max_seq_len)
        # the gated activation: one C kernel of a slice per row (swactor.model.gated)
        self._c_gated = self._cpu and gated.usable(self.device, facts.ffn_dim)
        self._load(weights.tensors, weights.blocks if quantised else {})
        synchronize(self.device)  # every weight copied in before the host copies go
        # the role holds what it needs now: drop the loader's host arrays, so what the
        # process holds from here is the role's (and RSS at ready measures that)
        weights.tensors.clear()
        weights.blocks.clear()
        heap.trim()  # the load's freed host copies sit in glibc's heap until trimmed
        self.file_bytes = weights.tensor_bytes
        self.weight_bytes, self.kv_cache_bytes = self.memory_bytes()
        self.rss_at_ready = process_rss_bytes()
        log.info(
            "stage blocks %d..%d ready on %s (%s weights): weights %.1f MiB = %.2fx its "
            "%.1f MiB in the file, KV cache %.1f MiB for %d slot(s) of max_seq_len %d, "
            "process RSS %.1f MiB", self.layer_start, self.layer_end, self.device,
            "blocks" if quantised else "dense", self.weight_bytes / MIB,
            self.weight_bytes / max(1, self.file_bytes), self.file_bytes / MIB,
            self.kv_cache_bytes / MIB, slots, max_seq_len, self.rss_at_ready / MIB)
        self._pos_var = UOp.variable("start_pos", 0, max_seq_len - 1)
        # one slot: the slot is the constant 0 (the graphs of a single-sequence role)
        self._slot_var = UOp.variable("slot", 0, slots - 1) if slots > 1 else None
        self._decode = TinyJit(self._forward_decode)
        self._last_var = UOp.variable("last_row", 0, max_seq_len - 1)
        self._max_prompts = min(slots, MAX_PROMPTS)  # the most prompts one prompt batch carries
        self._prefill: dict[int, _PrefillJit] = {}
        self._prompt_buffers: dict[int, _PrefillInputs] = {}  # CPU prefill inputs by bucket
        self._held_buckets: dict[int, dict[int, int] | None] = {}
        """The prefill buckets kept, least recently used first, each with its captured
        graph's buffers (``id`` -> bytes; None until captured)."""
        self._warming = False
        """In :meth:`warm_up`: a new bucket that does not fit is dropped by the warm-up
        itself (it, not the least recently used), so noting it drops nothing."""
        # on CPU, host views of every block's KV caches: a prefill's keys and values are
        # copied into the prompt's slot through them (the buffers never move)
        self._cache_views = [(_host_view(b.cache_k), _host_view(b.cache_v))
                             for b in self.blocks] if self._cpu else []
        self._decode_runner = _DecodeRunner(
            self._decode, "decode",
            (self._pos_var,) if self._slot_var is None else (self._pos_var, self._slot_var))
        self._rows: dict[int, _DecodeRunner] = {}  # decode JITs by rows per step (2+)
        # mixed steps' JITs and inputs by (rows, decode rows): at most PREFILL_ROWS / 8
        # row counts times slots - 1
        self._mixed: dict[tuple[int, int], tuple[_PrefillJit, _PrefillInputs]] = {}
        self._row_wise = self._products_row_wise()  # the blocks' matrices never change
        self._kernels = KernelCache.for_role(
            self, self._structure(),
            skip=("_decode", "_prefill", "_prompt_buffers", "_held_buckets", "_decode_runner",
                  "_rows", "_mixed", "_kernels",
                  "sampling",
                  "last_logits"))

    # -- loading --------------------------------------------------------------------------
    def _checked(
        self, tensors: dict[str, npt.NDArray[np.generic]], name: str, shape: tuple[int, ...]
    ) -> npt.NDArray[np.generic]:
        array = tensors[name]
        if tuple(array.shape) != shape:
            raise WeightsError(
                WeightsFault.CorruptHeader,
                f"tensor {name} has shape {tuple(array.shape)}, model needs {shape}",
            )
        return array

    def _tensor(
        self, tensors: dict[str, npt.NDArray[np.generic]], name: str, shape: tuple[int, ...]
    ) -> Tensor:
        return self._to_device(self._checked(tensors, name, shape))

    def _to_device(self, array: npt.NDArray[np.generic]) -> Tensor:
        return upload(array, self.device)

    def _kv_cache(self) -> Tensor:
        f = self.facts
        shape = (self.slots, f.head_count_kv, self.max_seq_len, f.head_dim)
        return upload(np.zeros(shape, dtype=self.np_dtype), self.device)

    def _matrix(
        self,
        tensors: dict[str, npt.NDArray[np.generic]],
        blocks: dict[str, QuantMatrix],
        parts: list[tuple[str, tuple[int, int], npt.NDArray[np.intp] | None]],
    ) -> _Matrix:
        """Tensors ``parts`` (name, shape, row order) stacked by rows onto the device.

        A tensor in ``blocks`` stays in its file blocks; consecutive ones of one type are
        joined into one block matrix, consecutive dense ones into one dense matrix (so a
        file that mixes types per tensor, like the ``_M`` variants, gives two or three
        products where a uniform file gives one).
        """
        groups: list[list[QuantMatrix | npt.NDArray[np.generic]]] = []
        kinds: list[int | None] = []  # a group's block type, None for dense
        for name, shape, order in parts:
            quant = blocks.get(name)
            found: QuantMatrix | npt.NDArray[np.generic]
            if quant is not None:
                if quant.shape != shape:
                    raise WeightsError(
                        WeightsFault.CorruptHeader,
                        f"tensor {name} has shape {quant.shape}, model needs {shape}",
                    )
                found = quant if order is None else quant.permute_rows(order)
            else:
                array = self._checked(tensors, name, shape)
                found = array if order is None else array[order]
            kind = quant.type_id if quant is not None else None
            if groups and kinds[-1] == kind:
                groups[-1].append(found)
            else:
                groups.append([found])
                kinds.append(kind)
        out: list[Tensor | DeviceQuant] = []
        for group in groups:
            quants = [g for g in group if isinstance(g, QuantMatrix)]
            arrays = [g for g in group if not isinstance(g, QuantMatrix)]
            if quants:
                joined = quants[0] if len(quants) == 1 else QuantMatrix.stack(quants)
                out.append(to_device(joined, self.device))
            else:
                out.append(self._to_device(np.concatenate(arrays) if len(arrays) > 1
                                           else arrays[0]))
        return _Matrix(out)

    def _load(
        self, tensors: dict[str, npt.NDArray[np.generic]], blocks: dict[str, QuantMatrix]
    ) -> None:
        f = self.facts
        dim, hd, heads, kv = f.hidden_dim, f.head_dim, f.head_count, f.head_count_kv
        self.blocks: list[_Block] = []
        llama = f.architecture == "llama"
        q_order: npt.NDArray[np.intp] | None = None
        k_order: npt.NDArray[np.intp] | None = None
        if llama and f.rope_dim > 0:
            q_order = _unpermute_rope_rows(np.arange(heads * hd), heads, hd, f.rope_dim)
            k_order = _unpermute_rope_rows(np.arange(kv * hd), kv, hd, f.rope_dim)
        for layer in range(self.layer_start, self.layer_end):
            p = f"blk.{layer}."
            biases = [tensors.get(p + f"attn_{x}.bias") for x in "qkv"]
            if biases[0] is not None and q_order is not None:
                biases[0] = biases[0][q_order]
            if biases[1] is not None and k_order is not None:
                biases[1] = biases[1][k_order]
            b_qkv = None
            if any(b is not None for b in biases):
                sizes = (heads * hd, kv * hd, kv * hd)
                b_qkv = self._to_device(
                    np.concatenate(
                        [
                            np.zeros(n, self.np_dtype) if b is None else b
                            for b, n in zip(biases, sizes, strict=True)
                        ]
                    )
                )
            w_qkv = self._matrix(tensors, blocks, [
                (p + "attn_q.weight", (heads * hd, dim), q_order),
                (p + "attn_k.weight", (kv * hd, dim), k_order),
                (p + "attn_v.weight", (kv * hd, dim), None),
            ])
            w_gate_up = self._matrix(tensors, blocks, [
                (p + "ffn_gate.weight", (f.ffn_dim, dim), None),
                (p + "ffn_up.weight", (f.ffn_dim, dim), None),
            ])
            self.blocks.append(
                _Block(
                    attn_norm=self._tensor(tensors, p + "attn_norm.weight", (dim,)),
                    w_qkv=w_qkv,
                    b_qkv=b_qkv,
                    wo=self._matrix(
                        tensors, blocks, [(p + "attn_output.weight", (dim, heads * hd), None)]
                    ),
                    ffn_norm=self._tensor(tensors, p + "ffn_norm.weight", (dim,)),
                    w_gate_up=w_gate_up,
                    w_down=self._matrix(
                        tensors, blocks, [(p + "ffn_down.weight", (dim, f.ffn_dim), None)]
                    ),
                    cache_k=self._kv_cache(),
                    cache_v=self._kv_cache(),
                )
            )
        vocab = f.vocab_size
        # the embedding lookup is a row gather: done on the host, it reads only the rows
        # used (from the file's blocks when kept in blocks)
        self.token_embd: npt.NDArray[np.generic] | QuantMatrix | SharedEmbedding | None = None
        if self.is_first:
            embd: npt.NDArray[np.generic] | QuantMatrix = blocks.get("token_embd.weight") or \
                tensors["token_embd.weight"]
            if tuple(embd.shape) != (vocab, dim):
                raise WeightsError(
                    WeightsFault.CorruptHeader,
                    f"tensor token_embd.weight has shape {tuple(embd.shape)}, model needs "
                    f"{(vocab, dim)}",
                )
            self.token_embd = embd
        self.output_norm: Tensor | None = None
        self.output: _Matrix | None = None
        if self.is_last:
            self.output_norm = self._tensor(tensors, "output_norm.weight", (dim,))
            out_name = "token_embd.weight" if f.tied_embeddings else "output.weight"
            self.output = self._matrix(tensors, blocks, [(out_name, (vocab, dim), None)])
            if self.is_first and f.tied_embeddings:
                # one stage of a tied model: the lookup reads the output matrix's own
                # buffers (on any device), so the embedding is held once
                self.token_embd = SharedEmbedding.of(self.output) or self.token_embd
        half = f.rope_dim // 2
        self.rope_cos: Tensor | None = None
        self.rope_sin: Tensor | None = None
        self._rope_rows: tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]] | None = None
        """The rotary tables on the host too: a packed prefill's rows are gathered from
        them (each row's position within its own prompt)."""
        if half:
            inv = 1.0 / (f.rope_theta ** (np.arange(0, half, dtype=np.float64) * 2 / f.rope_dim))
            angles = np.outer(np.arange(self.max_seq_len, dtype=np.float64), inv)
            cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
            self.rope_cos = self._to_device(cos)
            self.rope_sin = self._to_device(sin)
            self._rope_rows = (cos, sin)

    def _embed(self, ids: npt.NDArray[np.int32]) -> npt.NDArray[np.generic]:
        assert self.token_embd is not None
        if isinstance(self.token_embd, (QuantMatrix, SharedEmbedding)):
            return self.token_embd.dense_rows(ids, self.np_dtype)
        return np.ascontiguousarray(self.token_embd[ids], dtype=self.np_dtype)

    def memory_bytes(self) -> tuple[int, int]:
        """``(weights, kv_cache)``: bytes this role holds in weights (device tensors and the
        host embedding) and in its KV caches (``slots`` of ``max_seq_len`` positions)."""
        weights = 0
        tensors: list[Tensor | _Matrix | None] = [self.output_norm, self.output,
                                                  self.rope_cos, self.rope_sin]
        kv = 0
        for block in self.blocks:
            tensors += [block.attn_norm, block.w_qkv, block.b_qkv, block.wo, block.ffn_norm,
                        block.w_gate_up, block.w_down]
            kv += block.cache_k.nbytes() + block.cache_v.nbytes()
        for item in tensors:
            if isinstance(item, _Matrix):
                weights += item.nbytes
            elif item is not None:
                weights += item.nbytes()
        if isinstance(self.token_embd, (QuantMatrix, SharedEmbedding)):
            weights += self.token_embd.nbytes  # shared rows: 0, counted in the output
        elif self.token_embd is not None:
            weights += int(self.token_embd.nbytes)
        return weights, kv

    # -- math -----------------------------------------------------------------------------
    def _linear(self, x: Tensor, matrix: _Matrix, rows: bool = False) -> Tensor:
        """``x @ W.T`` in float32 for a ``[out, in]`` matrix (its parts' outputs joined).

        ``rows``: ``x`` is independent decode rows, each computed as a one-row product
        would be (the same 16-lane sums), not a prefill matrix product."""
        outs = [
            self._block_linear(x, part, rows) if isinstance(part, DeviceQuant)
            else self._dense_linear(x, part, rows)
            for part in matrix.parts
        ]
        return outs[0] if len(outs) == 1 else outs[0].cat(*outs[1:], dim=-1)

    def _dense_linear(self, x: Tensor, weight: Tensor, rows: bool = False) -> Tensor:
        """``x @ weight.T`` in float32, ``weight`` being ``[out, in]`` in the compute dtype."""
        wide = widen_f16(weight, cpu=True) if self._f16_bits else weight.float()
        return self._matvec(x, wide, _matvec_chunk(int(weight.shape[0])) if self._cpu
                            else int(weight.shape[0]), rows)

    def _matvec(self, x: Tensor, wide: Tensor, chunk: int, rows: bool = False) -> Tensor:
        """``x @ wide.T`` for a lazy float32 ``[out, in]`` expression ``wide``; with
        ``rows`` each row of ``x`` summed as a one-row product is."""
        out_features, in_features = wide.shape
        lanes = _REDUCE_LANES
        if (x.shape[0] != 1 and not rows
                and prefill_gemm.usable(self.device, int(x.shape[0]), int(out_features))):
            return prefill_gemm.panel_matmul(x, wide)  # prefill on CPU: widen once, tiled
        if in_features % lanes or (x.shape[0] != 1 and not rows):
            return x.matmul(wide.T)  # prefill: a matrix product, tinygrad's heuristics fit
        # 16 running sums along the contiguous input axis, then one short sum: the kernel
        # loads and widens 16 consecutive weights at once (2-2.5x the bandwidth of matmul)
        tokens = x.shape[0]
        groups = in_features // lanes
        products = x.reshape(tokens, 1, groups, lanes) * wide.reshape(
            1, out_features, groups, lanes
        )
        count = int(out_features)
        if chunk >= count:
            return products.sum(axis=2).sum(axis=-1)
        parts = [
            products[:, start : start + chunk].sum(axis=2).sum(axis=-1).contiguous()
            for start in range(0, count, chunk)
        ]
        return parts[0].cat(*parts[1:], dim=-1)

    def _block_linear(self, x: Tensor, blocks: DeviceQuant, batch: bool = False) -> Tensor:
        """``x @ W.T`` with ``W`` decoded from the file's blocks inside the product's kernels
        (:func:`~swactor.model.block_kernels.dequant_expr`); nothing dense is stored.

        On CPU a Q4_1 or Q8_0 decode product, or a prefill product
        :func:`~swactor.model.decode_gemv.prefill_usable` allows, is
        :func:`~swactor.model.decode_gemv.gemv` (on the integer path where the target has
        it); other decode products are cut below
        ``_BLOCK_ROWS_LIMIT`` rows on CPU, each a kernel over its rows' blocks; every
        product is materialised (fused into its consumer it would be recomputed per
        consumer row).
        """
        rows = blocks.rows
        tokens = int(x.shape[0])
        if (tokens != 1 and not batch and self._cpu
                and decode_gemv.prefill_usable(self.device, blocks, tokens)):
            return decode_gemv.gemv(x, blocks)
        if tokens != 1 and not batch:
            # prefill: a matrix product that widens the codes inside its kernel
            return block_matmul(x, blocks, self._cpu)
        if self._cpu and decode_gemv.usable(self.device, blocks, int(x.shape[0])):
            return decode_gemv.gemv(x, blocks)
        chunk = _matvec_chunk(rows, _BLOCK_ROWS_LIMIT) if self._cpu else rows
        parts = []
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            wide = dequant_expr(blocks.row_slice(start, n), self._cpu)
            parts.append(self._matvec(x, wide, n, batch).contiguous())
        return parts[0] if len(parts) == 1 else parts[0].cat(*parts[1:], dim=-1)

    def _rms_norm(self, x: Tensor, weight: Tensor) -> Tensor:
        normed = x * (x.square().mean(axis=-1, keepdim=True) + self.facts.norm_eps).rsqrt()
        return (normed * weight.float()).contiguous()

    def _rope_at(self, start: UOp | int, tokens: int) -> _Rope | None:
        """The rotary cosines and sines of positions ``start..start + tokens - 1``
        (``[1, tokens, rope_dim / 2]`` each; None without rope), materialised once per
        graph and read by every block's rotations. Sliced inside each rotation, every
        block's two rotation kernels would read the position variable: on a GPU every
        kernel that reads a bound variable is a graph node whose arguments are updated at
        each replay, and a decode step's host time grows with them."""
        rope_dim = self.facts.rope_dim
        if rope_dim == 0 or self.rope_cos is None or self.rope_sin is None:
            return None
        half = rope_dim // 2
        return (self.rope_cos[start : start + tokens].reshape(1, tokens, half).contiguous(),
                self.rope_sin[start : start + tokens].reshape(1, tokens, half).contiguous())

    def _rope(self, x: Tensor, rope: _Rope | None) -> Tensor:
        """Rotate the first ``rope_dim`` features of ``x`` ``[heads, tokens, head_dim]`` by
        ``rope`` (:meth:`_rope_at`)."""
        return x if rope is None else self._rotate(x, *rope)

    def _rotate(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """``x`` ``[heads, tokens, head_dim]`` rotated by ``cos``/``sin`` ``[1, tokens,
        rope_dim / 2]``."""
        rope_dim = self.facts.rope_dim
        half = rope_dim // 2
        x1, x2 = x[..., :half], x[..., half:rope_dim]
        rotated = (x1 * cos - x2 * sin).cat(x2 * cos + x1 * sin, dim=-1)
        if rope_dim == x.shape[-1]:
            return rotated
        return rotated.cat(x[..., rope_dim:], dim=-1)

    def _attention(self, block: _Block, x: Tensor, start: UOp | int, tokens: int,
                   slot: UOp | int, where: Tensor | None, rope: _Rope | None) -> Tensor:
        qkv = self._qkv(block, x)
        if where is not None:  # one decode row on CPU: the C kernel
            return self._linear(self._attend_c(block, qkv, where), block.wo)
        return self._linear(self._attend(block, qkv, start, tokens, slot, rope), block.wo)

    def _attention_rows(self, block: _Block, starts: Sequence[UOp], slots: Sequence[UOp],
                        where: Tensor | None, ropes: Sequence[_Rope | None], x: Tensor
                        ) -> Tensor:
        """Attention of decode rows ``x`` ``[B, hidden]``: row ``b`` at position
        ``starts[b]`` of slot ``slots[b]``. The products take every row at once. With
        ``where`` (:func:`~swactor.model.decode_attention.positions` of the rows) every
        row's cache write and attention are one C kernel per block, the one-row decode's
        kernel. Otherwise each row's are the one-row graph's, over its own slot, and each
        row's output is materialised, as the one-row graph's is (the output product's
        input): fused into their concatenation, every output value evaluated all ``B``
        rows' attention."""
        qkv = self._qkv(block, x, rows=True)
        if where is not None:
            return self._linear(self._attend_c(block, qkv, where), block.wo, rows=True)
        outs = [self._attend(block, qkv[b : b + 1], start, 1, slot, rope).contiguous()
                for b, (start, slot, rope) in enumerate(zip(starts, slots, ropes,
                                                            strict=True))]
        return self._linear(outs[0].cat(*outs[1:], dim=0), block.wo, rows=True)

    def _attend_c(self, block: _Block, qkv: Tensor, where: Tensor) -> Tensor:
        """Decode rows ``qkv`` at the positions and slots ``where``: their keys and
        values into the slots' caches and their attention, one C kernel
        (:func:`~swactor.model.decode_attention.attend`)."""
        f = self.facts
        rope = None if self.rope_cos is None or self.rope_sin is None else (
            self.rope_cos, self.rope_sin)
        return decode_attention.attend(qkv, where, block.cache_k, block.cache_v, rope,
                                       heads=f.head_count, kv_heads=f.head_count_kv,
                                       rope_dim=f.rope_dim if rope is not None else 0)

    def _qkv(self, block: _Block, x: Tensor, rows: bool = False) -> Tensor:
        qkv = self._linear(x, block.w_qkv, rows)
        if block.b_qkv is not None:
            qkv = qkv + block.b_qkv.float()
        return qkv

    def _attend(self, block: _Block, qkv: Tensor, start: UOp | int, tokens: int,
                slot: UOp | int, rope: _Rope | None) -> Tensor:
        """Rows ``qkv`` at positions ``start..`` of ``slot``: write their keys and values
        to the slot's cache and attend over its positions ``0..start + tokens - 1``;
        returns ``[tokens, heads * head_dim]`` (before the output projection)."""
        f = self.facts
        hd, heads, kv = f.head_dim, f.head_count, f.head_count_kv
        q = qkv[:, : heads * hd]
        k = qkv[:, heads * hd : (heads + kv) * hd]
        v = qkv[:, (heads + kv) * hd :]
        q = self._rope(q.reshape(tokens, heads, hd).transpose(0, 1), rope)
        k = self._rope(k.reshape(tokens, kv, hd).transpose(0, 1), rope)
        v = v.reshape(tokens, kv, hd).transpose(0, 1)
        # the slot's cache is [kv, max_seq_len, hd]: slot `slot` of the block's caches
        end = start + tokens
        block.cache_k[slot : slot + 1, :, start:end, :].assign(
            k.cast(self._tg_dtype).reshape(1, kv, tokens, hd))
        block.cache_v[slot : slot + 1, :, start:end, :].assign(
            v.cast(self._tg_dtype).reshape(1, kv, tokens, hd))
        keys = block.cache_k[slot : slot + 1, :, 0:end, :].reshape(kv, end, hd).float()
        values = block.cache_v[slot : slot + 1, :, 0:end, :].reshape(kv, end, hd).float()
        group = heads // kv
        q = q.reshape(kv, group * tokens, hd)
        scores = q.matmul(keys.transpose(1, 2)) * (1.0 / math.sqrt(hd))
        if tokens > 1:
            assert isinstance(start, int)
            causal = Tensor.ones(tokens, start + tokens, dtype=dtypes.bool, device=self.device)
            causal = causal.tril(start)
            scores = scores.reshape(kv, group, tokens, start + tokens)
            scores = causal.where(scores, float("-inf")).reshape(kv, group * tokens, -1)
        probs = scores.softmax(-1)
        if tokens > 1:
            # materialised: fused into the product with the values, the exponentials
            # were recomputed for every output column (18% of a 64-token prefill)
            probs = probs.contiguous()
        out = probs.matmul(values)  # [kv, group*tokens, hd]
        return out.reshape(heads, tokens, hd).transpose(0, 1).reshape(tokens, heads * hd)

    def _block(self, block: _Block, x: Tensor, start: UOp | int, tokens: int,
               slot: UOp | int, where: Tensor | None, rope: _Rope | None) -> Tensor:
        return self._block_with(
            block, x, lambda n: self._attention(block, n, start, tokens, slot, where, rope),
            rows=False)

    def _block_with(self, block: _Block, x: Tensor, attention: Callable[[Tensor], Tensor],
                    rows: bool) -> Tensor:
        h = x + attention(self._rms_norm(x, block.attn_norm))
        n = self._rms_norm(h, block.ffn_norm)
        gate_up = self._linear(n, block.w_gate_up, rows)
        ffn = self.facts.ffn_dim
        if self._c_gated and gate_up.dtype == dtypes.float32:
            hidden = gated.silu_mul(gate_up, ffn)
        else:
            # materialised: fused into the down projection, silu would be recomputed once
            # per output feature (measured: 8x slower prefill, slower decode)
            hidden = (gate_up[:, :ffn].silu() * gate_up[:, ffn:]).contiguous()
        mlp = self._linear(hidden, block.w_down, rows)
        out = (h + mlp).cast(self._tg_dtype)
        # materialised below float32: fused into its readers, tinygrad folds the round
        # trip through the compute dtype away, and a stage's inner block boundaries would
        # not round as a boundary between two stages does
        return out if self._tg_dtype == dtypes.float32 else out.contiguous()

    def _forward(
        self, x: Tensor, start: UOp | int, tokens: int, last: UOp | int | None = None,
        slot: UOp | int = 0, where: Tensor | None = None,
    ) -> Tensor:
        """``where``: a decode row's position and slot for the C attention (CPU)."""
        rope = self._rope_at(start, tokens) if where is None else None
        for block in self.blocks:
            x = self._block(block, x.float(), start, tokens, slot, where, rope)
        if not self.is_last:
            return x.contiguous()
        assert self.output_norm is not None and self.output is not None
        row = tokens - 1 if last is None else last
        last_row = self._rms_norm(x[row : row + 1].float(), self.output_norm)
        return self._linear(last_row, self.output).reshape(-1).contiguous()

    def _forward_rows(self, x: Tensor, *variables: UOp) -> Tensor:
        """``B`` decode rows ``x``; ``variables`` are the rows' positions then their slots
        (``2 B`` bound variables): the activation rows, or on the last stage ``[B,
        vocab]`` logits."""
        count = int(x.shape[0])
        starts, slots = variables[:count], variables[count:]
        where = (decode_attention.positions(starts, slots, self.device)
                 if self._c_attention else None)
        ropes = [None if where is not None else self._rope_at(start, 1) for start in starts]
        for block in self.blocks:
            x = self._block_with(
                block, x.float(),
                partial(self._attention_rows, block, starts, slots, where, ropes), rows=True)
        if not self.is_last:
            return x.contiguous().realize()
        assert self.output_norm is not None and self.output is not None
        normed = self._rms_norm(x.float(), self.output_norm)
        return self._linear(normed, self.output, rows=True).contiguous().realize()

    def _attention_prompt(self, block: _Block, cos: Tensor, sin: Tensor, mask: Tensor,
                          tokens: int, kv: list[Tensor], where: Tensor | None, x: Tensor
                          ) -> Tensor:
        """Attention of a CPU prefill's rows ``x`` (:meth:`_forward_prompt`): the first
        ``tokens`` rows are the prompt's (with its padding), whose keys and values are
        their own; each attends where ``mask`` lets it, and their keys and values in the
        compute dtype are appended to ``kv`` (what the slot's cache gets). ``where``
        (the C attention only): the rows after them are decode rows riding in the
        prefill, at the positions and slots ``where`` says, whose keys and values go
        into their slots' caches and who attend over them, by the decode graph's
        kernel (:func:`~swactor.model.decode_attention.attend`)."""
        f = self.facts
        hd, heads, kvh = f.head_dim, f.head_count, f.head_count_kv
        qkv = self._qkv(block, x)
        riding = None
        if where is not None:
            qkv, riding = qkv[:tokens], self._attend_c(block, qkv[tokens:], where)
        q = qkv[:, : heads * hd].reshape(tokens, heads, hd).transpose(0, 1)
        k = qkv[:, heads * hd : (heads + kvh) * hd].reshape(tokens, kvh, hd).transpose(0, 1)
        v = qkv[:, (heads + kvh) * hd :].reshape(tokens, kvh, hd).transpose(0, 1)
        if f.rope_dim:
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
        # materialised in the cache's dtype, as the cache would hold them (and read back)
        keys = k.cast(self._tg_dtype).contiguous()
        values = v.cast(self._tg_dtype).contiguous()
        kv += [keys, values]
        if self._c_attention:  # causal, by the decode kernel's statements (mask unused)
            half = f.rope_dim // 2
            rope = ((cos.reshape(tokens, half), sin.reshape(tokens, half)) if f.rope_dim
                    else None)
            out = decode_attention.attend_prompt(qkv, keys, values, rope, heads=heads,
                                                 rope_dim=f.rope_dim)
            return self._linear(out if riding is None else out.cat(riding, dim=0),
                                block.wo)
        group = heads // kvh
        q = q.reshape(kvh, group * tokens, hd)
        scores = q.matmul(keys.float().transpose(1, 2)) * (1.0 / math.sqrt(hd))
        scores = scores.reshape(kvh, group, tokens, tokens)
        scores = mask.where(scores, float("-inf")).reshape(kvh, group * tokens, tokens)
        probs = scores.softmax(-1).contiguous()  # materialised: see _attend
        out = probs.matmul(values.float())  # [kv, group*tokens, hd]
        out = out.reshape(heads, tokens, hd).transpose(0, 1).reshape(tokens, heads * hd)
        return self._linear(out, block.wo)

    def _forward_prompt(self, payload: Tensor, cos: Tensor, sin: Tensor, mask: Tensor,
                        last: UOp, where: Tensor | None = None) -> tuple[Tensor, ...]:
        """A CPU prefill of a prompt and its padding rows ``payload`` ``[T, hidden]``
        (module doc): ``cos``/``sin`` ``[1, T, rope_dim / 2]`` rotate each row by its
        position, ``mask`` ``[T, T]`` says which rows each row attends to (with the C
        attention kernel a ``[1, 1]`` stand-in, unread). Returns the
        activation rows (the last stage: the logits ``[1, vocab]`` of row ``last``),
        then each block's keys and values ``[kv_heads, T, head_dim]`` in the compute
        dtype, for the caller to copy into the slot.

        ``where`` (:meth:`_forward_mixed`): ``payload`` has ``D`` decode rows more after
        the ``T`` (``T`` is the rotary tables' length), at the positions and slots
        ``where`` says; the activation rows are then all ``T + D``, and the last stage's
        logits ``[1 + D, vocab]`` those of row ``last`` and of the decode rows."""
        tokens = int(cos.shape[1])
        kv: list[Tensor] = []
        x = payload
        for block in self.blocks:
            x = self._block_with(
                block, x.float(),
                partial(self._attention_prompt, block, cos, sin, mask, tokens, kv, where),
                rows=False)
        if self.is_last:
            assert self.output_norm is not None and self.output is not None
            x = x.float()
            normed = self._rms_norm(x[last : last + 1], self.output_norm)
            if where is not None:
                normed = normed.cat(self._rms_norm(x[tokens:], self.output_norm))
            x = self._linear(normed, self.output, rows=True)
        out = x.contiguous()
        Tensor.realize(out, *kv)
        return (out, *kv)

    def _forward_mixed(self, payload: Tensor, cos: Tensor, sin: Tensor, mask: Tensor,
                       where: Tensor, last: UOp) -> tuple[Tensor, ...]:
        """A mixed step's graph (:meth:`run_mixed`): :meth:`_forward_prompt` with decode
        rows riding after the prompt's."""
        return self._forward_prompt(payload, cos, sin, mask, last, where)

    def _forward_decode(self, payload: Tensor, start: UOp, slot: UOp | None = None) -> Tensor:
        slot_or_0: UOp | int = 0 if slot is None else slot
        where = (decode_attention.positions((start,), (slot_or_0,), self.device)
                 if self._c_attention else None)
        return self._forward(payload, start, 1, slot=slot_or_0, where=where).realize()

    def _forward_prefill(self, payload: Tensor, last: UOp, slot: UOp | None = None) -> Tensor:
        return self._forward(payload, 0, int(payload.shape[0]), last,
                             0 if slot is None else slot).realize()

    # -- the step API ---------------------------------------------------------------------
    def input_shape(self, tokens: int) -> tuple[int, ...]:
        return (tokens,) if self.is_first else (tokens, self.facts.hidden_dim)

    def step(self, sequence: int, payload: npt.NDArray[np.generic]) -> npt.NDArray[np.generic]:
        """Run inference step ``sequence`` on one input object; return the output object.

        The single-sequence API: slot 0, the last stage samples with ``sampling``."""
        if sequence != 0 and sequence != self._next_sequence:
            raise StepError(f"inference step {sequence} out of order (expected "
                            f"{self._next_sequence})")
        array = self._check_input(payload)
        tokens = array.shape[0]
        if sequence > 0 and tokens != 1:
            raise StepError(f"decode step {sequence} carries {tokens} positions, expected 1")
        start = 0 if sequence == 0 else self._positions[0]
        if start + tokens > self.max_seq_len:
            raise StepError(
                f"step {sequence}: positions {start}..{start + tokens - 1} "
                f"exceed max_seq_len {self.max_seq_len}"
            )
        result = self._compute(array, 0, start, prefill=sequence == 0)
        self._next_sequence = sequence + 1
        if not self.is_last:
            return result
        self.last_logits = result.astype(np.float32)
        token = sample_token(self.last_logits, self.sampling, sequence)
        return np.array([token], dtype=np.int32)

    def run_tagged(self, tag: SequenceTag, payload: npt.NDArray[np.generic]
                   ) -> npt.NDArray[np.generic]:
        """Run one tagged object (``swactor.wire.tags``) in KV slot ``tag.slot``.

        Position 0 is a prompt: its rows (one or more) take positions ``0..T-1`` of the
        slot, whatever the slot held before. A position ``p > 0`` is one decode row that
        must be the slot's next position (``p`` = the rows it has seen so far). A
        non-last stage returns its activation rows; the last stage returns one greedy id
        (argmax, lowest id on ties), or with ``tag.candidates`` the top
        ``CANDIDATES_K`` ids, most likely first (ties: lowest id first), followed by
        their float32 logits' bit patterns, all as one int32 array of ``2 *
        CANDIDATES_K``. ``sampling`` and the untagged step order are not used.
        """
        slot, start = tag.slot, tag.position
        if slot >= self.slots:
            raise StepError(f"slot {slot} outside this stage's slots 0..{self.slots - 1}")
        array = self._check_input(payload)
        tokens = array.shape[0]
        if start > 0:
            if tokens != 1:
                raise StepError(f"slot {slot}: a decode step at position {start} carries "
                                f"{tokens} rows, expected 1 (a prompt starts at 0)")
            if start != self._positions[slot]:
                raise StepError(f"slot {slot}: position {start} is not the slot's next "
                                f"position {self._positions[slot]}")
        if start + tokens > self.max_seq_len:
            raise StepError(f"slot {slot}: positions {start}..{start + tokens - 1} exceed "
                            f"max_seq_len {self.max_seq_len}")
        result = self._compute(array, slot, start, prefill=start == 0)
        if not self.is_last:
            return result
        logits = self.last_logits = result.astype(np.float32)
        if not tag.candidates:
            return np.array([int(np.argmax(logits))], dtype=np.int32)
        return candidates(logits)

    def run_batch(self, tags: Sequence[SequenceTag], payload: npt.NDArray[np.generic]
                  ) -> npt.NDArray[np.generic]:
        """Run one batch object (``swactor.wire.tags``): row ``i`` of ``payload`` is one
        decode row of KV slot ``tags[i].slot`` at position ``tags[i].position``.

        Every row is a decode row (position > 0, the slot's next position), no two rows
        share a slot, and ``payload`` has exactly ``len(tags)`` rows; all of it is
        checked before any row runs (a bad batch is a ``StepError`` that leaves every
        slot as it was). Each row's result is bit-identical to what :meth:`run_tagged`
        gives for it alone, in table order: a non-last stage returns the ``len(tags)``
        activation rows, the last stage each row's answer concatenated (one int32 id, or
        ``2 * CANDIDATES_K`` with ``tag.candidates``); ``last_logits`` is then ``[B,
        vocab]``.

        ``B`` rows run through the decode JITs :meth:`warm_up` made ready (built for
        ``rows``, or loaded from the kernel cache; :meth:`_decode_rows`: every weight is
        read once for all a JIT's rows): in table order, each chunk as many rows as the
        largest ready size that fits, rows left over one by one through the one-row
        decode (a batch size's first build takes minutes on a small CPU, too long to
        stall a live step for), and with ``beam > 0`` (BEAM picks each kernel's loop
        order, hence its summation order) every row alone.
        """
        array = self._check_input(payload)
        if not tags or array.shape[0] != len(tags):
            raise StepError(f"a batch of {len(tags)} tags carries {array.shape[0]} rows")
        self._check_rows(tags)
        count = len(tags)
        slots = [tag.slot for tag in tags]
        starts = [tag.position for tag in tags]
        if self.token_embd is not None:
            array = self._embed(cast("npt.NDArray[np.int32]", array))  # checked int32
        result = self._batch_rows(array, slots, starts)
        for slot, start in zip(slots, starts, strict=True):
            self._positions[slot] = start + 1
        if not self.is_last:
            return np.ascontiguousarray(result, dtype=self.np_dtype)
        logits = self.last_logits = result.astype(np.float32).reshape(count, -1)
        return self._answers(tags, logits)

    def _check_rows(self, tags: Sequence[SequenceTag], taken: frozenset[int] = frozenset()
                    ) -> None:
        """Decode rows ``tags``: each slot this stage's, in no other row nor in
        ``taken``, each row at its slot's next position (> 0) within ``max_seq_len``."""
        seen: set[int] = set()
        for tag in tags:
            slot, start = tag.slot, tag.position
            if slot >= self.slots:
                raise StepError(f"slot {slot} outside this stage's slots 0..{self.slots - 1}")
            if slot in seen or slot in taken:
                raise StepError(f"slot {slot} appears twice in one batch")
            seen.add(slot)
            if start == 0 or start != self._positions[slot]:
                raise StepError(f"slot {slot}: batch row at position {start} is not the "
                                f"slot's next position {self._positions[slot]}")
            if start + 1 > self.max_seq_len:
                raise StepError(f"slot {slot}: position {start} exceeds max_seq_len "
                                f"{self.max_seq_len}")

    def _batch_rows(self, array: npt.NDArray[np.generic], slots: Sequence[int],
                    starts: Sequence[int]) -> npt.NDArray[np.generic]:
        """Checked, embedded decode rows through the decode JITs (:meth:`run_batch`): in
        order, each chunk the largest ready size that fits, else one row."""
        count = len(slots)
        ready = [] if self.beam > 0 else sorted(self._rows, reverse=True)
        parts: list[npt.NDArray[np.generic]] = []
        b = 0
        while b < count:  # the largest ready size that fits, else one row
            size = next((rows for rows in ready if rows <= count - b), 1)
            if size == 1:
                parts.append(self._decode_step(array[b : b + 1], slots[b], starts[b])
                             .reshape(1, -1))
            else:
                parts.append(self._decode_rows(array[b : b + size], slots[b : b + size],
                                               starts[b : b + size]))
            b += size
        return np.concatenate(parts)

    @staticmethod
    def _answers(tags: Sequence[SequenceTag], logits: npt.NDArray[np.float32]
                 ) -> npt.NDArray[np.int32]:
        """The last stage's answers to rows ``tags`` from their ``logits``, joined: one
        greedy id each, or with ``candidates`` its ids and logits."""
        answers = [candidates(row) if tag.candidates
                   else np.array([int(np.argmax(row))], dtype=np.int32)
                   for tag, row in zip(tags, logits, strict=True)]
        return np.concatenate(answers)

    def run_prompts(self, tags: Sequence[SequenceTag], payload: npt.NDArray[np.generic]
                    ) -> npt.NDArray[np.generic]:
        """Run one prompt batch (``swactor.wire.tags``): prompt ``i`` is the next
        ``tags[i].position`` rows of ``payload`` (its row count), taking positions
        ``0..`` of KV slot ``tags[i].slot`` whatever the slot held.

        At most ``min(slots, MAX_PROMPTS)`` prompts, in distinct slots, whose row counts
        add up to ``payload``'s rows; all of it is checked before any prompt runs (a bad
        batch is a ``StepError`` that leaves every slot as it was). A non-last stage
        returns every prompt's activation rows in table order; the last stage each
        prompt's answer as :meth:`run_tagged` gives it (one greedy id, or with
        ``candidates`` its ``CANDIDATES_K`` ids and logits), concatenated in table
        order; ``last_logits`` is then ``[prompts, vocab]``. Each prompt is prefilled
        alone, one after another, through the JIT it would run alone (module doc,
        "Prompt batches"): its outputs and KV entries are those of the prompt alone.
        """
        array = self._check_input(payload)
        if not 1 <= len(tags) <= self._max_prompts:
            raise StepError(f"a prompt batch of {len(tags)} prompts (this stage takes "
                            f"1..{self._max_prompts})")
        seen: set[int] = set()
        for tag in tags:
            if tag.slot >= self.slots:
                raise StepError(f"slot {tag.slot} outside this stage's slots "
                                f"0..{self.slots - 1}")
            if tag.slot in seen:
                raise StepError(f"slot {tag.slot} appears twice in one prompt batch")
            seen.add(tag.slot)
            if not 1 <= tag.position <= self.max_seq_len:
                raise StepError(f"slot {tag.slot}: a prompt of {tag.position} rows (1.."
                                f"{self.max_seq_len})")
        counts = [tag.position for tag in tags]
        if sum(counts) != array.shape[0]:
            raise StepError(f"a prompt batch of {sum(counts)} rows carries "
                            f"{array.shape[0]}")
        if self.token_embd is not None:
            array = self._embed(cast("npt.NDArray[np.int32]", array))  # checked int32
        outputs: list[npt.NDArray[np.generic]] = []
        start = 0
        for tag, rows in zip(tags, counts, strict=True):
            result = self._prefill_step(array[start : start + rows], tag.slot)
            outputs.append(result if self.is_last else result[:rows])
            start += rows
        for tag in tags:
            self._positions[tag.slot] = tag.position
        if not self.is_last:
            return np.ascontiguousarray(np.concatenate(outputs), dtype=self.np_dtype)
        logits = self.last_logits = np.stack(outputs).astype(np.float32)
        return self._answers(tags, logits)

    def run_mixed(self, prompt: SequenceTag, tags: Sequence[SequenceTag],
                  payload: npt.NDArray[np.generic]) -> npt.NDArray[np.generic]:
        """A prompt and decode rows of other sequences as one step: ``payload`` is the
        prompt's ``prompt.position`` rows (its row count; positions ``0..`` of slot
        ``prompt.slot``, whatever the slot held), then one decode row per tag in
        ``tags`` as :meth:`run_batch` takes them (distinct slots, none the prompt's).

        All of it is checked before anything runs (a bad step is a ``StepError`` that
        leaves every slot as it was). A non-last stage returns the prompt's activation
        rows then the decode rows'; the last stage the prompt's answer then each row's,
        as :meth:`run_tagged` gives them; ``last_logits`` is then ``[1 + D, vocab]``.
        Every result and KV entry is bit-identical to the prompt's prefill alone and to
        each row's decode step alone (module doc, "Mixed steps").

        On the CPU path with the C attention, when the decode rows fit in the padding
        rows of a short prompt's prefill (:meth:`_mixable`), it is one graph
        (:meth:`_mixed_step`): the rows take the places of padding rows, and every
        weight is read once for all. Elsewhere the prompt is prefilled and then the rows
        run as :meth:`run_batch` runs them."""
        array = self._check_input(payload)
        tokens, count = prompt.position, len(tags)
        if prompt.slot >= self.slots:
            raise StepError(f"slot {prompt.slot} outside this stage's slots "
                            f"0..{self.slots - 1}")
        if not 1 <= tokens <= self.max_seq_len:
            raise StepError(f"slot {prompt.slot}: a prompt of {tokens} rows (1.."
                            f"{self.max_seq_len})")
        if not tags:
            raise StepError("a mixed step without decode rows")
        self._check_rows(tags, frozenset({prompt.slot}))
        if array.shape[0] != tokens + count:
            raise StepError(f"a mixed step of {tokens} + {count} rows carries "
                            f"{array.shape[0]}")
        slots = [tag.slot for tag in tags]
        starts = [tag.position for tag in tags]
        if self.token_embd is not None:
            array = self._embed(cast("npt.NDArray[np.int32]", array))  # checked int32
        if self._mixable(tokens, count):
            result = self._mixed_step(array, prompt.slot, tokens, slots, starts)
            first, rows = result[:1] if self.is_last else result[:tokens], result[-count:]
        else:
            first = self._prefill_step(array[:tokens], prompt.slot)
            first = first.reshape(1, -1) if self.is_last else first[:tokens]
            rows = self._batch_rows(array[tokens:], slots, starts)
        self._positions[prompt.slot] = tokens
        for slot, start in zip(slots, starts, strict=True):
            self._positions[slot] = start + 1
        result = np.concatenate([first, rows])
        if not self.is_last:
            return np.ascontiguousarray(result, dtype=self.np_dtype)
        logits = self.last_logits = result.astype(np.float32).reshape(1 + count, -1)
        return self._answers([prompt, *tags], logits)

    def _mixable(self, tokens: int, count: int) -> bool:
        """Whether a prompt of ``tokens`` rows and ``count`` decode rows run as one graph
        (:meth:`run_mixed`): where the graph computes the same, and the rows take the
        places of the prompt's padding rows. Rows that would open the next bucket cost
        its padding rows too, about what a decode step of their own costs (``bench
        mixed``: a prompt that fills its bucket, and one row more, 0.8-0.9x as fast in
        one graph), so then the step runs apart."""
        return (self._cpu and self._c_attention and self.beam == 0
                and tokens + count <= decode_gemv.PREFILL_ROWS
                and self._bucket(tokens + count) == self._bucket(tokens)
                and self._row_wise)

    def _products_row_wise(self) -> bool:
        """Whether every block product runs through :func:`~swactor.model.decode_gemv.gemv`
        at any row count up to :data:`~swactor.model.decode_gemv.PREFILL_ROWS`, whose
        rows are each the one-row product's arithmetic: then a decode row computes the
        same in a prefill's graph as in a decode step's. A dense or other block-type
        matrix does not (a prefill's product is a matrix product there)."""
        return all(
            isinstance(part, DeviceQuant) and decode_gemv.usable(self.device, part, 1)
            for block in self.blocks
            for matrix in (block.w_qkv, block.wo, block.w_gate_up, block.w_down)
            for part in matrix.parts)

    def _mixed_step(self, array: npt.NDArray[np.generic], slot: int, tokens: int,
                    slots: Sequence[int], starts: Sequence[int]
                    ) -> npt.NDArray[np.generic]:
        """A prompt's ``tokens`` rows then ``D`` decode rows (``array``, embedded) as one
        CPU graph (:meth:`_forward_mixed`): ``P`` rows for the prompt and its padding,
        then the decode rows, ``P + D`` the bucket of ``tokens + D`` rows. The prompt's
        keys and values go to positions ``0..tokens-1`` of ``slot``; the decode rows'
        the graph writes into their slots. Returns the ``P + D`` activation rows, or
        on the last stage the logits of the prompt's last row then of the decode rows.
        One JIT per ``(P + D, D)`` (kernel cache kind ``mixed-T-D``), its inputs kept
        buffers like a prefill bucket's, run from its
        :class:`~swactor.model.cpu_graph.DirectReplay` once it has replayed."""
        count = len(slots)
        total = self._bucket(tokens + count)
        span = total - count
        kind = f"mixed-{total}-{count}"
        self._hold_bucket(total)  # its graphs count with the bucket's (bucket_bytes)
        entry = self._mixed.get((total, count))
        new = entry is None
        if entry is None:  # on the C attention path only (_mixable): no mask
            jit = cast("_PrefillJit", TinyJit(self._forward_mixed))
            self._adopt(jit, kind)
            if jit.captured is None:
                jit.cnt = 1  # captured on its first call, as a CPU prefill bucket
            entry = self._mixed[(total, count)] = (
                jit, self._new_prompt_inputs(total, span, np.zeros(2 * count, np.int32)))
        jit, inputs = entry
        rows = inputs.views[0]
        rows[:tokens] = array[:tokens]
        rows[tokens:span] = 0  # padding rows: a block of their own
        rows[span:] = array[tokens:]
        self._write_prompt_tables(inputs, tokens, span)
        where = inputs.views[4]
        where[:count] = starts
        where[count:] = slots
        result = self._prompt_graph(jit, inputs, kind, slot, tokens)
        if new:
            self._fit_budget()
        return result

    def _compute(self, array: npt.NDArray[np.generic], slot: int, start: int,
                 prefill: bool) -> npt.NDArray[np.generic]:
        """Rows ``array`` (checked) at positions ``start..`` of KV slot ``slot``: a prefill
        (``start`` 0, any rows) or one decode row; the activation rows (plan dtype) or,
        on the last stage, the last row's logits."""
        tokens = array.shape[0]
        if self.token_embd is not None:
            array = self._embed(cast("npt.NDArray[np.int32]", array))  # checked int32
        if not prefill:
            result = self._decode_step(array, slot, start)
        else:
            result = self._prefill_step(array, slot)
        self._positions[slot] = start + tokens
        if not self.is_last:
            return np.ascontiguousarray(result[:tokens], dtype=self.np_dtype)
        return result

    def _slot_args(self, slot: int) -> tuple[UOp, ...]:
        """The JITs' trailing slot argument: none with one slot (the constant 0)."""
        return () if self._slot_var is None else (self._slot_var.bind(slot),)

    def _bucket(self, tokens: int) -> int:
        """The padded rows of a prefill of ``tokens`` rows (its JIT's bucket): a multiple
        of ``SHORT_PREFILL_BUCKET`` for a CPU prefill of at most
        :data:`~swactor.model.decode_gemv.PREFILL_ROWS` rows, of ``PREFILL_BUCKET`` up to
        ``LONG_PREFILL_ROWS`` rows, else of a sixteenth of the power of two at or above
        ``tokens`` (at most ``max_seq_len``, never fewer than ``tokens``)."""
        if self._cpu and tokens <= decode_gemv.PREFILL_ROWS:
            step = SHORT_PREFILL_BUCKET
        elif tokens <= LONG_PREFILL_ROWS:
            step = PREFILL_BUCKET
        else:
            step = (1 << (tokens - 1).bit_length()) // 16
        return max(tokens, min(self.max_seq_len, -(-tokens // step) * step))

    def _hold_bucket(self, padded: int) -> None:
        """Mark the prefill bucket of ``padded`` rows as the most recently used (it counts
        once its graph is captured, :meth:`_note_bucket`)."""
        self._held_buckets[padded] = self._held_buckets.pop(padded, None)

    def _note_bucket(self, padded: int, prefill: _PrefillJit) -> None:
        """After a bucket's prefill: note its graph's buffers once captured, and past
        ``PREFILL_KEEP_BYTES`` drop the least recently used other buckets (not while
        warming up: there the warm-up drops the bucket that does not fit)."""
        captured = prefill.captured
        if captured is None or self._held_buckets.get(padded, {}) is not None:
            return  # not captured yet, noted before, or dropped
        self._held_buckets[padded] = _graph_buffers(captured.linear)
        self._fit_budget()

    def _fit_budget(self) -> None:
        """Past ``PREFILL_KEEP_BYTES``, drop the least recently used buckets (the one just
        used is the most recent, and one bucket alone is always kept); not while warming
        up, where the warm-up drops what does not fit."""
        if self._warming:
            return
        dropped = []
        while self._over_budget():
            dropped.append(next(iter(self._held_buckets)))
            self._drop_bucket(dropped[-1])
        if dropped:
            log.info("dropped prefill buckets %s (least recently used) to keep %d MiB",
                     dropped, PREFILL_KEEP_BYTES >> 20)

    def bucket_bytes(self) -> dict[int, int]:
        """The bytes each kept prefill bucket holds alone (least recently used first):
        its inputs and the buffers of its graph that no other graph of the role reads
        (the weights and caches are the decode graph's, and every bucket's), with the
        mixed steps' graphs of its rows (:meth:`_mixed_step`) and their inputs. A graph
        not captured yet counts its inputs only."""
        graphs = {padded: self._bucket_graphs(padded) for padded in self._held_buckets}
        seen: dict[int, int] = {}
        for buffers in graphs.values():
            for key in buffers:
                seen[key] = seen.get(key, 0) + 1
        decode = self._decode.captured
        shared = _graph_buffers(decode.linear) if decode is not None else {}
        sizes = {}
        for padded, buffers in graphs.items():
            inputs = [self._prompt_buffers.get(padded), *(
                entry for (total, _), (_, entry) in self._mixed.items() if total == padded)]
            sizes[padded] = sum(size for key, size in buffers.items()
                                if key not in shared and seen[key] == 1) + sum(
                t.nbytes() for entry in inputs if entry is not None for t in entry.tensors)
        return sizes

    def _bucket_graphs(self, padded: int) -> dict[int, int]:
        """The buffers of a kept bucket's captured graphs: its prefill's and its mixed
        steps' (``id`` -> bytes; a buffer two of them read counted once)."""
        buffers = dict(self._held_buckets.get(padded) or {})
        for (total, _), (jit, _) in self._mixed.items():
            if total == padded and jit.captured is not None:
                buffers.update(_graph_buffers(jit.captured.linear))
        return buffers

    def _drop_mixed(self, padded: int) -> None:
        """Drop the mixed steps' graphs and inputs of bucket ``padded`` (their memory is
        given back with the next collection)."""
        for key in [key for key in self._mixed if key[0] == padded]:
            del self._mixed[key]

    def _over_budget(self) -> bool:
        """Whether the kept buckets hold more than ``PREFILL_KEEP_BYTES`` (one bucket alone
        is always kept, however large)."""
        return (len(self._held_buckets) > 1
                and sum(self.bucket_bytes().values()) > PREFILL_KEEP_BYTES)

    def _drop_bucket(self, padded: int) -> None:
        """Drop a bucket's graphs (its prefill's and its mixed steps') and inputs, their
        memory given back."""
        del self._held_buckets[padded]
        self._prefill.pop(padded, None)
        self._prompt_buffers.pop(padded, None)
        self._drop_mixed(padded)
        gc.collect()  # a dropped graph's buffers are freed with it
        self._release_build_memory()

    def _prefill_step(self, array: npt.NDArray[np.generic], slot: int
                      ) -> npt.NDArray[np.generic]:
        """A prompt's rows at positions ``0..T-1`` of ``slot`` through its bucket's JIT:
        the activation rows (padded), or on the last stage its last row's logits."""
        if self._cpu:
            return self._prefill_prompt(array, slot)
        tokens = array.shape[0]
        # pad the prompt to a multiple of PREFILL_BUCKET rows: kernels (and BEAM results)
        # are shared by every prompt length in a bucket. Padding rows come after the
        # real ones, so no real row attends to them, and their KV entries are rewritten
        # by decode before any step reads them.
        padded = self._bucket(tokens)
        if padded > tokens:
            pad = np.zeros((padded - tokens, array.shape[1]), dtype=array.dtype)
            array = np.concatenate([array, pad])
        data = upload(array, self.device)
        # one JIT per bucket: from the third prefill of a bucket its kernels replay
        # without scheduling. No BEAM here: searching prefill-sized kernels takes
        # minutes on a small CPU.
        prefill = self._prefill_jit(padded)
        built = prefill.cnt < 2  # this call runs the graph eagerly or captures it
        args = (data, self._last_var.bind(tokens - 1), *self._slot_args(slot))
        result = _copy_out(cast(Tensor, prefill(*args)))
        self._keep_prefill(prefill, f"prefill-{padded}", args)
        if built:
            self._release_build_memory()
        self._note_bucket(padded, prefill)
        return result

    def _prefill_prompt(self, array: npt.NDArray[np.generic], slot: int
                        ) -> npt.NDArray[np.generic]:
        """A prompt's rows ``array`` through one CPU prefill (:meth:`_forward_prompt`,
        the JIT of its bucket); its keys and values go to positions ``0..rows-1`` of
        ``slot``. Returns the activation rows ``[padded, hidden]``, or on the last stage
        its last row's logits ``[vocab]``.

        The bucket's inputs are kept buffers written through host views, and the
        outputs are read through host views of the JIT's output buffers:
        a ``numpy()`` per output (the rows and every block's keys and values) cost a
        schedule and a copy kernel each, about as much as a short prompt's kernels.
        Once the JIT has replayed, it runs from its
        :class:`~swactor.model.cpu_graph.DirectReplay`."""
        tokens = int(array.shape[0])
        padded = self._bucket(tokens)
        inputs = self._prompt_inputs(padded)
        rows = inputs.views[0]
        rows[:tokens] = array
        rows[tokens:] = 0  # padding rows: a block of their own (each attends to itself)
        self._write_prompt_tables(inputs, tokens, padded)
        replayed = inputs.replay is not None
        prefill = self._prefill_jit(padded)
        result = self._prompt_graph(prefill, inputs, f"prefill-{padded}", slot, tokens)
        if not replayed:
            self._note_bucket(padded, prefill)
        return result[0] if self.is_last else result

    def _prompt_graph(self, jit: _PrefillJit, inputs: _PrefillInputs, kind: str, slot: int,
                      tokens: int) -> npt.NDArray[np.generic]:
        """Run a CPU prompt graph (a prefill bucket's, :meth:`_forward_prompt`, or a mixed
        step's) on its kept ``inputs``, already written: the prompt's keys and values go
        to positions ``0..tokens-1`` of ``slot`` and a copy of the first output comes
        back (the activation rows, or the logits). Its first call captures the JIT
        (kernel cache kind ``kind``); once it has replayed, it runs from its
        :class:`~swactor.model.cpu_graph.DirectReplay`, whose outputs are host views of
        the JIT's output buffers."""
        if inputs.replay is not None:
            inputs.replay.replay({self._last_var.expr: tokens - 1})
            self._write_kv(inputs.outputs[1:], slot, tokens)
            return inputs.outputs[0].copy()
        last = self._last_var.bind(tokens - 1)
        use_cpu_graph(self.cpu_graph)
        built = jit.cnt < 2  # this call runs the graph eagerly or captures it
        outputs = jit(*inputs.tensors, last)  # held while read: an eager run's own
        views = tuple(_host_view(t) for t in outputs)
        self._write_kv(views[1:], slot, tokens)
        result = views[0].copy()
        self._keep_prefill(jit, kind, (*inputs.tensors, last))
        if built:
            self._release_build_memory()
        captured = jit.captured
        if captured is not None and jit.cnt >= 2:  # replayed once: batches built
            inputs.replay = DirectReplay.of(captured, tuple(t.uop.base for t in inputs.tensors),
                                            frozenset({self._last_var.expr}))
            inputs.outputs = tuple(_host_view(t) for t in captured.ret)
        return result

    def _prompt_inputs(self, padded: int) -> _PrefillInputs:
        """The kept inputs of the CPU prefill bucket of ``padded`` rows (made on first
        use): the rows, the rotary cosines and sines ``[1, padded, rope_dim / 2]`` (``[1,
        padded, 1]`` zeros without rope) and the ``[padded, padded]`` mask (``[1, 1]``,
        unread, with the C attention kernel)."""
        self._hold_bucket(padded)
        inputs = self._prompt_buffers.get(padded)
        if inputs is None:
            inputs = self._prompt_buffers[padded] = self._new_prompt_inputs(padded, padded)
        return inputs

    def _new_prompt_inputs(self, rows: int, prompt_rows: int,
                           *more: npt.NDArray[np.generic]) -> _PrefillInputs:
        """Kept inputs of a CPU prompt graph of ``rows`` rows whose first
        ``prompt_rows`` are the prompt's (and its padding): the rows, their rotary
        cosines and sines ``[1, prompt_rows, rope_dim / 2]`` (``[1, prompt_rows, 1]``
        zeros without rope), the mask (``[1, 1]``, unread, with the C attention kernel),
        then ``more``; with host views of each."""
        half = self.facts.rope_dim // 2 if self._rope_rows is not None else 1
        mask = (1, 1) if self._c_attention else (prompt_rows, prompt_rows)
        tensors = tuple(upload(a, self.device) for a in (
            np.zeros((rows, self.facts.hidden_dim), dtype=self.np_dtype),
            np.zeros((1, prompt_rows, half), dtype=np.float32),
            np.zeros((1, prompt_rows, half), dtype=np.float32),
            np.zeros(mask, dtype=np.bool_), *more))
        synchronize(self.device)
        return _PrefillInputs(tensors, tuple(_host_view(t) for t in tensors))

    def _write_prompt_tables(self, inputs: _PrefillInputs, tokens: int, padded: int
                             ) -> None:
        """Write the rotary rows and (for tinygrad's attention expression) the mask of a
        prompt of ``tokens`` rows padded to ``padded`` into a bucket's inputs: the
        prompt's rows at positions ``0..tokens-1`` attend to the prompt's rows up to
        themselves; the padding rows, positions ``0..``, are a block of their own."""
        cos, sin, mask = inputs.views[1:4]
        if self._rope_rows is not None:
            positions = np.concatenate([np.arange(tokens), np.arange(padded - tokens)])
            cos[0] = self._rope_rows[0][positions]
            sin[0] = self._rope_rows[1][positions]
        if self._c_attention:
            return  # the C attention kernel reads no mask
        mask[...] = False
        mask[:tokens, :tokens] = np.tri(tokens, dtype=np.bool_)
        mask[tokens:, tokens:] = np.tri(padded - tokens, dtype=np.bool_)

    def _write_kv(self, kv: Sequence[npt.NDArray[np.generic]], slot: int, rows: int
                  ) -> None:
        """Copy a prompt's keys and values (``kv``: per block keys then values,
        ``[kv_heads, T, head_dim]``) at rows ``0..rows-1`` into positions ``0..rows-1``
        of its slot's caches, through host views of the cache buffers."""
        synchronize(self.device)  # nothing queued may still read the caches
        for index, (cache_k, cache_v) in enumerate(self._cache_views):
            cache_k[slot, :, :rows] = kv[2 * index][:, :rows]
            cache_v[slot, :, :rows] = kv[2 * index + 1][:, :rows]

    def _release_build_memory(self) -> None:
        """Give back what building a graph left cached: a graph's first run, eager or capturing,
        allocates every intermediate apart (a prefill's widened weights: all of them,
        :mod:`~swactor.model.prefill_gemm`), and tinygrad's allocator keeps freed buffers
        for reuse (SmolLM2: 874 MB of RSS after a 64-token prefill instead of 303)."""
        free_cache = getattr(Device[self.device].allocator, "free_cache", None)
        if free_cache is not None:
            free_cache()
        heap.trim()

    def _decode_step(self, array: npt.NDArray[np.generic], slot: int, start: int
                     ) -> npt.NDArray[np.generic]:
        """One row at position ``start`` of ``slot`` through the decode JIT; returns its
        output as a numpy array."""
        values = (start,) if self._slot_var is None else (start, slot)
        return self._run_decode(self._decode_runner, array, values)

    def _decode_rows(self, array: npt.NDArray[np.generic], slots: Sequence[int],
                     starts: Sequence[int]) -> npt.NDArray[np.generic]:
        """``B`` decode rows ``array`` (``B >= 2``), row ``b`` at position ``starts[b]``
        of slot ``slots[b]`` (distinct slots), through the JIT for ``B`` rows (built on
        its first calls, kept in the kernel cache as ``decode-rows-B``). Each row's
        output is bit-identical to :meth:`_decode_step` of that row alone: the products
        sum each row as the one-row kernels do, and each row's attention is the one-row
        graph over its own slot and position."""
        count = array.shape[0]
        runner = self._rows.get(count)
        if runner is None:
            top = self.max_seq_len - 1
            variables = (*(UOp.variable(f"start_pos{b}", 0, top) for b in range(count)),
                         *(UOp.variable(f"slot{b}", 0, self.slots - 1) for b in range(count)))
            runner = self._rows[count] = _DecodeRunner(
                TinyJit(self._forward_rows), f"decode-rows-{count}", variables)
        return self._run_decode(runner, array, (*starts, *slots))

    def _run_decode(self, runner: _DecodeRunner, array: npt.NDArray[np.generic],
                    values: tuple[int, ...]) -> npt.NDArray[np.generic]:
        """``array`` through a decode JIT with its variables bound to ``values``.

        The JIT's input is one buffer kept for the role's life. On CPU both directions go
        through numpy views of device memory; on other devices one copy each way through
        the allocator (:func:`_copy_in`, :func:`_copy_out`). A fresh input Tensor and
        ``numpy()`` each cost a schedule and a copy kernel (about 1 ms of Python per
        token on a small CPU; 0.7 of a step's 1.4 ms of host time on tinygrad's NULL
        device, where kernels cost nothing: the host side of a GPU's step).
        """
        jit = runner.jit
        if jit.cnt == 0:
            self._adopt(jit, runner.kind)
        if runner.data is None:
            runner.data = upload(np.zeros(array.shape, dtype=self.np_dtype), self.device)
            if self._cpu:
                runner.data_view = _host_view(runner.data)
        if not self._cpu:
            _copy_in(runner.data, np.ascontiguousarray(array, dtype=self.np_dtype))
            with Context(BEAM=self.beam):  # type: ignore[no-untyped-call]
                out = jit(runner.data, *self._bound(runner, values))
            self._offer(jit, runner.kind)
            return _copy_out(out)
        runner.data_view[...] = array
        if runner.replay is not None:
            runner.replay.replay({v.expr: x for v, x in zip(runner.variables, values,
                                                            strict=True)})
            return runner.out_view.copy()
        use_cpu_graph(self.cpu_graph)
        with Context(BEAM=self.beam):  # type: ignore[no-untyped-call]
            out = jit(runner.data, *self._bound(runner, values))
        self._offer(jit, runner.kind)
        runner.out_view = _host_view(out)
        captured = jit.captured
        if captured is not None and jit.cnt >= 2:  # replayed once: batches built
            runner.replay = DirectReplay.of(captured, (runner.data.uop.base,),
                                            frozenset(v.expr for v in runner.variables))
        return runner.out_view.copy()

    @staticmethod
    def _bound(runner: _DecodeRunner, values: tuple[int, ...]) -> tuple[UOp, ...]:
        """A decode JIT's variables bound to ``values`` (its call's arguments; a CPU
        replay writes the values into its table instead)."""
        return tuple(v.bind(x) for v, x in zip(runner.variables, values, strict=True))

    @property
    def portable(self) -> bool:
        """Whether the role runs the portable path (module doc): every device but a CPU,
        or a CPU role made with ``portable=True``."""
        return not self._cpu

    def decode_graph(self, rows: int = 1) -> CapturedJit[Tensor] | None:
        """The captured decode graph of ``rows`` rows per step (1: the one-row decode);
        None until it is captured, or when no JIT for that many rows is ready."""
        runner = self._decode_runner if rows == 1 else self._rows.get(rows)
        return None if runner is None else runner.jit.captured

    # -- kernel cache (swactor.model.jit_cache) ----------------------------------------------
    def _structure(self) -> dict[str, Any]:
        """What the role's graphs depend on besides its buffers (the kernel cache key)."""
        return {"facts": self.facts.__dict__, "layers": [self.layer_start, self.layer_end],
                "first": self.is_first, "last": self.is_last, "dtype": self.dtype,
                "max_seq_len": self.max_seq_len, "device": self.device, "beam": self.beam,
                "cpu_graph": self.cpu_graph, "quantised": self.quantised, "slots": self.slots,
                "integer": decode_gemv.INTEGER, "eight_bit": decode_gemv.EIGHT_BIT,
                "prefetch": decode_gemv.PREFETCH,
                "attention": self._c_attention, "cpu_path": self._cpu}

    def _adopt(self, jit: _TinyJit[_Ret], kind: str) -> None:
        """Give a JIT that never ran the captured graph the cache holds for `kind`."""
        captured = self._kernels.load(kind) if self._kernels is not None else None
        if captured is not None:
            jit.captured, jit.cnt = captured, 2

    def _offer(self, jit: _TinyJit[_Ret], kind: str) -> None:
        """Keep a JIT's graph in the cache once it is captured."""
        if self._kernels is not None and jit.captured is not None:
            self._kernels.save(kind, jit.captured)

    def _prefill_jit(self, padded: int) -> _PrefillJit:
        """The bucket's prefill JIT (kernel cache kind ``prefill-P``)."""
        self._hold_bucket(padded)
        prefill = self._prefill.get(padded)
        if prefill is None:
            forward = self._forward_prompt if self._cpu else self._forward_prefill
            prefill = self._prefill[padded] = cast("_PrefillJit", TinyJit(forward))
            self._adopt(prefill, f"prefill-{padded}")
            if self._cpu and prefill.captured is None:
                # captured on its first call: an eager run first would trace and
                # schedule the whole graph once more and compute the prompt twice
                prefill.cnt = 1
        return prefill

    def _keep_prefill(self, prefill: _PrefillJit, kind: str,
                      args: tuple[Tensor | UOp, ...]) -> None:
        """After a bucket's first prefill, with the cache on: keep its captured graph, so
        later workers replay the bucket instead of building it. A CPU bucket is captured
        by that first call; another device's first call ran eagerly, so it runs once
        more to capture (same inputs, same positions and slots: the KV cache gets the
        same values)."""
        if self._kernels is None:
            return
        if prefill.captured is None and prefill.cnt == 1:
            prefill(*args)
        elif prefill.cnt != 2:  # loaded from the cache, or kept before
            return
        self._offer(prefill, kind)

    def warm_up(self, prompt_tokens: int = 0, rows: Sequence[int] = (),
                mixed: Sequence[int] = ()) -> None:
        """Build the decode JIT (or load it from the kernel cache), build or load the
        prefill buckets the cache holds for this role (none yet: the bucket of a
        one-token prompt) and the bucket of every prompt length up to
        ``prompt_tokens``, shortest first while they fit in ``PREFILL_KEEP_BYTES`` (the
        first that does not is dropped again, and the warm-up logs where it stopped:
        building more would only drop them), load every batched
        decode JIT the cache holds (``decode-rows-B``), build the batched decode JITs
        for ``rows`` (rows per step, 2..``slots``; minutes each on a small CPU unless
        cached), build the mixed steps' graphs (:meth:`run_mixed`) for the bucket of
        every prompt length up to ``prompt_tokens`` that was kept and each decode row
        count in ``mixed`` where the role runs them as one graph (about 5 s each on a
        small CPU unless cached; a bucket warmed only because the cache held it builds
        its mixed graphs at their first use), and run each once, so
        the first real steps replay kernels instead of building them. Leaves the role as
        if new: its positions restart at step 0, and the KV entries warming wrote (in
        slots ``0..B-1``; the slot is a variable of every graph, so one warm-up serves
        them all) are rewritten by the prefill before any step reads them."""
        row = np.zeros((1, self.facts.hidden_dim), dtype=self.np_dtype)
        for position in range(min(3, self.max_seq_len)):  # a JIT captures on its 2nd call
            self._decode_step(row, 0, position)
            if self._decode.captured is not None:
                break
        counts = set(rows)
        if self._kernels is not None:
            counts |= {int(kind.removeprefix("decode-rows-"))
                       for kind in self._kernels.kinds("decode-rows-")}
        for count in sorted(c for c in counts if 2 <= c <= self.slots):
            batch = np.zeros((count, self.facts.hidden_dim), dtype=self.np_dtype)
            for position in range(min(3, self.max_seq_len)):
                self._decode_rows(batch, range(count), [position] * count)
                if self._rows[count].jit.captured is not None:
                    break
        buckets = self._kernels.kinds("prefill-") if self._kernels is not None else []
        if self._kernels is not None and not buckets:
            buckets = [f"prefill-{self._bucket(1)}"]
        longest = min(prompt_tokens, self.max_seq_len)
        wanted = {self._bucket(tokens) for tokens in range(1, longest + 1)}
        sizes = sorted({int(kind.split("-")[1]) for kind in buckets} | wanted)  # prefill-P
        self._warming = True
        try:
            for padded in (size for size in sizes if 0 < size <= self.max_seq_len):
                self._warm_bucket(padded)
                if self._over_budget():  # past the bytes the role keeps: this one too
                    self._drop_bucket(padded)
                    if any(size >= padded for size in wanted):
                        log.warning("warming prompts up to %d tokens only: their prefill "
                                    "buckets fill the %d MiB a role keeps; longer prompts "
                                    "build theirs at first use",
                                    max((s for s in wanted if s < padded), default=0),
                                    PREFILL_KEEP_BYTES >> 20)
                    break
        finally:
            self._warming = False
        self._warming = True
        try:
            for padded in sorted(wanted & set(self._prefill)):  # the buckets kept
                for count in sorted({c for c in mixed if 1 <= c < min(self.slots, padded)}):
                    if self._mixable(padded - count, count):
                        zeros = np.zeros((padded, self.facts.hidden_dim),
                                         dtype=self.np_dtype)
                        self._mixed_step(zeros, 0, padded - count, range(1, count + 1),
                                         [1] * count)
                if self._over_budget():  # past the bytes the role keeps: not these
                    self._drop_mixed(padded)
                    log.warning("warming mixed steps for buckets below %d rows only: "
                                "they fill the %d MiB a role keeps; longer prompts build "
                                "theirs at first use", padded, PREFILL_KEEP_BYTES >> 20)
                    break
        finally:
            self._warming = False
        self._release_build_memory()
        self._positions = [0] * self.slots
        self._next_sequence = 0
        self.last_logits = None

    def _warm_bucket(self, padded: int) -> None:
        """Build (or load from the kernel cache) and run once the prefill bucket of
        ``padded`` rows, captured and noted (:meth:`_note_bucket`)."""
        zeros = np.zeros((padded, self.facts.hidden_dim), dtype=self.np_dtype)
        if self._cpu:
            self._prefill_prompt(zeros, 0)  # captured, kept and noted there
            return
        prefill = self._prefill_jit(padded)
        data = upload(zeros, self.device)
        args = (data, self._last_var.bind(0), *self._slot_args(0))
        prefill(*args)
        self._keep_prefill(prefill, f"prefill-{padded}", args)  # built: capture, keep
        self._note_bucket(padded, prefill)

    def decode_kernel_count(self) -> int | None:
        """Kernels one decode step runs (those batched into graphs counted one by one);
        None before the decode JIT is captured (third decode step)."""
        captured = self._decode.captured
        if captured is None:
            return None
        count = 0
        for call in captured.linear.src:
            ast = call.src[0]
            graph = ast.op is Ops.CUSTOM_FUNCTION and ast.arg == "graph"
            count += len(ast.src[0].src) if graph else 1
        return count

    def _check_input(self, payload: npt.NDArray[np.generic]) -> npt.NDArray[np.generic]:
        array = np.asarray(payload)
        if self.is_first:
            if array.dtype != np.int32 or array.ndim != 1 or array.shape[0] == 0:
                raise StepError(
                    f"stage 0 input must be a non-empty int32 [tokens] array, got "
                    f"{array.dtype} {array.shape}"
                )
            if int(array.min()) < 0 or int(array.max()) >= self.facts.vocab_size:
                raise StepError(f"token id outside [0, {self.facts.vocab_size})")
            return np.ascontiguousarray(array)
        if array.dtype != self.np_dtype or array.ndim != 2 or array.shape[0] == 0:
            raise StepError(
                f"activation input must be {np.dtype(self.np_dtype).name} [tokens, "
                f"{self.facts.hidden_dim}], got {array.dtype} {array.shape}"
            )
        if array.shape[1] != self.facts.hidden_dim:
            raise StepError(
                f"activation width {array.shape[1]} != hidden {self.facts.hidden_dim}"
            )
        return np.ascontiguousarray(array)
