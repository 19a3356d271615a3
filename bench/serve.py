"""Serving: TTFT, per-request decode and aggregate tokens/s at 1-8 clients, side by side.

Theory of operation
-------------------
One invocation starts every server it compares, each on its own loopback port, and waits
for each to answer its readiness URL with HTTP 200:

- ``swactor-1`` and ``swactor-3``: ``swactor serve --nodes 1`` / ``--nodes 3`` (local nodes,
  real QUIC edges and workers), ready when ``/health`` answers 200 (the session is
  serving); skipped with a note where this checkout has no ``swactor serve``;
- ``llama.cpp``: ``python -m llama_cpp.server`` from the reference venv (``just reference``
  builds it; skipped with a note naming that recipe when it is missing), ready when
  ``/v1/models`` answers 200;
- any ``--server NAME=COMMAND`` given (``{port}`` in COMMAND is replaced by a free port;
  ``--ready-path`` names the readiness path).

All serve the same GGUF file (SmolLM2-135M-Instruct Q4_1 from the model cache). Then, for
each concurrency level (1, 2, 4, 8 clients) and each server in turn (so that the
machine's load falls on every server alike), the harness sends one warm-up request per
prompt-length bucket (one after another, ``--warmup-tokens`` tokens, not measured), then
runs the level: each of C clients sends ``--rounds`` passes over the fixed prompt set,
one streaming completion after another (closed loop), client i's k-th request taking
prompt ``(i + k) mod P``, greedy (``temperature 0``, ``seed 0``), ``--max-tokens`` tokens
each. So every level serves each prompt exactly ``C * rounds`` times: the same mix of
prompt lengths and completion lengths at every level, and a level's aggregate over the
1-client level's compares the same work (a level that served some prompts and not others
would compare mixes with different prefill and decode shares). A server
whose warm-ups and requests of a level all fail is left out of the further levels.

The client is aiohttp reading the server-sent events itself, not the ``openai`` package:
a request's times are taken as each ``data:`` event's bytes arrive, with no per-chunk
model parsing in the measured path (eight streams share this one Python process on a
busy machine), and the event framing (``[DONE]``, error objects) is seen as sent. The
``openai`` client is what the serve tests use; the wire format is the same.

Per request: time to first token (request sent -> first event carrying text), decode
tokens/s ((tokens - 1) / (first text event -> last text event)), where the token count is
the server's streamed ``usage.completion_tokens`` when it sends one (``stream_options:
include_usage``; swactor does) and otherwise the count of events carrying text
(llama.cpp's server sends one event per token). Per level: TTFT p50 and p95 (linear
interpolation between order statistics), the median per-request decode rate, and the
aggregate rate (every request's tokens / the level's wall time, first send -> last end),
and for a server whose ``/health`` counts run restarts (swactor's), how many happened
during the level: a run that faults moves its sequences to a new run, which the figures
alone show only as lost time.

Where the time went, per level: the cores each kind of the server's processes used
(workers, nodes, orchestrator+http; their sum; and the whole machine's, so what the
rest of a shared machine took shows), from ``/proc`` at the level's start and end. With
``--trace DIR`` each swactor server writes its event logs to ``DIR/NAME`` and each
level also says each stage's busy share and median step, the output objects, the
decode rows per decode object, the objects in flight when each came back, the stages
computing at once and how long only prompts' prefills computed (a decode object behind
a prompt waits where it computes: every edge is FIFO), and the
hops of objects that travelled alone: stage to stage, last stage to orchestrator,
orchestrator to stage 0 (``bench._servetrace``). ``--server NAME=COMMAND`` variants
(``swactor serve`` with other flags, or another checkout's) measure side by side with
the defaults.

Threads: every server computes on the same ``--threads T`` CPU threads (default: this
machine's CPUs). llama.cpp's server is given ``--n_threads T --n_threads_batch T``; each
swactor pipeline ``--threads`` per local node as ``swactor serve`` itself splits T CPUs
(``swactor.serve.serve_cmd.local_stage_threads``): T over the stages that compute at
once, its objects in flight, at most its stages (1 stage: T threads; 3 stages with 2
objects in flight on T = 2: 1 each), so at any moment T threads compute on each side.
The header, the JSON (``settings.threads``, ``settings.server_threads``) and the
report say what each server got. llama.cpp's server runs
one request at a time (a lock around its one model; ``--interrupt_requests false``, or
by default a new request cuts the stream in progress short); swactor interleaves
sequences in its KV slots.

With ``--long-tokens N`` each swactor pipeline then serves 1 and 4 clients again (one
pass over the prompts each) with N-token completions. A request's prefill runs alone on
the pipeline and stalls every other sequence's decode, so with short completions the
4-client level pays four prompts' prefills for each round of batched steps; with long
ones the batched decode steps, where concurrent sequences share a step's cost, outweigh
them. The same ratio at both lengths shows how much of the gap is prefill. llama.cpp's
server is left out of these levels: it serves one request at a time at any length.

With ``--pairs K`` each swactor pipeline then serves K pairs of levels, 1 client then 4
clients (one pass each), at ``--max-tokens`` and, with ``--long-tokens``, at that length,
the pipelines taking turns pair by pair. On a shared machine the CPU a server gets
drifts over tens of seconds, and a ratio of two levels run once, minutes apart, carries
that drift whole; each pair's two levels run back to back, so the median of the K pairs'
ratios is what the 4-over-1 goal then reports (with the pairs' lowest and highest).

Goal ratios printed at the end (the serving goals): each swactor pipeline's warm TTFT
p50 over llama.cpp server's (1 client); aggregate at 4 clients over 1 client on the same
pipeline (>= 2.5), at ``--max-tokens`` and, with ``--long-tokens``, at that length (with
``--pairs``, the median of the pairs' ratios); the
3-stage pipeline's aggregate at 4 clients over llama.cpp server's at 4 (>= 0.5).
``--json PATH`` writes every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from bench._servetrace import (
    CpuWindow,
    cpu_line,
    read_events,
    trace_line,
    window_figures,
)

LEVELS = (1, 2, 4, 8)
LONG_LEVELS = (1, 4)
"""Client counts of the ``--long-tokens`` levels: the pair the 4-over-1 goal compares."""
GOALS = {"four_over_one": 2.5, "three_stage_over_llama_at_4": 0.5}
READY_TIMEOUT_S = 900.0  # a cold swactor pipeline loads weights and builds its kernels
REQUEST_TIMEOUT_S = 600.0
MAX_EVENT_BYTES = 1 << 20  # one server-sent event's data; more is a broken server

# A fixed prompt set in prompt-length buckets (SmolLM2's tokenizer; tests/bench check the
# counts), so every level mixes short and long prefills. swactor pads a prompt of up to 64
# tokens on a CPU to a multiple of 8 positions (longer ones to 16) and builds one prefill
# kernel set per padded length: these prompts pad to 8, 24, 32 and 56 positions, all
# built while a serving stage loads (`--warm-prompt-tokens`, 64 by default).
PROMPTS: dict[str, tuple[str, ...]] = {
    "short (<= 16 tokens)": (
        "The capital of France is",
        "Once upon a time, a small robot",
    ),
    "medium (17-32 tokens)": (
        "Write a short poem about the sea. The waves roll in and out, the gulls cry "
        "above the shore, and",
        "Explain to a child why the sky is blue. Sunlight is made of many colours, and "
        "when it passes through the air",
    ),
    "long (49-64 tokens)": (
        "A recipe for bread needs only flour, water, salt and yeast. First, mix the flour "
        "and the salt in a large bowl. Then dissolve the yeast in warm water and pour it "
        "into the flour. Knead the dough for ten minutes until it is smooth, and then",
        "The history of the bicycle begins in the early nineteenth century, when inventors "
        "in Europe built wooden machines that riders pushed along with their feet. Pedals "
        "came later, and with them chains, gears and air-filled tyres, so that by the end "
        "of the century",
    ),
}
BUCKET_TOKENS: dict[str, tuple[int, int]] = {
    "short (<= 16 tokens)": (1, 16),
    "medium (17-32 tokens)": (17, 32),
    "long (49-64 tokens)": (49, 64),
}


def prompt_set() -> list[str]:
    """Every prompt, buckets interleaved (short, medium, long, short, ...), so that any
    run of consecutive prompts mixes lengths."""
    columns = list(PROMPTS.values())
    return [column[i] for i in range(max(map(len, columns))) for column in columns
            if i < len(column)]


# -- statistics ----------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between order statistics
    (numpy's default): p50 of [1, 2, 3, 4] is 2.5, p95 of [0, 10] is 9.5."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} outside 0..100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class RequestTiming:
    """One streamed request's clock readings (seconds, one monotonic clock)."""

    sent: float
    first: float | None = None  # the first event carrying text
    last: float | None = None  # the last event carrying text
    ended: float | None = None  # [DONE], an error or the end of the body
    text_events: int = 0
    usage_tokens: int | None = None  # the streamed usage.completion_tokens, if any
    finish_reason: str | None = None
    error: str | None = None

    @property
    def tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else self.text_events

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.sent

    @property
    def decode_tokens_per_s(self) -> float | None:
        """(tokens - 1) / (first text event -> last): the rate after the first token."""
        if self.first is None or self.last is None or self.tokens < 2:
            return None
        span = self.last - self.first
        return (self.tokens - 1) / span if span > 0 else None


