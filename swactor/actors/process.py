"""The process actor: one child process, owned, reported, and never orphaned.

Theory of operation. `ProcessActor(spec, owner)` spawns `spec.argv` when it starts, in
its own process group, with `PR_SET_PDEATHSIG` (see `deathsig`) so that the kernel kills
it if this process dies, even by SIGKILL. The fds in `spec.pass_fds` are inherited (an
arena memfd, say); stdin, stdout and stderr are pipes owned by the actor. The owner gets:

- `Started(source, pid)` once the child runs, or `SpawnFailed(source, argv0, error)`;
- `Line(source, stream, text, truncated)` for every line the child writes on stdout or
  stderr, in order per stream;
- `Exited(source, code, signal)` exactly once, after the last `Line` (when the child
  exits by itself) or after the actor stopped it.

Two reader tasks turn pipe bytes into lines (`lines.LineSplitter`). A line longer than
`spec.max_line_bytes` is cut: its first `max_line_bytes` bytes go out with
`truncated=True` and the rest, up to the next newline, is dropped, so one endless line
cannot grow memory. Each line is handed to
the owner with `await owner.send(...)`, which waits while the owner's mailbox is at its
capacity: then the reader stops reading, the pipe fills, and the child blocks in
`write()`. A flooding child is slowed to its owner's pace instead of exhausting memory,
as long as the owner was spawned with a `mailbox_capacity`.

The actor watches its owner: if the owner ends, the actor stops (and so does the child).
When the child exits, whatever is left of its process group is killed, the readers
deliver every remaining line (however slow the owner), `Exited` is sent and the actor
stops itself. A reader still waiting for end of file `drain_s` after the exit (its pipe
held open by a process that escaped the group) is abandoned. Stopping the actor
(`ref.stop()`, `StopProcess(grace_s)`, its parent stopping, runtime shutdown) sends
SIGTERM to the process group, waits `grace_s`, then sends SIGKILL. Commands: `WriteLine`
(one line to the child's stdin; a child that stops reading its stdin while more than
`max_stdin_buffer` bytes pile up is a failure of this actor, which then kills it),
`CloseStdin`, `SendSignal`, `StopProcess`. Payload bytes do not travel here: stdio is for
control lines and logs; bulk data goes through inherited fds.

How GpuWorkerCtl runs a worker (spec §28), from inside its own actor::

    spec = ProcessSpec(
        (sys.executable, "-m", "swactor.worker"),
        pass_fds=(arena_fd,),
        extra_env={"SWACTOR_ARENA_FD": str(arena_fd), "SWACTOR_ARENA_BYTES": str(ceiling)},
    )
    worker = spawn_process(ctx, spec, ctx.self_ref, f"worker-{generation}")
    worker.tell(WriteLine(json.dumps(command)))     # one JSON command per line
    # ctx.self_ref then receives Started, Line(stdout: worker events / stderr: logs),
    # and Exited(code, signal) once, which is the crash signal for a worker generation.
"""

from __future__ import annotations

import asyncio
import enum
import os
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from swactor.actors.actor import Actor
from swactor.actors.address import Address
from swactor.actors.context import Context
from swactor.actors.deathsig import die_with_parent
from swactor.actors.errors import ActorError
from swactor.actors.lines import LineSplitter
from swactor.actors.messages import Terminated
from swactor.actors.ref import ActorRef
from swactor.actors.runtime import Runtime


class Stream(enum.Enum):
    """Which of the child's output pipes a line came from."""

    stdout = "stdout"
    stderr = "stderr"


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    """What to run and how."""

    argv: tuple[str, ...]
    env: Mapping[str, str] | None = None
    """Complete environment of the child; None inherits this process's environment."""
    cwd: str | None = None
    pass_fds: tuple[int, ...] = ()
    """Open fds the child inherits under the same numbers."""
    grace_s: float = 2.0
    """SIGTERM-to-SIGKILL grace period when stopping."""
    max_line_bytes: int = 64 * 1024
    max_stdin_buffer: int = 16 * 1024 * 1024
    death_signal: int = signal.SIGKILL
    """Signal the kernel sends the child if this process dies."""
    drain_s: float = 1.0
    """After the child exits, how long the readers may take to reach end of output."""
    extra_env: Mapping[str, str] = field(default_factory=dict)
    """Added on top of `env` (or of the inherited environment)."""

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError("ProcessSpec.argv is empty")
        if self.max_line_bytes < 1 or self.grace_s < 0 or self.drain_s < 0:
            raise ValueError("ProcessSpec: max_line_bytes >= 1, grace_s >= 0, drain_s >= 0")


