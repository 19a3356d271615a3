"""Prefill matrix products on tinygrad's CPU device: weights widened once, a tiled GEMM.

Theory of operation. A prefill product ``x @ W.T`` (``x`` ``float32 [tokens, cols]``,
``W`` ``[rows, cols]``) written as a tinygrad expression comes out of tinygrad's CPU
heuristics as scalar code that reads ``W`` along its contiguous input axis and, for block
weights, widens every code once per four tokens (measured on SmolLM2's products, 64
tokens, one core: 4-10 GFLOPS, where numpy's BLAS does about 100). Here a product is two
kernels:

1. **Widen once** (a tinygrad kernel): the lazy ``float32 [rows, cols]`` weights (a
   dequantised block matrix, :func:`~swactor.model.block_kernels.dequant_expr`, or a
   dense matrix widened to f32) are written once as *panels* ``[rows / 32, cols, 32]``:
   32 output rows side by side for every input column, so the product reads each panel
   front to back. Each weight is widened once per product, not once per token row; the
   panels are a transient buffer (tinygrad's JIT memory planner reuses it from product to
   product: the panels kernel is made to depend on the product's input, so it runs just
   before its product), at most :data:`PANEL_LIMIT_BYTES` per kernel: a bigger matrix is
   cut into row groups.
2. **Product** (a hand-written C kernel, a tinygrad custom kernel on the clang renderer):
   for every panel, blocks of :data:`ROW_BLOCK` tokens keep ``ROW_BLOCK x 32`` sums in
   vector registers (``ext_vector_type(16)`` floats: AVX-512, two AVX2 or four NEON
   registers each) and stream the panel once per block, multiply-adding each token's
   input value into the 32 sums. Every output is one sum in input order (clang contracts
   the multiply-add into an FMA where the target has one), so results differ from
   tinygrad's reduction only in rounding.

The product is cut into *slices* of whole panels (output columns): the kernel takes
tinygrad's ``core_id`` variable (the slice, ``0 .. slices - 1``), as
:mod:`swactor.model.decode_gemv` does, so :class:`~swactor.model.cpu_graph.CpuGraph`
gives each slice a row of its table and the native replay pool runs the slices of one
product on several threads. A slice computes every token of its panels with the same
statements as any other slice, so an output does not depend on the cut or the thread
(bit-identical to the product in one slice). Slices are about :data:`SLICE_MACS`
multiply-adds (at least one panel): the pool hands rows out one at a time, so the
threads finish a product within about one slice of each other. The kernel also loads
one value of each input in tinygrad's IR (unused by the C), so the replay graph knows
it only reads them.

Q4_1 and Q8_0 block matrices skip the panels buffer (:func:`block_matmul`, when a
panel fits :data:`WIDE_LIMIT`): each slice widens its panels one at a time from the
blocks into a buffer on its own stack (a panel is ``cols x 32`` floats: 72 KiB for
SmolLM2's 576 columns, so it stays in the core's cache) and multiplies it with the same
product statements. The widening computes the numbers
:func:`~swactor.model.block_kernels.dequant_expr` does (``d * q`` is exact, ``+ m`` the
one rounding), so the product is bit-identical to the two-kernel one; it saves writing and
reading back every weight as f32 (on a SmolLM2 prefill of 128 rows, one core, the
panels kernels take a quarter of the two-kernel path's time).

The weights a kernel reads are the same numbers either way (the widening is bit-identical
to ``gguf.quants.dequantize``). Used for products of at least :data:`MIN_TOKENS` rows on a
CPU device whose renderer is clang, with ``rows`` a multiple of 32; anything else keeps
tinygrad's own matrix product.
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as Q
from tinygrad.device import Device
from tinygrad.dtype import dtypes
from tinygrad.renderer.cstyle import ClangRenderer
from tinygrad.tensor import Tensor
from tinygrad.uop import Ops
from tinygrad.uop.ops import KernelInfo, UOp

from swactor.model.c_f16 import widen_f16_c
from swactor.model.c_kernel import c_template, check_columns, first_element

PANEL = 32  # output rows per panel: two 16-float vectors
ROW_BLOCK = 4  # tokens per register block (4 x 32 sums: 8 AVX-512 registers)
MIN_TOKENS = 8  # below this a product is a handful of matrix-vector rows: tinygrad's path
PANEL_LIMIT_BYTES = 16 << 20  # widened weights one kernel writes at most
SLICE_MACS = 1 << 20  # about this many multiply-adds per slice (at least one panel)
WIDE_LIMIT = 1 << 20  # bytes of one panel a block product widens on a slice's stack
BLOCK = 32  # weights per Q4_1 / Q8_0 block
Q4_1, Q8_0 = int(Q.Q4_1), int(Q.Q8_0)


def usable(device: str, tokens: int, rows: int) -> bool:
    """Whether a ``[tokens, cols] @ [rows, cols].T`` product on ``device`` goes through
    the panel GEMM."""
    if tokens < MIN_TOKENS or rows % PANEL or not device.startswith("CPU"):
        return False
    return isinstance(Device[device].renderer, ClangRenderer)


def widens_blocks(type_id: int, cols: int) -> bool:
    """Whether a product over a block matrix of ``type_id`` with ``cols`` input columns
    widens its panels inside the product (:func:`block_matmul`), not into a panels
    buffer first."""
    return type_id in (Q4_1, Q8_0) and cols % BLOCK == 0 and cols * PANEL * 4 <= WIDE_LIMIT


def slice_panels(tokens: int, cols: int, rows: int) -> int:
    """Panels per slice: about :data:`SLICE_MACS` multiply-adds, at least one."""
    per = max(1, SLICE_MACS // max(1, tokens * cols * PANEL))
    return min(rows // PANEL, per)


def _product(tokens: int, cols: int, rows: int) -> list[str]:
    """C for one panel's product: output ``out[t, j]`` (``out`` the panel's first
    column, row stride ``rows``) for every token ``t`` and ``j < 32``, from ``x[t, :]``
    (row stride ``cols``) and the panel ``w`` (``[cols, 32]``)."""
    block = ROW_BLOCK
    sums = " ".join(f"v16 s{i}a = (v16)(0.0f), s{i}b = (v16)(0.0f);" for i in range(block))
    inputs = " ".join(f"float x{i} = xr[{i * cols} + k];" for i in range(block))
    fmas = " ".join(f"s{i}a += x{i} * wa; s{i}b += x{i} * wb;" for i in range(block))
    stores = " ".join(f"*(v16 *)(o + {i * rows}) = s{i}a; *(v16 *)(o + {i * rows} + 16) = s{i}b;"
                      for i in range(block))
    return [
        "int t = 0;",
        f"for (; t + {block} <= {tokens}; t += {block}) {{",
        f"  const float *xr = x + (long)t * {cols};",
        f"  {sums}",
        f"  for (int k = 0; k < {cols}; k++) {{",
        f"    v16 wa = *(const v16 *)(w + k * {PANEL}), wb = *(const v16 *)(w + k * {PANEL}"
        " + 16);",
        f"    {inputs}",
        f"    {fmas}",
        "  }",
        f"  float *o = out + (long)t * {rows};",
        f"  {stores}",
        "}",
        f"for (; t < {tokens}; t++) {{",
        f"  const float *xr = x + (long)t * {cols};",
        "  v16 sa = (v16)(0.0f), sb = (v16)(0.0f);",
        f"  for (int k = 0; k < {cols}; k++) {{",
        "    float xv = xr[k];",
        f"    sa += xv * *(const v16 *)(w + k * {PANEL});",
        f"    sb += xv * *(const v16 *)(w + k * {PANEL} + 16);",
        "  }",
        f"  float *o = out + (long)t * {rows};",
        "  *(v16 *)o = sa; *(v16 *)(o + 16) = sb;",
        "}",
    ]


def _template(lines: list[str], pointers: int) -> str:
    """``lines`` as a ``str.format`` template (tinygrad's CUSTOM op): braces doubled,
    ``@i`` the ``i``-th pointer, ``@s`` the slice index after them."""
    return c_template(lines, pointers).replace("@s", f"{{{pointers}}}")


def _slice_loop(panels: int, per_slice: int, body: list[str]) -> list[str]:
    """C running ``body`` for every panel ``p`` of the slice (``@s``)."""
    return [
        f"int first = (int)(@s) * {per_slice};",
        f"int last = first + {per_slice} < {panels} ? first + {per_slice} : {panels};",
        "for (int p = first; p < last; p++) {",
        *(f"  {line}" for line in body),
        "}",
    ]


_HEADER = ["typedef float v16 __attribute__((ext_vector_type(16), aligned(4)));"]


def gemm_source(tokens: int, cols: int, rows: int, per_slice: int) -> str:
    """The C statement of one slice's product, as a ``str.format`` template over the
    output, input and panels pointers and the slice index (``{0}``..``{3}``).

    For each panel ``p`` of the slice (panels ``slice * per_slice`` on, at most
    ``per_slice``), output ``out[t, p * 32 + j]`` for every token ``t`` of the
    ``[tokens, rows]`` output (row stride ``rows``), from ``x[t, :]`` (row stride
    ``cols``) and panel ``p``: the same statements for a panel whatever the slice."""
    body = [f"const float *w = wide + (long)p * {cols * PANEL};",
            f"float *out = out0 + (long)p * {PANEL};",
            *_product(tokens, cols, rows)]
    lines = ["{", *_HEADER, "float *out0 = @0;", "const float *x = @1;",
             "const float *wide = @2;", *_slice_loop(rows // PANEL, per_slice, body), "}"]
    return _template(lines, 3)


def _widen_panel(q4: bool, cols: int) -> list[str]:
    """C writing panel ``p`` of a Q4_1 or Q8_0 block matrix into ``wp`` (``[cols, 32]``
    floats): ``d * q`` (plus ``m`` for Q4_1), the numbers
    :func:`~swactor.model.block_kernels.dequant_expr` computes, the f16 scales widened
    with its exact integer bit moves. ``d * q`` is exact in float32 (an 11-bit by an at
    most 8-bit significand), so ``+ m`` is the one rounding whether or not clang
    contracts the two into an FMA."""
    blocks = cols // BLOCK

    def half(name: str, pointer: str) -> list[str]:
        return [f"float {name};", widen_f16_c(f"{pointer}[b]", name)]

    if q4:
        codes = [
            f"const unsigned char *q = qs + b * {BLOCK // 2};",
            f"for (int i = 0; i < {BLOCK // 2}; i++) {{",
            f"  dst[i * {PANEL}] = (float)(q[i] & 15) * d + m;",
            f"  dst[(i + {BLOCK // 2}) * {PANEL}] = (float)(q[i] >> 4) * d + m;",
            "}",
        ]
    else:
        codes = [
            f"const signed char *q = qs + b * {BLOCK};",
            f"for (int i = 0; i < {BLOCK}; i++) dst[i * {PANEL}] = (float)q[i] * d;",
        ]
    return [
        f"for (int k = 0; k < {blocks}; k++) {{",
        f"  for (int j = 0; j < {PANEL}; j++) {{",
        f"    long b = ((long)p * {PANEL} + j) * {blocks} + k;",
        f"    float *dst = wp + k * {BLOCK * PANEL} + j;",
        *(f"    {line}" for line in half("d", "dp")),
        *((f"    {line}" for line in half("m", "mp")) if q4 else ()),
        *(f"    {line}" for line in codes),
        "  }",
        "}",
    ]


def block_gemm_source(type_id: int, tokens: int, cols: int, rows: int, per_slice: int) -> str:
    """:func:`gemm_source` for a Q4_1 or Q8_0 block matrix: a ``str.format`` template
    over the output, input, codes, scales (and Q4_1 mins) pointers, then the slice index.
    Each panel is widened into the slice's own buffer (on its stack, :data:`WIDE_LIMIT`
    bytes at most) just before its product, which is :func:`gemm_source`'s."""
    q4 = type_id == Q4_1
    scalar = "const unsigned char" if q4 else "const signed char"
    body = [f"float *out = out0 + (long)p * {PANEL};",
            *_widen_panel(q4, cols),
            "const float *w = wp;",
            *_product(tokens, cols, rows)]
    lines = [
        "{", *_HEADER, "float *out0 = @0;", "const float *x = @1;",
        f"{scalar} *qs = ({scalar} *)(@2);",
        "const unsigned short *dp = (const unsigned short *)(@3);",
        *(["const unsigned short *mp = (const unsigned short *)(@4);"] if q4 else []),
        f"float wp[{cols * PANEL}] __attribute__((aligned(64)));",
        *_slice_loop(rows // PANEL, per_slice, body),
        "}",
    ]
    return _template(lines, 5 if q4 else 4)


def _panels_product(x: Tensor, weights: Tensor) -> Tensor:
    """``x @ weights.T`` through panels for one row group (``rows`` a multiple of 32)."""
    rows, cols = (int(s) for s in weights.shape)
    tokens = int(x.shape[0])
    # the panels kernel reads one input value it cannot use (|x| < 0 is never true, so
    # every weight gets + 0.0): without a dependency on the input, tinygrad schedules
    # every product's panels kernel at the start of a graph, all panels are alive at
    # once and the JIT's memory plan holds every weight widened (SmolLM2: 426 MB)
    never = (x[0:1, 0:1].abs() < 0).where(1.0, 0.0).reshape(1, 1, 1)
    panels = (weights.reshape(rows // PANEL, PANEL, cols).permute(0, 2, 1) + never).contiguous()
    per_slice = slice_panels(tokens, cols, rows)
    slices = -(-(rows // PANEL) // per_slice)
    code = gemm_source(tokens, cols, rows, per_slice)
    name = f"prefill_gemm_{tokens}_{cols}_{rows}"

    def kernel(out: UOp, inputs: UOp, wide: UOp) -> UOp:
        core = UOp.variable("core_id", 0, slices - 1, dtypes.int, param=True)
        pointers = (first_element(out), first_element(inputs), first_element(wide))
        # a plain load of each input's first element, unused: ProgramInfo then lists
        # the inputs as read, so the replay graph knows the kernel only reads them
        reads = tuple(p.load() for p in pointers[1:])
        body = UOp(Ops.CUSTOM, src=(*pointers, core, *reads), arg=code)
        kernel_sink: UOp = body.sink(arg=KernelInfo(name=name, opts_to_apply=()))
        return kernel_sink

    out = Tensor.empty(tokens, rows, dtype=dtypes.float32, device=x.device)
    return out.custom_kernel(x, panels, fxn=kernel)[0]


def panel_matmul(x: Tensor, weights: Tensor) -> Tensor:
    """``x @ weights.T`` for ``x`` ``float32 [tokens, cols]`` and a lazy ``float32
    [rows, cols]`` expression ``weights`` (:func:`usable` said yes)."""
    rows, cols = (int(s) for s in weights.shape)
    check_columns(x, cols)
    x = x.float().contiguous()
    group = max(PANEL, PANEL_LIMIT_BYTES // (4 * cols) // PANEL * PANEL)
    if rows <= group:
        return _panels_product(x, weights)
    parts = [_panels_product(x, weights[start : min(rows, start + group)])
             for start in range(0, rows, group)]
    return parts[0].cat(*parts[1:], dim=-1)


def block_matmul(x: Tensor, type_id: int, shape: tuple[int, int],
                 fields: dict[str, Tensor]) -> Tensor:
    """``x @ W.T`` for ``x`` ``float32 [tokens, cols]`` and a Q4_1 or Q8_0 block matrix
    ``W`` ``[rows, cols]`` (its ``qs``, ``d`` and, Q4_1, ``m`` arrays;
    :func:`widens_blocks` and :func:`usable` said yes): one kernel whose slices widen
    each of their panels on their own stack and multiply it, no panels buffer."""
    rows, cols = shape
    check_columns(x, cols)
    x = x.float().contiguous()
    tokens = int(x.shape[0])
    q4 = type_id == Q4_1
    per_slice = slice_panels(tokens, cols, rows)
    slices = -(-(rows // PANEL) // per_slice)
    code = block_gemm_source(type_id, tokens, cols, rows, per_slice)
    name = f"prefill_gemm_{Q(type_id).name.lower()}_{tokens}_{cols}_{rows}"
    arrays = [fields["qs"], fields["d"]] + ([fields["m"]] if q4 else [])

    def kernel(out: UOp, inputs: UOp, *blocks: UOp) -> UOp:
        core = UOp.variable("core_id", 0, slices - 1, dtypes.int, param=True)
        pointers = (first_element(out), first_element(inputs),
                    *(first_element(b) for b in blocks))
        # unused loads: the inputs listed as read (see _panels_product)
        reads = tuple(p.load() for p in pointers[1:])
        body = UOp(Ops.CUSTOM, src=(*pointers, core, *reads), arg=code)
        sink: UOp = body.sink(arg=KernelInfo(name=name, opts_to_apply=()))
        return sink

    out = Tensor.empty(tokens, rows, dtype=dtypes.float32, device=x.device)
    return out.custom_kernel(x, *arrays, fxn=kernel)[0]
