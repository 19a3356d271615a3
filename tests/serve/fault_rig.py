"""`FaultRig`: the serving fault tests' `swactor serve`, its event files, an `openai`
client, and the steps those tests share.

`FaultRig(tmp_path, *flags)` starts `swactor serve --port 0 --slots 4 --warm-batch-rows 0
--events-dir tmp_path/events` (no batched decode kernels built at load: test time) with
`flags` (the pool: `--nodes`, `--stages`, `--spares`, ...) and
waits for its URL; as a context manager it stops the process (SIGTERM, then its group
killed) however the test ends. `healthy` streams `PROMPTS` once on the healthy server;
`stream_to_kill` streams them again and returns once each has `KILL_AFTER` chunks, the
moment a test kills a node; `assert_continued` waits for the faulted streams and says
each ended exactly as its healthy twin; `check_traces` runs `swactor check` on every
process's event file.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

import openai

from swactor.testing.serve_process import ServeProcess

from .streams import Stream, events, join, stream_all, wait_chunks

PROMPTS = ("The capital of France is", "Once upon a time, in a small village,",
           "The three primary colors are")
MAX_TOKENS = 28
KILL_AFTER = 4
"""Chunks every stream has received before a node is killed."""
TIMEOUT_S = 600.0
"""Bound on each wait for the streams (and each request)."""


class FaultRig:
    """One `swactor serve` for a fault test (module doc)."""

    def __init__(self, tmp_path: Path, *flags: str, boot_s: float = 600.0) -> None:
        self.events_dir = tmp_path / "events"
        self.log = self.events_dir / "orchestrator.jsonl"
        """The orchestrator's event file."""
        self.serve = ServeProcess(["serve", "--port", "0", "--slots", "4",
                                   "--warm-batch-rows", "0", *flags,
                                   "--events-dir", str(self.events_dir)])
        try:
            self.url = self.serve.wait_url(boot_s)
        except BaseException:
            self.serve.stop()
            raise
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="unused",
                                    max_retries=0, timeout=TIMEOUT_S)

    def __enter__(self) -> FaultRig:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.serve.stop()

    def stop(self) -> int:
        """SIGTERM and wait (`ServeProcess.stop`): the exit status."""
        return self.serve.stop()

    def events(self) -> list[dict[str, Any]]:
        """The orchestrator's events so far."""
        return events(self.log)

    def first_run(self) -> int:
        """The run id the session started serving on."""
        return int(next(e for e in self.events() if e["event"] == "serve_started")["run_id"])

    def run_nodes(self, run_id: int) -> set[int]:
        """Every node id with an event for a stage of run `run_id`."""
        return {int(e["node_id"]) for path in self.events_dir.glob("node-*.jsonl")
                for e in events(path) if e.get("run_id") == run_id
                and e.get("stage_index") is not None}

    def healthy(self, max_tokens: int = MAX_TOKENS) -> list[Stream]:
        """`PROMPTS` streamed at once on the healthy server, each to `max_tokens` chunks."""
        streams = stream_all(self.client, PROMPTS, max_tokens)
        join(streams, TIMEOUT_S)
        assert all(len(s.chunks) == max_tokens for s in streams), [s.chunks for s in streams]
        return streams

    def stream_to_kill(self, max_tokens: int = MAX_TOKENS) -> tuple[list[Stream], list[int]]:
        """`PROMPTS` streamed at once, returned when each has `KILL_AFTER` chunks and none
        is done: the streams, and how many chunks each had then."""
        streams = stream_all(self.client, PROMPTS, max_tokens)
        streamed = wait_chunks(streams, KILL_AFTER, TIMEOUT_S)
        assert max(streamed) < max_tokens, "killed too late"
        return streams, streamed

    def check_traces(self) -> None:
        """`swactor check` accepts every process's trace: one its tables allow."""
        check = subprocess.run(
            [sys.executable, "-m", "swactor.cli", "check",
             *map(str, sorted(self.events_dir.glob("*.jsonl")))],
            capture_output=True, text=True, timeout=300, check=False)
        assert check.returncode == 0 and " 0 violations" in check.stdout, check.stdout[-2000:]


def assert_continued(healthy: list[Stream], faulted: list[Stream]) -> None:
    """Wait for `faulted`; each has exactly its healthy twin's chunks (no token lost or
    repeated: one chunk per token) and ended at the length limit."""
    join(faulted, TIMEOUT_S)
    for before, after in zip(healthy, faulted, strict=True):
        assert after.chunks == before.chunks, (after.prompt, before.chunks, after.chunks)
        assert after.finish == before.finish == "length"
