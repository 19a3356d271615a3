"""Typed planner errors: a plan that cannot be built is a `PlannerError` naming why.

Theory of operation. Planning happens before the run machine exists (spec §13: "plan
validation failures are planner errors and are not FSM states"). Every rule the planner
checks raises `PlannerError(reason, detail)`: `reason` is a stable `PlanProblem`
member a caller or test can match, `detail` is one human line. Nothing here carries
payload bytes.
"""

from __future__ import annotations

import enum

from swactor.wire.errors import ReasonError


class PlanProblem(enum.Enum):
    """Which planning rule a request broke."""

    EmptyPool = "EmptyPool"
    DuplicateNode = "DuplicateNode"
    NodeInvalid = "NodeInvalid"
    ZeroMemoryNode = "ZeroMemoryNode"
    PoolFileInvalid = "PoolFileInvalid"
    ModelUnreadable = "ModelUnreadable"
    UnsupportedArchitecture = "UnsupportedArchitecture"
    UnsupportedTensorType = "UnsupportedTensorType"
    UnsupportedTokenizer = "UnsupportedTokenizer"
    TooManyStages = "TooManyStages"
    SplitInvalid = "SplitInvalid"
    SplitSumMismatch = "SplitSumMismatch"
    SplitNodeCountMismatch = "SplitNodeCountMismatch"
    MaxTokensInvalid = "MaxTokensInvalid"
    MaxSeqLenInvalid = "MaxSeqLenInvalid"
    PromptTooLong = "PromptTooLong"
    NodeMemoryTooSmall = "NodeMemoryTooSmall"
    EdgeIdRange = "EdgeIdRange"
    PlanRejected = "PlanRejected"


class PlannerError(ReasonError[PlanProblem], ValueError):
    """A run plan cannot be built; `reason` says which rule, `detail` (and `str()`) why."""
