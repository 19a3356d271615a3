"""Typed weight faults (spec §15, §36): every way a stage can fail to obtain its layer range.

Theory of operation: the range reader, the sources and the stage role never let a raw
``OSError``/``ValueError``/``urllib`` exception escape to the caller. Each failure is mapped
to exactly one :class:`WeightsFault` reason and raised as :class:`WeightsError`, whose message
names the problem (file, tensor, offset, expected vs. found) but never carries payload bytes.
A StageController turns a ``WeightsError`` into a stage fault with ``error.reason``.
"""

from __future__ import annotations

import enum


class WeightsFault(enum.Enum):
    """Why a stage could not obtain, parse or bind its assigned weights."""

    LAYER_RANGE_INVALID = "LayerRangeInvalid"
    TRUNCATED = "Truncated"
    CORRUPT_HEADER = "CorruptHeader"
    UNSUPPORTED_TENSOR_TYPE = "UnsupportedTensorType"
    UNSUPPORTED_ARCHITECTURE = "UnsupportedArchitecture"
    MISSING_TENSOR = "MissingTensor"
    PLAN_MISMATCH = "PlanMismatch"
    DOWNLOAD_FAILED = "DownloadFailed"
    CACHE_CORRUPT = "CacheCorrupt"
    SOURCE_INVALID = "SourceInvalid"
    DIGEST_MISMATCH = "DigestMismatch"


class WeightsError(Exception):
    """A weight download/parse/validate/bind failure with a typed reason."""

    def __init__(self, reason: WeightsFault, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail
