"""Sinks and the emitter: JSON Lines with rotation, stderr verbosity, failing sinks."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

from swactor.events import (
    EVENT_CLASSES,
    Emitted,
    Emitter,
    EventName,
    JsonlSink,
    MemorySink,
    NodeStarted,
    ObjectLoaded,
    RunFaulted,
    StderrSink,
    validate_line,
)
from swactor.wire import NodeId

from .samples import IDS, sample


def test_emitter_stamps_time_pid_and_process() -> None:
    sink = MemorySink()
    emitter = Emitter("orchestrator", [sink])
    before_mono, before_wall = time.monotonic_ns(), time.time_ns()
    emitted = emitter.emit(NodeStarted(node_id=NodeId(3)))
    assert sink.events == [emitted]
    assert before_mono <= emitted.mono <= time.monotonic_ns()
    assert before_wall <= emitted.wall <= time.time_ns()
    assert emitted.pid == os.getpid() and emitted.proc == "orchestrator"


def test_jsonl_sink_writes_valid_lines_and_rotates_by_size(tmp_path: Path) -> None:
    path = tmp_path / "node.jsonl"
    line_bytes = len(Emitter("node").emit(sample(ObjectLoaded, sequence=10)).to_line()) + 1
    sink = JsonlSink(path, max_bytes=line_bytes * 10, keep=2)
    emitter = Emitter("node", [sink])
    sent = [emitter.emit(sample(ObjectLoaded, sequence=n)) for n in range(35)]
    sink.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["node.jsonl", "node.jsonl.1", "node.jsonl.2"]
    for name in files:
        assert path.with_name(name).stat().st_size <= line_bytes * 10
    kept = [
        validate_line(line)
        for name in ("node.jsonl.2", "node.jsonl.1", "node.jsonl")
        for line in path.with_name(name).read_text().splitlines()
    ]
    # the newest lines survive, in order, and equal what was emitted
    assert kept == sent[-len(kept):]
    assert len(kept) >= 21  # the two rotated files are full: 10 lines each


def test_jsonl_sink_appends_to_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    for n in range(2):
        sink = JsonlSink(path)
        Emitter("node", [sink]).emit(sample(ObjectLoaded, sequence=n))
        sink.close()
    lines = path.read_text().splitlines()
    assert [json.loads(line)["sequence"] for line in lines] == [0, 1]


def test_stderr_sink_shows_events_up_to_its_verbosity() -> None:
    shown: dict[int, list[str]] = {}
    for verbosity in (0, 1, 2):
        out = io.StringIO()
        emitter = Emitter("node", [StderrSink(verbosity, out)])
        for name in (EventName.run_faulted, EventName.stage_ready, EventName.object_loaded):
            emitter.emit(sample(EVENT_CLASSES[name]))
        shown[verbosity] = [line.split()[2] for line in out.getvalue().splitlines()]
    assert shown[0] == ["run_faulted"]
    assert shown[1] == ["run_faulted", "stage_ready"]
    assert shown[2] == ["run_faulted", "stage_ready", "object_loaded"]


def test_stderr_line_is_short_and_names_identities_and_reason() -> None:
    out = io.StringIO()
    Emitter("node", [StderrSink(0, out)]).emit(sample(RunFaulted))
    line = out.getvalue().strip()
    assert "node[" in line and "run_faulted" in line
    assert f"run={IDS['run_id']}" in line and f"node={IDS['node_id']}" in line
    assert "reason=WorkerCrashed" in line and "component=worker_ctl" in line


class Broken:
    def __init__(self) -> None:
        self.calls = 0

    def write(self, emitted: Emitted) -> None:
        self.calls += 1
        raise OSError(28, "No space left on device")

    def close(self) -> None:
        pass


def test_a_failing_sink_does_not_stop_the_others() -> None:
    broken, memory = Broken(), MemorySink()
    emitter = Emitter("node", [broken, memory])
    emitter.emit(NodeStarted(node_id=NodeId(1)))
    emitter.emit(NodeStarted(node_id=NodeId(2)))
    assert broken.calls == 2
    assert [e.event.node_id for e in memory.events] == [1, 2]


def test_flags_configure_the_process_default_emitter(tmp_path: Path) -> None:
    import argparse

    from swactor.events import (
        add_event_arguments,
        configure_from_args,
        default_emitter,
        emit,
        set_default_emitter,
    )

    parser = argparse.ArgumentParser()
    add_event_arguments(parser)
    path = tmp_path / "events" / "node.jsonl"
    args = parser.parse_args(["--events-file", str(path), "--event-verbosity", "-1"])
    previous = default_emitter()
    try:
        emitter = configure_from_args(args, "node")
        assert default_emitter() is emitter
        assert [type(s) for s in emitter.sinks] == [JsonlSink]
        emitted = emit(NodeStarted(node_id=NodeId(5)))
        emitter.close()
        assert [validate_line(line) for line in path.read_text().splitlines()] == [emitted]
    finally:
        set_default_emitter(previous)


class _CountingFile(io.BytesIO):
    """A file that counts its writes and flushes (JsonlSink's `_file`)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = self.flushes = 0

    def write(self, data: object) -> int:
        self.writes += 1
        return super().write(data)  # type: ignore[arg-type]

    def flush(self) -> None:
        self.flushes += 1


def test_emit_all_writes_a_batch_once_with_the_lines_emit_would_write(
        tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path / "e.jsonl")
    counting = _CountingFile()
    sink._file = counting
    emitter = Emitter("node", [sink])
    now = time.monotonic_ns()
    batch = emitter.emit_all([(sample(ObjectLoaded, sequence=n), now - 1000 * (4 - n))
                              for n in range(4)] + [(NodeStarted(node_id=NodeId(2)), None)])
    assert (counting.writes, counting.flushes) == (1, 1), "one write and one flush per batch"
    lines = counting.getvalue().decode().splitlines()
    assert [validate_line(line) for line in lines] == batch
    assert [e.mono for e in batch[:4]] == [now - 1000 * (4 - n) for n in range(4)]
    assert batch[4].mono >= now
    # a stamped event's wall time moves back with its mono, as `emit` does
    assert batch[4].wall - batch[0].wall >= batch[4].mono - batch[0].mono - 1000


def test_emit_all_rotates_between_lines_like_emit(tmp_path: Path) -> None:
    path = tmp_path / "node.jsonl"
    line_bytes = len(Emitter("node").emit(sample(ObjectLoaded, sequence=10)).to_line()) + 1
    sink = JsonlSink(path, max_bytes=line_bytes * 10, keep=5)
    emitter = Emitter("node", [sink])
    sent = []
    for start in range(0, 36, 4):
        sent += emitter.emit_all([(sample(ObjectLoaded, sequence=n), None)
                                  for n in range(start, start + 4)])
    sink.close()
    names = ["node.jsonl.3", "node.jsonl.2", "node.jsonl.1", "node.jsonl"]
    for name in names:
        assert len(path.with_name(name).read_text().splitlines()) == (10 if name != "node.jsonl"
                                                                     else 6)
    kept = [validate_line(line) for name in names
            for line in path.with_name(name).read_text().splitlines()]
    assert kept == sent


def test_emit_all_reaches_sinks_without_write_all_and_memory_and_stderr() -> None:
    class Plain:
        def __init__(self) -> None:
            self.got: list[Emitted] = []

        def write(self, emitted: Emitted) -> None:
            self.got.append(emitted)

        def close(self) -> None:
            pass

    plain, memory, out = Plain(), MemorySink(), io.StringIO()
    emitter = Emitter("node", [plain, memory, StderrSink(1, out)])
    batch = emitter.emit_all([(sample(ObjectLoaded), None), (sample(RunFaulted), None)])
    assert plain.got == batch and memory.events == batch
    assert [line.split()[2] for line in out.getvalue().splitlines()] == ["run_faulted"]
