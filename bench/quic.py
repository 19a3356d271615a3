"""QUIC edge benchmark: throughput vs plain asyncio TCP, and per-record hop latency.

Theory of operation
-------------------
Everything runs in one invocation on loopback, `--repeat` interleaved rounds (median and
[min..max] printed; `--json FILE` writes them), each figure from a fresh pair of
processes (a sender and a receiver, `python -m bench.quic --role ...`, pinned to one
core each where there are two or more), so the two ends never share an event loop, a
GIL or a core:

1. `edge MiB/s` at each datagram size (default 1452 and 16383: 16384 itself is refused,
   aioquic corrupts streams above 16383): the sender's worker side writes MIB MiB into a
   4 MiB egress ring (memfd arena, cffi helper); its `Driver` send-pump moves them over
   one QUIC edge stream (mutual TLS, consumer-credited flow control); the receiver's
   recv-pump copies them into a 4 MiB ingress ring whose worker side drains it. Time runs
   from the receiver's first byte to its last. Also shown: MiB per CPU second of the
   busier process (CPU time, so less sensitive to other load on a shared machine).
   Variants per size: pacing on (`flow.TickPacer`, the default config) and off; pacing
   on with UDP GSO/GRO offload off (one system call per datagram,
   `TransportConfig.udp_offload`); pacing on with the native bulk path off (aioquic
   builds and parses every packet in Python, `TransportConfig.native_path`). MIB
   defaults to 128: at ~1 GiB/s a shorter run is mostly congestion-control ramp-up.
2. `tcp MiB/s`: the same kind of bytes over one plain asyncio TCP stream (write + drain
   per MiB, read 1 MiB at a time; 8x as many, so that the much faster run is long enough
   to time), measured the same way. Ratio = edge / tcp, per round.
3. `hop latency`: RECORDS records of 2,304 bytes (one SmolLM2 activation row), one at a
   time, 2 ms apart: stamp CLOCK_MONOTONIC, write the record into the egress ring, ...,
   the receiver's worker side sees it complete in the ingress ring: p50 / p99 / max.

The worker side of each ring lives in the same process as its driver (it wakes the pump
by a direct call instead of an eventfd doorbell), so the figures include both rings and
both pumps but not a doorbell hop. `--profile DIR` writes cProfile stats per process.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from swactor.arena import Arena
from swactor.ring import Ring, RingState
from swactor.testing.ring_rig import make_layout
from swactor.transport.config import TransportConfig
from swactor.transport.driver import Driver
from swactor.transport.endpoint import QuicEndpoint
from swactor.transport.identity import NodeIdentity
from swactor.transport.messages import (
    DriverEvent,
    EstablishRecv,
    EstablishSend,
    PumpStopped,
    StreamFault,
    WakeHint,
)

MiB = 1 << 20
RING = 4 * MiB
RECORD = 2304
EDGE = 1


def _config(
    datagram: int, pacing: bool, offload: bool = True, native: bool = True
) -> TransportConfig:
    return TransportConfig(
        max_datagram_size=datagram,
        pacing=pacing,
        udp_offload=offload,
        native_path=native,
        stream_window=2 * MiB,
        edges_per_connection=4,
        connection_window=8 * MiB,
        send_high_water=2 * MiB,
    )


class _Side:
    """One process's endpoint, arena, ring and driver, with in-process wake routing."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.identity = NodeIdentity.load(args.key)
        config = _config(
            args.datagram, args.pacing == "on", args.offload == "on", args.native == "on"
        )
        allowed = args.peer_id
        self.endpoint = QuicEndpoint(self.identity, config, allowed=[allowed])
        self.arena = Arena.create(RING + (1 << 20))
        self.layout = make_layout(RING, ring_id=1, offset=1 << 16)
        self.ring = Ring.init(self.arena, self.layout)
        self.wake = asyncio.Event()
        self.events: list[DriverEvent] = []
        self.done = asyncio.Event()
        self.driver = Driver(self.endpoint, self.arena, self._emit, self._wake)

    def _emit(self, event: DriverEvent) -> None:
        self.events.append(event)
        if isinstance(event, StreamFault):
            print(f"bench quic: {event}", file=sys.stderr)
        if isinstance(event, (PumpStopped, StreamFault)):
            self.done.set()

    def _wake(self, hint: WakeHint) -> None:
        self.wake.set()