@dataclass
class LevelFigures:
    """One concurrency level against one server."""

    clients: int
    requests: int
    errors: int
    tokens: int
    wall_s: float
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    decode_p50_tokens_per_s: float | None
    aggregate_tokens_per_s: float | None
    finish_reasons: dict[str, int] = field(default_factory=dict)
    error_examples: list[str] = field(default_factory=list)
    cores: dict[str, float] = field(default_factory=dict)
    """Cores the server's processes used during the level, by kind (workers, nodes,
    orchestrator+http), their sum (swactor) and the whole machine's (``bench._servetrace``)."""
    trace: dict[str, Any] | None = None
    """With ``--trace``: per-stage busy share and steps, objects out, rows per decode
    object, objects in flight, stages computing at once
    (``bench._servetrace.TraceFigures``)."""
    restarts: int | None = None
    """Runs the server provisioned again during the level's warm-ups and requests (its
    ``/health`` ``restarts`` before and after; None where it reports none): a run that
    faulted mid-level moves its sequences to a new run, which shows in the figures only
    as lost time."""

    @property
    def tokens_per_cpu_s(self) -> float | None:
        """Tokens per CPU-second the server's processes spent in the level: on a shared
        machine the aggregate follows the CPU the server got, this hardly moves."""
        cpu_s = self.cores.get("swactor", 0.0) * self.wall_s
        return self.tokens / cpu_s if cpu_s > 0 and self.tokens else None

    @classmethod
    def of(cls, clients: int, timings: Sequence[RequestTiming], wall_s: float
           ) -> LevelFigures:
        ttfts = [1e3 * t.ttft for t in timings if t.error is None and t.ttft is not None]
        rates = [r for t in timings if t.error is None
                 and (r := t.decode_tokens_per_s) is not None]
        errors = [t.error for t in timings if t.error is not None]
        tokens = sum(t.tokens for t in timings if t.error is None)
        return cls(
            clients=clients, requests=len(timings), errors=len(errors), tokens=tokens,
            wall_s=wall_s,
            ttft_p50_ms=percentile(ttfts, 50) if ttfts else None,
            ttft_p95_ms=percentile(ttfts, 95) if ttfts else None,
            decode_p50_tokens_per_s=statistics.median(rates) if rates else None,
            aggregate_tokens_per_s=tokens / wall_s if wall_s > 0 and tokens else None,
            finish_reasons=dict(Counter(t.finish_reason or "none" for t in timings
                                        if t.error is None)),
            error_examples=sorted(set(errors))[:3],
        )


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


# -- the client ----------------------------------------------------------------------------


def _event_text(payload: dict[str, Any]) -> str:
    """The text an OpenAI stream chunk carries (completion ``text`` or chat ``delta``)."""
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    choice = choices[0]
    text = choice.get("text")
    if text is None and isinstance(choice.get("delta"), dict):
        text = choice["delta"].get("content")
    return text if isinstance(text, str) else ""