# ------------------------------------------------------------- to the owner


@dataclass(frozen=True, slots=True)
class Started:
    """The child is running."""

    source: Address
    pid: int


@dataclass(frozen=True, slots=True)
class SpawnFailed:
    """The child could not be started (no such program, bad cwd, bad fd...)."""

    source: Address
    argv0: str
    error: str


@dataclass(frozen=True, slots=True)
class Line:
    """One line of the child's output, newline removed, decoded as UTF-8 (replace)."""

    source: Address
    stream: Stream
    text: str
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class Exited:
    """The child has ended: `code` if it exited, `signal` if a signal killed it."""

    source: Address
    code: int | None
    signal: int | None


ProcessEvent = Started | SpawnFailed | Line | Exited
ProcessOutput = ProcessEvent
"""Spec §28's name for what the process owner receives."""


# ------------------------------------------------------------ to the actor


@dataclass(frozen=True, slots=True)
class WriteLine:
    """Write `text` and a newline to the child's stdin."""

    text: str


@dataclass(frozen=True, slots=True)
class CloseStdin:
    """Close the child's stdin (it reads end of file)."""


@dataclass(frozen=True, slots=True)
class SendSignal:
    """Send `signum` to the child (its pid, not its group)."""

    signum: int


@dataclass(frozen=True, slots=True)
class StopProcess:
    """Stop the child (SIGTERM, then SIGKILL after `grace_s`) and end the actor."""

    grace_s: float | None = None


ProcessCommand = WriteLine | CloseStdin | SendSignal | StopProcess

_Mail = ProcessCommand | Terminated  # what the actor's mailbox takes: commands, owner's end


class StdinOverflow(ActorError):
    """The child stopped reading stdin while more than `max_stdin_buffer` bytes waited."""


class ProcessActor(Actor[_Mail]):
    """Runs one child process for `owner`; see the module docstring."""

    def __init__(self, spec: ProcessSpec, owner: ActorRef[ProcessEvent]) -> None:
        self.spec = spec
        self.owner = owner
        self.process: asyncio.subprocess.Process | None = None
        self._grace_s = spec.grace_s
        self._reported = False
        self._reading: set[str] = set()  # names of the reader tasks waiting in read()

    async def started(self, ctx: Context[_Mail]) -> None:
        spec = self.spec
        env = dict(os.environ if spec.env is None else spec.env)
        env.update(spec.extra_env)
        try:
            self.process = await asyncio.create_subprocess_exec(
                *spec.argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                cwd=spec.cwd,
                pass_fds=spec.pass_fds,
                process_group=0,
                preexec_fn=die_with_parent(os.getpid(), spec.death_signal),
            )
        except (OSError, ValueError, subprocess.SubprocessError) as error:
            self._reported = True
            detail = getattr(error, "strerror", None) or str(error)
            reason = f"{type(error).__name__}: {detail}"
            self.owner.tell(SpawnFailed(ctx.address, spec.argv[0], reason))
            ctx.stop_self()
            return
        self.owner.tell(Started(ctx.address, self.process.pid))
        ctx.watch(self.owner)
        pipes = {Stream.stdout: self.process.stdout, Stream.stderr: self.process.stderr}
        readers = []
        for stream, pipe in pipes.items():
            assert pipe is not None
            readers.append(ctx.spawn_task(self._pump(ctx, pipe, stream), stream.value))
        ctx.spawn_task(self._watch_exit(ctx, self.process, readers), "exit")

    async def receive(self, ctx: Context[_Mail], message: _Mail) -> None:
        process = self.process
        if process is None:
            return
        match message:
            case WriteLine(text=text):
                stdin = process.stdin
                if stdin is None or stdin.is_closing() or process.returncode is not None:
                    return
                stdin.write(text.encode() + b"\n")
                if stdin.transport.get_write_buffer_size() > self.spec.max_stdin_buffer:
                    raise StdinOverflow(
                        f"{ctx.address}: child is not reading stdin "
                        f"({self.spec.max_stdin_buffer} bytes waiting)"
                    )
            case CloseStdin():
                if process.stdin is not None:
                    process.stdin.close()
            case SendSignal(signum=signum):
                if process.returncode is None:
                    _signal_quietly(process.pid, signum, group=False)
            case StopProcess(grace_s=grace_s):
                if grace_s is not None:
                    self._grace_s = grace_s
                ctx.stop_self()
            case Terminated():  # the owner is gone: nobody would hear from the child
                ctx.stop_self()

    async def stopped(self, ctx: Context[_Mail]) -> None:
        process = self.process
        if process is None:
            return
        if process.returncode is None:
            _signal_quietly(process.pid, signal.SIGTERM, group=True)
            try:
                async with asyncio.timeout(self._grace_s):
                    await _exit_of(process)
            except TimeoutError:
                _signal_quietly(process.pid, signal.SIGKILL, group=True)
                await _exit_of(process)
        _signal_quietly(process.pid, signal.SIGKILL, group=True)
        self._report_exit(ctx, process)
        _close_pipes(process)

    def cancelled(self, ctx: Context[_Mail]) -> None:
        process = self.process
        if process is not None and process.returncode is None:
            _signal_quietly(process.pid, signal.SIGKILL, group=True)
        if process is not None:
            _close_pipes(process)

    async def _watch_exit(
        self,
        ctx: Context[_Mail],
        process: asyncio.subprocess.Process,
        readers: list[asyncio.Task[None]],
    ) -> None:
        await _exit_of(process)
        _signal_quietly(process.pid, signal.SIGKILL, group=True)  # leftover grandchildren
        # Every line goes out before Exited, however slow the owner. Only a reader still
        # waiting for end of file after `drain_s` (a pipe held open by a process that left
        # the group) is given up on.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.spec.drain_s
        pending = set(readers)
        while pending:
            _done, pending = await asyncio.wait(pending, timeout=0.05)
            if pending and loop.time() >= deadline and self._reading >= {
                task.get_name() for task in pending
            }:
                for task in pending:
                    task.cancel()
                break
        self._report_exit(ctx, process)
        ctx.stop_self()

    def _report_exit(
        self, ctx: Context[_Mail], process: asyncio.subprocess.Process
    ) -> None:
        if self._reported:
            return
        self._reported = True
        code = process.returncode
        if code is not None and code < 0:
            self.owner.tell(Exited(ctx.address, None, -code))
        else:
            self.owner.tell(Exited(ctx.address, code, None))

    async def _pump(
        self, ctx: Context[_Mail], reader: asyncio.StreamReader, stream: Stream
    ) -> None:
        splitter = LineSplitter(self.spec.max_line_bytes)
        while True:
            self._reading.add(stream.value)  # blocked on the child, not on the owner
            chunk = await reader.read(64 * 1024)
            self._reading.discard(stream.value)
            lines = splitter.feed(chunk) if chunk else splitter.finish()
            for raw, truncated in lines:
                await self._emit(ctx, stream, raw, truncated)
            if not chunk:
                return

    async def _emit(
        self, ctx: Context[_Mail], stream: Stream, raw: bytes, truncated: bool
    ) -> None:
        text = raw.decode("utf-8", errors="replace")
        await self.owner.send(Line(ctx.address, stream, text, truncated))