async def _wait_readable(side: _Side) -> bool:
    """Worker-side wait for bytes; False once the producer closed and all is read."""
    ring = side.ring
    while True:
        if len(ring.readable_span()):
            return True
        if ring.state is not RingState.Open:
            return bool(len(ring.readable_span()))
        side.wake.clear()
        ring.clear_readable_pending()
        if len(ring.readable_span()) or ring.state is not RingState.Open:
            continue
        await side.wake.wait()


async def _rx_quic(args: argparse.Namespace) -> dict[str, Any]:
    side = _Side(args)
    _, port = await side.endpoint.start()
    print(json.dumps({"port": port}), flush=True)
    side.driver.handle(EstablishRecv(EDGE, args.peer_id, 1, side.layout))
    ring, received, first, cpu0 = side.ring, 0, 0.0, 0.0
    latencies: list[int] = []
    partial = bytearray()
    while await _wait_readable(side):
        span = ring.readable_span()
        n = len(span)
        if not first:
            first, cpu0 = time.perf_counter(), time.process_time()
        if args.mode == "lat":
            partial += span
            while len(partial) >= RECORD:
                stamp = int.from_bytes(partial[:8], "little")
                latencies.append(time.monotonic_ns() - stamp)
                del partial[:RECORD]
        del span
        received += n
        if ring.consume_and_mark(n):
            side.driver.ring_writable(1)
    seconds, cpu = time.perf_counter() - first, time.process_time() - cpu0
    await side.driver.close()
    await side.endpoint.close()
    return {"bytes": received, "seconds": seconds, "cpu": cpu, "latencies_ns": latencies}


async def _tx_quic(args: argparse.Namespace) -> dict[str, Any]:
    side = _Side(args)
    await side.endpoint.start()
    side.endpoint.address_book[args.peer_id] = ("127.0.0.1", args.port)
    side.driver.handle(EstablishSend(EDGE, args.peer_id, 1, side.layout))
    ring = side.ring
    pattern = os.urandom(MiB)
    cpu0 = time.process_time()
    total = args.mib * MiB if args.mode == "tput" else args.records * RECORD
    written = 0
    while written < total:
        if args.mode == "lat":
            await asyncio.sleep(0.002)
            record = bytearray(RECORD)
            record[:8] = time.monotonic_ns().to_bytes(8, "little")
            data = memoryview(record)
        else:
            off = written % MiB
            data = memoryview(pattern)[off : off + min(MiB - off, total - written)]
        while data:
            span = ring.writable_span(len(data))
            if not len(span):
                side.wake.clear()
                ring.clear_writable_pending()
                if not len(ring.writable_span()):
                    await side.wake.wait()
                continue
            k = len(span)
            span[:] = data[:k]
            del span
            data = data[k:]
            written += k
            if ring.commit_and_mark(k):
                side.driver.ring_readable(1)
        if args.mode == "tput":
            await asyncio.sleep(0)
    ring.close_producer()
    if ring.mark_readable_pending():
        side.driver.ring_readable(1)
    await side.done.wait()
    send = side.driver.send_edges[EDGE]
    while send.link is not None and not send.link.closed and send.stream_id is not None:
        if send.link.quic.send_buffered(send.stream_id) == 0:
            break
        await asyncio.sleep(0.01)
    cpu = time.process_time() - cpu0
    await asyncio.sleep(0.2)
    await side.driver.close()
    await side.endpoint.close()
    return {"bytes": written, "cpu": cpu}


async def _rx_tcp(args: argparse.Namespace) -> dict[str, Any]:
    done = asyncio.Event()
    result: dict[str, Any] = {}

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received, first, cpu0 = 0, 0.0, 0.0
        while chunk := await reader.read(MiB):
            if not first:
                first, cpu0 = time.perf_counter(), time.process_time()
            received += len(chunk)
        result.update(
            bytes=received,
            seconds=time.perf_counter() - first,
            cpu=time.process_time() - cpu0,
        )
        writer.close()
        done.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    print(json.dumps({"port": server.sockets[0].getsockname()[1]}), flush=True)
    await done.wait()
    server.close()
    return result


