"""How a serving run spreads its ready decode rows over the objects it may have in flight.

Theory of operation
-------------------
A serving run (``swactor.orchestrator.run``) queues each sequence's next decode row and,
whenever an output was accepted or a batch object written (the table's BatchDue), asks
this module how many queued rows the next batch object takes now (``next_batch_rows``;
0: none now). The answer depends on nothing but counts, so the rule is tested here
without a run:

- ``rows``: every decoding sequence's row, those queued plus those in flight in decode
  objects (which come back and queue again);
- ``computing``: the objects that can be computed at once, the run's stages but no more
  than its in-flight cap (``swactor serve``'s local nodes: its CPUs). A decode object
  beyond them only hides the orchestrator's own hop (accepting an output, writing the
  next input), so rows are not split for it: splitting costs each row its share of a
  step's fixed part and the batched kernels' savings (one stage, measured: a 2-row step
  61 ms against two 1-row steps of 41 ms each);
- the decode objects wanted: ``min(cap, max(ceil(rows / max_batch), min(computing,
  rows)))``: enough for every row at ``max_batch`` rows each, at least one per stage that
  can compute at once (while there are rows for them), never more than the cap;
- the next object takes the queued rows spread evenly (ceil) over the objects still
  wanted and the places free under the cap, at most ``max_batch``; so S rows over K
  objects go as ceil/floor(S/K) each, not one full object and then stragglers alone;
- when the decode objects in flight are already as many as wanted, the queued rows wait
  for them (gather): their rows come back, and the next BatchDue sends everything
  together. A wait always ends, since a decode object is in flight.

Prompt objects count against the cap (they occupy stages) but not as decode objects.
With ``max_batch`` 1 every row is its own object and the wanted objects are the rows,
so no row ever waits for another.
"""

from __future__ import annotations

from collections.abc import Sequence


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def decode_objects_wanted(rows: int, *, max_in_flight: int, max_batch: int,
                          computing: int) -> int:
    """Decode objects `rows` decoding sequences' rows travel in (module doc)."""
    if rows <= 0:
        return 0
    return min(max_in_flight, max(_ceil_div(rows, max_batch), min(computing, rows)))


def next_batch_rows(queued: int, decode_rows_in_flight: Sequence[int],
                    objects_in_flight: int, *, max_in_flight: int, max_batch: int,
                    computing: int) -> int:
    """Queued decode rows the next batch object takes now; 0: none now, because nothing
    is queued, the cap is reached, or the queued rows gather with rows in flight.

    `decode_rows_in_flight`: the decode rows of each decode object in flight (prompt
    objects left out); `objects_in_flight`: every object in flight, prompts included."""
    free = max_in_flight - objects_in_flight
    if queued <= 0 or free <= 0:
        return 0
    decode_objects = sum(1 for rows in decode_rows_in_flight if rows > 0)
    wanted = decode_objects_wanted(queued + sum(decode_rows_in_flight),
                                   max_in_flight=max_in_flight, max_batch=max_batch,
                                   computing=computing)
    more = wanted - decode_objects
    if more <= 0:
        return 0  # gather: the rows in flight come back and go with these
    return min(max_batch, queued, _ceil_div(queued, min(more, free)))
