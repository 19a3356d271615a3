"""Worker benchmark: objects through a real `python -m swactor.worker`, next to memcpy.

Theory of operation
-------------------
All in one run, side by side:

1. `memcpy`: this process copies an object of SIZE bytes in ring-sized chunks (the
   floor any path that touches every byte once pays).
2. `ring only`: the same bytes through a ring of CAP bytes, producer and consumer in
   this process (`write_from` / `read_into`, the copy in C).
3. `ingress`: a record of SIZE bytes written into a CAP-byte ingress ring of a real
   worker, wake hints as JSON lines on its stdin; time from the first byte to
   ObjectLoaded (header parse, device allocation, prefix copies to the tinygrad device,
   completion barrier).
4. `step+egress`: an echo step on the loaded object (a standing grant that takes the
   object loaded before it), its output streamed back through a CAP-byte egress ring
   and read here; time from GrantSteps to StepCompleted.
5. `small objects`: COUNT records of 256 bytes on an ingress ring no grant names,
   objects/s to ObjectLoaded (per-object cost of the control path: parse, allocate,
   event line).

Ratios are against memcpy. `main(["--quick"])` shrinks the sizes.
"""

from __future__ import annotations

import argparse
import os
import time

from swactor.arena import Arena
from swactor.ring import Ring
from swactor.testing.worker_rig import (
    WorkerRig,
    float_spec,
    grant,
    read_all,
    record,
    write_all,
)
from swactor.wire import (
    ConfigureRole,
    ObjectHeader,
    ObjectLoaded,
    RingDirection,
    RoleConfigured,
    RoleId,
    SequencePolicy,
    StepCompleted,
)

MIB = 1 << 20


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def bench_memcpy(payload: bytes, chunk: int) -> float:
    dst = bytearray(len(payload))
    src = memoryview(payload)
    start = time.perf_counter()
    for offset in range(0, len(payload), chunk):
        dst[offset : offset + chunk] = src[offset : offset + chunk]
    return time.perf_counter() - start


def bench_ring_only(payload: bytes, cap: int) -> float:
    rig_arena = Arena.create(cap + 3 * 4096 + (1 << 16))
    from swactor.testing.ring_rig import make_layout

    layout = make_layout(cap)
    producer = Ring.init(rig_arena, layout)
    consumer = Ring.open(rig_arena, layout)
    out = bytearray(len(payload))
    sent = got = 0
    start = time.perf_counter()
    while got < len(payload):
        n, _ = producer.write_from(memoryview(payload)[sent:])
        sent += n
        m, _ = consumer.read_into(memoryview(out)[got:])
        got += m
    elapsed = time.perf_counter() - start
    assert out == payload
    producer.close()
    consumer.close()
    rig_arena.close()
    return elapsed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench worker")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    size = (8 if args.quick else 64) * MIB
    cap = 1 * MIB
    count = 200 if args.quick else 2000
    payload = os.urandom(size)

    t_memcpy = bench_memcpy(payload, cap)
    t_ring = bench_ring_only(payload, cap)

    rig = WorkerRig(arena_bytes=8 * MIB + (1 << 20))
    try:
        ready = rig.initialize()
        spec = float_spec(max_extent=size, policy=SequencePolicy.Increasing)
        ingress = rig.add_ring(1, RingDirection.Ingress, cap, spec)
        egress = rig.add_ring(2, RingDirection.Egress, cap, spec)
        others = rig.add_ring(3, RingDirection.Ingress, cap, spec)
        start = time.perf_counter()
        write_all(rig, ingress, record(1, 0, payload))
        rig.expect(ObjectLoaded)
        t_ingress = time.perf_counter() - start

        rig.send(ConfigureRole(RoleId(1), {"kind": "echo"}))
        rig.expect(RoleConfigured)
        start = time.perf_counter()
        rig.send(grant(1, 1, object_id=2, extent=size))
        data = read_all(rig, egress, ObjectHeader.LEN + size)
        rig.expect(StepCompleted)
        t_egress = time.perf_counter() - start
        assert data[ObjectHeader.LEN :] == payload

        small = b"".join(record(100 + i, i, bytes(256)) for i in range(count))
        start = time.perf_counter()
        write_all(rig, others, small)
        for _ in range(count):
            rig.expect(ObjectLoaded)
        t_small = time.perf_counter() - start
    finally:
        rig.close()

    device = ready.backend
    print(f"object {size // MIB} MiB, rings {cap // MIB} MiB, device {device}")
    rows = [
        ("memcpy", t_memcpy),
        ("ring only (one process)", t_ring),
        ("ingress -> ObjectLoaded", t_ingress),
        ("echo step -> egress read", t_egress),
    ]
    for name, seconds in rows:
        ratio = t_memcpy / seconds
        print(f"  {name:28s} {gbps(size, seconds):7.2f} GB/s   x{ratio:5.3f} of memcpy")
    print(f"  {'small objects (256 B)':28s} {count / t_small:9.0f} objects/s")
    return 0
