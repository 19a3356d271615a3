"""The node's control channel reports a peer lost only when its last live link closes.

Each orchestrator session has an endpoint of its own, so a node can see the previous
session's control link close after the next session already provisioned it over a new
link (found by the fault matrix: a run stopped 0.1 s after provisioning, then timed out
its readiness barrier). The links here are stand-ins with the attributes the channel
reads; the channel is the node's real `_WatchedControl`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from swactor.node.node import _WatchedControl
from swactor.transport import ControlAuthority
from swactor.wire.codec import WireStruct

ORCHESTRATOR = 0x1234


@dataclass(eq=False)
class Link:
    peer_node_id: int | None = ORCHESTRATOR
    expected_peer: int | None = None
    closed: bool = False

    def consume(self, stream_id: int, nbytes: int) -> None:
        pass


class Endpoint:
    def register_handler(self, alpn: str, handler: Any) -> None:
        pass


async def _handler(peer: int, message: WireStruct) -> WireStruct | None:
    return None


def channel(lost: list[int]) -> _WatchedControl:
    control = _WatchedControl(Endpoint(), [], _handler,  # type: ignore[arg-type]
                              ControlAuthority(ORCHESTRATOR))
    control.on_lost = lost.append
    return control


def close(control: _WatchedControl, link: Link) -> None:
    link.closed = True
    control.link_closed(link, "closed")  # type: ignore[arg-type]


def test_an_old_link_closing_while_a_new_one_is_live_is_not_a_lost_peer() -> None:
    lost: list[int] = []
    control = channel(lost)
    old, new = Link(), Link()
    control.stream_data(old, 0, b"", False)  # type: ignore[arg-type]
    control.stream_data(new, 0, b"", False)  # type: ignore[arg-type]
    close(control, old)
    assert lost == []
    close(control, new)
    assert lost == [ORCHESTRATOR]


def test_the_only_link_closing_is_a_lost_peer() -> None:
    lost: list[int] = []
    control = channel(lost)
    only = Link()
    control.stream_data(only, 0, b"", False)  # type: ignore[arg-type]
    close(control, only)
    assert lost == [ORCHESTRATOR]
    close(control, Link())  # a link that never carried traffic: still the peer's last
    assert lost == [ORCHESTRATOR, ORCHESTRATOR]