def _apply_event(timing: RequestTiming, data: str, now: float) -> bool:
    """Fold one event's data into ``timing``; True when the stream is over."""
    if data == "[DONE]":
        return True
    try:
        payload = json.loads(data)
    except ValueError:
        timing.error = f"event is not JSON: {data[:60]!r}"
        return True
    if not isinstance(payload, dict):
        timing.error = "event is not a JSON object"
        return True
    if "error" in payload:
        error = payload["error"]
        message = error.get("message") if isinstance(error, dict) else error
        timing.error = f"server error: {message}"
        return True
    if _event_text(payload):
        timing.text_events += 1
        if timing.first is None:
            timing.first = now
        timing.last = now
    choices = payload.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        reason = choices[0].get("finish_reason")
        if isinstance(reason, str):
            timing.finish_reason = reason
    usage = payload.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        timing.usage_tokens = usage["completion_tokens"]
    return False


async def stream_completion(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    clock: Callable[[], float] = time.perf_counter,
) -> RequestTiming:
    """POST ``body`` (with ``stream: true``) to ``url`` and time its server-sent events.

    The clock is read once when the request is sent and once per complete event (its
    closing blank line read). A refused request, an error event or a malformed stream ends
    in ``timing.error``; nothing is raised for what the server sends."""
    timing = RequestTiming(sent=clock())
    try:
        async with session.post(url, json={**body, "stream": True}) as response:
            if response.status != 200:
                text = (await response.content.read(2048)).decode("utf-8", "replace")
                timing.error = f"HTTP {response.status}: {text.strip()[:200]}"
                timing.ended = clock()
                return timing
            data: list[str] = []
            size = 0
            done = False
            while not done:
                raw = await response.content.readline()
                if not raw:
                    if timing.error is None and timing.finish_reason is None:
                        timing.error = "stream ended without [DONE] or a finish_reason"
                    break
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if line:
                    if line.startswith("data:"):
                        piece = line[5:].removeprefix(" ")
                        size += len(piece)
                        if size > MAX_EVENT_BYTES:
                            timing.error = f"an event's data exceeds {MAX_EVENT_BYTES} bytes"
                            break
                        data.append(piece)
                    continue  # comments (":"), event:/id:/retry: fields carry no data
                if data:
                    done = _apply_event(timing, "\n".join(data), clock())
                data, size = [], 0
    except (aiohttp.ClientError, TimeoutError, ValueError) as error:
        timing.error = f"{type(error).__name__}: {error}"
    timing.ended = clock()
    return timing


def completion_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """A greedy streaming completion of exactly the fields both servers understand."""
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "seed": 0, "stream": True, "stream_options": {"include_usage": True}}


async def run_level(session: aiohttp.ClientSession, base_url: str, model: str,
                    prompts: Sequence[str], clients: int, rounds: int, max_tokens: int,
                    clock: Callable[[], float] = time.perf_counter) -> LevelFigures:
    """C clients, each ``rounds`` passes over `prompts` one request after another, client
    i starting at prompt i (module doc); every request's timing."""
    timings: list[RequestTiming] = []
    url = f"{base_url}/v1/completions"

    async def client(index: int) -> None:
        for k in range(rounds * len(prompts)):
            prompt = prompts[(index + k) % len(prompts)]
            timings.append(await stream_completion(
                session, url, completion_body(model, prompt, max_tokens), clock))

    started = clock()
    await asyncio.gather(*(client(i) for i in range(clients)))
    return LevelFigures.of(clients, timings, clock() - started)


