"""One call from a stage plan to a ready role, and the byte form of step objects.

Theory of operation: a worker's ``ConfigureRole`` (spec §29) knows the GGUF location, the
layer range, whether the stage is first/last, the plan's dtype family and
``max_seq_len``, and the sampling policy. :func:`load_stage_role` opens the source (local
path or HTTP Range, optionally through the content-addressed cache), validates the plan
against the file, reads and dequantises the stage's tensors and builds the
:class:`~swactor.model.llama_role.StageRole`; it returns the role and a
:class:`LoadReport` of byte counts for the ``WeightsReady`` event. Failures are
:class:`~swactor.model.errors.WeightsError`.

Ring payloads are bytes. :func:`input_from_bytes` turns an input object's payload into the
array ``step`` takes (int32 ids for stage 0, ``[tokens, hidden]`` in the plan dtype
otherwise; a payload whose size is not a whole number of rows is a ``StepError``), and
``output.tobytes()`` (C order) is the output object's payload, of ``output.nbytes`` bytes
(:func:`object_extent` gives the same number from a token count).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from swactor.model.gguf_range import open_reader
from swactor.model.llama_role import NP_DTYPES, StageRole, StepError
from swactor.model.sampling import SamplingPolicy


@dataclass(frozen=True)
class LoadReport:
    """What loading one stage cost, for the ``WeightsReady`` event and the benchmark."""

    header_bytes: int
    tensor_bytes: int
    bytes_read: int
    file_size: int
    ranges: int


def load_stage_role(
    location: str | os.PathLike[str],
    *,
    layer_start: int,
    layer_end: int,
    is_first: bool,
    is_last: bool,
    dtype: str,
    max_seq_len: int,
    sampling: SamplingPolicy | None = None,
    num_layers: int | None = None,
    hidden_dim: int | None = None,
    digest: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    device: str | None = None,
    beam: int = 0,
) -> tuple[StageRole, LoadReport]:
    """Validate the plan against the file, load the range, build the role."""
    reader = open_reader(location, digest=digest, cache_dir=cache_dir)
    weights = reader.load_stage(
        layer_start,
        layer_end,
        is_first=is_first,
        is_last=is_last,
        dtype=dtype,
        max_seq_len=max_seq_len,
        num_layers=num_layers,
        hidden_dim=hidden_dim,
    )
    role = StageRole(
        weights, max_seq_len=max_seq_len, sampling=sampling, device=device, beam=beam
    )
    report = LoadReport(
        header_bytes=reader.header_bytes,
        tensor_bytes=weights.tensor_bytes,
        bytes_read=reader.source.bytes_read,
        file_size=reader.file_size,
        ranges=len(weights.ranges),
    )
    return role, report


def object_extent(tokens: int, *, hidden_dim: int, dtype: str, is_token: bool) -> int:
    """Payload bytes of an object: ``tokens * 4`` for ids, ``tokens * hidden * width``."""
    if is_token:
        return tokens * 4
    return tokens * hidden_dim * np.dtype(NP_DTYPES[dtype]).itemsize


def input_from_bytes(role: StageRole, payload: bytes | memoryview) -> npt.NDArray[Any]:
    """The array ``role.step`` takes, viewed over an input object's payload bytes."""
    if role.is_first:
        dtype: np.dtype[Any] = np.dtype("<i4")
        row = dtype.itemsize
    else:
        dtype = np.dtype(NP_DTYPES[role.dtype]).newbyteorder("<")
        row = dtype.itemsize * role.facts.hidden_dim
    size = len(payload) if isinstance(payload, bytes) else payload.nbytes
    if size == 0 or size % row:
        raise StepError(f"payload of {size} bytes is not a whole number of {row}-byte rows")
    array = np.frombuffer(payload, dtype=dtype)
    return array if role.is_first else array.reshape(-1, role.facts.hidden_dim)
