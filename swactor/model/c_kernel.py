"""What every hand-written clang kernel (:mod:`~swactor.model.decode_gemv`,
:mod:`~swactor.model.decode_attention`, :mod:`~swactor.model.gated`,
:mod:`~swactor.model.prefill_gemm`) needs to become a tinygrad CUSTOM op.

A CUSTOM op's argument is a ``str.format`` template whose fields ``{0}``, ``{1}``, ...
are its sources (pointers, the slice index). The kernels are written as lines of C
with ``@0``, ``@1``, ... for those fields, so C's own braces stay readable;
:func:`c_template` doubles the braces and turns the ``@i`` into fields. A buffer is
handed to the C as a pointer to its first element (:func:`first_element`). The C reads
as many values per row as its shape says, with no bound of its own, so a product checks
its input's width first (:func:`check_columns`).
"""

from __future__ import annotations

from tinygrad.dtype import dtypes
from tinygrad.tensor import Tensor
from tinygrad.uop.ops import UOp


def c_template(lines: list[str], fields: int) -> str:
    """``lines`` as a CUSTOM op's template: braces doubled, ``@i`` (``i < fields``) the
    ``i``-th field."""
    text = "\n".join(lines).replace("{", "{{").replace("}", "}}")
    for index in range(fields):
        text = text.replace(f"@{index}", f"{{{index}}}")
    return text


def first_element(buffer: UOp) -> UOp:
    """``buffer``'s first element (a pointer to the buffer in the custom C)."""
    zero = UOp.const(0, dtypes.weakint)
    first: UOp = buffer.index(*([zero] * len(buffer.shape)))
    return first


def check_columns(x: Tensor, cols: int) -> None:
    """Refuse an input that is not ``[rows, cols]``: a kernel built for ``cols`` would read
    each row of a narrower one past its end."""
    if len(x.shape) != 2 or int(x.shape[1]) != cols:
        raise ValueError(f"input of shape {tuple(x.shape)} for a product over {cols} "
                         "columns: [rows, cols] needed")
