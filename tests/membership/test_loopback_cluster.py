"""Five SWIM members in separate processes on loopback: one view, kill -9 seen, forgery reported.

Each member is `python -m swactor.membership` with the default timings scaled by
`SCALE` (1: the defaults a node runs); the test reads their JSON event lines. Event
times are CLOCK_MONOTONIC, which all processes of the machine share, so they compare
with the test's own clock.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from swactor.membership.config import SwimConfig, detection_bound_s
from swactor.membership.messages import DeadUpdate
from swactor.membership.wire import Signer, seal
from swactor.transport.identity import NodeIdentity
from swactor.wire import NodeId

SCALE = 1.0
MEMBERS = 5


class Member:
    """One member process and the events it printed."""

    def __init__(self, key: Path, seeds: list[str]) -> None:
        args = [sys.executable, "-m", "swactor.membership", "--key", str(key),
                "--scale", str(SCALE), "--available"]
        for seed in seeds:
            args += ["--seed", seed]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        started = wait_for(lambda: self.find("started"), 30.0, "member start")
        self.node_id: int = started["node_id"]
        self.swim: str = started["swim"]

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._lock:
                self.events.append(json.loads(line))

    def find(self, kind: str, **fields: object) -> dict[str, Any] | None:
        with self._lock:
            for event in self.events:
                if event["event"] == kind and all(event.get(k) == v for k, v in fields.items()):
                    return event
        return None

    def view(self) -> dict[int, str]:
        """node id -> latest state, from this member's events (itself included)."""
        out = {self.node_id: "alive"}
        with self._lock:
            for event in self.events:
                if event["event"] == "member":
                    out[event["node_id"]] = event["state"]
        return out

    def host_port(self) -> tuple[str, int]:
        host, port = self.swim.rsplit(":", 1)
        return host, int(port)


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[Member]]:
    members: list[Member] = []
    try:
        first = Member(tmp_path / "k0.pem", [])
        members.append(first)
        for i in range(1, MEMBERS):
            members.append(Member(tmp_path / f"k{i}.pem", [first.swim]))
        yield members
    finally:
        for member in members:
            if member.proc.poll() is None:
                member.proc.send_signal(signal.SIGTERM)
        for member in members:
            try:
                member.proc.wait(5)
            except subprocess.TimeoutExpired:
                member.proc.kill()
                member.proc.wait()


def _converged(members: list[Member]) -> bool:
    everyone = {m.node_id: "alive" for m in members}
    return all(m.view() == everyone for m in members)


def test_five_processes_reach_the_same_view_and_see_a_kill_9(cluster: list[Member]) -> None:
    wait_for(lambda: _converged(cluster), 30.0, "every member to see all five alive")
    views = [m.view() for m in cluster]
    assert all(v == views[0] for v in views)
    assert len(views[0]) == MEMBERS

    victim = cluster[2]
    os.kill(victim.proc.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    victim.proc.wait()
    survivors = [m for m in cluster if m is not victim]
    bound = detection_bound_s(SwimConfig().scaled(SCALE), MEMBERS)
    wait_for(lambda: all(m.find("member", node_id=victim.node_id, state="dead")
                         for m in survivors), bound + 5.0, "every survivor to declare it dead")
    delays = []
    for m in survivors:
        dead = m.find("member", node_id=victim.node_id, state="dead")
        assert dead is not None
        delays.append(dead["at"] - killed_at)
    print(f"\nkill -9 seen dead by all 4 after {max(delays):.2f}s "
          f"(first {min(delays):.2f}s, bound {bound:.2f}s)")
    assert max(delays) <= bound
    # nobody else was declared dead on the way
    for m in survivors:
        assert {n: s for n, s in m.view().items() if s != "alive"} == {victim.node_id: "dead"}


def test_forged_update_is_dropped_and_reported(cluster: list[Member]) -> None:
    wait_for(lambda: _converged(cluster), 30.0, "every member to see all five alive")
    target, impersonated = cluster[0], cluster[1]
    mallory = NodeIdentity.generate()
    # Mallory's own key, but the datagram claims to come from member 1 and says member 3
    # is dead: the node id does not derive from the key it carries.
    body = json.dumps({"t": "gossip", "s": impersonated.node_id, "u": []}).encode()
    counter = int(time.time() * 1e6)
    datagram = seal(body, mallory.private_key, to=target.node_id, n=counter)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(datagram, target.host_port())
        # and a genuine datagram from Mallory carrying a dead update "by member 1"
        signer = Signer(mallory.private_key)
        fake = dict(signer.own_update(
            DeadUpdate(NodeId(cluster[3].node_id), 50, NodeId(mallory.node_id))))
        fake["a"] = impersonated.node_id
        body2 = json.dumps({"t": "gossip", "s": mallory.node_id, "u": [fake]}).encode()
        sock.sendto(seal(body2, mallory.private_key, to=target.node_id, n=counter + 1),
                    target.host_port())
    reported = wait_for(
        lambda: [e for e in target.events if e["event"] == "forged"]
        if len([e for e in target.events if e["event"] == "forged"]) >= 2 else None,
        10.0, "two forged reports")
    assert [(e["claimed"], e["reason"]) for e in reported] == [
        (impersonated.node_id, "NodeIdMismatch"), (impersonated.node_id, "NodeIdMismatch")]
    time.sleep(1.0)
    assert target.view()[cluster[3].node_id] == "alive"

