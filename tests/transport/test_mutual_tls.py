"""Mutual identity over real QUIC handshakes: every refusal delivers 0 bytes to a ring."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from swactor.ring import Ring
from swactor.transport.config import EDGE_ALPN, TransportConfig
from swactor.transport.endpoint import PEER_REJECTED_CODE, PeerRefused, QuicEndpoint
from swactor.transport.errors import (
    ConnectionLostError,
    PeerRejectedError,
    TransportConfigError,
)
from swactor.transport.identity import NodeIdentity
from swactor.transport.messages import EstablishRecv, EstablishSend, StreamFault
from swactor.wire.enums import StreamFaultReason
from tests.transport.harness import Node, address_of, make_node, produce

CONFIG = TransportConfig(max_datagram_size=16383, handshake_timeout=5.0)
pytestmark = pytest.mark.timeout(60)


class NoClientCertConfig(TransportConfig):
    """Client side presents no certificate at all (the server asked for one)."""

    def quic_configuration(self, identity: NodeIdentity, *, is_client: bool):  # type: ignore[no-untyped-def]
        config = TransportConfig.quic_configuration(self, identity, is_client=is_client)
        if is_client:
            config.certificate = None
            config.private_key = None
        return config


_addr = address_of


async def _receiver(allowed: tuple[int, ...]) -> tuple[Node, Ring]:
    b = await make_node(CONFIG, allowed=allowed)
    ring_id, layout, ring = b.new_ring(1 << 16)
    b.driver.handle(EstablishRecv(1, allowed[0], ring_id, layout))
    return b, ring


async def _send_from(a: Node, b: Node, rx_node_id: int) -> None:
    a.endpoint.address_book[rx_node_id] = _addr(b)
    tx_id, layout, tx = a.new_ring(1 << 16)
    a.driver.handle(EstablishSend(1, rx_node_id, tx_id, layout))
    # The producer stays open: the edge is live when the refusal comes.
    await produce(a, tx, tx_id, [b"secret" * 1000], close=False)
    await a.wait_for(StreamFault)


async def test_wrong_server_id_is_refused_by_the_client() -> None:
    impostor_id = NodeIdentity.generate().node_id
    a = await make_node(CONFIG)
    b, ring = await _receiver(allowed=(a.identity.node_id,))
    try:
        # a believes b's address belongs to `impostor_id`.
        await _send_from(a, b, impostor_id)
        fault = a.of_type(StreamFault)[0]
        assert isinstance(fault, StreamFault) and fault.reason == StreamFaultReason.PeerNotAllowed
        assert list(a.endpoint.refused) == [
            PeerRefused(
                b.identity.node_id,
                f"server is node {b.identity.node_id:#018x}, expected {impostor_id:#018x}",
                inbound=False,
            )
        ]
        await asyncio.sleep(0.1)
        assert ring.commit == 0
    finally:
        await a.close()
        await b.close()


async def test_unknown_client_is_refused_naming_its_id() -> None:
    a = await make_node(CONFIG)
    b, ring = await _receiver(allowed=(NodeIdentity.generate().node_id,))
    try:
        await _send_from(a, b, b.identity.node_id)
        assert list(b.endpoint.refused) == [
            PeerRefused(
                a.identity.node_id,
                f"node {a.identity.node_id:#018x} is not in the allow-list",
                inbound=True,
            )
        ]
        fault = a.of_type(StreamFault)[0]
        assert isinstance(fault, StreamFault)
        assert fault.reason in (StreamFaultReason.ConnectionLost, StreamFaultReason.PeerReset)
        assert ring.commit == 0 and not b.driver.pending_streams
    finally:
        await a.close()
        await b.close()


async def test_client_without_certificate_is_refused() -> None:
    ident = NodeIdentity.generate()
    endpoint = QuicEndpoint(ident, NoClientCertConfig(max_datagram_size=16383))
    await endpoint.start()
    b, ring = await _receiver(allowed=(ident.node_id,))
    try:
        link = await endpoint.connect(b.identity.node_id, EDGE_ALPN, _addr(b))
        with contextlib.suppress(ConnectionLostError):  # the refusal may be here already
            sid = link.open_uni_stream()
            link.send(sid, b"x" * 4000)
        async with asyncio.timeout(5):
            while not link.closed:
                await asyncio.sleep(0.01)
        assert "peer presented no certificate" in link.close_reason
        refusal = PeerRefused(None, "peer presented no certificate", True)
        assert list(b.endpoint.refused) == [refusal]
        assert ring.commit == 0
    finally:
        await endpoint.close()
        await b.close()


async def test_replaced_key_changes_the_id_and_is_refused(tmp_path: object) -> None:
    from pathlib import Path

    key = Path(str(tmp_path)) / "node.key"
    original = NodeIdentity.load_or_create(key)
    b, ring = await _receiver(allowed=(original.node_id,))
    key.unlink()
    replaced = NodeIdentity.load_or_create(key)  # someone swapped the key file
    assert replaced.node_id != original.node_id
    a = await make_node(CONFIG, identity=replaced)
    try:
        await _send_from(a, b, b.identity.node_id)
        assert [r.peer_node_id for r in b.endpoint.refused] == [replaced.node_id]
        assert ring.commit == 0
    finally:
        await a.close()
        await b.close()


async def test_allowed_client_gets_through() -> None:
    a = await make_node(CONFIG)
    b, ring = await _receiver(allowed=(a.identity.node_id,))
    try:
        a.endpoint.address_book[b.identity.node_id] = _addr(b)
        tx_id, layout, tx = a.new_ring(1 << 16)
        a.driver.handle(EstablishSend(1, b.identity.node_id, tx_id, layout))
        await produce(a, tx, tx_id, [b"hello" * 100])
        async with asyncio.timeout(5):
            while ring.commit < 500:
                await asyncio.sleep(0.01)
        assert bytes(ring.readable_span()) == b"hello" * 100
        assert not b.endpoint.refused and not a.endpoint.refused
    finally:
        await a.close()
        await b.close()


def test_rejection_code_is_application_specific() -> None:
    assert PEER_REJECTED_CODE > 0xFF  # outside QUIC transport error codes


@pytest.mark.parametrize("size", [16384, 65000, 1199])
def test_datagram_size_outside_safe_range_is_rejected(size: int) -> None:
    with pytest.raises(TransportConfigError, match="max_datagram_size"):
        TransportConfig(max_datagram_size=size)


def test_connection_window_below_edges_times_stream_window_is_rejected() -> None:
    with pytest.raises(TransportConfigError, match="connection_window"):
        TransportConfig(stream_window=1 << 20, edges_per_connection=8, connection_window=4 << 20)


def test_peer_rejected_error_names_the_id() -> None:
    assert "0x00000000000000ff" in str(PeerRejectedError(255, "x"))
    assert "no certificate" in str(PeerRejectedError(None, "x"))


@pytest.mark.parametrize(("value", "native"), [("1", True), ("0", False), (" 0 ", False)])
def test_native_path_default_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str, native: bool
) -> None:
    monkeypatch.setenv("SWACTOR_NATIVE_QUIC", value)
    assert TransportConfig().native_path is native
    assert TransportConfig(native_path=not native).native_path is not native  # explicit wins


def test_a_bad_native_path_switch_is_a_clean_command_line_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from swactor import cli

    monkeypatch.setenv("SWACTOR_NATIVE_QUIC", "yes")
    with pytest.raises(TransportConfigError, match="SWACTOR_NATIVE_QUIC='yes'"):
        TransportConfig()
    key = tmp_path / "node.key"
    assert cli.main(["node", "--key", str(key), "--trust-orchestrator", "0x1234",
                     "--open-pool"]) == 2
    assert "SWACTOR_NATIVE_QUIC='yes': expected 0 or 1" in capsys.readouterr().err
