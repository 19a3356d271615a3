"""An edge between two Linux network namespaces over a veth pair with a 1500-byte MTU:
the default 1452-byte datagrams cross it; mutual TLS, flow control and digests hold."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from swactor.transport.identity import NodeIdentity

pytestmark = [
    pytest.mark.multihost,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2"
    ),
]
ROOT = Path(__file__).resolve().parents[2]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def two_hosts() -> Iterator[tuple[str, str, str]]:
    tag = f"{os.getpid() % 100000}"
    ns_a, ns_b = f"swq{tag}a", f"swq{tag}b"
    subnet = f"10.{77 + os.getpid() % 100}.{os.getpid() % 250}"
    _ip("netns", "add", ns_a)
    _ip("netns", "add", ns_b)
    try:
        _ip("link", "add", f"sq{tag}a", "type", "veth", "peer", "name", f"sq{tag}b")
        for ns, dev, addr in ((ns_a, f"sq{tag}a", ".1"), (ns_b, f"sq{tag}b", ".2")):
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{subnet}{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "mtu", "1500", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield ns_a, ns_b, f"{subnet}.2"
    finally:
        for ns in (ns_a, ns_b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _peer(ns: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", ns, sys.executable, "-m", "tests.transport.netns_peer", *args]


def test_edge_between_namespaces_at_1452_byte_datagrams(
    two_hosts: tuple[str, str, str], tmp_path: Path
) -> None:
    ns_a, ns_b, rx_addr = two_hosts
    ids = {}
    for name in ("tx", "rx"):
        ids[name] = NodeIdentity.load_or_create(tmp_path / f"{name}.key").node_id
    rx = subprocess.Popen(
        _peer(ns_b, "rx", "--key", str(tmp_path / "rx.key"), "--peer-id", str(ids["tx"]),
              "--bind", rx_addr),
        stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        assert rx.stdout is not None
        port = json.loads(rx.stdout.readline())["port"]
        tx = subprocess.run(
            _peer(ns_a, "tx", "--key", str(tmp_path / "tx.key"), "--peer-id", str(ids["rx"]),
                  "--connect", f"{rx_addr}:{port}", "--mib", "8"),
            capture_output=True, text=True, cwd=ROOT, timeout=240,
        )  # fmt: skip
        assert tx.returncode == 0, tx.stderr[-3000:]
        out, _ = rx.communicate(timeout=60)
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.wait()
    sent = json.loads(tx.stdout.strip().splitlines()[-1])
    got = json.loads(out.strip().splitlines()[-1])
    assert got["bytes"] == sent["bytes"] == 8 << 20
    assert got["digest"] == sent["digest"]
