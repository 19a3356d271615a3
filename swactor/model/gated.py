"""The gated activation of a feed-forward block on CPU, ``silu(g) * u``: one hand-written
C kernel for any number of rows.

Theory of operation. A block's feed-forward runs one product for the gate and up
projections together (``gate_up`` ``[R, 2 F]``: per row the ``F`` gate features, then
the ``F`` up features) and then multiplies ``silu(g) = g / (1 + exp(-g))`` by ``u``
feature by feature into ``hidden`` ``[R, F]``, the down projection's input. Written as a
tinygrad expression, a one-row kernel is one loop clang turns into vector code, but for
``R > 1`` rows tinygrad upcasts the feature axis by 4 and the kernel computes every
exponential in scalar code: 25 us per block at 4 rows against 0.7 us at one row on
SmolLM2 (``F`` = 1536), a quarter of a 4-row decode step's single-threaded time, and the
same per row in a prompt's prefill.

Here it is one tinygrad custom kernel on the clang renderer, cut into ``R`` slices (the
``core_id`` variable, as :mod:`swactor.model.decode_gemv`: the replay pool runs the rows
on several threads), each slice one row in 16-float vectors (``ext_vector_type(16)``:
one AVX-512, two AVX2 or four NEON registers). Per vector of gate features ``g``:
``x = -g`` clamped to ``[-88, 88]``, ``e = exp(x)`` by Cody-Waite reduction and Cephes'
``expf`` polynomial (about one ulp; the statements of
:mod:`swactor.model.decode_attention`'s softmax) with ``e = 0`` where ``-g < -87.33654``
(``exp`` below ``2**-126``: ``silu(g) = g``) and ``e = inf`` where ``-g > 88``
(``silu(g) = -0``, where the true value is below ``1e-36`` in magnitude), then
``hidden = (g / (1 + e)) * u``. Every feature is
computed by the same statements whatever ``R``, the slice or the thread, so a row is
bit-identical wherever it runs: alone, in a batched decode step, in a prompt.

Used on a CPU device whose renderer is clang for float32 ``gate_up`` with ``F`` a
multiple of 16 (:func:`usable`); elsewhere the role keeps the tinygrad expression.
"""

from __future__ import annotations

from tinygrad.device import Device
from tinygrad.dtype import dtypes
from tinygrad.renderer.cstyle import ClangRenderer
from tinygrad.tensor import Tensor
from tinygrad.uop import Ops
from tinygrad.uop.ops import KernelInfo, UOp

from swactor.model.c_kernel import c_template, first_element

ENABLED = True
"""Whether CPU roles take this kernel (benchmarks switch it off to compare with the
tinygrad expression side by side)."""
WIDTH = 16  # floats per vector


def usable(device: str, ffn: int) -> bool:
    """Whether the gated activation of ``ffn`` features on ``device`` runs through this
    kernel."""
    if not ENABLED or ffn % WIDTH or not device.startswith("CPU"):
        return False
    return isinstance(Device[device].renderer, ClangRenderer)


def gated_source(ffn: int) -> str:
    """The C statement of one slice (a ``str.format`` template over the output,
    ``gate_up`` and the slice index): row ``core_id``'s ``ffn`` outputs."""
    body = [
        "{",
        f"typedef float vf __attribute__((ext_vector_type({WIDTH}), aligned(4)));",
        f"typedef int vi __attribute__((ext_vector_type({WIDTH}), aligned(4)));",
        "float *out = @0;",
        "int row = (int)(@2);",
        f"const float *g = @1 + (long)row * {2 * ffn};",
        f"const float *u = g + {ffn};",
        f"float *o = out + (long)row * {ffn};",
        f"for (int i = 0; i < {ffn}; i += {WIDTH}) {{",
        "  vf gv = *(const vf *)(g + i);",
        "  vf xr = -gv;",
        "  vf x = __builtin_elementwise_max(__builtin_elementwise_min(xr, (vf)(88.0f)),"
        " (vf)(-88.0f));",
        # n = round(x / ln 2) (1.5 * 2**23 rounds to an integer), r = x - n ln 2 in two
        # steps (Cody-Waite), exp(r) by Cephes' expf polynomial, times 2**n in the bits
        "  vf n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;",
        "  vf r = x - n * 0.693359375f;",
        "  r = r - n * -2.12194440e-4f;",
        "  vf p = (vf)(1.9875691500e-4f);",
        "  p = p * r + 1.3981999507e-3f;",
        "  p = p * r + 8.3334519073e-3f;",
        "  p = p * r + 4.1665795894e-2f;",
        "  p = p * r + 1.6666665459e-1f;",
        "  p = p * r + 5.0000001201e-1f;",
        "  p = p * (r * r) + r + 1.0f;",
        "  vi bits = (__builtin_convertvector(n, vi) + 127) << 23;",
        # exp below 2**-126 (-g < -87.33654) is 0: silu(g) = g there; above exp(88)
        # (-g > 88) it is infinite: silu(g) = -0
        "  vi keep = (vi)(x >= -87.33654f), over = (vi)(xr > 88.0f);",
        "  vf e = (vf)((((vi)(p * (vf)bits)) & keep & ~over) | (over & 0x7f800000));",
        "  *(vf *)(o + i) = (gv / (1.0f + e)) * *(const vf *)(u + i);",
        "}",
        "}",
    ]
    return c_template(body, 3)


def silu_mul(gate_up: Tensor, ffn: int) -> Tensor:
    """``silu(gate_up[:, :ffn]) * gate_up[:, ffn:]`` for ``gate_up`` ``float32 [R, 2
    ffn]`` (:func:`usable` said yes): ``float32 [R, ffn]``, one kernel of ``R`` slices."""
    rows = int(gate_up.shape[0])
    if int(gate_up.shape[1]) != 2 * ffn:
        raise ValueError(f"gate_up {tuple(gate_up.shape)} is not [rows, 2 * {ffn}]")
    code = gated_source(ffn)

    def kernel(out: UOp, source: UOp) -> UOp:
        core = UOp.variable("core_id", 0, rows - 1, dtypes.int, param=True)
        # a plain load of the input's first element, unused: ProgramInfo then lists it
        # as read, so the replay graph knows the kernel only reads it
        body = UOp(Ops.CUSTOM, src=(first_element(out), first_element(source), core,
                                    first_element(source).load()), arg=code)
        sink: UOp = body.sink(arg=KernelInfo(name=f"silu_mul_{rows}_{ffn}",
                                             opts_to_apply=()))
        return sink

    out = Tensor.empty(rows, ffn, dtype=dtypes.float32, device=gate_up.device)
    return out.custom_kernel(gate_up.float().contiguous(), fxn=kernel)[0]
