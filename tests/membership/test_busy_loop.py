"""A busy asyncio loop in the node process does not make its SWIM member look dead.

The observer is a separate member process; the node under test runs its
`MembershipNode` thread in this process while the asyncio loop spins on pure-Python
work that never awaits. The control holds the GIL inside one C call for seconds, which
no thread can preempt: then the observer does suspect the node, which shows the check
would catch a starved prober.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from swactor.membership.config import SwimConfig
from swactor.membership.messages import BootHealth, MemberMeta
from swactor.membership.udp import MembershipNode
from swactor.transport.identity import NodeIdentity

SCALE = 1.0


@pytest.fixture
def observer(tmp_path: Path) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "swactor.membership", "--key", str(tmp_path / "obs.pem"),
         "--scale", str(SCALE)], stdout=subprocess.PIPE, text=True)
    events: list[dict[str, Any]] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            events.append(json.loads(line))

    threading.Thread(target=read, daemon=True).start()
    try:
        deadline = time.monotonic() + 30
        while not events:
            assert time.monotonic() < deadline, "observer did not start"
            time.sleep(0.05)
        yield events[0]["swim"], events
    finally:
        proc.terminate()
        proc.wait(5)


def _suspicions(events: list[dict[str, Any]], node: int, since: float) -> list[dict[str, Any]]:
    return [e for e in list(events) if e["event"] == "member" and e["node_id"] == node
            and e["state"] != "alive" and e["at"] >= since]


def test_busy_event_loop_does_not_starve_probes(
    observer: tuple[str, list[dict[str, Any]]]
) -> None:
    address, events = observer
    host, port = address.rsplit(":", 1)
    node = MembershipNode(NodeIdentity.generate(), SwimConfig().scaled(SCALE),
                          MemberMeta("127.0.0.1", 0, "127.0.0.1", 7400, BootHealth.Available),
                          seeds=[(host, int(port))], rng=random.Random(5))
    node.start()
    try:
        deadline = time.monotonic() + 10
        while not any(e["event"] == "member" and e["node_id"] == node.node_id for e in events):
            assert time.monotonic() < deadline, "observer never saw the node"
            time.sleep(0.05)

        async def spin(seconds: float) -> int:
            end = time.monotonic() + seconds
            count = 0
            while time.monotonic() < end:  # never awaits: the loop is stuck here
                count += sum(i * i for i in range(200))
            return count

        busy_from = time.monotonic()
        asyncio.run(spin(4.0))
        time.sleep(1.0)  # let any late verdict arrive
        assert _suspicions(events, node.node_id, busy_from) == []

        # control: one C call that holds the GIL for seconds starves the thread
        held_from = time.monotonic()
        total = sum(range(150_000_000))
        assert total > 0
        deadline = time.monotonic() + 5
        while not _suspicions(events, node.node_id, held_from):
            assert time.monotonic() < deadline, "a GIL-starved node was never suspected"
            time.sleep(0.05)
    finally:
        node.stop()