async def _exit_of(process: asyncio.subprocess.Process) -> int:
    """The child's return code, as soon as it has exited.

    Not `process.wait()`: asyncio's wait also waits until every pipe is closed, which a
    grandchild that escaped the process group can delay forever. A pidfd (Linux 5.3+)
    becomes readable when the child exits; asyncio's child watcher then sets the return
    code a moment later.
    """
    loop = asyncio.get_running_loop()
    if process.returncode is None:
        try:
            pidfd = os.pidfd_open(process.pid)
        except OSError:  # already reaped (return code is on its way) or no pidfd support
            pidfd = -1
        if pidfd >= 0:
            exited: asyncio.Future[None] = loop.create_future()
            loop.add_reader(pidfd, _resolve, exited)
            try:
                await exited
            finally:
                loop.remove_reader(pidfd)
                os.close(pidfd)
    delay = 0.001
    while (code := process.returncode) is None:
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)
    return code


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _close_pipes(process: asyncio.subprocess.Process) -> None:
    """Release the child's pipe fds now (asyncio keeps them while a grandchild holds one)."""
    transport = getattr(process, "_transport", None)  # private, stable since 3.4
    if transport is not None and process.returncode is not None:
        transport.close()


def _signal_quietly(pid: int, signum: int, *, group: bool) -> None:
    """Signal the child (or its process group); a process already gone is not an error."""
    try:
        if group:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def spawn_process(
    spawner: Runtime | Context[Any],
    spec: ProcessSpec,
    owner: ActorRef[ProcessEvent],
    name: str | None = None,
) -> ActorRef[ProcessCommand]:
    """Spawn a `ProcessActor` for `owner`, top-level or as a child of an actor."""
    runtime = spawner if isinstance(spawner, Runtime) else spawner.runtime
    name = name or f"process-{runtime.next_uid()}"
    return spawner.spawn(lambda: ProcessActor(spec, owner), name)
