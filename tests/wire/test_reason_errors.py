"""Every error that carries a typed reason shares one base and one spelling.

`ReasonError` gives `reason` (an enum member), `detail` (one line) and `str()` as
`Reason: detail`; the errors below are all of that shape, and their reason enums spell
every member as its value (CamelCase), as the spec's enums do.
"""

from __future__ import annotations

import enum
from typing import Any

import pytest

from swactor.arena import ArenaError
from swactor.model.errors import WeightsError, WeightsFault
from swactor.model.tokenizer_errors import TokenizerError, TokenizerFault
from swactor.orchestrator.errors import PlannerError, PlanProblem
from swactor.transport.control import ControlRejectedError, RejectCode
from swactor.transport.errors import ControlError
from swactor.wire import ArenaFailure, ReasonError, RunFaultError, RunFaultReason

CASES: list[tuple[type[ReasonError[Any]], type[enum.Enum]]] = [
    (WeightsError, WeightsFault),
    (TokenizerError, TokenizerFault),
    (PlannerError, PlanProblem),
    (ArenaError, ArenaFailure),
    (RunFaultError, RunFaultReason),
]


@pytest.mark.parametrize(("error", "reasons"), CASES)
def test_one_base_one_spelling(error: type[ReasonError[Any]],
                               reasons: type[enum.Enum]) -> None:
    member = next(iter(reasons))
    raised = error(member, "what went wrong")
    assert isinstance(raised, ReasonError)
    assert (raised.reason, raised.detail) == (member, "what went wrong")
    assert str(raised) == f"{member.value}: what went wrong"
    assert [m.name for m in reasons] == [m.value for m in reasons]


def test_a_planner_error_is_still_a_value_error() -> None:
    with pytest.raises(ValueError, match="EmptyPool: no nodes"):
        raise PlannerError(PlanProblem.EmptyPool, "no nodes")


def test_a_control_refusal_has_the_same_reason_and_detail() -> None:
    refused = ControlRejectedError(RejectCode.Unauthorized, "not the orchestrator")
    assert isinstance(refused, ReasonError) and isinstance(refused, ControlError)
    assert (refused.reason, refused.detail) == (RejectCode.Unauthorized, "not the orchestrator")
    assert str(refused) == "control request rejected (Unauthorized): not the orchestrator"
    assert [m.name for m in RejectCode] == [m.value for m in RejectCode]
