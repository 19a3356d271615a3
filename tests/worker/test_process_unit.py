"""WorkerProcess in-process: an exception escaping worker code is WorkerFatal, exit 1;
a run's last ring is answered before its heap is released.

Unit tests of the binding alone (no child process): stdout is a BytesIO, and one
method is made to raise, or the heap release is replaced by a probe, which a real worker
cannot be made to do from outside.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from swactor import heap
from swactor.arena import Arena
from swactor.arena.arena import ENV_ARENA_BYTES, ENV_ARENA_FD
from swactor.ring import Ring, WorkerDoorbells, header_len
from swactor.testing.worker_rig import float_spec
from swactor.wire import (
    ConfigureRole,
    EdgeId,
    InitializeWorker,
    InstallRing,
    PortId,
    RingDirection,
    RingId,
    RingLayout,
    RingQuiesced,
    RoleConfigured,
    RoleId,
    UninstallReason,
    UninstallRing,
    WireStruct,
    WorkerFatal,
    WorkerFatalReason,
    WorkerGeneration,
    decode_event,
    encode_command,
)
from swactor.worker.adapter import EventWriter
from swactor.worker.process import WorkerProcess, ring_helper_abi


def test_unhandled_exception_is_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.BytesIO()
    worker = WorkerProcess(EventWriter(out))

    def explode(*_: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(worker, "initialize_runtime", explode)
    line = encode_command(InitializeWorker(WorkerGeneration(1), 4096, ring_helper_abi(), None))
    worker.handle_line(line.encode())
    assert worker.exit_code == 1
    events = [decode_event(raw) for raw in out.getvalue().splitlines()]
    assert events == [WorkerFatal(WorkerFatalReason.UnhandledException)]


def test_eof_on_stdin_exits_zero_without_events() -> None:
    out = io.BytesIO()
    assert WorkerProcess(EventWriter(out)).run(io.BytesIO(b"")) == 0
    assert out.getvalue() == b""


@dataclass
class Probed:
    """An in-process worker with doorbells (its events written in bursts) on a fresh
    arena, its heap calls replaced by probes that record what it had written then."""

    worker: WorkerProcess
    arena: Arena
    out: io.BytesIO
    calls: list[tuple[str, list[object]]]
    """(heap call, every event written before it) in call order."""

    def send(self, command: WireStruct) -> None:
        self.worker.handle_line(encode_command(command).encode())
        assert self.worker.exit_code is None


@pytest.fixture
def probed(monkeypatch: pytest.MonkeyPatch) -> Iterator[Probed]:
    arena = Arena.create(1 << 20)
    bells = WorkerDoorbells.create()
    monkeypatch.setenv(ENV_ARENA_FD, str(os.dup(arena.fd)))
    monkeypatch.setenv(ENV_ARENA_BYTES, str(arena.size))
    out = io.BytesIO()
    calls: list[tuple[str, list[object]]] = []

    def probe(name: str) -> Callable[..., None]:
        def call(**kwargs: object) -> None:
            written = [decode_event(raw) for raw in out.getvalue().splitlines()]
            calls.append((f"{name}{kwargs or ''}", written))
        return call

    monkeypatch.setattr(heap, "release", probe("release"))
    monkeypatch.setattr(heap, "settle", probe("settle"))
    worker = WorkerProcess(EventWriter(out), doorbells=bells)
    rig = Probed(worker, arena, out, calls)
    try:
        rig.send(InitializeWorker(WorkerGeneration(1), arena.size, ring_helper_abi(), None))
        yield rig
    finally:
        if worker.arena is not None:
            worker.arena.close()
        bells.close()
        arena.close()


def test_the_last_rings_answer_is_written_before_the_heap_release(probed: Probed) -> None:
    """With doorbells the worker writes its events in bursts. When a run's last ring is
    uninstalled it releases the run's heap (a full collection and a trim); the ring's
    RingQuiesced, which the node's teardown waits for, must be written before that."""
    layout = RingLayout.at(1, 1 << 16, 4096, header_bytes=header_len())
    ring = Ring.init(probed.arena, layout)
    try:
        probed.send(InstallRing(RingId(1), EdgeId(101), PortId(1), RingDirection.Ingress,
                                layout, float_spec()))
        probed.send(UninstallRing(RingId(1), UninstallReason.EdgeStopped))
    finally:
        ring.close()
    assert [name for name, _ in probed.calls] == ["release"]  # the run's last ring
    assert RingQuiesced(RingId(1)) in probed.calls[0][1]


def test_a_built_role_is_frozen_after_its_answer_and_thawed_when_replaced(
    probed: Probed,
) -> None:
    """A role's objects live as long as the role: once its RoleConfigured is written the
    worker freezes them (`heap.settle`), so a run boundary's collection does not scan
    them; a build that replaces the role thaws first, so the old role's cycles can go."""
    probed.send(ConfigureRole(RoleId(1), {"kind": "echo"}))
    probed.send(ConfigureRole(RoleId(2), {"kind": "echo"}))
    probed.send(ConfigureRole(RoleId(1), {"kind": "echo"}))  # echo re-arms nothing: rebuilt
    probed.send(ConfigureRole(RoleId(3), {"kind": "no such kind"}))
    assert [name for name, _ in probed.calls] == [
        "settle{'thaw': False}", "settle{'thaw': False}", "settle{'thaw': True}"]
    for (_, written), role in zip(probed.calls, (1, 2, 1), strict=True):
        assert written[-1] == RoleConfigured(RoleId(role), None)
