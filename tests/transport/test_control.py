"""Control channel over real QUIC: schemas, request/reply, timeouts, authority."""

from __future__ import annotations

import asyncio
import json
import struct
from dataclasses import dataclass, replace

import pytest

from swactor.testing.examples import example
from swactor.transport.config import TransportConfig
from swactor.transport.control import (
    ControlAuthority,
    ControlChannel,
    ControlRejectedError,
    ControlTimeoutError,
    RejectCode,
    decode_frame,
    encode_frame,
)
from swactor.transport.endpoint import QuicEndpoint
from swactor.transport.errors import ControlError
from swactor.transport.identity import NodeIdentity
from swactor.wire import ProvisionRx, ProvisionStage, RunId
from swactor.wire.codec import WireStruct

pytestmark = pytest.mark.timeout(60)
CONFIG = TransportConfig(max_datagram_size=16383)


@dataclass(frozen=True, slots=True)
class StageAck(WireStruct):
    """A reply type for the tests: which run and stage was accepted."""

    run_id: RunId
    stage_index: int


@dataclass
class Pair:
    orch: QuicEndpoint
    node: QuicEndpoint
    other: QuicEndpoint
    orch_ctl: ControlChannel
    node_ctl: ControlChannel
    other_ctl: ControlChannel
    handled: list[tuple[int, WireStruct]]

    async def close(self) -> None:
        for endpoint in (self.orch, self.node, self.other):
            await endpoint.close()


async def _pair(delay: float = 0.0) -> Pair:
    ids = [NodeIdentity.generate() for _ in range(3)]
    orch, node, other = (QuicEndpoint(i, CONFIG) for i in ids)
    orch.allowed = {ids[1].node_id}
    node.allowed = {ids[0].node_id, ids[2].node_id}
    other.allowed = {ids[1].node_id}
    for endpoint in (orch, node, other):
        await endpoint.start()
    for endpoint in (orch, other):
        endpoint.address_book[node.node_id] = node.address
    handled: list[tuple[int, WireStruct]] = []

    async def on_node(peer: int, message: WireStruct) -> WireStruct | None:
        handled.append((peer, message))
        await asyncio.sleep(delay)
        if isinstance(message, ProvisionStage):
            return StageAck(message.run_id, int(message.stage_index))
        return None

    async def unused(peer: int, message: WireStruct) -> WireStruct | None:
        raise AssertionError("the requester side got a request")

    registry = (ProvisionStage, ProvisionRx, StageAck)
    authority = ControlAuthority(
        orchestrator_id=orch.node_id,
        orchestrator_only=frozenset({"ProvisionStage", "ProvisionRx"}),
        opening_types=frozenset({"ProvisionStage"}),
    )
    return Pair(
        orch,
        node,
        other,
        ControlChannel(orch, registry, unused, ControlAuthority()),
        ControlChannel(node, registry, on_node, authority),
        ControlChannel(other, registry, unused, ControlAuthority()),
        handled,
    )


async def test_provisioning_from_the_orchestrator_gets_its_reply() -> None:
    pair = await _pair()
    try:
        stage = example(ProvisionStage)
        reply = await pair.orch_ctl.request(pair.node.node_id, stage, timeout=5)
        assert reply == StageAck(stage.run_id, int(stage.stage_index))
        assert pair.handled == [(pair.orch.node_id, stage)]
        # The node's plan now names the run and the edges: an edge message for one passes.
        pair.node_ctl.authority.active_run_id = int(stage.run_id)
        pair.node_ctl.authority.active_edges = {int(stage.inbound.edge_id)}
        rx = replace(example(ProvisionRx), edge_id=stage.inbound.edge_id)
        assert await pair.orch_ctl.request(pair.node.node_id, rx, timeout=5) is None
    finally:
        await pair.close()


async def test_provisioning_from_another_node_is_unauthorized() -> None:
    pair = await _pair()
    try:
        with pytest.raises(ControlRejectedError) as info:
            await pair.other_ctl.request(pair.node.node_id, example(ProvisionStage), timeout=5)
        assert info.value.reason is RejectCode.Unauthorized
        assert f"{pair.other.node_id:#018x}" in info.value.detail
        assert pair.handled == []
    finally:
        await pair.close()


async def test_wrong_run_and_unknown_edge_are_rejected() -> None:
    pair = await _pair()
    try:
        stage = example(ProvisionStage)
        pair.node_ctl.authority.active_run_id = int(stage.run_id) + 1
        with pytest.raises(ControlRejectedError) as info:
            await pair.orch_ctl.request(pair.node.node_id, stage, timeout=5)
        assert info.value.reason is RejectCode.RunMismatch
        pair.node_ctl.authority.active_edges = {12345}
        rx = replace(example(ProvisionRx), edge_id=777)
        with pytest.raises(ControlRejectedError) as info:
            await pair.orch_ctl.request(pair.node.node_id, rx, timeout=5)
        assert info.value.reason is RejectCode.UnknownEdge
        assert pair.handled == []
    finally:
        await pair.close()


async def test_slow_handler_times_out() -> None:
    pair = await _pair(delay=2.0)
    try:
        with pytest.raises(ControlTimeoutError, match=r"no answer within 0\.3 s"):
            await pair.orch_ctl.request(pair.node.node_id, example(ProvisionStage), timeout=0.3)
    finally:
        await pair.close()


@pytest.mark.parametrize(
    ("frame", "needle"),
    [
        (struct.pack(">I", 5) + b"nope!", "not UTF-8 JSON"),
        (struct.pack(">I", 9) + b"short", "holds 5 of 9"),
        (encode_frame({"kind": "request", "type": "Nope", "body": {}}), "unknown message type"),
        (encode_frame({"kind": "request", "type": "ProvisionRx", "body": {"x": 1}}), "keys"),
        (encode_frame({"kind": "reply"}), "expected a request"),
        (b"\x00", "shorter than its length prefix"),
    ],
    ids=["not-json", "truncated", "unknown-type", "bad-body", "wrong-kind", "tiny"],
)
async def test_malformed_requests_are_rejected_as_bad_message(frame: bytes, needle: str) -> None:
    pair = await _pair()
    try:
        raw = await pair.orch_ctl.request_raw(pair.node.node_id, frame, timeout=5)
        answer = decode_frame(raw)
        assert answer["kind"] == "reject" and answer["code"] == "BadMessage"
        assert needle in str(answer["reason"])
        assert b"nope!" not in json.dumps(answer).encode()
        assert pair.handled == []
    finally:
        await pair.close()


@dataclass(frozen=True, slots=True)
class RunIdHolder(WireStruct):
    """Registered nowhere."""

    run_id: RunId


async def test_unregistered_type_is_refused_locally() -> None:
    pair = await _pair()
    try:
        with pytest.raises(ControlError, match="not a registered"):
            await pair.orch_ctl.request(pair.node.node_id, RunIdHolder(RunId(1)), timeout=1)
    finally:
        await pair.close()
