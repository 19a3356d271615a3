"""Decode matrix-vector products over Q4_1 and Q8_0 blocks: a hand-written C kernel for
``B`` rows at once.

Theory of operation. A decode step multiplies each weight matrix ``W`` ``[rows, cols]``
(kept in the file's blocks, :mod:`swactor.model.block_kernels`) by ``B`` activation
rows ``x`` ``[B, cols]`` (``B = 1``: one sequence; more: a batched step of several
sequences). On a CPU the cost is widening the codes, not the multiply-adds, and
tinygrad's kernels for ``B`` rows widened each block about once per row (4 rows cost
6.5x one row on SmolLM2 Q4_1). Here each product is a tinygrad custom kernel on the
clang renderer (as :mod:`swactor.model.prefill_gemm`), on one of two paths. On the
*float path* one kernel, per block of 32 weights, loads and widens the codes once
(``w = d * q + m`` for Q4_1, ``w = d * q`` for Q8_0) into two 16-float vectors
(``ext_vector_type(16)``: one AVX-512, two AVX2 or four NEON registers), then
multiply-adds them into every row's running sums: ``B`` rows cost one widening and
``2 B`` vector multiply-adds per block. Two details keep
the widening off the vector shuffle unit: the f16 scales of the output rows in hand are
widened first into a small array with integer bit moves (exact for every finite f16;
a block then reads its scale as a broadcast load), and Q4_1's bytes are widened to
32-bit lanes before the nibbles are cut.

On the float path every output ``(b, o)`` is computed by the same arithmetic
whatever ``B``, the chunk or the thread: a 16-lane running sum ``acc += w[0:16] *
x[b, k:k+16]`` then ``acc += w[16:32] * x[b, k+16:k+32]`` over the blocks ``k`` in order
(clang contracts each into one FMA where the target has one, the same way in every
variant: the statements are the same text), then the lanes added in one fixed tree.
Results differ from ``gguf.quants.dequantize`` followed by an exact product only in
float32 rounding. It serves targets other than x86-64 (and benchmarks side by side:
:data:`INTEGER`).

The *integer path* (x86-64: :func:`integer_path`), integer dot products as llama.cpp
does. A first kernel (:func:`quantise`, one per product) quantises each activation row
once per block of 32: ``d = max|x| / L``, codes ``q = x * (1 / d)`` rounded half to even
(``|q| <= L``; zero where ``d < 2**-120``), and per block ``d`` and ``d * sum(q)``. For a
Q4_1 matrix the codes are int8 (``L = 127``: :func:`activation_bits`), which is what
llama.cpp's CPU backend computes a Q4_1 product with (its Q8_1 activations); for Q8_0
they are int16 (``L = 32767``), whose products would overflow the 16-bit pair sums of
AVX2's byte multiply. The int8 codes move the logits of the tests' small random models
by about 5e-3 of their range against an exact float64 product, so those tests hold the
role to a reference that rounds the inputs of Q4_1 products the same way; int16 codes
move them about 2e-5.

The product kernel takes 16 output rows at a time, one per vector lane: per block it
loads the 16 rows' codes and transposes them with in-register shuffles. With int16
activations each 32-bit lane then holds two codes of its row as 16-bit integers (Q4_1
nibbles cut, Q8_0 bytes sign-extended), shared by every activation row; per activation
row, 16 integer pair-products (``vpdpwssd`` with AVX-512 VNNI or AVX-VNNI, ``vpmaddwd``
with AVX2, plain C elsewhere: all the same exact 32-bit sums) give each lane its block's
``sum(w_code * x_code)``. With int8 activations each lane holds four Q4_1 codes as bytes
and 8 byte products per block do it (:data:`_DOT8`: ``vpdpbusd``, or AVX2's
``vpmaddubsw`` with 16-bit sums; about half the multiply instructions of int16). The
sum is converted to float and scaled: ``acc += (sum * dw) * d`` plus ``acc += mw * (d *
sum(q))`` for Q4_1's min term. The lanes are the output rows, so no sum across lanes is
needed. Per product whose weights stay in cache (``bench gemv``, SmolLM2's shapes) int16
runs 1.7-2.6x the float path's speed for 1 to 8 rows, and int8 about 1.3-1.8x int16's
for 8 or more rows. A whole decode step streams every weight from memory: measured on
SmolLM2's whole step with int16, one row runs as fast as on the float path and each
further row of a batched step costs about a quarter less.

One integer-path kernel takes any number of activation rows (a prefill's): per tile of
16 output rows it widens the tile's scales once, then takes the rows
:data:`MAX_ROWS` at a time (the registers' worth of running sums), each group one pass
over the tile's blocks, which stay in cache for the next group; a row's statements are
those of any other group. Past :data:`CHUNK_ROWS` rows it takes them a chunk at a time
over every tile of its slice, so that a chunk's quantised rows stay in cache from tile
to tile while the slice's blocks stay in cache from chunk to chunk. So a product reads
its weights from memory once, and a prompt's graph holds one kernel per product, not
one per 8 rows. Measured on SmolLM2 Q4_1 (one stage, 2 cores, int16 codes), warm
prefill ms against the same rows 8 per kernel (up to 64 rows) or the panel GEMM
(beyond), side by side: 24 tokens 42 against 47, 56 tokens about equal (93), 128 tokens
215 against 401, 512 tokens 968 against 2040, 2048 tokens 5432 against 7853 (6268
without chunks); building a 56-token prompt's graph 6.5 s instead of 20 s. With int8
codes, side by side against int16: 24 tokens 39 ms against 50, 56 tokens 68 against
96, 128 tokens 149 against 325, 512 tokens 761 against 896; a one-row decode step 12.2
against 13.6.

On either path row ``b`` of a ``B``-row product is bit-identical to the one-row
product of that row (integer sums are exact; each lane's float steps are the same
statements whatever ``B``), and the one-row decode path uses this kernel with ``B = 1``.

A product is cut into *slices* of output rows: the kernel takes tinygrad's ``core_id``
variable (the slice, ``0 .. slices - 1``), as tinygrad's own ``THREAD`` opt does, so
:class:`~swactor.model.cpu_graph.CpuGraph` gives each slice a row of its table and the
native replay pool runs the slices of one product on several threads (slices write
disjoint outputs). The kernel also loads one value of each input in tinygrad's IR (a
value the C never uses), so tinygrad's ``ProgramInfo`` lists every input as read and
the replay graph knows the kernel only reads them: kernels that read the same input
can share a phase. On the float path ``R`` output rows are interleaved inside a slice
(:func:`interleave`: ``R * B <= 8`` running sums) so that the chains of dependent
multiply-adds overlap; the integer path's 16 lanes are 16 independent rows.

Used for decode products on a CPU device whose renderer is clang, for Q4_1 and Q8_0
matrices with ``cols`` a multiple of 32 (more than :data:`MAX_ROWS` rows go through in
groups of at most that many, each row computed as always); anything else keeps
tinygrad's expression (:func:`~swactor.model.block_kernels.dequant_expr`). Prefill
products use it too (:func:`prefill_usable`): at any length on the integer path, up to
:data:`PREFILL_ROWS` rows on the float path.
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
from swactor.model.c_f16 import widen_f16_c
from swactor.model.c_kernel import c_template, check_columns, first_element

TYPES = frozenset({int(Q.Q4_1), int(Q.Q8_0)})
"""Block types with a hand-written decode kernel."""
MAX_ROWS = 8
"""Activation rows one pass over the blocks takes: a float-path kernel's most (a batched
decode step's ``B``; more go through in several kernels), an integer-path kernel's group."""
PREFILL_ROWS = 64
"""Float-path prefill products of at most this many rows (a padded prompt, or packed
prompts) go through :func:`gemv` instead of the panel GEMM
(:mod:`swactor.model.prefill_gemm`); on the integer path every prefill product does (see
the module docstring). Measured on SmolLM2 Q4_1, a whole-model prefill on the float
path, CPU ms on one thread: 32 rows 143 against the GEMM's 138, 64 rows 257 against
214 (the GEMM is ahead from 48 rows, but 8 rows per kernel keeps short prompts' graph
builds short). It also ends the prompt lengths padded to a multiple of 8
(:class:`~swactor.model.llama_role.StageRole`)."""
CHUNK_ROWS = 64
"""Activation rows an integer-path kernel takes over every tile of a slice before the
next rows (a multiple of :data:`MAX_ROWS`): a chunk's quantised rows stay in cache from
one tile to the next (see the module docstring)."""
SUMS = 8  # running sums a slice keeps at once: R output rows x B activation rows
SLICE_WEIGHTS = 1 << 16  # about this many weights per slice (the last may be shorter)
BLOCK = 32
INTEGER = True
"""Whether x86-64 products take the integer path (:func:`integer_path`); the float path
stays for other targets and for benchmarks side by side."""


def usable(device: str, matrix: DeviceQuant, batch: int) -> bool:
    """Whether a ``[batch, cols] @ matrix.T`` decode product runs through this kernel."""
    cols = matrix.shape[1]
    if matrix.type_id not in TYPES or cols % BLOCK or batch < 1 or not device.startswith("CPU"):
        return False
    return isinstance(Device[device].renderer, ClangRenderer)


def slice_rows(rows: int, cols: int) -> int:
    """Output rows per slice: about :data:`SLICE_WEIGHTS` weights, a multiple of 16."""
    per = max(16, SLICE_WEIGHTS // max(1, cols) // 16 * 16)
    return min(rows, per)


def interleave(batch: int) -> int:
    """Output rows a slice works on at once for ``batch`` activation rows."""
    return max(1, SUMS // batch)


def _widen_scales(pointer: str, name: str, count: int, blocks: int) -> list[str]:
    """C that widens the f16 scales of rows ``o .. o + count - 1`` (contiguous in
    ``pointer``) into a float array ``name`` with exact integer bit moves."""
    return [
        f"float {name}[{count * blocks}];",
        f"for (int i = 0; i < {count * blocks}; i++)",
        "  " + widen_f16_c(f"{pointer}[(long)o * {blocks} + i]", f"{name}[i]"),
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
    return c_template(body, 6)


# --- integer path: activations quantised to int16 per block, integer dot products ---

QUANT_LEVELS = 32767
"""An activation block is quantised to ``round(x / d)`` with ``d = amax / QUANT_LEVELS``
(int16 codes)."""
QUANT_LEVELS_8 = 127
"""The same for int8 codes: ``d = amax / 127``, codes in ``-127 .. 127``."""
EIGHT_BIT = True
"""Whether Q4_1 products quantise their activations to int8 (:func:`activation_bits`);
off, they take int16 codes as Q8_0's do (for benchmarks side by side)."""
PREFETCH = 256
"""How far ahead (bytes of a row's codes) an integer-path kernel asks for the codes it
will read (``__builtin_prefetch``; 0: never). A tile reads 16 rows' blocks side by side,
16 strided streams that the hardware prefetcher does not keep ahead of: measured side by
side on SmolLM2 (one stage, 2 threads), a one-row decode step 7.9 ms against 11.7
without, a 4-row step 12.4 against 16.5; 128 to 384 bytes all about equal."""
LANES = 16  # output rows one vector holds (one AVX-512 register, two AVX2)
_MAGIC = "12582912.0f"  # 1.5 * 2**23: (v + M) - M rounds v to nearest-even for |v| < 2**22


