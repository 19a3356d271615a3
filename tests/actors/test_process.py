"""Process actor: a real child that exits, is killed, floods, or outlives a killed parent."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from swactor.actors import Actor, Context, Runtime
from swactor.actors.process import (
    CloseStdin,
    Exited,
    Line,
    ProcessEvent,
    ProcessSpec,
    SendSignal,
    SpawnFailed,
    Started,
    StopProcess,
    Stream,
    WriteLine,
    spawn_process,
)

PY = sys.executable


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), timeout=30))


def python(code: str, **kw: Any) -> ProcessSpec:
    return ProcessSpec(argv=(PY, "-c", textwrap.dedent(code)), **kw)


class Owner(Actor[ProcessEvent]):
    """Collects what the process actor reports; may be held shut by `gate`."""

    def __init__(self, gate: asyncio.Event | None = None) -> None:
        self.events: list[ProcessEvent] = []
        self.gate = gate
        self.exited = asyncio.Event()

    async def receive(self, ctx: Context[ProcessEvent], message: ProcessEvent) -> None:
        if self.gate is not None:
            await self.gate.wait()
        self.events.append(message)
        if isinstance(message, Exited | SpawnFailed):
            self.exited.set()

    def lines(self, stream: Stream = Stream.stdout) -> list[str]:
        return [e.text for e in self.events if isinstance(e, Line) and e.stream is stream]

    def last(self) -> ProcessEvent:
        return self.events[-1]


def gone(pid: int) -> bool:
    """No such process, or only a zombie waiting for a reaper."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # ESRCH if it vanishes mid-read
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def test_child_that_exits_reports_started_lines_and_exit_code_in_order() -> None:
    async def body() -> None:
        owner = Owner()
        async with Runtime() as rt:
            owner_ref = rt.spawn(lambda: owner, "owner")
            spec = python("""
                import sys
                print("one"); print("two", file=sys.stderr); print("three", end="")
                sys.exit(3)
            """)
            proc = spawn_process(rt, spec, owner_ref, "child")
            await asyncio.wait_for(owner.exited.wait(), 10)
            assert isinstance(owner.events[0], Started) and owner.events[0].pid > 0
            assert owner.lines() == ["one", "three"]
            assert owner.lines(Stream.stderr) == ["two"]
            assert owner.last() == Exited(proc.address, 3, None)
            await proc.join()  # the actor ends with its process

    run(body)


def test_stdin_lines_reach_the_child_and_inherited_fds_work() -> None:
    async def body() -> None:
        owner = Owner()
        read_end, write_end = os.pipe()
        try:
            async with Runtime() as rt:
                owner_ref = rt.spawn(lambda: owner, "owner")
                spec = python(
                    f"""
                    import os, sys
                    for line in sys.stdin:
                        print(line.strip().upper(), flush=True)
                    os.write({write_end}, b"via inherited fd")
                    """,
                    pass_fds=(write_end,),
                )
                proc = spawn_process(rt, spec, owner_ref)
                proc.tell(WriteLine("hello"))
                proc.tell(WriteLine("world"))
                proc.tell(CloseStdin())
                await asyncio.wait_for(owner.exited.wait(), 10)
                assert owner.lines() == ["HELLO", "WORLD"]
                assert owner.last() == Exited(proc.address, 0, None)
                assert os.read(read_end, 100) == b"via inherited fd"
        finally:
            os.close(read_end)
            os.close(write_end)

    run(body)


def test_child_killed_by_a_signal_reports_the_signal() -> None:
    async def body() -> None:
        owner = Owner()
        async with Runtime() as rt:
            owner_ref = rt.spawn(lambda: owner, "owner")
            proc = spawn_process(rt, python("import time; print('up', flush=True); time.sleep(30)"),
                                 owner_ref)
            while owner.lines() != ["up"]:
                await asyncio.sleep(0.01)
            proc.tell(SendSignal(signal.SIGKILL))
            await asyncio.wait_for(owner.exited.wait(), 10)
            assert owner.last() == Exited(proc.address, None, signal.SIGKILL)

    run(body)


