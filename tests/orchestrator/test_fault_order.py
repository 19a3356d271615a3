"""SWIM must declare a cut-off node dead before QUIC's idle timeout (discovery, Fault order).

The expected bounds are memberlist's formulas worked by hand. The defaults (probe every
0.5 s, 0.25 s probe timeout, suspicion 4 x max(1, log10 N) probe intervals, at most 2 x
that, gossip every 0.2 s, 4 x ceil(log10(N + 1)) retransmits): 3 x 0.5 + 0.25 + 4 + 0.8
= 6.55 s for 4 members. memberlist's LAN values (probe 1 s / 0.5 s, suspicion at most
6 x): 3 x 1 + 0.5 + 24 + 0.8 = 28.3 s.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from swactor.membership import SwimConfig
from swactor.membership.config import MEMBERLIST_LAN
from swactor.orchestrator.discovery import (
    DiscoveryError,
    FaultOrderError,
    check_fault_order,
    discover_pool,
)
from swactor.transport.config import TransportConfig
from swactor.transport.identity import NodeIdentity

IDLE_S = TransportConfig().idle_timeout


def test_the_defaults_put_swim_before_the_idle_timeout() -> None:
    assert IDLE_S == 30.0
    assert check_fault_order(SwimConfig(), 4, IDLE_S) == pytest.approx(6.55)
    assert check_fault_order(MEMBERLIST_LAN, 4, IDLE_S) == pytest.approx(28.3)


def test_the_defaults_stay_below_the_idle_timeout_up_to_the_largest_table() -> None:
    # 1024 members: 1.75 + 4 x log10(1024) + 4 x 4 x 0.2 = 16.99 s
    largest = SwimConfig().max_members
    assert check_fault_order(SwimConfig(), largest, IDLE_S) == pytest.approx(16.99, abs=0.01)


def test_a_slower_swim_is_refused_with_both_figures() -> None:
    slow = replace(MEMBERLIST_LAN, probe_interval_s=2.0)  # 6 + 0.5 + 48 + 0.8
    with pytest.raises(FaultOrderError, match=r"55\.3s for 4 members .* 30\.0s"):
        check_fault_order(slow, 4, IDLE_S)


def test_a_shorter_idle_timeout_is_refused() -> None:
    with pytest.raises(FaultOrderError, match="StreamFault instead of MembershipLost"):
        check_fault_order(SwimConfig(), 4, 5.0)


def test_a_large_view_lengthens_the_bound_past_the_idle_timeout() -> None:
    # 10 members: 3.5 + 24 + 8 retransmits x 0.2 = 29.1 s; 11 members: the suspicion
    # maximum grows to 6 x 4 x log10(11) = 25.0 s, so 3.5 + 25.0 + 1.6 = 30.1 s
    assert check_fault_order(MEMBERLIST_LAN, 10, IDLE_S) == pytest.approx(29.1)
    with pytest.raises(FaultOrderError):
        check_fault_order(MEMBERLIST_LAN, 11, IDLE_S)


def test_discovery_warns_of_the_order_before_joining_and_still_looks_for_the_pool() -> None:
    identity = NodeIdentity.generate()
    warnings: list[str] = []

    async def main() -> None:
        # The seed does not exist: discovery times out after warning, it is not refused.
        await discover_pool(identity, ("127.0.0.1", 0), (("127.0.0.1", 9),), 3,
                            timeout_s=0.5, idle_timeout_s=5.0, warn=warnings.append)

    with pytest.raises(DiscoveryError, match="0 of 3 nodes") as raised:
        asyncio.run(asyncio.wait_for(main(), 10))
    assert not isinstance(raised.value, FaultOrderError)
    assert len(warnings) == 1 and "StreamFault instead of MembershipLost" in warnings[0]
    assert "for 4 members" in warnings[0] and "5.0s" in warnings[0]
