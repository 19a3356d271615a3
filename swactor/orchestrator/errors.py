"""Typed planner errors: a plan that cannot be built is a `PlannerError` naming why.

Theory of operation. Planning happens before the run machine exists (spec §13: "plan
validation failures are planner errors and are not FSM states"). Every rule the planner
checks raises `PlannerError(problem, message)`: `problem` is a stable `PlanProblem`
member a caller or test can match, the message is one human line. Nothing here carries
payload bytes.
"""

from __future__ import annotations

import enum


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


class PlannerError(ValueError):
    """A run plan cannot be built; `problem` says which rule, `str()` says why."""

    def __init__(self, problem: PlanProblem, message: str) -> None:
        super().__init__(f"{problem.value}: {message}")
        self.problem = problem
        self.message = message