def integer_path(device: str) -> bool:
    """Whether products on ``device`` take the integer path (x86-64 clang targets)."""
    return INTEGER and str(Device[device].renderer.target.arch).startswith("x86_64")


def activation_bits(type_id: int) -> int:
    """Bits per activation code on the integer path for a matrix of ``type_id``: 8 for
    Q4_1 (while :data:`EIGHT_BIT`), 16 otherwise (see the module docstring)."""
    return 8 if EIGHT_BIT and type_id == int(Q.Q4_1) else 16


def code_words(cols: int, bits: int) -> int:
    """32-bit words of one quantised activation row's codes: per block 32 codes of
    ``bits`` bits (16 words of int16 codes, 8 of int8 codes)."""
    return cols // BLOCK * (BLOCK * bits // 32)


def quant_words(cols: int, bits: int = 16) -> int:
    """32-bit words of one quantised activation row: its codes (:func:`code_words`),
    then every block's scale ``d``, then every block's ``d * sum(codes)``."""
    return code_words(cols, bits) + 2 * (cols // BLOCK)


def quant_source(batch: int, cols: int, bits: int = 16) -> str:
    """C that quantises ``batch`` rows of ``cols`` floats (``{1}``) into ``{0}``
    (:func:`quant_words` per row) with ``bits``-bit codes. As int16 a block's 16 codes
    of each half are stored even positions first, then odd ones: the order the weight
    vectors pair them in; as int8 they are stored in order."""
    blocks = cols // BLOCK
    words = quant_words(cols, bits)
    levels = QUANT_LEVELS if bits == 16 else QUANT_LEVELS_8
    body = [
        "{",
        "typedef float v16 __attribute__((ext_vector_type(16), aligned(4)));",
        "typedef int v16i __attribute__((ext_vector_type(16), aligned(4)));",
        "typedef int v8i __attribute__((ext_vector_type(8)));",
        "typedef int v4i __attribute__((ext_vector_type(4)));",
        "typedef int v2i __attribute__((ext_vector_type(2)));",
        "typedef short v16s __attribute__((ext_vector_type(16), aligned(2)));",
        "typedef signed char v16c __attribute__((ext_vector_type(16), aligned(1)));",
        "int *q = (int *)(@0);",
        "const float *x = @1;",
        f"for (int b = 0; b < {batch}; b++) {{",
        f"  for (int k = 0; k < {blocks}; k++) {{",
        f"    const float *xb = x + (long)b * {cols} + k * 32;",
        "    v16 lo = *(const v16 *)xb, hi = *(const v16 *)(xb + 16);",
        "    v16i al = (v16i)lo & 0x7fffffff, ah = (v16i)hi & 0x7fffffff;",
        # |x| bit patterns compare as integers; max of the 32 without a float compare
        "    v16i m = al ^ ((al ^ ah) & (al < ah));",
        "    v8i m8 = m.lo ^ ((m.lo ^ m.hi) & (m.lo < m.hi));",
        "    v4i m4 = m8.lo ^ ((m8.lo ^ m8.hi) & (m8.lo < m8.hi));",
        "    v2i m2 = m4.lo ^ ((m4.lo ^ m4.hi) & (m4.lo < m4.hi));",
        "    int amax_bits = m2[0] > m2[1] ? m2[0] : m2[1];",
        "    float amax; __builtin_memcpy(&amax, &amax_bits, 4);",
        f"    float d = amax / {levels}.0f;",
        # a block below 2**-120 (all but zero) quantises to zero codes: 1 / d stays finite
        "    float id = d >= 0x1p-120f ? 1.0f / d : 0.0f;",
        "    v16 vl = lo * id;",
        "    v16 vh = hi * id;",
        f"    vl = (vl + {_MAGIC}) - {_MAGIC};",
        f"    vh = (vh + {_MAGIC}) - {_MAGIC};",
        "    v16i ql = __builtin_convertvector(vl, v16i), qh = __builtin_convertvector(vh, v16i);",
        "    v16i s16 = ql + qh; v8i s8 = s16.lo + s16.hi; v4i s4 = s8.lo + s8.hi;",
        "    int sum = (s4[0] + s4[1]) + (s4[2] + s4[3]);",
        f"    int *row = q + (long)b * {words};",
        *(_store16() if bits == 16 else _store8()),
        f"    float *dd = (float *)(row + {code_words(cols, bits)});",
        f"    dd[k] = d; dd[{blocks} + k] = d * (float)sum;",
        "  }",
        "}",
        "}",
    ]
    return c_template(body, 6)


def _store16() -> list[str]:
    """C storing a block's int16 codes ``ql``, ``qh`` at word ``k * 16`` of ``row``."""
    order = ", ".join(str(i) for i in [*range(0, 16, 2), *range(1, 16, 2)])
    return [
        "    v16s sl = __builtin_convertvector(ql, v16s), sh = __builtin_convertvector(qh, v16s);",
        f"    *(v16s *)(row + k * 16) = __builtin_shufflevector(sl, sl, {order});",
        f"    *(v16s *)(row + k * 16 + 8) = __builtin_shufflevector(sh, sh, {order});",
    ]


def _store8() -> list[str]:
    """C storing a block's int8 codes ``ql``, ``qh`` in order at word ``k * 8`` of ``row``."""
    return [
        "    *(v16c *)(row + k * 8) = __builtin_convertvector(ql, v16c);",
        "    *(v16c *)(row + k * 8 + 4) = __builtin_convertvector(qh, v16c);",
    ]


_DOT = """#if defined(__AVX512VNNI__)
#define DOT(acc, w, x) acc = (v16i)__builtin_ia32_vpdpwssd512((gv16)acc, (gv16)(w), (gv16)(v16i)(x))
#elif defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
#define DOT(acc, w, x) do { v16i w_ = (w), x_ = (v16i)(x); v8i l_ = acc.lo, h_ = acc.hi; \\
  l_ = (v8i)__builtin_ia32_vpdpwssd256((gv8)l_, (gv8)w_.lo, (gv8)x_.lo); \\
  h_ = (v8i)__builtin_ia32_vpdpwssd256((gv8)h_, (gv8)w_.hi, (gv8)x_.hi); \\
  acc.lo = l_; acc.hi = h_; } while (0)
#elif defined(__AVX2__)
#define DOT(acc, w, x) do { v16i w_ = (w), x_ = (v16i)(x); v8i l_ = acc.lo, h_ = acc.hi; \\
  l_ += (v8i)__builtin_ia32_pmaddwd256((gs16)w_.lo, (gs16)x_.lo); \\
  h_ += (v8i)__builtin_ia32_pmaddwd256((gs16)w_.hi, (gs16)x_.hi); \\
  acc.lo = l_; acc.hi = h_; } while (0)
#else
#define DOT(acc, w, x) do { v16i w_ = (w), x_ = (v16i)(x); \\
  acc += ((w_ << 16) >> 16) * ((x_ << 16) >> 16) + (w_ >> 16) * (x_ >> 16); } while (0)
#endif"""


_DOT8 = """#if defined(__AVX512VNNI__)
#define DOT8(acc, w, x) \\
  acc = (v16i)__builtin_ia32_vpdpbusd512((gv16)acc, (gv16)(w), (gv16)(v16i)(x))
#define SUM8(p) (p)
#elif defined(__AVXVNNI__)
#define DOT8(acc, w, x) do { v16i w_ = (w), x_ = (v16i)(x); v8i l_ = acc.lo, h_ = acc.hi; \\
  l_ = (v8i)__builtin_ia32_vpdpbusd256((gv8)l_, (gv8)w_.lo, (gv8)x_.lo); \\
  h_ = (v8i)__builtin_ia32_vpdpbusd256((gv8)h_, (gv8)w_.hi, (gv8)x_.hi); \\
  acc.lo = l_; acc.hi = h_; } while (0)
#define SUM8(p) (p)
#elif defined(__AVX2__)
#define DOT8(acc, w, x) do { v16i w_ = (w), x_ = (v16i)(x); v8i l_ = acc.lo, h_ = acc.hi; \\
  l_ = (v8i)((gs16)l_ + __builtin_ia32_pmaddubsw256((gc32)w_.lo, (gc32)x_.lo)); \\
  h_ = (v8i)((gs16)h_ + __builtin_ia32_pmaddubsw256((gc32)w_.hi, (gc32)x_.hi)); \\
  acc.lo = l_; acc.hi = h_; } while (0)
#define SUM8(p) ({ v16i p_ = (p), r_; \\
  const gs16 one_ = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}; \\
  r_.lo = (v8i)__builtin_ia32_pmaddwd256((gs16)p_.lo, one_); \\
  r_.hi = (v8i)__builtin_ia32_pmaddwd256((gs16)p_.hi, one_); r_; })
#else
#define DOT8(acc, w, x) do { v16i w_ = (w), x_ = (v16i)(x); \\
  acc += (w_ & 255) * ((x_ << 24) >> 24) + ((w_ >> 8) & 255) * ((x_ << 16) >> 24) \\
       + ((w_ >> 16) & 255) * ((x_ << 8) >> 24) + ((w_ >> 24) & 255) * (x_ >> 24); } while (0)
#define SUM8(p) (p)
#endif"""
"""``DOT8(p, w, x)``: each 32-bit lane of ``w`` holds four unsigned codes (bytes) of its
output row, ``x`` four signed int8 activation codes; adds their four products to the
lane's partial sum ``p``; ``SUM8(p)`` gives each lane's int32 total. With AVX-512 VNNI
or AVX-VNNI one ``vpdpbusd`` does it in int32 lanes. With AVX2 ``vpmaddubsw`` gives
pairs of products summed as 16-bit integers, added up in 16 bits, and ``SUM8`` adds
each lane's two halves with one ``vpmaddwd`` by ones: exact for the 8 ``DOT8`` of a
Q4_1 block (each half at most ``8 * 2 * 15 * 127 = 30480``). Every variant gives the
same exact sums."""


def _transpose(loads: list[str]) -> list[str]:
    """C giving ``T0..T3`` (``v16i``): lane ``r`` of ``Tj`` is dword ``j`` of ``loads[r]``
    (16 four-dword ``v4i`` expressions): four registers of four rows, then a 4x4 dword
    transpose inside each 128-bit chunk."""
    lines = [f"v4i p{r} = {expr};" for r, expr in enumerate(loads)]
    for i in range(4):
        lines.append(f"v16i z{i} = __builtin_shufflevector("
                     f"__builtin_shufflevector(p{i}, p{i + 4}, 0, 1, 2, 3, 4, 5, 6, 7), "
                     f"__builtin_shufflevector(p{i + 8}, p{i + 12}, 0, 1, 2, 3, 4, 5, 6, 7), "
                     + ", ".join(str(n) for n in range(16)) + ");")

    def mask(pattern: list[tuple[int, int]]) -> str:
        return ", ".join(str(16 * src + 4 * c + at) for c in range(4) for src, at in pattern)

    lo32, hi32 = [(0, 0), (1, 0), (0, 1), (1, 1)], [(0, 2), (1, 2), (0, 3), (1, 3)]
    lo64, hi64 = [(0, 0), (0, 1), (1, 0), (1, 1)], [(0, 2), (0, 3), (1, 2), (1, 3)]
    lines += [
        f"v16i u0 = __builtin_shufflevector(z0, z1, {mask(lo32)});",
        f"v16i u1 = __builtin_shufflevector(z0, z1, {mask(hi32)});",
        f"v16i u2 = __builtin_shufflevector(z2, z3, {mask(lo32)});",
        f"v16i u3 = __builtin_shufflevector(z2, z3, {mask(hi32)});",
        f"v16i T0 = __builtin_shufflevector(u0, u2, {mask(lo64)});",
        f"v16i T1 = __builtin_shufflevector(u0, u2, {mask(hi64)});",
        f"v16i T2 = __builtin_shufflevector(u1, u3, {mask(lo64)});",
        f"v16i T3 = __builtin_shufflevector(u1, u3, {mask(hi64)});",
    ]
    return lines


def _int_scales(q4: bool, cols: int, full: bool) -> list[str]:
    """C widening the scales (and Q4_1 mins) of the 16 output rows from ``o`` on
    (``full``) or of the last ``last - o`` of them (rows past ``last`` read as row
    ``last - 1``: ``rr``), once for every activation row of the tile."""
    blocks = cols // BLOCK
    if full:
        lines = _widen_scales("dp", "sd", LANES, blocks)
        return lines + (_widen_scales("mp", "sm", LANES, blocks) if q4 else [])
    lines = [f"int rr[{LANES}];",
             f"for (int r = 0; r < {LANES}; r++) rr[r] = o + r < last ? o + r : last - 1;"]
    for pointer, name in [("dp", "sd")] + ([("mp", "sm")] if q4 else []):
        lines += [
            f"float {name}[{LANES * blocks}];",
            f"for (int r = 0; r < {LANES}; r++) for (int k = 0; k < {blocks}; k++)",
            "  " + widen_f16_c(f"{pointer}[(long)rr[r] * {blocks} + k]",
                               f"{name}[r * {blocks} + k]"),
        ]
    return lines


def _prefetch(full: bool, blocks: int, size: int) -> list[str]:
    """C asking for the codes :data:`PREFETCH` bytes ahead of block ``k`` of each of the
    tile's 16 rows (``size`` code bytes per block), once per 64-byte line; past the
    row's end, the next tile's rows from their start."""
    if not PREFETCH:
        return []
    ahead, step = PREFETCH // size, 64 // size
    row = "(long)o + r" if full else "(long)rr[r]"
    after = "(long)o + 16 + r" if full else "(long)rr[r]"
    stride = blocks * size
    return [f"if ((k & {step - 1}) == 0) for (int r = 0; r < {LANES}; r++) {{",
            f"  if (k + {ahead} < {blocks}) __builtin_prefetch(qs + ({row}) * {stride} "
            f"+ (k + {ahead}) * {size});",
            f"  else __builtin_prefetch(qs + ({after}) * {stride} "
            f"+ (k + {ahead} - {blocks}) * {size});",
            "}"]


def _tile_row(full: bool, r: int) -> str:
    """C for output row ``r`` of the tile (``rr``: the rows of a last, short tile)."""
    return f"((long)o + {r})" if full else f"((long)rr[{r}])"


def _block_scales(q4: bool, blocks: int) -> list[str]:
    """C gathering block ``k``'s scales (and Q4_1 mins) of the tile's 16 rows into one
    vector each (``dw``, ``mw``), from the widened ``sd``, ``sm``."""
    names = [("dw", "sd")] + ([("mw", "sm")] if q4 else [])
    return ["const v16 " + vector + " = (v16){"
            + ", ".join(f"{array}[{r * blocks} + k]" for r in range(LANES)) + "};"
            for vector, array in names]


def _accumulate(q4: bool, b: int, words: int, blocks: int, sums: str) -> list[str]:
    """C adding activation row ``b``'s block ``k`` to its running sums ``a{b}``: the
    block's integer ``sums`` of its 16 lanes converted and scaled, plus Q4_1's min term."""
    lines = [
        f"  v16 f = __builtin_convertvector({sums}, v16);",
        "  v16 t = f * dw;",
        f"  a{b} = a{b} + t * xs[{b * words} + k];",
    ]
    if q4:
        lines.append(f"  a{b} = a{b} + mw * xs[{b * words + blocks} + k];")
    return lines


def _store(batch: int, rows: int, full: bool) -> list[str]:
    """C storing the ``batch`` rows' running sums at ``xo`` (not past ``last``)."""
    if full:
        return [f"*(v16 *)(xo + {b * rows} + o) = a{b};" for b in range(batch)]
    return [f"for (int r = 0; o + r < last; r++) xo[{b * rows} + o + r] = a{b}[r];"
            for b in range(batch)]


def _int_group(q4: bool, batch: int, cols: int, rows: int, full: bool) -> list[str]:
    """C for ``batch`` activation rows (from ``xq``/``xs`` on, results at ``xo``) of the
    16 output rows from ``o`` on (``full``) or of the last ``last - o`` of them (results
    not stored past ``last``), over every block: each lane is one output row and
    computes the same arithmetic whatever ``batch`` and the group."""
    blocks = cols // BLOCK
    size = 16 if q4 else 32  # code bytes of one block
    words = quant_words(cols)
    lines = [" ".join(f"v16 a{b} = (v16)(0.0f);" for b in range(batch))]
    lines.append(f"for (int k = 0; k < {blocks}; k++) {{")
    body: list[str] = []
    halves = 1 if q4 else 2
    weights: list[str] = []
    body += _prefetch(full, blocks, size)
    for h in range(halves):
        loads = [f"*(const v4i *)(qs + {_tile_row(full, r)} * {blocks * size} + k * {size}"
                 f" + {16 * h})"
                 for r in range(LANES)]
        body.append("{")
        body += _transpose(loads)
        for j in range(4):
            if q4:  # codes 4j, 4j+2 / 4j+1, 4j+3 (low nibbles), the same + 16 (high)
                body += [f"w0_{j} = T{j} & 0x000f000f; w1_{j} = (T{j} >> 8) & 0x000f000f;",
                         f"w2_{j} = (T{j} >> 4) & 0x000f000f; w3_{j} = (T{j} >> 12) & 0x000f000f;"]
            else:  # signed bytes 4j, 4j+2 / 4j+1, 4j+3 of half h as int16 pairs
                body += [f"w{2 * h}_{j} = (v16i)(((v16s2)T{j} << 8) >> 8);",
                         f"w{2 * h + 1}_{j} = (v16i)((v16s2)T{j} >> 8);"]
        body.append("}")
    weights = [f"w{g}_{j}" for g in range(4) for j in range(4)]
    body.insert(0, "v16i " + ", ".join(weights) + ";")
    body += _block_scales(q4, blocks)
    for b in range(batch):
        base = f"xq + {b * words} + k * 16"
        body.append(f"{{ const int *xc = {base};")
        body.append("  v16i i0 = (v16i)(0), i1 = (v16i)(0);")
        # group g pairs with words g*4 .. g*4+3 of the block (even/odd of each half)
        for g in range(4):
            for j in range(4):
                body.append(f"  DOT(i{g % 2}, w{g}_{j}, xc[{g * 4 + j}]);")
        body += [*_accumulate(q4, b, words, blocks, "i0 + i1"), "}"]
    lines += [f"  {line}" for line in body]
    lines.append("}")
    return lines + _store(batch, rows, full)


def _int8_group(batch: int, cols: int, rows: int, full: bool) -> list[str]:
    """:func:`_int_group` for Q4_1 with int8 activation codes: per block the 16 rows'
    codes transposed so that each 32-bit lane holds four codes of its row as bytes
    (nibbles cut in place), then per activation row 8 :data:`_DOT8` over the block's 8
    words of codes, the same statements whatever ``batch`` and the group."""
    blocks = cols // BLOCK
    words = quant_words(cols, 8)
    lines = [" ".join(f"v16 a{b} = (v16)(0.0f);" for b in range(batch))]
    lines.append(f"for (int k = 0; k < {blocks}; k++) {{")
    body = ["v16i " + ", ".join(f"wl{j}, wh{j}" for j in range(4)) + ";", "{"]
    body += _prefetch(full, blocks, 16)
    body += _transpose([f"*(const v4i *)(qs + {_tile_row(full, r)} * {blocks * 16} + k * 16)"
                        for r in range(LANES)])
    # byte i of a Q4_1 block holds code i (low nibble) and code i + 16 (high nibble)
    body += [f"wl{j} = T{j} & 0x0f0f0f0f; wh{j} = (T{j} >> 4) & 0x0f0f0f0f;" for j in range(4)]
    body.append("}")
    body += _block_scales(True, blocks)
    for b in range(batch):
        body.append(f"{{ const int *xc = xq + {b * words} + k * 8;")
        body.append("  v16i p = (v16i)(0);")
        body += [f"  DOT8(p, wl{j}, xc[{j}]); DOT8(p, wh{j}, xc[{4 + j}]);" for j in range(4)]
        body += [*_accumulate(True, b, words, blocks, "SUM8(p)"), "}"]
    lines += [f"  {line}" for line in body]
    lines.append("}")
    return lines + _store(batch, rows, full)


def _int_tiles(q4: bool, group: int, cols: int, rows: int, groups: str, bits: int
               ) -> list[str]:
    """C for the groups of ``group`` activation rows in the range ``groups`` (C for a
    ``g`` loop's bounds) over every tile of 16 output rows of the slice: per tile its
    scales widened once, then a pass over the tile's blocks per group, the blocks staying
    in cache from one group to the next (see :func:`_int_group`, :func:`_int8_group` for
    ``bits`` 8)."""
    words = quant_words(cols, bits)
    lines = ["int o = first;"]
    for full in (True, False):
        lines.append(f"for (; o + {LANES} <= last; o += {LANES}) {{" if full else
                     "if (o < last) {")
        lines += [f"  {line}" for line in _int_scales(q4, cols, full)]
        lines += [f"  for ({groups}) {{",
                  f"    const int *xq = q + (long)g * {MAX_ROWS * words};",
                  f"    const float *xs = (const float *)xq + {code_words(cols, bits)};",
                  f"    float *xo = out + (long)g * {MAX_ROWS * rows};"]
        code = (_int8_group(group, cols, rows, full) if bits == 8
                else _int_group(q4, group, cols, rows, full))
        lines += [f"    {line}" for line in code]
        lines += ["  }", "}"]
    return lines


def _int_rows_source(q4: bool, batch: int, cols: int, rows: int, bits: int
                     ) -> list[str]:
    """C for every activation row of a slice: the groups of :data:`MAX_ROWS` rows in
    chunks of :data:`CHUNK_ROWS` rows, each chunk over every tile of the slice, which
    keeps a chunk's quantised rows in cache from one tile to the next and the slice's
    blocks in cache from one chunk to the next; then the rows of the last short group.
    A row's statements are the same whatever the group, the chunk or ``batch``."""
    groups, rest = divmod(batch, MAX_ROWS)
    chunk = CHUNK_ROWS // MAX_ROWS
    lines: list[str] = []
    if groups:
        lines.append(f"for (int c = 0; c < {groups}; c += {chunk}) {{")
        lines.append(f"  int end = c + {chunk} < {groups} ? c + {chunk} : {groups};")
        lines += [f"  {line}" for line in
                  _int_tiles(q4, MAX_ROWS, cols, rows, "int g = c; g < end; g++", bits)]
        lines.append("}")
    if rest:
        lines.append("{")
        lines += [f"  {line}" for line in
                  _int_tiles(q4, rest, cols, rows, f"int g = {groups}; g <= {groups}; g++",
                             bits)]
        lines.append("}")
    return lines


def int_source(type_id: int, batch: int, cols: int, rows: int, per_slice: int) -> str:
    """The C of one slice of the integer path (see the module docstring): output, quantised
    activations (:func:`activation_bits`), codes, scales (and Q4_1 mins), then the slice."""
    q4 = type_id == int(Q.Q4_1)
    bits = activation_bits(type_id)
    scalar = "const unsigned char" if q4 else "const signed char"
    body = [
        "{",
        "typedef float v16 __attribute__((ext_vector_type(16), aligned(4)));",
        "typedef int v16i __attribute__((ext_vector_type(16), aligned(4)));",
        "typedef int v8i __attribute__((ext_vector_type(8), aligned(4)));",
        "typedef int v4i __attribute__((ext_vector_type(4), aligned(1)));",
        "typedef short v16s2 __attribute__((ext_vector_type(32)));",
        "typedef int gv16 __attribute__((vector_size(64)));",
        "typedef int gv8 __attribute__((vector_size(32)));",
        "typedef short gs16 __attribute__((vector_size(32)));",
        "typedef char gc32 __attribute__((vector_size(32)));",
        _DOT8 if bits == 8 else _DOT,
        "float *out = @0;",
        "const int *q = (const int *)(@1);",
        f"{scalar} *qs = ({scalar} *)(@2);",
        "const unsigned short *dp = (const unsigned short *)(@3);",
        *(["const unsigned short *mp = (const unsigned short *)(@4);"] if q4 else []),
        f"int first = (int)(@{5 if q4 else 4}) * {per_slice};",
        f"int last = first + {per_slice} < {rows} ? first + {per_slice} : {rows};",
        *_int_rows_source(q4, batch, cols, rows, bits),
        "#undef DOT8\n#undef SUM8" if bits == 8 else "#undef DOT",
        "}",
    ]
    return c_template(body, 6)


def gemv(x: Tensor, matrix: DeviceQuant) -> Tensor:
    """``x @ W.T`` for rows ``x`` ``float32 [B, cols]`` and a Q4_1 or Q8_0 block matrix
    (:func:`usable` said yes): ``float32 [B, rows]``. On the integer path (where the
    target has it, :func:`integer_path`) one kernel quantising every row, then one
    kernel for all of them (:data:`MAX_ROWS` at a time inside each tile); on the float
    path one kernel per :data:`MAX_ROWS` rows."""
    check_columns(x, matrix.shape[1])
    batch = int(x.shape[0])
    if integer_path(str(x.device)):
        return _int_rows(quantise(x, activation_bits(matrix.type_id)), batch, matrix)
    parts = [_gemv_rows(x[start : start + MAX_ROWS] if batch > MAX_ROWS else x, matrix)
             for start in range(0, batch, MAX_ROWS)]
    return parts[0] if len(parts) == 1 else parts[0].cat(*parts[1:], dim=0)


def prefill_usable(device: str, matrix: DeviceQuant, tokens: int) -> bool:
    """Whether a prefill product of ``tokens`` rows goes through :func:`gemv`: on the
    integer path at any length, on the float path up to :data:`PREFILL_ROWS` rows."""
    if not usable(device, matrix, tokens):
        return False
    return integer_path(device) or tokens <= PREFILL_ROWS


def quantise(x: Tensor, bits: int = 16) -> Tensor:
    """Rows ``x`` ``float32 [B, cols]`` quantised for the integer path to ``bits``-bit
    codes: ``int32 [B, quant_words(cols, bits)]`` (:func:`quant_source`), one
    single-slice kernel."""
    batch, cols = int(x.shape[0]), int(x.shape[1])
    code = quant_source(batch, cols, bits)

    def kernel(out: UOp, inputs: UOp) -> UOp:
        pointers = (first_element(out), first_element(inputs))
        body = UOp(Ops.CUSTOM, src=(*pointers, first_element(inputs).load()), arg=code)
        sink: UOp = body.sink(arg=KernelInfo(name=f"quant_i{bits}_{batch}_{cols}",
                                             opts_to_apply=()))
        return sink

    out = Tensor.empty(batch, quant_words(cols, bits), dtype=dtypes.int32, device=x.device)
    return out.custom_kernel(x.float().contiguous(), fxn=kernel)[0]


def _sliced(inputs: Tensor, matrix: DeviceQuant, batch: int, code: str, name: str) -> Tensor:
    """The ``[batch, rows]`` output of ``code`` (a slice's C) over ``inputs`` and the
    matrix's arrays, in :func:`slice_rows` slices (the ``core_id`` variable)."""
    rows, cols = matrix.shape
    slices = -(-rows // slice_rows(rows, cols))
    q4 = matrix.type_id == int(Q.Q4_1)
    fields = [matrix.fields["qs"], matrix.fields["d"]] + ([matrix.fields["m"]] if q4 else [])

    def kernel(out: UOp, source: UOp, *arrays: UOp) -> UOp:
        core = UOp.variable("core_id", 0, slices - 1, dtypes.int, param=True)
        pointers = (first_element(out), first_element(source),
                    *(first_element(a) for a in arrays), core)
        # a plain load of each input's first element, unused: ProgramInfo then lists
        # the inputs as read, so the replay graph knows the kernel only reads them
        reads = tuple(first_element(b).load() for b in (source, *arrays))
        body = UOp(Ops.CUSTOM, src=(*pointers, *reads), arg=code)
        sink: UOp = body.sink(arg=KernelInfo(name=name, opts_to_apply=()))
        return sink

    out = Tensor.empty(batch, rows, dtype=dtypes.float32, device=inputs.device)
    return out.custom_kernel(inputs, *fields, fxn=kernel)[0]


def _int_rows(quantised: Tensor, batch: int, matrix: DeviceQuant) -> Tensor:
    """The integer path's product of ``batch`` quantised rows: one kernel."""
    rows, cols = matrix.shape
    code = int_source(matrix.type_id, batch, cols, rows, slice_rows(rows, cols))
    bits = activation_bits(matrix.type_id)
    name = f"gemv_i{bits}_{matrix.type_name.lower()}_{batch}_{cols}_{rows}"
    return _sliced(quantised, matrix, batch, code, name)


def _gemv_rows(x: Tensor, matrix: DeviceQuant) -> Tensor:
    """:func:`gemv` of at most :data:`MAX_ROWS` rows on the float path: one kernel."""
    rows, cols = matrix.shape
    batch = int(x.shape[0])
    code = gemv_source(matrix.type_id, batch, cols, rows, slice_rows(rows, cols))
    name = f"gemv_{matrix.type_name.lower()}_{batch}_{cols}_{rows}"
    return _sliced(x.float().contiguous(), matrix, batch, code, name)
