"""How a serving run spreads ready decode rows over its objects in flight
(`swactor.orchestrator.spread`), by counts alone, and over many round trips."""

from __future__ import annotations

from collections import Counter, deque

import pytest

from swactor.orchestrator.spread import decode_objects_wanted, next_batch_rows


def turn(queued: int, in_flight: list[int], *, prompts: int = 0, max_in_flight: int,
         max_batch: int, computing: int) -> list[int]:
    """The objects one BatchDue turn writes (the binding asks again after each one)."""
    written: list[int] = []
    while (rows := next_batch_rows(queued, [*in_flight, *written], prompts + len(in_flight)
                                   + len(written), max_in_flight=max_in_flight,
                                   max_batch=max_batch, computing=computing)) > 0:
        written.append(rows)
        queued -= rows
    return written


def test_ready_rows_go_as_even_shares_of_the_objects_allowed() -> None:
    # 4 rows at once (a prompt batch answered), 2 objects allowed: 2 + 2, not 4 + 0
    assert turn(4, [], max_in_flight=2, max_batch=4, computing=2) == [2, 2]
    assert turn(3, [], max_in_flight=2, max_batch=4, computing=2) == [2, 1]
    assert turn(4, [], max_in_flight=4, max_batch=2, computing=3) == [2, 1, 1]
    # more rows than the objects carry at max_batch: full objects, the rest wait
    assert turn(6, [], max_in_flight=2, max_batch=2, computing=2) == [2, 2]
    # a row that comes back while another object is in flight fills the free place
    assert turn(2, [2], max_in_flight=2, max_batch=2, computing=2) == [2]
    assert turn(1, [2], max_in_flight=2, max_batch=2, computing=2) == [1]


def test_prompts_take_places_but_are_not_decode_objects() -> None:
    # one place left beside a prompt: both rows go in it rather than one waiting
    assert turn(2, [], prompts=1, max_in_flight=2, max_batch=2, computing=2) == [2]
    assert turn(2, [], prompts=2, max_in_flight=2, max_batch=2, computing=2) == []


def test_rows_gather_when_the_computing_stages_hold_their_objects() -> None:
    # one stage: a second one-row object would cost a second step; the row waits for
    # the row in flight to come back, and the two go as one object
    assert turn(1, [1], max_in_flight=2, max_batch=2, computing=1) == []
    assert turn(2, [], max_in_flight=2, max_batch=2, computing=1) == [2]
    # beyond max_batch rows, the object the cap leaves for the hop carries the rest
    assert turn(2, [2], max_in_flight=2, max_batch=2, computing=1) == [2]
    # three stages computing at once: two rows go as two objects, one per stage
    assert turn(2, [], max_in_flight=4, max_batch=2, computing=3) == [1, 1]
    assert turn(1, [1], max_in_flight=4, max_batch=2, computing=3) == [1]


def test_one_row_per_object_never_waits() -> None:
    assert turn(3, [1], max_in_flight=4, max_batch=1, computing=3) == [1, 1, 1]
    assert decode_objects_wanted(4, max_in_flight=4, max_batch=1, computing=1) == 4
    assert decode_objects_wanted(0, max_in_flight=4, max_batch=2, computing=3) == 0


def settle(sequences: int, *, max_in_flight: int, max_batch: int, computing: int,
           first: list[int], round_trips: int = 40) -> Counter[int]:
    """Rows per object written once `sequences` rows went round a FIFO pipeline for
    `round_trips` outputs, starting from `first` (the objects in flight at the start):
    every output's rows queue again, then the run's turn writes what the spread says."""
    in_flight: deque[int] = deque(first)
    queued = sequences - sum(first)
    written: Counter[int] = Counter()
    for _ in range(round_trips):
        queued += in_flight.popleft() if in_flight else 0
        for rows in turn(queued, list(in_flight), max_in_flight=max_in_flight,
                         max_batch=max_batch, computing=computing):
            in_flight.append(rows)
            queued -= rows
            written[rows] += 1
        assert sum(in_flight) + queued == sequences, "no row is lost or doubled"
        assert in_flight, "rows never all wait"
    return written


@pytest.mark.parametrize(("sequences", "computing", "first", "rows"), [
    (4, 2, [1, 1], {2}),  # 3 stages on 2 CPUs: stragglers merge into even pairs
    (4, 2, [2], {2}),
    (3, 2, [1, 1], {1, 2}),  # 2 and 1: the even split of 3 rows over 2 objects
    (2, 2, [2], {1}),  # two stages compute at once: one row each
    (2, 1, [1, 1], {2}),  # one stage: the two rows step together
    (4, 1, [1, 1], {2}),
])
def test_round_trips_settle_on_even_shares(sequences: int, computing: int, first: list[int],
                                           rows: set[int]) -> None:
    written = settle(sequences, max_in_flight=2, max_batch=2, computing=computing,
                     first=first)
    late = settle(sequences, max_in_flight=2, max_batch=2, computing=computing,
                  first=first, round_trips=80) - written  # the last 40 outputs' objects
    assert set(late) == rows
