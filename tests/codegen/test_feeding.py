"""EventFeeder: events fed while effects are carried out queue behind the current one."""

from __future__ import annotations

import pytest

from swactor.fsm.feeding import EventFeeder


class Recorder:
    """A stand-in machine: event n answers effects (n, 0), (n, 1); a binding that feeds
    n + 10 from the first effect of events below 10, and fails on event 99's first
    effect and on event 7's second."""

    def __init__(self) -> None:
        self.handled: list[int] = []
        self.carried: list[tuple[int, int]] = []
        self.feeder: EventFeeder[int, tuple[int, int]] = EventFeeder(self.handle, self.carry)

    def handle(self, event: int) -> list[tuple[int, int]]:
        self.handled.append(event)
        return [(event, 0), (event, 1)]

    def carry(self, effect: tuple[int, int]) -> None:
        self.carried.append(effect)
        event, index = effect
        if event == 99 or effect == (7, 1):
            raise RuntimeError("effect failed")
        if event < 10 and index == 0:
            self.feeder.feed(event + 10)


def test_an_event_fed_from_an_effect_waits_for_the_current_events_effects() -> None:
    rec = Recorder()
    rec.feeder.feed(1)
    assert rec.handled == [1, 11]
    assert rec.carried == [(1, 0), (1, 1), (11, 0), (11, 1)]


def test_a_failing_effect_propagates_and_the_feeder_keeps_working() -> None:
    rec = Recorder()
    with pytest.raises(RuntimeError):
        rec.feeder.feed(99)
    rec.feeder.feed(2)
    assert rec.handled == [99, 2, 12]
    assert rec.carried == [(99, 0), (2, 0), (2, 1), (12, 0), (12, 1)]


def test_events_queued_before_a_failure_are_handled_first_by_the_next_feed() -> None:
    rec = Recorder()
    with pytest.raises(RuntimeError):
        rec.feeder.feed(7)  # (7, 0) queues 17, then (7, 1) fails
    assert rec.handled == [7]
    rec.feeder.feed(3)
    assert rec.handled == [7, 17, 3, 13]
