"""Test and benchmark rig: an arena with one ring, its wake channels, peer processes.

Theory of operation
-------------------
`RingRig` plays the node: it creates the arena, leases one ring by hand (a layout at a
fixed offset), writes the header, and creates both wake channels.  `spawn` starts
`python -m swactor.testing.ring_peer` with the arena fd and the channel fds inherited through
`pass_fds`, exactly like a worker.  `run_pair` runs a producer and a consumer peer
through the start barrier and returns their JSON results.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from swactor.arena import Arena
from swactor.ring.ring import DEFAULT_VERSION, Ring, header_len
from swactor.ring.wake import READABLE_EVENT, WRITABLE_EVENT, Doorbell, JsonLineWake, Wake
from swactor.wire import RingLayout


def make_layout(
    capacity: int, ring_id: int = 1, offset: int = 1 << 16, version_header: int | None = None
) -> RingLayout:
    """A layout at `offset`: header first, data at the next 4 KiB boundary."""
    hdr = version_header if version_header is not None else header_len()
    return RingLayout.at(ring_id, offset, capacity, header_bytes=hdr)


@dataclass
class RingRig:
    capacity: int
    wake: str = "eventfd"
    version: int = DEFAULT_VERSION
    arena_bytes: int = 0
    arena: Arena = field(init=False)
    layout: RingLayout = field(init=False)
    ring: Ring = field(init=False)
    readable: Wake = field(init=False)
    writable: Wake = field(init=False)

    def __post_init__(self) -> None:
        self.layout = make_layout(self.capacity)
        size = self.arena_bytes or (self.layout.end_offset + 4095) // 4096 * 4096
        self.arena = Arena.create(size)
        self.ring = Ring.init(self.arena, self.layout, self.version)
        if self.wake == "eventfd":
            self.readable, self.writable = Doorbell.create(), Doorbell.create()
        else:
            self.readable = JsonLineWake.create(READABLE_EVENT)
            self.writable = JsonLineWake.create(WRITABLE_EVENT)

    def wake_fds(self, w: Wake) -> tuple[str, list[int]]:
        if isinstance(w, Doorbell):
            return str(w.fd), [w.fd]
        assert isinstance(w, JsonLineWake)
        return f"{w.read_fd},{w.write_fd}", [w.read_fd, w.write_fd]

    def spawn(self, role: str, *extra: str, barrier: bool = True) -> subprocess.Popen[str]:
        r_arg, r_fds = self.wake_fds(self.readable)
        w_arg, w_fds = self.wake_fds(self.writable)
        argv = [
            sys.executable, "-m", "swactor.testing.ring_peer", role,
            "--layout", json.dumps(self.layout.to_json()),
            "--wake", self.wake, "--readable", r_arg, "--writable", w_arg, *extra,
        ]  # fmt: skip
        if not barrier:
            argv.append("--no-barrier")
        env = dict(os.environ, **self.arena.child_env())
        return subprocess.Popen(
            argv,
            pass_fds=[self.arena.fd, *r_fds, *w_fds],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def close(self) -> None:
        self.ring.close()
        self.readable.close()
        self.writable.close()
        self.arena.close()


def run_pair(
    rig: RingRig, producer: list[str], consumer: list[str], timeout: float
) -> tuple[dict[str, Any], dict[str, Any], int, int]:
    """Start both peers, release them together, and collect (producer result, consumer
    result, producer rc, consumer rc)."""
    procs = [rig.spawn("producer", *producer), rig.spawn("consumer", *consumer)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = [json.loads(out.strip().splitlines()[-1]) for out in outs]
    return results[0], results[1], procs[0].returncode, procs[1].returncode