def restarts_of(health: object) -> int | None:
    """The ``restarts`` count of a ``/health`` answer (swactor serve's), else None."""
    value = health.get("restarts") if isinstance(health, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


async def server_restarts(session: aiohttp.ClientSession, base_url: str) -> int | None:
    """The server's ``/health`` restarts count now; None if it reports none."""
    try:
        async with session.get(f"{base_url}/health",
                               timeout=aiohttp.ClientTimeout(total=10)) as reply:
            return restarts_of(await reply.json(content_type=None))
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


async def warm_up(session: aiohttp.ClientSession, base_url: str, model: str,
                  tokens: int) -> list[str]:
    """One request per prompt-length bucket, one after another; the errors, if any."""
    errors = []
    for bucket in PROMPTS.values():
        timing = await stream_completion(session, f"{base_url}/v1/completions",
                                         completion_body(model, bucket[0], tokens))
        if timing.error is not None:
            errors.append(timing.error)
    return errors


# -- the servers ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Target:
    """A server command to start, where it answers, and how to tell it is ready."""

    name: str
    argv: list[str]
    port: int
    ready_path: str
    env: dict[str, str] = field(default_factory=dict)
    events_dir: Path | None = None
    """Where its processes write their event logs (``--trace``), if anywhere."""
    threads: dict[str, Any] | None = None
    """The CPU threads it was given (None: what its command says): ``flags``, ``where``
    they apply (words), ``per_node`` and ``at_once`` (its stages that compute at once)."""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class Server:
    """One started server process (its own process group), its log, its model id."""

    def __init__(self, target: Target, log_dir: Path) -> None:
        self.target = target
        self.log_path = log_dir / f"{target.name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.model = ""
        self.ready_s = 0.0

    def start(self) -> None:
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.target.argv, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, env={**os.environ, **self.target.env},
                start_new_session=True)

    def log_tail(self, lines: int = 8) -> str:
        try:
            text = self.log_path.read_text(errors="replace").rstrip().splitlines()
        except OSError:
            return ""
        return "\n".join(f"    {line}" for line in text[-lines:])

    async def wait_ready(self, session: aiohttp.ClientSession, timeout_s: float) -> None:
        """Poll the readiness URL until HTTP 200; then read the model id from /v1/models.
        Raises RuntimeError naming why when the process exits or the time runs out."""
        assert self.process is not None
        started = time.monotonic()
        url = self.target.base_url + self.target.ready_path
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.target.name} exited with {self.process.returncode} "
                                   f"before {url} answered:\n{self.log_tail()}")
            if time.monotonic() - started > timeout_s:
                raise RuntimeError(f"{self.target.name}: {url} not ready after {timeout_s:.0f}"
                                   f" s:\n{self.log_tail()}")
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as reply:
                    if reply.status == 200:
                        break
            await asyncio.sleep(1.0)
        self.ready_s = time.monotonic() - started
        async with session.get(self.target.base_url + "/v1/models") as reply:
            models = await reply.json()
        self.model = str(models["data"][0]["id"])

    def stop(self) -> str:
        """SIGINT (Ctrl-C: swactor serve tears its run down), then SIGTERM, then SIGKILL to
        the process group this server was started in; how it ended, in words."""
        process = self.process
        if process is None:
            return "never started"
        if process.poll() is not None:
            return f"had exited with {process.returncode}"
        started = time.monotonic()
        how = "still running after SIGKILL"
        for sig, wait_s in ((signal.SIGINT, 60.0), (signal.SIGTERM, 10.0),
                            (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            try:
                process.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
            how = (f"exited with {process.returncode} {time.monotonic() - started:.1f} s "
                   f"after {sig.name}")
            break
        with contextlib.suppress(ProcessLookupError):  # stragglers of the group
            os.killpg(process.pid, signal.SIGKILL)
        return how


def swactor_serve_available() -> str | None:
    """None when this checkout's CLI has ``swactor serve``; otherwise why not."""
    result = subprocess.run([sys.executable, "-m", "swactor.cli", "serve", "--help"],
                            capture_output=True, text=True, timeout=120)
    if result.returncode == 0:
        return None
    return "this checkout has no `swactor serve` (`swactor serve --help` failed)"


def swactor_threads(stages: int, threads: int) -> tuple[int, int]:
    """``(per node, computing at once)``: the ``--threads`` each local node of a
    ``stages``-stage ``swactor serve`` gets when ``threads`` CPUs are split as the server
    splits its host's (``local_stage_threads``, default batching), and how many of its
    stages compute at once (its objects in flight, at most its stages)."""
    from swactor.serve.serve_cmd import (
        DEFAULT_BATCH_ROWS,
        local_stage_threads,
        objects_in_flight_for,
    )

    per_node = local_stage_threads(stages, DEFAULT_BATCH_ROWS, None, threads)
    in_flight = objects_in_flight_for(stages, DEFAULT_BATCH_ROWS, None, threads) or stages
    return per_node, min(stages, in_flight)


def default_targets(stages: Sequence[int], threads: int, model: Path
                    ) -> tuple[list[Target], list[str]]:
    """The swactor pipelines and llama.cpp's server, or a note for each that cannot run;
    each given ``threads`` CPU threads (module doc)."""
    from bench.model import reference_venv

    targets: list[Target] = []
    notes: list[str] = []
    why_not = swactor_serve_available() if stages else None
    for count in stages:
        if why_not is not None:
            notes.append(f"swactor-{count}: skipped: {why_not}")
            continue
        port = free_port()
        per_node, at_once = swactor_threads(count, threads)
        where = ("on its node" if count == 1 else
                 f"on each of its {count} nodes, which compute one at a time (one object "
                 "in flight)" if at_once == 1 else
                 f"on each of its {count} nodes, {at_once} of which compute at once "
                 "(its objects in flight)")
        targets.append(Target(f"swactor-{count}", [
            sys.executable, "-m", "swactor.cli", "serve", "--nodes", str(count),
            "--threads", str(per_node), "--port", str(port)], port, "/health",
            threads={"flags": f"--threads {per_node}", "where": where,
                     "per_node": per_node, "at_once": at_once}))
    python = reference_venv() / "bin" / "python"
    check = (subprocess.run([str(python), "-c", "import llama_cpp.server"],
                            capture_output=True, timeout=120) if python.exists() else None)
    if check is None or check.returncode != 0:
        notes.append(f"llama.cpp: skipped: no llama_cpp.server in {reference_venv()} "
                     "(`just reference` builds it)")
    else:
        port = free_port()
        targets.append(Target("llama.cpp", [
            str(python), "-m", "llama_cpp.server", "--model", str(model),
            "--n_threads", str(threads), "--n_threads_batch", str(threads),
            "--interrupt_requests", "false", "--host", "127.0.0.1", "--port", str(port)],
            port, "/v1/models",
            threads={"flags": f"--n_threads {threads} --n_threads_batch {threads}",
                     "where": "", "per_node": threads, "at_once": 1}))
    return targets, notes


def parse_server(spec: str, ready_path: str, trace: Path | None = None) -> Target:
    """``NAME=COMMAND`` with ``{port}`` in COMMAND -> a Target on a free port;
    ``{events_dir}`` in COMMAND is ``trace/NAME`` (``--trace``)."""
    name, sep, command = spec.partition("=")
    if not sep or not name or not command.strip():
        raise argparse.ArgumentTypeError(f"--server wants NAME=COMMAND, got {spec!r}")
    if "{events_dir}" in command and trace is None:
        raise argparse.ArgumentTypeError(f"--server {name}: {{events_dir}} needs --trace DIR")
    port = free_port()
    events = None if trace is None or "{events_dir}" not in command else trace / name
    return Target(name, [word.replace("{port}", str(port))
                         .replace("{events_dir}", str(events)) for word in shlex.split(command)],
                  port, ready_path, events_dir=events)


def traced(target: Target, trace: Path) -> Target:
    """A swactor serve target that writes its processes' event logs to ``trace/NAME``."""
    events = trace / target.name
    return replace(target, argv=[*target.argv, "--events-dir", str(events)],
                   events_dir=events)


# -- the run -------------------------------------------------------------------------------


async def measure(targets: Sequence[Target], levels: Sequence[int], rounds: int,
                  max_tokens: int, warmup_tokens: int, log_dir: Path, long_tokens: int = 0,
                  pairs: int = 0) -> dict[str, Any]:
    """Start every target, run the levels interleaved across them (then, with
    `long_tokens`, the swactor pipelines' levels of longer completions, and with `pairs`,
    their pairs of 1- and 4-client levels), stop them all."""
    prompts = prompt_set()
    servers = [Server(target, log_dir) for target in targets]
    figures: dict[str, Any] = {"servers": {}, "levels": {}, "notes": []}
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S, sock_read=REQUEST_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        try:
            ready: list[Server] = []
            for server in servers:
                print(f"  starting {server.target.name}: {shlex.join(server.target.argv)}",
                      flush=True)
                server.start()
                try:
                    await server.wait_ready(session, READY_TIMEOUT_S)
                except RuntimeError as error:
                    figures["notes"].append(f"{server.target.name}: not measured: {error}")
                    print(f"  {server.target.name}: not measured: {error}", flush=True)
                    print(f"  {server.target.name}: {server.stop()}", flush=True)
                    continue
                ready.append(server)
                figures["servers"][server.target.name] = {
                    "argv": server.target.argv, "ready_s": server.ready_s,
                    "model": server.model}
                print(f"  {server.target.name} ready in {server.ready_s:.0f} s "
                      f"(model {server.model})", flush=True)
            failing: set[str] = set()
            for clients in levels:
                for server in ready:
                    if server.target.name in failing:
                        continue
                    level, warm_ups_failed = await _run_level(
                        session, server, prompts, clients, rounds, max_tokens, warmup_tokens,
                        figures["notes"])
                    figures["levels"].setdefault(server.target.name, {})[str(clients)] = (
                        asdict(level))
                    if level.errors == level.requests and warm_ups_failed:
                        failing.add(server.target.name)  # every request failed: so would the rest
                        figures["notes"].append(
                            f"{server.target.name}: every request of {clients} client(s) and "
                            "every warm-up failed; its further levels are not run")
            if long_tokens:
                figures["long"] = {"max_tokens": long_tokens, "levels": {}}
                for clients in LONG_LEVELS:
                    for server in ready:
                        name = server.target.name
                        if name in failing or not name.startswith("swactor-"):
                            continue
                        print(f"  {name:10s} {long_tokens}-token completions:", flush=True)
                        level, _ = await _run_level(session, server, prompts, clients, 1,
                                                    long_tokens, warmup_tokens,
                                                    figures["notes"])
                        figures["long"]["levels"].setdefault(name, {})[str(clients)] = (
                            asdict(level))
            if pairs:
                pipelines = [server for server in ready if server.target.name not in failing
                             and server.target.name.startswith("swactor-")]
                figures["pairs"] = await _run_pairs(
                    session, pipelines, prompts, pairs,
                    [max_tokens, *([long_tokens] if long_tokens else [])], warmup_tokens,
                    figures["notes"])
        finally:
            for server in servers:
                if server.process is not None and server.process.poll() is None:
                    how = server.stop()
                    figures["servers"].setdefault(server.target.name, {})["stop"] = how
                    print(f"  {server.target.name}: {how}", flush=True)
    return figures


async def _run_level(session: aiohttp.ClientSession, server: Server, prompts: Sequence[str],
                     clients: int, rounds: int, max_tokens: int, warmup_tokens: int,
                     notes: list[str], echo: bool = True) -> tuple[LevelFigures, bool]:
    """One level on one server: its warm-ups, then `clients` clients' requests, with the
    cores its processes used and (traced servers) where the time went; printed as it ends
    (unless not `echo`). Also whether every warm-up failed."""
    name = server.target.name
    before = await server_restarts(session, server.target.base_url)
    errors = await warm_up(session, server.target.base_url, server.model, warmup_tokens)
    assert server.process is not None
    cpu = CpuWindow(server.process.pid)
    cpu.start()
    window_start = time.monotonic_ns()
    level = await run_level(session, server.target.base_url, server.model,
                            prompts, clients, rounds, max_tokens)
    window_end = time.monotonic_ns()
    level.cores = cpu.stop((window_end - window_start) / 1e9)
    trace = (None if server.target.events_dir is None else window_figures(
        read_events(server.target.events_dir), window_start, window_end))
    level.trace = None if trace is None else asdict(trace)
    after = await server_restarts(session, server.target.base_url)
    if before is not None and after is not None:
        level.restarts = after - before
        if level.restarts:
            notes.append(f"{name}: {level.restarts} run restart(s) during the "
                         f"{clients}-client level of {max_tokens}-token completions (a run "
                         "faulted; its sequences continued on a new run)")
    if errors:
        level.error_examples = [f"warm-up: {e}" for e in errors[:2]] + level.error_examples
    if echo:
        print(f"  {name:10s} {clients} client(s): " + _level_line(level), flush=True)
        print(f"  {'':10s} {cpu_line(level.cores)}; {_fmt(level.tokens_per_cpu_s)} tokens "
              "per CPU-second of the server's processes", flush=True)
        if trace is not None:
            print(f"  {'':10s} {trace_line(trace)}", flush=True)
    return level, len(errors) == len(PROMPTS)


async def _run_pairs(session: aiohttp.ClientSession, pipelines: Sequence[Server],
                     prompts: Sequence[str], pairs: int, lengths: Sequence[int],
                     warmup_tokens: int, notes: list[str]) -> dict[str, Any]:
    """`pairs` pairs of a 1-client and a 4-client level (one pass each) per pipeline and
    completion length, the pipelines taking turns pair by pair (module doc). Per length
    and pipeline: each pair's aggregates and ratio."""
    result: dict[str, Any] = {"count": pairs, "lengths": {}}
    for tokens in lengths:
        by_name: dict[str, list[dict[str, Any]]] = {}
        result["lengths"][str(tokens)] = by_name
        for index in range(pairs):
            for server in pipelines:
                one, _ = await _run_level(session, server, prompts, 1, 1, tokens,
                                          warmup_tokens, notes, echo=False)
                four, _ = await _run_level(session, server, prompts, 4, 1, tokens,
                                           warmup_tokens, notes, echo=False)
                pair = {"one": one.aggregate_tokens_per_s,
                        "four": four.aggregate_tokens_per_s,
                        "ratio": (ratio(four.aggregate_tokens_per_s,
                                        one.aggregate_tokens_per_s)
                                  if not (one.errors or four.errors) else None),
                        "errors": one.errors + four.errors}
                by_name.setdefault(server.target.name, []).append(pair)
                print(f"  {server.target.name:10s} pair {index + 1}/{pairs}, {tokens} tokens: "
                      f"1 client {_fmt(pair['one'])} tok/s, 4 clients {_fmt(pair['four'])} "
                      f"-> {_fmt(pair['ratio'], 2)}"
                      + (f" ({one.errors + four.errors} error(s))"
                         if one.errors or four.errors else ""), flush=True)
    return result


def pair_ratios(figures: dict[str, Any], name: str, tokens: int) -> list[float]:
    """The 4-over-1 ratios of `name`'s pairs at `tokens`-token completions (none where
    no pairs ran; a pair with an error has none)."""
    pairs = (figures.get("pairs") or {}).get("lengths", {}).get(str(tokens), {}).get(name, [])
    return [pair["ratio"] for pair in pairs if pair.get("ratio") is not None]


def _level_line(level: LevelFigures) -> str:
    errors = f", {level.errors} error(s): {level.error_examples}" if level.errors else ""
    return (f"TTFT p50 {_fmt(level.ttft_p50_ms, 0)} ms p95 {_fmt(level.ttft_p95_ms, 0)} ms, "
            f"decode {_fmt(level.decode_p50_tokens_per_s)} tok/s per request, aggregate "
            f"{_fmt(level.aggregate_tokens_per_s)} tok/s ({level.requests} requests, "
            f"{level.tokens} tokens, {level.wall_s:.1f} s; finish "
            f"{', '.join(f'{k} {v}' for k, v in sorted(level.finish_reasons.items()))})"
            f"{errors}"
            + (f", {level.restarts} run restart(s)" if level.restarts else ""))


def _per_cpu_s(level: dict[str, Any]) -> float | None:
    """A level's tokens per CPU-second of the server's processes (None where its figures
    have no cores: llama.cpp's are there too, an older run's are not)."""
    cores = (level.get("cores") or {}).get("swactor")
    cpu_s = cores * level.get("wall_s", 0.0) if cores else 0.0
    return level["tokens"] / cpu_s if cpu_s > 0 and level.get("tokens") else None


def _fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _figure(figures: dict[str, Any], name: str, clients: int, key: str) -> float | None:
    value = figures["levels"].get(name, {}).get(str(clients), {}).get(key)
    return float(value) if value is not None else None


def goal_rows(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """The serving goals as ratios of figures of this run (module doc)."""
    rows: list[dict[str, Any]] = []
    reference = "llama.cpp"
    pipelines = sorted(name for name in figures["levels"] if name.startswith("swactor-"))
    for name in pipelines:
        rows.append({
            "goal": f"{name} warm TTFT p50 / llama.cpp server's (1 client)",
            "measured": ratio(_figure(figures, name, 1, "ttft_p50_ms"),
                              _figure(figures, reference, 1, "ttft_p50_ms")),
            "target": None, "at_least": False})
    settings = figures.get("settings") or {}
    for name in [*pipelines, reference]:
        if name not in figures["levels"]:
            continue
        rows.append(_four_over_one(
            figures, name, f"{name} aggregate tok/s at 4 clients / 1 client",
            ratio(_figure(figures, name, 4, "aggregate_tokens_per_s"),
                  _figure(figures, name, 1, "aggregate_tokens_per_s")),
            settings.get("max_tokens"), GOALS["four_over_one"] if name != reference else None))
    long = figures.get("long") or {}
    for name, levels in sorted((long.get("levels") or {}).items()):
        rows.append(_four_over_one(
            figures, name, (f"{name} aggregate tok/s at 4 clients / 1 client, "
                            f"{long['max_tokens']}-token completions"),
            ratio(levels.get("4", {}).get("aggregate_tokens_per_s"),
                  levels.get("1", {}).get("aggregate_tokens_per_s")),
            long["max_tokens"], GOALS["four_over_one"]))
    rows.append({
        "goal": "swactor-3 aggregate at 4 clients / llama.cpp server's at 4",
        "measured": ratio(_figure(figures, "swactor-3", 4, "aggregate_tokens_per_s"),
                          _figure(figures, reference, 4, "aggregate_tokens_per_s")),
        "target": GOALS["three_stage_over_llama_at_4"], "at_least": True})
    for row in rows:
        measured, target = row["measured"], row["target"]
        row["verdict"] = ("not measured" if measured is None else "reported" if target is None
                          else "met" if measured >= target else "missed")
    return rows


def _four_over_one(figures: dict[str, Any], name: str, goal: str, levels_ratio: float | None,
                   tokens: int | None, target: float | None) -> dict[str, Any]:
    """A 4-over-1 goal row: the median of the pipeline's pairs at that length where pairs
    ran (with their lowest and highest), else the ratio of its two levels."""
    ratios = pair_ratios(figures, name, tokens) if tokens is not None else []
    if not ratios:
        return {"goal": goal, "measured": levels_ratio, "target": target, "at_least": True}
    count = f"{len(ratios)} pair{'s' if len(ratios) != 1 else ''}"
    return {"goal": f"{goal}, median of {count} ({min(ratios):.2f}-"
            f"{max(ratios):.2f}; the levels' own ratio {_fmt(levels_ratio, 2)})",
            "measured": statistics.median(ratios), "target": target, "at_least": True}


def table(figures: dict[str, Any], levels: Sequence[int]) -> list[str]:
    """Side by side: one row per level and server, and each figure over llama.cpp's."""
    names = list(figures["levels"])
    reference = figures["levels"].get("llama.cpp", {})
    lines = [f"{'clients':>7s}  {'server':10s} {'TTFT p50 ms':>11s} {'p95 ms':>8s} "
             f"{'decode tok/s':>12s} {'aggregate':>9s} {'agg/1 client':>12s}  "
             f"{'vs llama.cpp: TTFT p50':>22s} {'aggregate':>9s}"]
    for clients in levels:
        for name in names:
            level = figures["levels"][name].get(str(clients))
            if level is None:
                continue
            one = figures["levels"][name].get("1", {}).get("aggregate_tokens_per_s")
            ref = reference.get(str(clients), {})
            versus = ("" if name == "llama.cpp" or not ref else
                      f"{_fmt(ratio(level['ttft_p50_ms'], ref.get('ttft_p50_ms')), 2):>22s} "
                      f"{_fmt(ratio(level['aggregate_tokens_per_s'], ref.get('aggregate_tokens_per_s')), 2):>9s}")  # noqa: E501
            lines.append(
                f"{clients:7d}  {name:10s} {_fmt(level['ttft_p50_ms'], 0):>11s} "
                f"{_fmt(level['ttft_p95_ms'], 0):>8s} "
                f"{_fmt(level['decode_p50_tokens_per_s']):>12s} "
                f"{_fmt(level['aggregate_tokens_per_s']):>9s} "
                f"{_fmt(ratio(level['aggregate_tokens_per_s'], one), 2):>12s}  {versus}"
                + (f"  ({level['errors']} errors)" if level["errors"] else ""))
    return lines


def threads_sentence(settings: dict[str, Any]) -> str:
    """What the report says of each server's CPU threads (``settings``: a run's)."""
    given = settings.get("server_threads")
    if not given:  # figures of a run that recorded llama.cpp's alone
        return (f"Threads: llama.cpp {settings.get('threads')}, swactor serve's "
                "own default.")
    return (f"Threads: {settings.get('threads')} for every server: "
            + "; ".join(f"{name} `{info['flags']}`"
                        + (f" {info['where']}" if info["where"] else "")
                        for name, info in given.items()) + ".")


def markdown(figures: dict[str, Any]) -> list[str]:
    """The report's serving section from this module's ``--json`` figures."""
    settings = figures.get("settings", {})
    lines = ["## Serving: swactor serve against llama.cpp's server", "",
             f"`python -m bench serve`: streaming greedy completions of "
             f"{settings.get('max_tokens')} tokens; each client runs {settings.get('rounds')} "
             f"pass(es) over the same {sum(settings.get('prompts', {}).values())} prompts "
             "(three prompt-length buckets), from its own offset, so every level serves the "
             "same mix; the same model file for every server; one warm-up "
             "request per bucket before each level; levels run server after server. "
             + threads_sentence(settings), ""]
    when = figures.get("measured")
    if when:
        lines += [f"Measured {when['date_utc']} UTC at commit {when['commit']} in "
                  f"{when['minutes']:.1f} min; load average (1 min) "
                  f"{when['load_average_start']:.1f} at the start, "
                  f"{when['load_average_end']:.1f} at the end (a shared "
                  "2-core machine: the ratios pair figures of this one run).", ""]
    lines += [
             "| clients | server | TTFT p50 ms | TTFT p95 ms | decode tok/s per request "
             "(median) | aggregate tok/s | aggregate / 1 client | TTFT p50 / llama.cpp | "
             "aggregate / llama.cpp | requests, tokens (finish reasons) | errors | "
             "tokens per CPU-second (server's processes) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    reference = figures["levels"].get("llama.cpp", {})
    for clients in settings.get("levels", LEVELS):
        for name, rows in figures["levels"].items():
            level = rows.get(str(clients))
            if level is None:
                continue
            one = rows.get("1", {}).get("aggregate_tokens_per_s")
            ref = reference.get(str(clients), {}) if name != "llama.cpp" else {}
            lines.append(
                f"| {clients} | {name} | {_fmt(level['ttft_p50_ms'], 0)} | "
                f"{_fmt(level['ttft_p95_ms'], 0)} | {_fmt(level['decode_p50_tokens_per_s'])} | "
                f"{_fmt(level['aggregate_tokens_per_s'])} | "
                f"{_fmt(ratio(level['aggregate_tokens_per_s'], one), 2)} | "
                f"{_fmt(ratio(level['ttft_p50_ms'], ref.get('ttft_p50_ms')), 2)} | "
                f"{_fmt(ratio(level['aggregate_tokens_per_s'], ref.get('aggregate_tokens_per_s')), 2)} | "  # noqa: E501
                f"{level['requests']}, {level['tokens']} ("
                + ", ".join(f"{k} {v}" for k, v in sorted(level.get("finish_reasons", {}).items()))
                + f") | {level['errors']} | {_fmt(_per_cpu_s(level))} |")
    long = figures.get("long")
    if long:
        lines += ["", f"The same prompts with {long['max_tokens']}-token completions "
                  f"(`--long-tokens {long['max_tokens']}`), swactor's pipelines at 1 and 4 "
                  "clients, one pass each, after the levels above: decode outweighs "
                  "prefill here.", "",
                  "| clients | server | TTFT p50 ms | decode tok/s per request (median) | "
                  "aggregate tok/s | aggregate / 1 client | requests, tokens | errors |",
                  "|---|---|---|---|---|---|---|---|"]
        for clients in LONG_LEVELS:
            for name, rows in long["levels"].items():
                level = rows.get(str(clients))
                if level is None:
                    continue
                one = rows.get("1", {}).get("aggregate_tokens_per_s")
                lines.append(
                    f"| {clients} | {name} | {_fmt(level['ttft_p50_ms'], 0)} | "
                    f"{_fmt(level['decode_p50_tokens_per_s'])} | "
                    f"{_fmt(level['aggregate_tokens_per_s'])} | "
                    f"{_fmt(ratio(level['aggregate_tokens_per_s'], one), 2)} | "
                    f"{level['requests']}, {level['tokens']} | {level['errors']} |")
    pairs = figures.get("pairs")
    if pairs:
        lines += ["", f"Then {pairs['count']} pairs of a 1-client and a 4-client level per "
                  "pipeline and length (`--pairs`), one pass each, the two levels of a pair "
                  "back to back, the pipelines taking turns: aggregate tok/s at 1 and 4 "
                  "clients and their ratio, pair by pair (the goals below take the median "
                  "ratio: the CPU a shared machine gives drifts between levels run apart).",
                  "", "| completion tokens | server | pairs: 1 client -> 4 clients (ratio) "
                  "| median ratio |", "|---|---|---|---|"]
        for tokens, by_name in pairs["lengths"].items():
            for name, each in by_name.items():
                ratios = pair_ratios(figures, name, int(tokens))
                lines.append(
                    f"| {tokens} | {name} | "
                    + "; ".join(f"{_fmt(p['one'])} -> {_fmt(p['four'])} ({_fmt(p['ratio'], 2)})"
                                for p in each)
                    + f" | {_fmt(statistics.median(ratios) if ratios else None, 2)} |")
    lines += ["", "| goal | measured | target | verdict |", "|---|---|---|---|"]
    for row in figures.get("goals", []):
        target = (f"{'>=' if row['at_least'] else '<'} {row['target']:g}"
                  if row["target"] is not None else "(reported)")
        lines.append(f"| {row['goal']} | {_fmt(row['measured'], 2)} | {target} | "
                     f"{row['verdict']} |")
    lines.append("")
    lines += [f"- {note}" for note in figures.get("notes", [])]
    servers = figures.get("servers", {})
    lines += [f"- {name}: "
              + "; ".join(part for part in (
                  f"ready {info['ready_s']:.0f} s after start" if "ready_s" in info else "",
                  f"stop: {info['stop']}" if "stop" in info else "") if part)
              for name, info in servers.items()]
    return [*lines, ""]


def main(argv: list[str]) -> int:
    from swactor.model.paths import default_model_path

    parser = argparse.ArgumentParser(prog="python -m bench serve",
                                     description=__doc__.split("\n\n")[0],
                                     epilog="Every option has a small default: the whole "
                                     "run takes a few minutes once the servers are up.")
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)),
                        help="concurrent clients per level, comma-separated (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="passes over the prompt set per client per level, each "
                             "pass one request per prompt (default %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=32,
                        help="tokens per request, greedy (default %(default)s)")
    parser.add_argument("--long-tokens", type=int, default=0, metavar="N",
                        help="after the levels, each swactor pipeline serves 1 and 4 "
                        "clients again, one pass each, with N-token completions, for the "
                        "4-over-1 ratio where decode outweighs prefill (default "
                        "%(default)s: not run)")
    parser.add_argument("--pairs", type=int, default=0, metavar="K",
                        help="after that, each swactor pipeline serves K pairs of a 1- and "
                        "a 4-client level, back to back, at --max-tokens (and --long-tokens); "
                        "the 4-over-1 goal is then the median of the pairs' ratios, which a "
                        "shared machine's drifting CPU moves far less (default "
                        "%(default)s: not run)")
    parser.add_argument("--warmup-tokens", type=int, default=4,
                        help="tokens per warm-up request (default %(default)s)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, metavar="T",
                        help="CPU threads every server computes on: llama.cpp's server "
                        "--n_threads T --n_threads_batch T, each swactor pipeline T split "
                        "over its stages that compute at once, as swactor serve splits "
                        "its host's CPUs (default: this machine's CPUs, %(default)s)")
    parser.add_argument("--stages", default="1,3",
                        help="swactor serve pipelines, comma-separated stage counts "
                        "(default %(default)s; empty: none)")
    parser.add_argument("--no-llama", action="store_true", help="leave llama.cpp out")
    parser.add_argument("--server", action="append", default=[], metavar="NAME=COMMAND",
                        help="another server to measure; {port} in COMMAND is its port")
    parser.add_argument("--ready-path", default="/v1/models",
                        help="readiness path for --server targets (default %(default)s)")
    parser.add_argument("--model", type=Path, default=None,
                        help="GGUF file for llama.cpp (default: the cached SmolLM2 Q4_1)")
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    parser.add_argument("--trace", type=Path, default=None, metavar="DIR",
                        help="each swactor server writes its event logs to DIR/NAME "
                        "(--server commands: {events_dir}); each level then also says "
                        "each stage's busy share, the objects in flight, the rows per "
                        "decode object, the stages computing at once (and how long only "
                        "prefills did) and the hops of lone objects (costs a little CPU "
                        "per step)")
    args = parser.parse_args(argv)
    levels = [int(word) for word in args.levels.split(",") if word]
    stages = [int(word) for word in args.stages.split(",") if word]
    if (not levels or min(levels) < 1 or args.rounds < 1 or args.max_tokens < 2
            or args.threads < 1 or (args.long_tokens and args.long_tokens < 2)
            or args.pairs < 0):
        parser.error("levels >= 1, rounds >= 1, max-tokens >= 2, long-tokens 0 or >= 2, "
                     "pairs >= 0 and threads >= 1 are needed")
    model = args.model or default_model_path()

    targets, notes = default_targets(stages, args.threads, model)
    if args.no_llama:
        targets = [t for t in targets if t.name != "llama.cpp"]
        notes = [n for n in notes if not n.startswith("llama.cpp")]
    if args.trace is not None:
        targets = [traced(t, args.trace) if t.name.startswith("swactor-") else t
                   for t in targets]
    try:
        targets += [parse_server(spec, args.ready_path, args.trace) for spec in args.server]
    except argparse.ArgumentTypeError as error:
        parser.error(str(error))
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; model {model.name}; "
          f"levels {levels}, {args.rounds} pass(es) over {len(prompt_set())} prompts per "
          f"client, {args.max_tokens} tokens, "
          f"greedy, stream; {args.threads} thread(s) for every server:")
    for each in targets:
        given = each.threads or {"flags": "as its command says", "where": ""}
        print(f"  {each.name}: {given['flags']} {given['where']}".rstrip())
    for note in notes:
        print(f"  {note}")
    if not targets:
        print("bench serve: nothing to measure")
        return 0
    from bench._machine import machine

    measured = machine()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="swactor-bench-serve-") as log_dir:
        figures = asyncio.run(measure(targets, levels, args.rounds, args.max_tokens,
                                      args.warmup_tokens, Path(log_dir), args.long_tokens,
                                      args.pairs))
    figures["notes"] = notes + figures["notes"]
    figures["settings"] = {"levels": levels, "rounds": args.rounds,
                           "max_tokens": args.max_tokens, "warmup_tokens": args.warmup_tokens,
                           "long_tokens": args.long_tokens, "pairs": args.pairs,
                           "threads": args.threads, "model": str(model),
                           "server_threads": {t.name: t.threads for t in targets
                                              if t.threads is not None},
                           "prompts": {b: len(p) for b, p in PROMPTS.items()}}
    figures["goals"] = goal_rows(figures)
    figures["seconds"] = time.monotonic() - started
    figures["measured"] = {"date_utc": measured["date_utc"],
                           "commit": measured["swactor_commit"],
                           "load_average_start": measured["load_average"][0],
                           "load_average_end": os.getloadavg()[0],
                           "minutes": figures["seconds"] / 60}
    print()
    for line in table(figures, levels):
        print(line)
    if figures.get("long"):
        print(f"{figures['long']['max_tokens']}-token completions:")
        for line in table({"levels": figures["long"]["levels"]}, LONG_LEVELS)[1:]:
            print(line)
    print("goals:")
    for row in figures["goals"]:
        target = (f" (goal {'>=' if row['at_least'] else '<'} {row['target']:g})"
                  if row["target"] is not None else "")
        print(f"  {row['goal']}: {_fmt(row['measured'], 2)}{target} -> {row['verdict']}")
    print(f"load average now {os.getloadavg()[0]:.1f}; {figures['seconds'] / 60:.1f} min")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    failed = any(level["errors"] for each in (figures, figures.get("long") or {"levels": {}})
                 for rows in each["levels"].values() for level in rows.values()) or any(
        pair["errors"] for by_name in (figures.get("pairs") or {}).get("lengths", {}).values()
        for each in by_name.values() for pair in each)
    return 1 if failed or any("not measured" in n for n in figures["notes"]) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
