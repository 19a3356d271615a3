"""Concurrent `openai` streams and event-log readers for the serving fault tests.

`Stream` is one streaming greedy completion in its own thread: its chunks' texts, when
each arrived, its finish reason or the error that ended it. `stream_all` starts one per
prompt; `join` waits for them. `events` reads a JSON-lines event file; `stage_node_pid`
finds, from the node event files of `swactor serve --events-dir`, the process and node
id that hold one stage of one run. Run as a module (`main`), it streams prompts from a
process of its own, for a client that must run inside a test host's network namespace.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import openai


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Stream(threading.Thread):
    """One streaming completion: its chunks' texts and when each arrived."""

    def __init__(self, client: openai.OpenAI, prompt: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.client, self.prompt, self.max_tokens = client, prompt, max_tokens
        self.chunks: list[str] = []
        self.times: list[float] = []
        self.finish: str | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for chunk in self.client.completions.create(
                    model="swactor", prompt=self.prompt, max_tokens=self.max_tokens,
                    temperature=0.0, stream=True):
                choice = chunk.choices[0]
                if choice.text:
                    self.chunks.append(choice.text)
                    self.times.append(time.monotonic())
                if choice.finish_reason:
                    self.finish = choice.finish_reason
        except BaseException as error:  # reported by the test
            self.error = error


def stream_all(client: openai.OpenAI, prompts: Sequence[str], max_tokens: int) -> list[Stream]:
    streams = [Stream(client, prompt, max_tokens) for prompt in prompts]
    for stream in streams:
        stream.start()
    return streams


def join(streams: list[Stream], timeout_s: float, *, errors: bool = False) -> None:
    """Wait for every stream to end; unless `errors`, none may have failed."""
    deadline = time.monotonic() + timeout_s
    for stream in streams:
        stream.join(max(0.0, deadline - time.monotonic()))
        assert not stream.is_alive(), f"stream {stream.prompt!r} did not end"
        assert errors or stream.error is None, f"stream {stream.prompt!r}: {stream.error!r}"


def wait_chunks(streams: list[Stream], count: int, timeout_s: float) -> list[int]:
    """Wait until every stream has `count` chunks (none failing); the counts then."""
    deadline = time.monotonic() + timeout_s
    while min(len(s.chunks) for s in streams) < count:
        assert time.monotonic() < deadline, "the streams did not start"
        assert all(s.error is None for s in streams), [s.error for s in streams]
        time.sleep(0.01)
    return [len(s.chunks) for s in streams]


def stage_node_pid(events_dir: Path, stage: int, run_id: int) -> tuple[int, int] | None:
    """(pid, node id) of the node process that holds `stage` of run `run_id`, if any
    node file names it yet."""
    for path in sorted(events_dir.glob("node-*.jsonl")):
        for event in events(path):
            if event.get("run_id") == run_id and event.get("stage_index") == stage:
                return int(event["pid"]), int(event["node_id"])
    return None


def run_ids(events_dir: Path) -> set[int]:
    """Every run id a node event file names so far."""
    return {int(e["run_id"]) for path in events_dir.glob("node-*.jsonl")
            for e in events(path) if e.get("run_id") is not None}


def main(argv: Sequence[str]) -> int:
    """`python -m tests.serve.streams URL MAX_TOKENS PROMPT...`: stream every prompt at
    once (greedy) from a process that can reach URL (e.g. inside a test host's network
    namespace); one JSON line per chunk, `{"stream": i, "chunks": n}`, as it arrives,
    then `{"results": [{"prompt", "chunks", "finish", "error"}, ...]}`."""
    url, max_tokens, prompts = argv[0], int(argv[1]), argv[2:]
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=900)
    streams = stream_all(client, prompts, max_tokens)
    seen = [0] * len(streams)
    while any(s.is_alive() for s in streams) or seen != [len(s.chunks) for s in streams]:
        time.sleep(0.01)
        for index, stream in enumerate(streams):
            if len(stream.chunks) != seen[index]:
                seen[index] = len(stream.chunks)
                print(json.dumps({"stream": index, "chunks": seen[index]}), flush=True)
    print(json.dumps({"results": [
        {"prompt": s.prompt, "chunks": s.chunks, "finish": s.finish,
         "error": None if s.error is None else f"{type(s.error).__name__}: {s.error}"}
        for s in streams]}), flush=True)
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