async def _tx_tcp(args: argparse.Namespace) -> dict[str, Any]:
    _, writer = await asyncio.open_connection("127.0.0.1", args.port)
    pattern = os.urandom(MiB)
    cpu0 = time.process_time()
    for _ in range(args.mib):
        writer.write(pattern)
        await writer.drain()
    writer.write_eof()
    writer.close()
    await writer.wait_closed()
    return {"bytes": args.mib * MiB, "cpu": time.process_time() - cpu0}


ROLES = {"rx-quic": _rx_quic, "tx-quic": _tx_quic, "rx-tcp": _rx_tcp, "tx-tcp": _tx_tcp}


def _role(args: argparse.Namespace) -> int:
    runner = ROLES[args.role]
    if args.cpu >= 0:
        os.sched_setaffinity(0, {args.cpu})
    if args.profile:
        profiler = cProfile.Profile()
        result = profiler.runcall(asyncio.run, runner(args))
        name = f"{args.role}-{args.datagram}-pacing-{args.pacing}-offload-{args.offload}.prof"
        profiler.dump_stats(str(Path(args.profile) / name))
    else:
        result = asyncio.run(runner(args))
    print(json.dumps(result), flush=True)
    return 0


def _pair(kind: str, keys: dict[str, tuple[Path, int]], extra: list[str]) -> dict[str, Any]:
    base = [sys.executable, "-m", "bench.quic"]
    rx_key, rx_id = keys["rx"]
    tx_key, tx_id = keys["tx"]
    # One core each when there are two: the two ends then never share a core (measured
    # on 2 cores: unpinned QUIC runs fell into a slow mode in about one run in three).
    cpus = sorted(os.sched_getaffinity(0))
    rx_cpu, tx_cpu = (cpus[1], cpus[0]) if len(cpus) >= 2 else (-1, -1)
    rx = subprocess.Popen(
        [*base, "--role", f"rx-{kind}", "--key", str(rx_key), "--peer-id", str(tx_id),
         "--cpu", str(rx_cpu), *extra],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert rx.stdout is not None
    port = json.loads(rx.stdout.readline())["port"]
    tx = subprocess.run(
        [*base, "--role", f"tx-{kind}", "--key", str(tx_key), "--peer-id", str(rx_id),
         "--port", str(port), "--cpu", str(tx_cpu), *extra],
        capture_output=True,
        text=True,
        timeout=600,
    )
    out, _ = rx.communicate(timeout=60)
    if tx.returncode or rx.returncode:
        raise RuntimeError(f"bench quic {kind}: sender rc={tx.returncode} {tx.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    sent: dict[str, Any] = json.loads(tx.stdout.strip().splitlines()[-1])
    result["cpu_max"] = max(float(result["cpu"]), float(sent["cpu"]))
    return result


def _mib_s(result: dict[str, Any]) -> tuple[float, float]:
    """(MiB per wall second at the receiver, MiB per CPU second of the busier side)."""
    mib = float(result["bytes"]) / MiB
    return mib / max(float(result["seconds"]), 1e-9), mib / max(float(result["cpu_max"]), 1e-9)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench quic", description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=128, help="MiB per throughput run")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (median, min, max)")
    parser.add_argument("--json", default="", help="also write the figures to this file")
    parser.add_argument("--datagrams", default="1452,16383", help="datagram sizes to measure")
    parser.add_argument("--records", type=int, default=300, help="records for hop latency")
    parser.add_argument("--profile", default="", help="write cProfile stats to this directory")
    parser.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    parser.add_argument("--key", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--peer-id", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--datagram", type=int, default=1452, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=["tput", "lat"], default="tput", help=argparse.SUPPRESS)
    parser.add_argument("--pacing", choices=["on", "off"], default="on", help=argparse.SUPPRESS)
    parser.add_argument("--offload", choices=["on", "off"], default="on", help=argparse.SUPPRESS)
    parser.add_argument("--native", choices=["on", "off"], default="on", help=argparse.SUPPRESS)
    parser.add_argument("--cpu", type=int, default=-1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role:
        return _role(args)

    figures = measure(args.mib, args.datagrams, args.records, args.repeat, args.profile)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if figures["ok"] else 1


def _spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def _show(values: list[float], unit: str, digits: int = 1) -> str:
    spread = _spread(values)
    return (
        f"{spread['median']:.{digits}f} {unit} "
        f"[{spread['min']:.{digits}f}..{spread['max']:.{digits}f}]"
    )


def measure(mib: int, datagrams: str, records: int, repeat: int, profile: str) -> dict[str, Any]:
    """Run every figure `repeat` times, interleaved (each ratio pairs figures of the same
    round); print medians with [min..max]; return everything as a JSON-able dict."""
    sizes = [int(d) for d in datagrams.split(",")]
    # (pacing, UDP GSO/GRO offload, native bulk path) per datagram size; the last two
    # show what the offload and the native path give against the same pacing in the
    # same round.
    variants = (("on", "on", "on", "pacing on"), ("off", "on", "on", "pacing off"),
                ("on", "off", "on", "pacing on, no offload"),
                ("on", "on", "off", "pacing on, aioquic only"))
    configs = [(d, *variant) for d in sizes for variant in variants]
    tput: dict[str, dict[str, list[float]]] = {}
    hops: dict[str, dict[str, list[float]]] = {}
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        keys = {}
        for name in ("rx", "tx"):
            path = Path(tmp) / f"{name}.key"
            keys[name] = (path, NodeIdentity.load_or_create(path).node_id)
        common = ["--mib", str(mib)] + (["--profile", profile] if profile else [])
        for _ in range(repeat):
            # TCP is ~20x faster: move 8x the bytes so that its run is long enough to time.
            tcp_args = [*common, "--mib", str(8 * mib)]
            tcp, tcp_cpu = _mib_s(_pair("tcp", keys, tcp_args))
            row = tput.setdefault("tcp", {})
            row.setdefault("mib_s", []).append(tcp)
            row.setdefault("mib_cpu_s", []).append(tcp_cpu)
            for datagram, pacing, offload, native, label in configs:
                extra = [*common, "--datagram", str(datagram), "--pacing", pacing,
                         "--offload", offload, "--native", native]
                quic, quic_cpu = _mib_s(_pair("quic", keys, extra))
                row = tput.setdefault(f"quic {datagram} {label}", {})
                row.setdefault("mib_s", []).append(quic)
                row.setdefault("mib_cpu_s", []).append(quic_cpu)
                row.setdefault("ratio_wall", []).append(quic / tcp)
                row.setdefault("ratio_cpu", []).append(quic_cpu / tcp_cpu)
            for pacing in ("on", "off"):
                extra = ["--mode", "lat", "--records", str(records), "--datagram", "1452"]
                lat = _pair("quic", keys, [*extra, "--pacing", pacing])
                values = sorted(v / 1e6 for v in lat["latencies_ns"])
                if len(values) != records:
                    print(f"bench quic: {len(values)} of {records} records timed", file=sys.stderr)
                    ok = False
                    continue
                row = hops.setdefault(f"pacing {pacing}", {})
                row.setdefault("p50_ms", []).append(statistics.median(values))
                p99 = values[min(len(values) - 1, len(values) * 99 // 100)]
                row.setdefault("p99_ms", []).append(p99)
                row.setdefault("max_ms", []).append(values[-1])
    print(f"loopback, {mib} MiB per run, {repeat} round(s): median [min..max]")
    for name, row in tput.items():
        wall, cpu = _show(row["mib_s"], "MiB/s"), _show(row["mib_cpu_s"], "MiB/cpu-s")
        line = f"{name:39s} {wall:28s} {cpu}"
        if "ratio_wall" in row:
            line += (
                f"   x tcp: {_show(row['ratio_wall'], 'wall', 3)}"
                f"  {_show(row['ratio_cpu'], 'cpu', 3)}"
            )
        print(line)
    for name, row in hops.items():
        print(
            f"hop {RECORD} B, 1452 dgrams, {name:10s} p50 {_show(row['p50_ms'], 'ms', 3)}"
            f"  p99 {_show(row['p99_ms'], 'ms', 3)}  max {_show(row['max_ms'], 'ms', 3)}"
        )
    return {
        "ok": ok,
        "mib": mib,
        "repeat": repeat,
        "throughput": {k: {m: _spread(v) for m, v in row.items()} for k, row in tput.items()},
        "hop": {k: {m: _spread(v) for m, v in row.items()} for k, row in hops.items()},
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
