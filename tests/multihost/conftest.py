"""The `topology` fixture: an orchestrator host and three stage hosts on one bridged
test subnet (`swactor.cluster.netns`), removed afterwards even when the test fails, and
checked gone."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator

import pytest

from swactor.cluster import netns
from swactor.cluster.netns import NetnsTopology
from swactor.testing.netns_pool import STAGES


@pytest.fixture
def topology() -> Iterator[NetnsTopology]:
    netns.sweep_stale()
    pid = os.getpid()
    subnet = ipaddress.IPv4Network(f"10.{200 + pid % 50}.{pid % 250}.0/24")
    hosts = NetnsTopology(["orch", *STAGES], subnet)
    with hosts:
        yield hosts
    left = [n for n in netns.namespaces() if n.startswith(hosts.hub.removesuffix("hub"))]
    assert left == [], f"namespaces left behind: {left}"
