"""An edge between two Linux network namespaces (`swactor.cluster.netns`, 1500-byte
MTU): the default 1452-byte datagrams cross it; mutual TLS, flow control and digests
hold."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from swactor.cluster import netns
from swactor.cluster.netns import NetnsTopology
from swactor.transport.identity import NodeIdentity

pytestmark = [
    pytest.mark.multihost,
    pytest.mark.timeout(300),
    pytest.mark.skipif(netns.available() is not None, reason=str(netns.available())),
]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def two_hosts() -> Iterator[tuple[str, str, str]]:
    pid = os.getpid()
    subnet = ipaddress.IPv4Network(f"10.{77 + pid % 100}.{pid % 250}.0/24")
    with NetnsTopology(["a", "b"], subnet, mtu=1500) as hosts:
        yield hosts["a"].netns, hosts["b"].netns, hosts["b"].address


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
