"""Dequantisation of GGUF tensor bytes, once at load, into the plan's compute dtype.

Theory of operation: a stage reads each tensor's raw bytes and calls :func:`dequantize`
exactly once; the result is a C-contiguous numpy array in numpy shape order (GGUF lists
dimensions innermost first; we reverse them) and in the compute dtype (``float32`` or
``float16``). F32/F16 are reinterpreted directly; block-quantised types go through
``gguf.quants.dequantize`` (vectorised numpy, ~1 s for all of SmolLM2-135M on one core).
Only the types in :data:`SUPPORTED_TYPES` are accepted; the reader rejects others with
``UnsupportedTensorType`` before reading any tensor bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from gguf import GGMLQuantizationType as Q
from gguf import quants

SUPPORTED_TYPES: frozenset[int] = frozenset(
    int(t)
    for t in (
        Q.F32,
        Q.F16,
        Q.BF16,
        Q.Q4_0,
        Q.Q4_1,
        Q.Q5_0,
        Q.Q5_1,
        Q.Q8_0,
        Q.Q2_K,
        Q.Q3_K,
        Q.Q4_K,
        Q.Q5_K,
        Q.Q6_K,
    )
)


def dequantize(
    raw: npt.NDArray[np.uint8],
    type_id: int,
    shape: tuple[int, ...],
    target: type[np.floating[Any]],
) -> npt.NDArray[Any]:
    """Turn one tensor's raw bytes into a ``shape``-shaped array of ``target`` dtype."""
    qtype = Q(type_id)
    if qtype == Q.F32:
        values: npt.NDArray[Any] = raw.view(np.float32)
    elif qtype == Q.F16:
        values = raw.view(np.float16)
    else:
        rows = quants.quant_shape_to_byte_shape(shape, qtype)
        values = quants.dequantize(raw.reshape(rows), qtype)
    return np.ascontiguousarray(values.reshape(shape), dtype=target)