def test_stop_escalates_from_sigterm_to_sigkill_after_the_grace_period() -> None:
    async def body() -> None:
        owner = Owner()
        async with Runtime() as rt:
            owner_ref = rt.spawn(lambda: owner, "owner")
            spec = python("""
                import signal, time
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                print("ignoring TERM", flush=True)
                time.sleep(30)
            """)
            proc = spawn_process(rt, spec, owner_ref)
            while owner.lines() != ["ignoring TERM"]:
                await asyncio.sleep(0.01)
            pid = next(e.pid for e in owner.events if isinstance(e, Started))
            loop = asyncio.get_running_loop()
            began = loop.time()
            proc.tell(StopProcess(grace_s=0.3))
            await asyncio.wait_for(owner.exited.wait(), 10)
            assert 0.25 <= loop.time() - began < 5
            assert owner.last() == Exited(proc.address, None, signal.SIGKILL)
            assert gone(pid)

    run(body)


def test_stop_with_a_cooperative_child_ends_it_with_sigterm() -> None:
    async def body() -> None:
        owner = Owner()
        async with Runtime() as rt:
            owner_ref = rt.spawn(lambda: owner, "owner")
            proc = spawn_process(rt, ProcessSpec(("sleep", "30")), owner_ref)
            while not owner.events:
                await asyncio.sleep(0.01)
            await proc.stop_and_join()
            await asyncio.wait_for(owner.exited.wait(), 10)
            assert owner.last() == Exited(proc.address, None, signal.SIGTERM)

    run(body)


def test_missing_program_reports_spawn_failed() -> None:
    async def body() -> None:
        owner = Owner()
        async with Runtime() as rt:
            owner_ref = rt.spawn(lambda: owner, "owner")
            proc = spawn_process(rt, ProcessSpec(("/nonexistent/swactor-test",)), owner_ref)
            await asyncio.wait_for(owner.exited.wait(), 10)
            (event,) = owner.events
            assert isinstance(event, SpawnFailed)
            assert "FileNotFoundError" in event.error
            await proc.join()

    run(body)


def test_flooding_child_is_held_back_by_a_slow_owner_and_loses_nothing() -> None:
    async def body() -> None:
        gate = asyncio.Event()
        owner = Owner(gate)
        count = 20_000
        async with Runtime() as rt:
            owner_ref = rt.spawn(lambda: owner, "owner", mailbox_capacity=16)
            spec = python(f"""
                import sys
                row = "x" * 200
                for n in range({count}):
                    sys.stdout.write(f"{{n}} {{row}}\\n")
                sys.stdout.flush()
            """)
            proc = spawn_process(rt, spec, owner_ref)
            await asyncio.sleep(1.0)
            # 4 MB of output cannot fit in the pipe, the reader's buffer and 16 queued
            # lines: the child must still be blocked in write(), unable to exit
            assert not owner.exited.is_set()
            pid = next(iter(p for p in _children_of(os.getpid())), None)
            assert pid is not None and not gone(pid)
            gate.set()
            await asyncio.wait_for(owner.exited.wait(), 20)
            lines = owner.lines()
            assert len(lines) == count
            assert [int(line.split()[0]) for line in lines] == list(range(count))
            assert owner.last() == Exited(proc.address, 0, None)

    run(body)


def _children_of(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(entry.name))
    return found


def test_an_endless_line_is_truncated_not_buffered() -> None:
    async def body() -> None:
        owner = Owner()
        async with Runtime() as rt:
            owner_ref = rt.spawn(lambda: owner, "owner")
            spec = python(
                """
                import sys
                sys.stdout.write("a" * 5_000_000)
                sys.stdout.write("\\nafter\\n" + "b" * 3000)
                """,
                max_line_bytes=1000,
            )
            spawn_process(rt, spec, owner_ref)
            await asyncio.wait_for(owner.exited.wait(), 10)
            out = [e for e in owner.events if isinstance(e, Line)]
            assert [(len(e.text), e.truncated) for e in out] == [
                (1000, True), (5, False), (1000, True)
            ]
            assert out[1].text == "after"

    run(body)


