"""Prefill matrix products on tinygrad's CPU device: weights widened once, then a tiled GEMM.

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

The weights a kernel reads are the same numbers either way (the widening is bit-identical
to ``gguf.quants.dequantize``). Used for products of at least :data:`MIN_TOKENS` rows on a
CPU device whose renderer is clang, with ``rows`` a multiple of 32; anything else keeps
tinygrad's own matrix product.
"""

from __future__ import annotations

from tinygrad.device import Device
from tinygrad.dtype import dtypes
from tinygrad.renderer.cstyle import ClangRenderer
from tinygrad.tensor import Tensor
from tinygrad.uop import Ops
from tinygrad.uop.ops import KernelInfo, UOp

PANEL = 32  # output rows per panel: two 16-float vectors
ROW_BLOCK = 4  # tokens per register block (4 x 32 sums: 8 AVX-512 registers)
MIN_TOKENS = 8  # below this a product is a handful of matrix-vector rows: tinygrad's path
PANEL_LIMIT_BYTES = 16 << 20  # widened weights one kernel writes at most
SLICE_MACS = 1 << 20  # about this many multiply-adds per slice (at least one panel)


def usable(device: str, tokens: int, rows: int) -> bool:
    """Whether a ``[tokens, cols] @ [rows, cols].T`` product on ``device`` goes through
    the panel GEMM."""
    if tokens < MIN_TOKENS or rows % PANEL or not device.startswith("CPU"):
        return False
    return isinstance(Device[device].renderer, ClangRenderer)


def slice_panels(tokens: int, cols: int, rows: int) -> int:
    """Panels per slice: about :data:`SLICE_MACS` multiply-adds, at least one."""
    per = max(1, SLICE_MACS // max(1, tokens * cols * PANEL))
    return min(rows // PANEL, per)


def gemm_source(tokens: int, cols: int, rows: int, per_slice: int) -> str:
    """The C statement of one slice's product, as a ``str.format`` template over the
    output, input and panels pointers and the slice index (``{0}``..``{3}``).

    For each panel ``p`` of the slice (panels ``slice * per_slice`` on, at most
    ``per_slice``), output ``out[t, p * 32 + j]`` for every token ``t`` of the
    ``[tokens, rows]`` output (row stride ``rows``), from ``x[t, :]`` (row stride
    ``cols``) and panel ``p``: the same statements for a panel whatever the slice."""
    block = ROW_BLOCK
    panels = rows // PANEL
    sums = " ".join(f"v16 s{i}a = (v16)(0.0f), s{i}b = (v16)(0.0f);" for i in range(block))
    inputs = " ".join(f"float x{i} = xr[{i * cols} + k];" for i in range(block))
    fmas = " ".join(f"s{i}a += x{i} * wa; s{i}b += x{i} * wb;" for i in range(block))
    stores = " ".join(f"*(v16 *)(o + {i * rows}) = s{i}a; *(v16 *)(o + {i * rows} + 16) = s{i}b;"
                      for i in range(block))
    # doubled braces: the template goes through str.format (tinygrad's CUSTOM op)
    return (
        "{{ typedef float v16 __attribute__((ext_vector_type(16), aligned(4)));\n"
        f"  int first = (int)({{3}}) * {per_slice};\n"
        f"  int last = first + {per_slice} < {panels} ? first + {per_slice} : {panels};\n"
        "  for (int p = first; p < last; p++) {{\n"
        f"  const float *w = {{2}} + (long)p * {cols * PANEL};\n"
        f"  float *out = {{0}} + (long)p * {PANEL};\n"
        "  int t = 0;\n"
        f"  for (; t + {block} <= {tokens}; t += {block}) {{{{\n"
        f"    const float *xr = {{1}} + (long)t * {cols};\n"
        f"    {sums}\n"
        f"    for (int k = 0; k < {cols}; k++) {{{{\n"
        f"      v16 wa = *(const v16 *)(w + k * {PANEL}), wb = *(const v16 *)(w + k * {PANEL}"
        " + 16);\n"
        f"      {inputs}\n"
        f"      {fmas}\n"
        "    }}\n"
        f"    float *o = out + (long)t * {rows};\n"
        f"    {stores}\n"
        "  }}\n"
        f"  for (; t < {tokens}; t++) {{{{\n"
        f"    const float *xr = {{1}} + (long)t * {cols};\n"
        "    v16 sa = (v16)(0.0f), sb = (v16)(0.0f);\n"
        f"    for (int k = 0; k < {cols}; k++) {{{{\n"
        "      float xv = xr[k];\n"
        f"      sa += xv * *(const v16 *)(w + k * {PANEL});\n"
        f"      sb += xv * *(const v16 *)(w + k * {PANEL} + 16);\n"
        "    }}\n"
        f"    float *o = out + (long)t * {rows};\n"
        "    *(v16 *)o = sa; *(v16 *)(o + 16) = sb;\n"
        "  }}\n"
        "  }}\n"
        "}}"
    )


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
        zero = UOp.const(0, dtypes.weakint)
        core = UOp.variable("core_id", 0, slices - 1, dtypes.int, param=True)
        pointers = (out.index(zero, zero), inputs.index(zero, zero),
                    wide.index(zero, zero, zero))
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
    x = x.float().contiguous()
    group = max(PANEL, PANEL_LIMIT_BYTES // (4 * cols) // PANEL * PANEL)
    if rows <= group:
        return _panels_product(x, weights)
    parts = [_panels_product(x, weights[start : min(rows, start + group)])
             for start in range(0, rows, group)]
    return parts[0].cat(*parts[1:], dim=-1)
