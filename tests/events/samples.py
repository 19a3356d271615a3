"""Valid sample events for the tests: every required field filled, ids distinct."""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any

from swactor.events import IDENTITY_TYPES, LifecycleEvent
from swactor.wire import Component, RunFaultReason, RunOutcome, TeardownOutcome

IDS = {name: 100 + n for n, name in enumerate(IDENTITY_TYPES)}
NON_IDENTITY: dict[str, Any] = {
    "reason": RunFaultReason.WorkerCrashed,
    "component": Component.WorkerCtl,
    "outcome": RunOutcome.Faulted,
    "teardown": TeardownOutcome.Clean,
}


def required_kwargs(cls: type[LifecycleEvent]) -> dict[str, Any]:
    """Constructor arguments without defaults, each with a valid value."""
    out: dict[str, Any] = {}
    for f in fields(cls):
        if f.default is MISSING and f.default_factory is MISSING:
            out[f.name] = IDENTITY_TYPES[f.name](IDS[f.name]) if f.name in IDS else NON_IDENTITY[
                f.name
            ]
    return out


def sample(cls: type[LifecycleEvent], **extra: Any) -> LifecycleEvent:
    return cls(**{**required_kwargs(cls), **extra})
