"""Ctrl-C and SIGTERM in the serving commands (`swactor.serve.interrupts`): signals sent
to this very process, a real child process to stop."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import pytest

from swactor.serve.interrupts import Phase, Stops, run_stoppable


def _signal_self(signum: int) -> None:
    os.kill(os.getpid(), signum)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_booting_cancels_at_an_await_and_the_finally_stops_the_child(
        signum: int) -> None:
    stopped: list[int] = []

    async def main(stops: Stops) -> int:
        child = await asyncio.create_subprocess_exec(sys.executable, "-c",
                                                     "import time; time.sleep(60)")
        try:
            asyncio.get_running_loop().call_later(0.05, _signal_self, signum)
            return await child.wait()
        finally:
            child.kill()
            stopped.append(await child.wait())

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        run_stoppable(main)
    assert stopped == [-signal.SIGKILL]
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_signal_inside_a_loop_callback_loses_none_of_its_work() -> None:
    """The signal arrives while one of the loop's callbacks runs; the callback finishes
    and the main task is cancelled at its await, not the callback cut short."""
    done: list[str] = []

    async def main(stops: Stops) -> None:
        def callback() -> None:
            _signal_self(signal.SIGTERM)
            done.append("callback")

        asyncio.get_running_loop().call_soon(callback)
        try:
            await asyncio.sleep(60)
        finally:
            done.append("finally")

    with pytest.raises(KeyboardInterrupt):
        run_stoppable(main)
    assert done == ["callback", "finally"]


def test_while_serving_a_signal_calls_the_stop_and_afterwards_is_ignored() -> None:
    async def main(stops: Stops) -> str:
        stopped = asyncio.Event()
        with stops.serving(stopped.set):
            assert stops.phase is Phase.SERVING
            _signal_self(signal.SIGTERM)
            await asyncio.wait_for(stopped.wait(), 10)
        assert stops.phase is Phase.STOPPING
        _signal_self(signal.SIGINT)
        _signal_self(signal.SIGTERM)
        await asyncio.sleep(0.1)  # a cancellation would end the task here
        return "stopped"

    assert run_stoppable(main) == "stopped"


def test_a_second_signal_does_not_cut_the_teardown_short() -> None:
    finished: list[str] = []

    async def main(stops: Stops) -> None:
        asyncio.get_running_loop().call_later(0.05, _signal_self, signal.SIGTERM)
        try:
            await asyncio.sleep(60)
        finally:
            _signal_self(signal.SIGTERM)
            await asyncio.sleep(0.1)
            finished.append("teardown")

    with pytest.raises(KeyboardInterrupt):
        run_stoppable(main)
    assert finished == ["teardown"]


def test_an_error_that_is_not_a_signal_passes_through() -> None:
    async def main(stops: Stops) -> None:
        raise ValueError("the pool file names no node")

    with pytest.raises(ValueError, match="names no node"):
        run_stoppable(main)


def test_serving_begins_only_once() -> None:
    async def main(stops: Stops) -> None:
        with stops.serving(lambda: None):
            pass
        with pytest.raises(RuntimeError, match="not stopping"), stops.serving(lambda: None):
            pass

    run_stoppable(main)
