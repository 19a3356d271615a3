"""Typed weight faults (spec §15, §36): every way a stage can fail to obtain its layer range.

Theory of operation: the range reader, the sources and the stage role never let a raw
``OSError``/``ValueError``/``urllib`` exception escape to the caller. Each failure is mapped
to exactly one :class:`WeightsFault` reason and raised as :class:`WeightsError`, whose message
names the problem (file, tensor, offset, expected vs. found) but never carries payload bytes.
A StageController turns a ``WeightsError`` into a stage fault with ``error.reason``.
"""

from __future__ import annotations

import enum

from swactor.wire.errors import ReasonError


class WeightsFault(enum.Enum):
    """Why a stage could not obtain, parse or bind its assigned weights."""

    LayerRangeInvalid = "LayerRangeInvalid"
    Truncated = "Truncated"
    CorruptHeader = "CorruptHeader"
    UnsupportedTensorType = "UnsupportedTensorType"
    UnsupportedArchitecture = "UnsupportedArchitecture"
    MissingTensor = "MissingTensor"
    PlanMismatch = "PlanMismatch"
    DownloadFailed = "DownloadFailed"
    CacheCorrupt = "CacheCorrupt"
    SourceInvalid = "SourceInvalid"
    DigestMismatch = "DigestMismatch"


class WeightsError(ReasonError[WeightsFault]):
    """A weight download/parse/validate/bind failure with a typed reason."""
