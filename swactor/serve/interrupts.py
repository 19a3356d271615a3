"""Ctrl-C and SIGTERM for the serving commands.

Theory of operation. `swactor serve` and `swactor orchestrator --serve` start things
(node processes, a SWIM participant, a run) that must be stopped in order whatever ends
the command. Both signals therefore go through the event loop (`add_signal_handler`)
and never raise from a plain signal handler: an exception raised there lands wherever
the interpreter happens to be, which in an asyncio program is usually inside one of the
loop's own callbacks (a pipe read, a child's exit report), and that callback's work is
lost. A lost exit report leaves `process.wait()` waiting for ever, so the command would
hang instead of stopping.

`run_stoppable(main)` runs `main(stops)` on a new event loop. What a signal does depends
on the phase, which the command marks with `Stops`:

- booting (the default): the signal cancels the main task. The cancellation arrives at
  the task's next `await`, its `finally` blocks stop what it started, and
  `run_stoppable` then raises KeyboardInterrupt for the command to report (exit 130);
- serving (`with stops.serving(stop):`): the signal calls `stop`, the session's
  operator stop, and the command returns normally once the session has stopped;
- stopping (after `serving` ends, or after the first signal while booting): a signal is
  ignored. The teardown is already under way and bounded (a node that does not stop is
  killed), and cancelling it half-way would leave nodes behind.

Before the loop runs, SIGTERM raises KeyboardInterrupt like Ctrl-C does (nothing is
started yet, so there is nothing to lose). The loop's handlers stay until the loop
closes, so a signal during asyncio.run's own shutdown is ignored too; the previous
handlers are restored when `run_stoppable` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import signal
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Phase(enum.Enum):
    BOOTING = "booting"
    SERVING = "serving"
    STOPPING = "stopping"


class Stops:
    """Where SIGINT and SIGTERM go in each phase of a serving command (module doc)."""

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self._task = task
        self._stop: Callable[[], None] | None = None
        self.phase = Phase.BOOTING
        self.interrupted = False
        """Whether a signal cancelled the main task while booting."""

    def signalled(self) -> None:
        """The loop's handler for both signals."""
        if self.phase is Phase.SERVING:
            assert self._stop is not None
            self._stop()
        elif self.phase is Phase.BOOTING:
            self.phase = Phase.STOPPING
            self.interrupted = True
            self._task.cancel()

    @contextlib.contextmanager
    def serving(self, stop: Callable[[], None]) -> Iterator[None]:
        """While inside, a signal calls `stop`; afterwards signals are ignored."""
        if self.phase is not Phase.BOOTING:
            raise RuntimeError(f"serving begins only while booting, not {self.phase.value}")
        self._stop, self.phase = stop, Phase.SERVING
        try:
            yield
        finally:
            self._stop, self.phase = None, Phase.STOPPING


def run_stoppable(main: Callable[[Stops], Coroutine[Any, Any, T]]) -> T:
    """`asyncio.run(main(stops))` with the signals routed by phase (module doc); raises
    KeyboardInterrupt when a signal ended it before serving began."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    async def guarded() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        stops = Stops(task)
        for sig in SIGNALS:
            loop.add_signal_handler(sig, stops.signalled)
        try:
            return await main(stops)
        except asyncio.CancelledError:
            if stops.interrupted:
                raise KeyboardInterrupt from None
            raise
        finally:  # the handlers stay until the loop closes: asyncio.run's own shutdown
            stops.phase = Phase.STOPPING

    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    try:
        signal.signal(signal.SIGTERM, interrupt)
        return asyncio.run(guarded())
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
