"""The gossip queue: each update piggybacked a limited number of times, newest first.

Theory of operation
-------------------
memberlist's TransmitLimitedQueue, reduced to what the core needs. The queue holds at
most one update per subject member: queueing an update about a member replaces the
older one (a suspect is superseded by the refuting alive, an alive by the dead).
`take(n, limit)` returns up to `n` updates, those sent fewest times first (newer ones
first among equals), counts one transmission for each, and drops an update once it has
been sent `limit` times. The limit is passed at take time because it grows with the
pool (retransmit_mult * ceil(log10(N + 1))).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from swactor.membership.messages import Update
from swactor.wire import NodeId


@dataclass(slots=True)
class _Entry:
    update: Update
    transmits: int
    order: int


class BroadcastQueue:
    """Updates waiting to be piggybacked, keyed by the member they are about."""

    def __init__(self) -> None:
        self._entries: dict[NodeId, _Entry] = {}
        self._order = 0

    def __len__(self) -> int:
        return len(self._entries)

    def push(self, update: Update) -> None:
        """Queue `update`, replacing any queued update about the same member."""
        self._order += 1
        self._entries[update.node_id] = _Entry(update, 0, self._order)

    def take(self, count: int, limit: int) -> tuple[Update, ...]:
        """Up to `count` updates to piggyback now; each counts one transmission."""
        if not self._entries or count <= 0:
            return ()
        chosen = heapq.nsmallest(count, self._entries.values(), key=_rank)
        for entry in chosen:
            entry.transmits += 1
            if entry.transmits >= limit:
                del self._entries[entry.update.node_id]
        return tuple(entry.update for entry in chosen)


def _rank(entry: _Entry) -> tuple[int, int]:
    return (entry.transmits, -entry.order)
