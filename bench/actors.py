"""Actor runtime, process actor and event sink costs, each beside a plain-asyncio baseline.

Figures (one run, printed side by side with their ratio):
- tell throughput: N messages through an actor mailbox vs. an asyncio.Queue consumer task;
- ask round trip: sequential asks (p50/p99) vs. a future answered by a queue consumer;
- process lines: a child printing N lines, delivered as `Line` messages to an owner vs.
  a bare `readline()` loop on the same child's stdout;
- events: emitting N events to a JSON Lines file vs. `json.dumps` + write of the same
  dict, and `validate_line` parsing them back.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from swactor.actors import Actor, Context, Runtime
from swactor.actors.process import Exited, Line, ProcessEvent, ProcessSpec, spawn_process
from swactor.events import Emitter, JsonlSink, ObjectLoaded, validate_line
from swactor.wire import (
    EdgeId,
    NodeId,
    ObjectId,
    RingId,
    RunId,
    Sequence,
    StageIndex,
    WorkerGeneration,
)


def row(label: str, ours: float, base: float, unit: str, higher_is_better: bool) -> None:
    ratio = ours / base if base else float("nan")
    better = "higher" if higher_is_better else "lower"
    print(f"  {label:<34} swactor {ours:>12,.1f} {unit:<8} baseline {base:>12,.1f} {unit:<8}"
          f" ratio {ratio:5.2f} ({better} is better)")


class Count(Actor[int]):
    def __init__(self, total: int, done: asyncio.Event) -> None:
        self.seen, self.total, self.done = 0, total, done

    async def receive(self, ctx: Context[int], message: int) -> None:
        self.seen += 1
        if self.seen == self.total:
            self.done.set()


class Echo(Actor[int]):
    async def receive(self, ctx: Context[int], message: int) -> None:
        ctx.reply(message)


async def tell_throughput(n: int) -> tuple[float, float]:
    done = asyncio.Event()
    async with Runtime("bench") as rt:
        ref = rt.spawn(lambda: Count(n, done), "count")
        began = time.perf_counter()
        for i in range(n):
            ref.tell(i)
        await done.wait()
        ours = n / (time.perf_counter() - began)
    queue: asyncio.Queue[int] = asyncio.Queue()
    finished = asyncio.Event()

    async def consume() -> None:
        for _ in range(n):
            await queue.get()
        finished.set()

    task = asyncio.ensure_future(consume())
    began = time.perf_counter()
    for i in range(n):
        queue.put_nowait(i)
    await finished.wait()
    base = n / (time.perf_counter() - began)
    await task
    return ours, base


async def ask_latency(n: int) -> tuple[list[float], list[float]]:
    ours: list[float] = []
    async with Runtime("bench") as rt:
        ref = rt.spawn(Echo, "echo")
        for i in range(n):
            began = time.perf_counter()
            await ref.ask(i, timeout=5)
            ours.append(time.perf_counter() - began)
    queue: asyncio.Queue[tuple[int, asyncio.Future[int]]] = asyncio.Queue()

    async def serve() -> None:
        while True:
            value, reply = await queue.get()
            reply.set_result(value)

    server = asyncio.ensure_future(serve())
    base: list[float] = []
    loop = asyncio.get_running_loop()
    for i in range(n):
        began = time.perf_counter()
        future: asyncio.Future[int] = loop.create_future()
        queue.put_nowait((i, future))
        await future
        base.append(time.perf_counter() - began)
    server.cancel()
    return ours, base


class Lines(Actor[ProcessEvent]):
    def __init__(self, done: asyncio.Event) -> None:
        self.count, self.done = 0, done

    async def receive(self, ctx: Context[ProcessEvent], message: ProcessEvent) -> None:
        if isinstance(message, Line):
            self.count += 1
        elif isinstance(message, Exited):
            self.done.set()


async def process_lines(n: int) -> tuple[float, float]:
    code = f"import sys\nsys.stdout.write(''.join(f'{{i}} line of output\\n' for i in range({n})))"
    argv = (sys.executable, "-c", code)
    done = asyncio.Event()
    owner = Lines(done)
    async with Runtime("bench") as rt:
        owner_ref = rt.spawn(lambda: owner, "owner", mailbox_capacity=1024)
        began = time.perf_counter()
        spawn_process(rt, ProcessSpec(argv), owner_ref)
        await done.wait()
        ours = owner.count / (time.perf_counter() - began)
    began = time.perf_counter()
    child = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
    assert child.stdout is not None
    count = 0
    while await child.stdout.readline():
        count += 1
    await child.wait()
    base = count / (time.perf_counter() - began)
    return ours, base


def events(n: int) -> tuple[float, float, float]:
    record = ObjectLoaded(
        node_id=NodeId(1), run_id=RunId(2), stage_index=StageIndex(0), edge_id=EdgeId(3),
        ring_id=RingId(4), object_id=ObjectId(5), sequence=Sequence(6),
        worker_generation=WorkerGeneration(1), detail={"extent": 2304},
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.jsonl"
        sink = JsonlSink(path)
        emitter = Emitter("bench", [sink])
        began = time.perf_counter()
        for _ in range(n):
            emitter.emit(record)
        ours = n / (time.perf_counter() - began)
        sink.close()
        lines = path.read_text().splitlines()
        began = time.perf_counter()
        for line in lines:
            validate_line(line)
        parse = n / (time.perf_counter() - began)
        plain: dict[str, Any] = json.loads(lines[0])
        with open(Path(tmp) / "plain.jsonl", "a") as out:
            began = time.perf_counter()
            for _ in range(n):
                plain["mono"] = time.monotonic_ns()
                plain["wall"] = time.time_ns()
                out.write(json.dumps(plain) + "\n")
                out.flush()
            base = n / (time.perf_counter() - began)
    return ours, base, parse


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench actors",
        description="actor, process actor and event sink costs beside plain asyncio (no options).")
    parser.parse_args(argv)
    n_tell, n_ask, n_lines, n_events = 100_000, 5_000, 100_000, 20_000
    ours, base = asyncio.run(tell_throughput(n_tell))
    row(f"tell throughput ({n_tell:,} msgs)", ours, base, "msg/s", True)
    ask_ours, ask_base = asyncio.run(ask_latency(n_ask))
    for label, q in (("p50", 0.5), ("p99", 0.99)):
        o = statistics.quantiles(ask_ours, n=100)[int(q * 100) - 1] * 1e6
        b = statistics.quantiles(ask_base, n=100)[int(q * 100) - 1] * 1e6
        row(f"ask round trip {label} ({n_ask:,} asks)", o, b, "us", False)
    ours, base = asyncio.run(process_lines(n_lines))
    row(f"child stdout lines ({n_lines:,})", ours, base, "lines/s", True)
    ours, base, parse = events(n_events)
    row(f"emit to JSON Lines ({n_events:,})", ours, base, "events/s", True)
    print(f"  {'validate_line':<34} {parse:>20,.1f} lines/s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
