"""The C statement that widens an f16 bit pattern to float32, for the hand-written
kernels (:mod:`swactor.model.decode_gemv`, :mod:`swactor.model.prefill_gemm`).

The same exact integer bit moves as :func:`swactor.model.block_kernels.widen_f16`: sign
to bit 31, exponent and mantissa shifted by 13, then a multiply by ``2**112`` that
rebiases the exponent; exact for every finite f16, subnormals included.
"""

from __future__ import annotations


def widen_f16_c(bits: str, target: str) -> str:
    """A C block assigning ``target`` the float32 value of the f16 bit pattern ``bits``
    (a C expression of an unsigned 16-bit value)."""
    return (f"{{ unsigned u_ = {bits}; u_ = ((u_ & 0x8000u) << 16) | ((u_ & 0x7fffu) << 13);"
            f" float f_; __builtin_memcpy(&f_, &u_, 4); {target} = f_ * 0x1p112f; }}")
