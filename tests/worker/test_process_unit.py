"""WorkerProcess in-process: an exception escaping worker code is WorkerFatal, exit 1.

A unit test of the binding alone (no child process): stdout is a BytesIO and one
method is made to raise, which a real worker cannot be made to do from outside.
"""

from __future__ import annotations

import io

import pytest

from swactor.wire import (
    InitializeWorker,
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
