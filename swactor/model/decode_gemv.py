"""Decode matrix-vector products over Q4_1 and Q8_0 blocks: a hand-written C kernel for
``B`` rows at once.

Theory of operation. A decode step multiplies each weight matrix ``W`` ``[rows, cols]``
(kept in the file's blocks, :mod:`swactor.model.block_kernels`) by ``B`` activation
rows ``x`` ``[B, cols]`` (``B = 1``: one sequence; more: a batched step of several
sequences). On a CPU the cost is widening the codes, not the multiply-adds, and
tinygrad's kernels for ``B`` rows widened each block about once per row (4 rows cost
6.5x one row on SmolLM2 Q4_1). Here each product is one kernel (a tinygrad custom
kernel on the clang renderer, as :mod:`swactor.model.prefill_gemm`) that, per block of
32 weights, loads and widens the codes once (``w = d * q + m`` for Q4_1, ``w = d * q``
for Q8_0) into two 16-float vectors (``ext_vector_type(16)``: one AVX-512, two AVX2 or
four NEON registers), then multiply-adds them into every row's running sums: ``B``
rows cost one widening and ``2 B`` vector multiply-adds per block. Two details keep
the widening off the vector shuffle unit: the f16 scales of the output rows in hand are
widened first into a small array with integer bit moves (exact for every finite f16;
a block then reads its scale as a broadcast load), and Q4_1's bytes are widened to
32-bit lanes before the nibbles are cut.

Every output ``(b, o)`` is computed by the same arithmetic whatever ``B``, the chunk
or the thread: a 16-lane running sum ``acc += w[0:16] * x[b, k:k+16]`` then ``acc +=
w[16:32] * x[b, k+16:k+32]`` over the blocks ``k`` in order (clang contracts each into
one FMA where the target has one, the same way in every variant: the statements are
the same text), then the lanes added in one fixed tree. So row ``b`` of a ``B``-row
product is bit-identical to the one-row product of that row, and the one-row decode
path uses this kernel with ``B = 1``. Results differ from
``gguf.quants.dequantize`` followed by an exact product only in float32 rounding.

A product is cut into *slices* of output rows: the kernel takes tinygrad's ``core_id``
variable (the slice, ``0 .. slices - 1``), as tinygrad's own ``THREAD`` opt does, so
:class:`~swactor.model.cpu_graph.CpuGraph` gives each slice a row of its table and the
native replay pool runs the slices of one product on several threads (slices write
disjoint outputs). The kernel also loads one value of each input in tinygrad's IR (a
value the C never uses), so tinygrad's ``ProgramInfo`` lists every input as read and
the replay graph knows the kernel only reads them: kernels that read the same input
can share a phase. Inside a slice ``R`` output rows are interleaved (:func:`interleave`:
``R * B <= 8`` running sums) so that the chains of dependent multiply-adds overlap.

Used for decode products on a CPU device whose renderer is clang, for Q4_1 and Q8_0
matrices with ``cols`` a multiple of 32 (more than :data:`MAX_ROWS` rows go through in
groups of at most that many, each row computed as always); anything else keeps
tinygrad's expression (:func:`~swactor.model.block_kernels.dequant_expr`). A prefill of
at most :data:`PREFILL_ROWS` rows uses it too: widening the blocks once per group of 8
rows beats widening the whole matrix into the prefill GEMM's panels up to there.
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as Q
from tinygrad.device import Device
from tinygrad.dtype import dtypes
from tinygrad.renderer.cstyle import ClangRenderer
from tinygrad.tensor import Tensor
from tinygrad.uop import Ops
from tinygrad.uop.ops import KernelInfo, UOp

from swactor.model.block_kernels import DeviceQuant

TYPES = frozenset({int(Q.Q4_1), int(Q.Q8_0)})
"""Block types with a hand-written decode kernel."""
MAX_ROWS = 8
"""Most activation rows one kernel takes (a batched decode step's ``B``)."""
PREFILL_ROWS = 64
"""Prefill products of at most this many rows (a padded prompt, or packed prompts) go
through :func:`gemv` instead of the panel GEMM (:mod:`swactor.model.prefill_gemm`).
Measured on SmolLM2 Q4_1, a whole-model prefill: 16 rows 54 ms against 152 ms on 2
threads (80 against 183 on 1), 64 rows 166 against 276 (264 against 311); at 128 rows the
GEMM is ahead on one thread (495 against 537 ms)."""
SUMS = 8  # running sums a slice keeps at once: R output rows x B activation rows
SLICE_WEIGHTS = 1 << 16  # about this many weights per slice (the last may be shorter)
BLOCK = 32


def usable(device: str, matrix: DeviceQuant, batch: int) -> bool:
    """Whether a ``[batch, cols] @ matrix.T`` decode product runs through this kernel."""
    cols = matrix.shape[1]
    if matrix.type_id not in TYPES or cols % BLOCK or batch < 1 or not device.startswith("CPU"):
        return False
    return isinstance(Device[device].renderer, ClangRenderer)


def slice_rows(rows: int, cols: int) -> int:
    """Output rows per slice: about :data:`SLICE_WEIGHTS` weights, a multiple of 8."""
    per = max(8, SLICE_WEIGHTS // max(1, cols) // 8 * 8)
    return min(rows, per)


def interleave(batch: int) -> int:
    """Output rows a slice works on at once for ``batch`` activation rows."""
    return max(1, SUMS // batch)


def _widen_scales(pointer: str, name: str, count: int, blocks: int) -> list[str]:
    """C that widens the f16 scales of rows ``o .. o + count - 1`` (contiguous in
    ``pointer``) into a float array ``name`` with exact integer bit moves."""
    return [
        f"float {name}[{count * blocks}];",
        f"for (int i = 0; i < {count * blocks}; i++) {{",
        f"  unsigned h = {pointer}[(long)o * {blocks} + i];",
        "  unsigned u = ((h & 0x8000u) << 16) | ((h & 0x7fffu) << 13); float f;",
        f"  __builtin_memcpy(&f, &u, 4); {name}[i] = f * 0x1p112f;",
        "}",
    ]


def _group(q4: bool, batch: int, cols: int, rows: int, count: int) -> list[str]:
    """C for ``count`` output rows from ``o`` on, over every block (see the module
    docstring: the same statements for every row whatever ``count`` and ``batch``)."""
    blocks = cols // BLOCK
    lines = _widen_scales("dp", "sd", count, blocks)
    if q4:
        lines += _widen_scales("mp", "sm", count, blocks)
    lines += [" ".join(f"v16 a{r}_{b} = (v16)(0.0f);" for b in range(batch))
              for r in range(count)]
    lines.append(f"for (int k = 0; k < {blocks}; k++) {{")
    lines += [f"  const v16 x{b}a = *(const v16 *)(x + {b * cols} + k * 32),"
              f" x{b}b = *(const v16 *)(x + {b * cols} + k * 32 + 16);" for b in range(batch)]
    for r in range(count):
        row = f"(long)(o + {r}) * {blocks} + k"
        lines.append(f"  {{ float d = sd[{r * blocks} + k];")
        if q4:
            # bytes widened to 32-bit lanes first, nibbles cut there (fewer shuffles)
            lines += [
                f"    float m = sm[{r * blocks} + k];",
                f"    v16i q = __builtin_convertvector(*(const v16b *)(qs + ({row}) * 16), v16i);",
                "    v16 wa = __builtin_convertvector(q & 15, v16) * d + m;",
                "    v16 wb = __builtin_convertvector(q >> 4, v16) * d + m;",
            ]
        else:
            lines += [
                f"    const signed char *c = qs + ({row}) * 32;",
                "    v16 wa = __builtin_convertvector(*(const v16c *)c, v16) * d;",
                "    v16 wb = __builtin_convertvector(*(const v16c *)(c + 16), v16) * d;",
            ]
        lines += [f"    a{r}_{b} += wa * x{b}a; a{r}_{b} += wb * x{b}b;" for b in range(batch)]
        lines.append("  }")
    lines.append("}")
    for r in range(count):
        for b in range(batch):
            a = f"a{r}_{b}"
            # one fixed order: lanes i and i + 8, then those eight sums left to right
            tree = " + ".join(f"({a}[{i}] + {a}[{i + 8}])" for i in range(8))
            lines.append(f"out[{b * rows} + o + {r}] = {tree};")
    return lines


def gemv_source(type_id: int, batch: int, cols: int, rows: int, per_slice: int) -> str:
    """The C statement of one slice, a ``str.format`` template (tinygrad's CUSTOM op)
    over the output, input, codes, scales (and Q4_1 mins) pointers, then the slice index
    (``{0}``..)."""
    q4 = type_id == int(Q.Q4_1)
    scalar = "const unsigned char" if q4 else "const signed char"
    step = interleave(batch)
    body = [
        "{",
        "typedef float v16 __attribute__((ext_vector_type(16), aligned(4)));",
        "typedef unsigned char v16b __attribute__((ext_vector_type(16), aligned(1)));",
        "typedef signed char v16c __attribute__((ext_vector_type(16), aligned(1)));",
        "typedef int v16i __attribute__((ext_vector_type(16)));",
        "float *out = @0;",
        "const float *x = @1;",
        f"{scalar} *qs = ({scalar} *)(@2);",
        "const unsigned short *dp = (const unsigned short *)(@3);",
        *(["const unsigned short *mp = (const unsigned short *)(@4);"] if q4 else []),
        f"int first = (int)(@{5 if q4 else 4}) * {per_slice};",
        f"int last = first + {per_slice} < {rows} ? first + {per_slice} : {rows};",
        "int o = first;",
        f"for (; o + {step} <= last; o += {step}) {{",
        *(f"  {line}" for line in _group(q4, batch, cols, rows, step)),
        "}",
        "for (; o < last; o++) {",
        *(f"  {line}" for line in _group(q4, batch, cols, rows, 1)),
        "}",
        "}",
    ]
    text = "\n".join(body).replace("{", "{{").replace("}", "}}")
    for index in range(6):
        text = text.replace(f"@{index}", f"{{{index}}}")
    return text


def gemv(x: Tensor, matrix: DeviceQuant) -> Tensor:
    """``x @ W.T`` for decode rows ``x`` ``float32 [B, cols]`` and a Q4_1 or Q8_0 block
    matrix (:func:`usable` said yes): ``float32 [B, rows]``; one kernel per
    :data:`MAX_ROWS` rows."""
    batch = int(x.shape[0])
    if batch <= MAX_ROWS:
        return _gemv_rows(x, matrix)
    parts = [_gemv_rows(x[start : start + MAX_ROWS], matrix)
             for start in range(0, batch, MAX_ROWS)]
    return parts[0].cat(*parts[1:], dim=0)


def _gemv_rows(x: Tensor, matrix: DeviceQuant) -> Tensor:
    """:func:`gemv` of at most :data:`MAX_ROWS` rows: one kernel."""
    rows, cols = matrix.shape
    batch = int(x.shape[0])
    per_slice = slice_rows(rows, cols)
    slices = -(-rows // per_slice)
    q4 = matrix.type_id == int(Q.Q4_1)
    code = gemv_source(matrix.type_id, batch, cols, rows, per_slice)
    name = f"gemv_{matrix.type_name.lower()}_{batch}_{cols}_{rows}"
    fields = [matrix.fields["qs"], matrix.fields["d"]] + ([matrix.fields["m"]] if q4 else [])

    def kernel(out: UOp, inputs: UOp, *arrays: UOp) -> UOp:
        zero = UOp.const(0, dtypes.weakint)

        def at(buffer: UOp) -> UOp:
            first: UOp = buffer.index(*([zero] * len(buffer.shape)))
            return first

        core = UOp.variable("core_id", 0, slices - 1, dtypes.int, param=True)
        pointers = (at(out), at(inputs), *(at(a) for a in arrays), core)
        # a plain load of each input's first element, unused: ProgramInfo then lists
        # the inputs as read, so the replay graph knows the kernel only reads them
        reads = tuple(at(b).load() for b in (inputs, *arrays))
        body = UOp(Ops.CUSTOM, src=(*pointers, *reads), arg=code)
        sink: UOp = body.sink(arg=KernelInfo(name=name, opts_to_apply=()))
        return sink

    out = Tensor.empty(batch, rows, dtype=dtypes.float32, device=x.device)
    return out.custom_kernel(x.float().contiguous(), *fields, fxn=kernel)[0]
