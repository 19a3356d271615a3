"""`Runtime`: the root of one process's actor tree.

A runtime lives inside a running asyncio loop. `spawn` starts top-level actors (children
of the root, path `/<runtime name>/<actor name>`); actors spawn their own children
through their context. The runtime keeps the registry of top-level actors, hands out
uids, counts dead letters (mail for actors that had ended), and records failures that
were escalated past every parent (`escalations`, plus the optional `on_escalation`
callback): the runtime never dies of an actor's exception.

`shutdown()` stops every top-level actor (each stops its children first) and waits up to
its timeout; actors still running after that are cancelled. `async with Runtime() as rt`
shuts down on exit.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Never, TypeVar

from swactor.actors.actor import Actor
from swactor.actors.address import Address
from swactor.actors.cell import ActorCell
from swactor.actors.errors import InvalidActorName
from swactor.actors.ref import ActorRef
from swactor.actors.supervision import SupervisorStrategy

M = TypeVar("M")

log = logging.getLogger("swactor.actors")

_uids = itertools.count(1)


class Runtime:
    """One process's actor system; see the module docstring."""

    def __init__(
        self,
        name: str = "swactor",
        on_escalation: Callable[[Address, Exception], None] | None = None,
    ) -> None:
        self._check_name(name)
        self.name = name
        self.escalations: list[tuple[Address, Exception]] = []
        self.dead_letters = 0
        self._on_escalation = on_escalation
        self._roots: dict[str, ActorCell[Any]] = {}
        self._closed = False

    async def __aenter__(self) -> Runtime:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.shutdown()

    def spawn(
        self,
        factory: Callable[[], Actor[M]],
        name: str | None = None,
        *,
        strategy: SupervisorStrategy | None = None,
        mailbox_capacity: int | None = None,
    ) -> ActorRef[M]:
        """Start a top-level actor built by `factory` (default strategy: stop on failure)."""
        if self._closed:
            raise InvalidActorName(f"/{self.name}: runtime is shut down")
        name = self.child_name(factory, name, self._roots)
        cell = ActorCell(
            self,
            None,
            Address(f"/{self.name}/{name}", self.next_uid()),
            factory,
            strategy or SupervisorStrategy.stop(),
            mailbox_capacity,
        )
        self._roots[name] = cell
        return cell.ref

    @property
    def actors(self) -> list[ActorRef[Never]]:
        """The live top-level actors."""
        return [cell.ref for cell in self._roots.values()]

    async def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop every actor, children first; cancel whatever outlives `timeout_s`."""
        self._closed = True
        cells = list(self._roots.values())
        for cell in cells:
            cell.request_stop()
        waits = [asyncio.shield(cell.terminated) for cell in cells]
        if not waits:
            return
        _done, pending = await asyncio.wait(waits, timeout=timeout_s)
        if pending:
            log.warning("/%s: %d actors did not stop in %g s; cancelling",
                        self.name, len(pending), timeout_s)
            for cell in cells:
                if not cell.terminated.done():
                    cell._task.cancel()
            await asyncio.wait(waits, timeout=1.0)

    # ------------------------------------------------------- used by the cells

    def next_uid(self) -> int:
        return next(_uids)

    def child_name(
        self, factory: Callable[[], Any], name: str | None, siblings: Mapping[str, Any]
    ) -> str:
        if name is None:
            base = getattr(factory, "__name__", "actor").lower()
            name = f"{base}-{self.next_uid()}"
        self._check_name(name)
        if name in siblings:
            raise InvalidActorName(f"an actor named {name!r} already exists here")
        return name

    def forget(self, address: Address) -> None:
        cell = self._roots.get(address.name)
        if cell is not None and cell.address == address:
            del self._roots[address.name]

    def escalated(self, address: Address, error: Exception) -> None:
        self.escalations.append((address, error))
        log.error("%s: failure escalated to the runtime root: %s: %s",
                  address, type(error).__name__, error)
        if self._on_escalation is not None:
            try:
                self._on_escalation(address, error)
            except Exception:  # the callback must not kill the runtime
                log.exception("/%s: on_escalation callback raised", self.name)

    def count_dead_letter(self, address: Address, message: object) -> None:
        self.dead_letters += 1
        log.debug("%s: dead letter %s", address, type(message).__name__)

    @staticmethod
    def _check_name(name: str) -> None:
        if not name or "/" in name or "#" in name:
            raise InvalidActorName(f"invalid actor name {name!r}: empty or contains / or #")