PARENT = """
import asyncio, sys
from swactor.actors import Actor, Runtime
from swactor.actors.process import ProcessSpec, Started, spawn_process

class Owner(Actor[object]):
    async def receive(self, ctx, message):
        if isinstance(message, Started):
            print(message.pid, flush=True)

async def main():
    rt = Runtime("parent")
    owner = rt.spawn(Owner, "owner")
    spawn_process(rt, ProcessSpec(("sleep", "60")), owner)
    await asyncio.sleep(60)

asyncio.run(main())
"""


def test_child_of_a_sigkilled_parent_is_gone_within_a_second() -> None:
    parent = subprocess.Popen([PY, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        assert not gone(child_pid)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 1.0
        while not gone(child_pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gone(child_pid), "child outlived its SIGKILLed parent"
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()


def test_when_the_owner_ends_the_process_actor_stops_its_child() -> None:
    async def body() -> None:
        owner = Owner()
        async with Runtime() as rt:
            owner_ref = rt.spawn(lambda: owner, "owner")
            proc = spawn_process(rt, ProcessSpec(("sleep", "30")), owner_ref)
            while not owner.events:
                await asyncio.sleep(0.01)
            started = owner.events[0]
            assert isinstance(started, Started)
            await owner_ref.stop_and_join()
            await asyncio.wait_for(proc.join(), 5)
            assert gone(started.pid)

    run(body)


def test_every_line_reaches_a_slow_owner_before_exited() -> None:
    async def body() -> None:
        gate = asyncio.Event()
        owner = Owner(gate)
        async with Runtime() as rt:
            owner_ref = rt.spawn(lambda: owner, "owner", mailbox_capacity=4)
            spec = python("for n in range(2000): print(n)", drain_s=0.1)
            spawn_process(rt, spec, owner_ref)
            await asyncio.sleep(0.6)  # the child has long exited; its lines wait on us
            gate.set()
            await asyncio.wait_for(owner.exited.wait(), 10)
            assert owner.lines() == [str(n) for n in range(2000)]
            assert isinstance(owner.last(), Exited)

    run(body)


def test_a_pipe_held_by_an_escaped_grandchild_does_not_delay_exited_forever() -> None:
    async def body() -> None:
        owner = Owner()
        async with Runtime() as rt:
            owner_ref = rt.spawn(lambda: owner, "owner")
            spec = python(
                """
                import subprocess
                escaped = subprocess.Popen(["sleep", "30"], start_new_session=True)
                print(escaped.pid, flush=True)
                """,
                drain_s=0.2,
            )
            spawn_process(rt, spec, owner_ref)
            try:
                await asyncio.wait_for(owner.exited.wait(), 5)
                assert owner.last() == Exited(owner.last().source, 0, None)
            finally:
                for text in owner.lines():
                    os.kill(int(text), signal.SIGKILL)

    run(body)


class StuckOwner(Actor[Any]):
    """Owns a process as its child, then hangs in a handler so shutdown must cancel it."""

    def __init__(self) -> None:
        self.pid: int | None = None

    async def started(self, ctx: Context[Any]) -> None:
        spawn_process(ctx, ProcessSpec(("sleep", "30")), ctx.self_ref, "sleeper")

    async def receive(self, ctx: Context[Any], message: Any) -> None:
        if isinstance(message, Started):
            self.pid = message.pid
        elif message == "hang":
            await asyncio.Event().wait()


def test_forced_shutdown_still_kills_the_child_of_a_cancelled_process_actor() -> None:
    async def body() -> None:
        owner = StuckOwner()
        rt = Runtime()
        ref = rt.spawn(lambda: owner, "owner")
        while owner.pid is None:
            await asyncio.sleep(0.01)
        ref.tell("hang")
        await asyncio.sleep(0.01)
        await rt.shutdown(timeout_s=0.2)
        deadline = time.monotonic() + 1.0
        while not gone(owner.pid) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert gone(owner.pid)

    run(body)
