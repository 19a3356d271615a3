"""Supervision: what happens when an actor's handler raises.

Every actor is spawned with a `SupervisorStrategy` (its parent's decision for it, fixed at
spawn time). When the actor's handler, `started()` hook, or one of its owned tasks raises
an `Exception`, the runtime asks `strategy.decide(error)` for a `Directive`:

- `Stop`: the actor ends with `StopReason.Crashed`; its watchers get `Terminated` with
  the error. This is the default: the system is fail-stop.
- `Restart`: the failed incarnation is torn down (timers cancelled, owned tasks cancelled,
  children stopped, `stopped()` called) and a fresh instance is built from the actor's
  factory. The mailbox survives; the message that failed is dropped. More than
  `max_restarts` restarts within `within_s` seconds stops the actor instead, with a
  `RestartBudgetExhausted` error.
- `Escalate`: the actor is stopped as crashed and its parent fails with `ChildFailed`,
  to which the parent's own strategy then applies. An escalation that reaches the runtime
  root is recorded on the runtime (`Runtime.escalations`) and reported to its
  `on_escalation` callback; the runtime itself keeps running.

No directive ever lets an exception leave the runtime: one crashing actor never takes
the runtime down.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


class Directive(enum.Enum):
    """A supervisor's decision about a failed actor."""

    Stop = "stop"
    Restart = "restart"
    Escalate = "escalate"


@dataclass(frozen=True, slots=True)
class SupervisorStrategy:
    """Decides a `Directive` for each failure, with a restart budget."""

    decider: Callable[[Exception], Directive] = field(default=lambda _error: Directive.Stop)
    max_restarts: int = 3
    within_s: float = 10.0

    @classmethod
    def stop(cls) -> SupervisorStrategy:
        """Stop on any failure (the default)."""
        return cls(lambda _error: Directive.Stop)

    @classmethod
    def restart(cls, max_restarts: int = 3, within_s: float = 10.0) -> SupervisorStrategy:
        """Restart on any failure, at most `max_restarts` times per `within_s` seconds."""
        return cls(lambda _error: Directive.Restart, max_restarts, within_s)

    @classmethod
    def escalate(cls) -> SupervisorStrategy:
        """Hand any failure to the parent."""
        return cls(lambda _error: Directive.Escalate)

    def decide(self, error: Exception) -> Directive:
        return self.decider(error)


@dataclass(slots=True)
class RestartBudget:
    """Sliding-window count of recent restarts for one actor."""

    max_restarts: int
    within_s: float
    recent: deque[float] = field(default_factory=deque)

    def allow(self, now: float) -> bool:
        """Record a restart at `now` if the budget allows it; False when exhausted."""
        if not self.would_allow(now):
            return False
        self.record(now)
        return True

    def would_allow(self, now: float) -> bool:
        """Whether a restart at `now` fits the window (forgets restarts older than it)."""
        while self.recent and now - self.recent[0] > self.within_s:
            self.recent.popleft()
        return len(self.recent) < self.max_restarts

    def record(self, now: float) -> None:
        """Count a restart at `now`."""
        self.recent.append(now)
