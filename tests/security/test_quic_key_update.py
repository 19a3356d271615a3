"""AES-GCM usage limit (RFC 9001 §6.6): a connection that keeps sending starts a key
update every `key_update_packets` packets, counting the ones the native bulk path seals,
so no key protects more than that (plus one transmit) however long a link lives.

Two `SwactorConnection`s exchange datagrams in memory (the harness of
`tests/transport/test_bulk_path.py`), with the native path on and off.
"""

from __future__ import annotations

import hashlib
import random

import pytest
from aioquic import tls
from aioquic.buffer import Buffer  # type: ignore[attr-defined]
from aioquic.quic.packet import pull_quic_header

from swactor.transport.config import AES_GCM_CONFIDENTIALITY_LIMIT, TransportConfig
from swactor.transport.errors import TransportConfigError
from swactor.transport.flow import SwactorConnection
from swactor.transport.identity import NodeIdentity
from tests.transport.test_bulk_path import CLIENT_ADDR, SERVER_ADDR, Transfer

pytestmark = pytest.mark.timeout(120)
ONE_RTT = tls.Epoch.ONE_RTT
LIMIT = 256
SIZE = 16383
PAYLOAD = random.Random(9).randbytes(24 << 20)  # ~1,550 packets: several key phases


def _pair(native: bool) -> tuple[SwactorConnection, SwactorConnection]:
    config = TransportConfig(max_datagram_size=SIZE, key_update_packets=LIMIT)
    kwargs = {"stream_window": config.stream_window,
              "connection_window": config.connection_window,
              "native_path": native, "key_update_packets": LIMIT}
    client = SwactorConnection(
        configuration=config.quic_configuration(NodeIdentity.generate(), is_client=True),
        **kwargs,  # type: ignore[arg-type]
    )
    client.connect(SERVER_ADDR, now=0.0)
    initial = [bytes(data) for data, _ in client.datagrams_to_send(now=0.0)]
    odcid = pull_quic_header(Buffer(data=initial[0]), host_cid_length=8).destination_cid
    server = SwactorConnection(
        configuration=config.quic_configuration(NodeIdentity.generate(), is_client=False),
        original_destination_connection_id=odcid,
        **kwargs,  # type: ignore[arg-type]
    )
    for data in initial:
        server.receive_datagram(data, CLIENT_ADDR, now=0.0)
    return client, server


class _KeyWatch(Transfer):
    """A transfer that records the client's packet number at each new send key, and
    the most packets one client transmit carried."""

    def __init__(self, client: SwactorConnection, server: SwactorConnection) -> None:
        super().__init__(client, server)
        self.phases: list[int] = []
        self.secret: bytes | None = None
        self.largest_step = 0

    def step(self) -> bool:
        before = self.client._packet_number
        moved = super().step()
        self.largest_step = max(self.largest_step, self.client._packet_number - before)
        secret = self.client._cryptos[ONE_RTT].send.secret
        if secret is not self.secret:
            self.secret = secret
            self.phases.append(self.client._packet_number)
        return moved


@pytest.mark.parametrize("native", [True, False], ids=["native", "aioquic"])
def test_a_long_transfer_updates_its_keys_before_the_limit(native: bool) -> None:
    client, server = _pair(native)
    transfer = _KeyWatch(client, server)
    transfer.run(lambda: client._handshake_confirmed and server._handshake_confirmed)
    sid = client.get_next_available_stream_id(is_unidirectional=True)
    client.send_stream_data(sid, PAYLOAD)
    transfer.run(lambda: transfer.counts.get(sid, 0) >= len(PAYLOAD)
                 and client.send_buffered(sid) == 0)
    assert transfer.received[sid].hexdigest() == hashlib.sha256(PAYLOAD).hexdigest()
    sent = client._packet_number
    assert client.key_updates >= sent // LIMIT - 2 >= 3
    # no key protected more than LIMIT packets plus two transmits (the one a new key
    # began in is not counted; the update applies in the transmit after the request)
    spans = [b - a for a, b in zip(transfer.phases, [*transfer.phases[1:], sent], strict=True)]
    assert max(spans) <= LIMIT + 2 * transfer.largest_step, spans
    # the receiver followed every update (its receive key phase is the sender's)
    assert server._cryptos[ONE_RTT].recv.key_phase == client._cryptos[ONE_RTT].send.key_phase
    if native:  # the bulk path sealed most packets, under the new keys too
        assert client.bulk_sent > 0.8 * (len(PAYLOAD) // SIZE)
        assert server.bulk_received > 0.8 * (len(PAYLOAD) // SIZE)
    else:
        assert client.bulk_sent == 0


def test_key_update_interval_is_bounded_by_the_aes_gcm_limit() -> None:
    assert TransportConfig().key_update_packets <= AES_GCM_CONFIDENTIALITY_LIMIT // 2
    with pytest.raises(TransportConfigError, match="confidentiality limit"):
        TransportConfig(key_update_packets=AES_GCM_CONFIDENTIALITY_LIMIT)
    with pytest.raises(TransportConfigError, match="positive"):
        TransportConfig(key_update_packets=0)
