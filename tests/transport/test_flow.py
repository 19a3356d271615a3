"""Consumer-credited flow control, sans I/O: two connections shuttle datagrams in memory."""

from __future__ import annotations

from aioquic.buffer import Buffer  # type: ignore[attr-defined]
from aioquic.quic import events
from aioquic.quic.connection import QuicConnection
from aioquic.quic.packet import pull_quic_header

from swactor.transport.config import TransportConfig
from swactor.transport.flow import SwactorConnection
from swactor.transport.identity import NodeIdentity

WINDOW = 64 << 10
CONFIG = TransportConfig(
    max_datagram_size=1452,
    stream_window=WINDOW,
    edges_per_connection=2,
    connection_window=2 * WINDOW,
)
CLIENT_ADDR = ("10.0.0.1", 1000)
SERVER_ADDR = ("10.0.0.2", 2000)


def _pair(
    stock_server: bool = False, tickets: list[object] | None = None
) -> tuple[QuicConnection, QuicConnection]:
    client = SwactorConnection(
        configuration=CONFIG.quic_configuration(NodeIdentity.generate(), is_client=True),
        stream_window=WINDOW,
        connection_window=2 * WINDOW,
        session_ticket_handler=None if tickets is None else tickets.append,
    )
    server_config = CONFIG.quic_configuration(NodeIdentity.generate(), is_client=False)
    client.connect(SERVER_ADDR, now=0.0)
    initial = [data for data, _ in client.datagrams_to_send(now=0.0)]
    odcid = pull_quic_header(Buffer(data=initial[0]), host_cid_length=8).destination_cid
    server: QuicConnection
    if stock_server:
        server = QuicConnection(
            configuration=server_config, original_destination_connection_id=odcid
        )
    else:
        server = SwactorConnection(
            configuration=server_config,
            original_destination_connection_id=odcid,
            stream_window=WINDOW,
            connection_window=2 * WINDOW,
        )
    for data in initial:
        server.receive_datagram(data, CLIENT_ADDR, now=0.0)
    return client, server


def _shuttle(client: QuicConnection, server: QuicConnection, now: float) -> list[events.QuicEvent]:
    """Exchange datagrams until both are quiet; the server's events."""
    got: list[events.QuicEvent] = []
    for _ in range(10_000):
        moved = False
        for data, _ in client.datagrams_to_send(now=now):
            # bytes(): the bulk path's datagrams are views; a stock server takes bytes only
            server.receive_datagram(bytes(data), CLIENT_ADDR, now=now)
            moved = True
        for data, _ in server.datagrams_to_send(now=now):
            client.receive_datagram(data, SERVER_ADDR, now=now)
            moved = True
        while (event := server.next_event()) is not None:
            got.append(event)
        while client.next_event() is not None:
            pass
        if not moved:
            return got
    raise AssertionError("connections never went quiet")


def _received(evts: list[events.QuicEvent]) -> int:
    return sum(len(e.data) for e in evts if isinstance(e, events.StreamDataReceived))


def test_server_asks_for_the_client_certificate() -> None:
    client, server = _pair()
    _shuttle(client, server, 0.0)
    assert isinstance(server, SwactorConnection)
    cert = server.peer_certificate()
    assert cert is not None
    assert cert.public_key() == client._configuration.certificate.public_key()


def test_server_issues_no_session_ticket_so_no_0rtt_is_possible() -> None:
    tickets: list[object] = []
    client, server = _pair(tickets=tickets)
    _shuttle(client, server, 0.0)
    for now in (0.1, 0.2, 0.5):
        client.handle_timer(now)
        server.handle_timer(now)
        _shuttle(client, server, now)
    assert isinstance(server, SwactorConnection) and server.peer_certificate() is not None
    assert tickets == []


def test_receiver_credits_only_consumed_bytes() -> None:
    client, server = _pair()
    assert isinstance(client, SwactorConnection) and isinstance(server, SwactorConnection)
    _shuttle(client, server, 0.0)
    stream_id = client.get_next_available_stream_id(is_unidirectional=True)
    client.send_stream_data(stream_id, bytes(4 * WINDOW))
    now = 0.0
    total = 0
    for _ in range(20):  # the consumer never consumes: time passes, nothing more arrives
        now += 0.05
        total += _received(_shuttle(client, server, now))
        client.handle_timer(now)
        server.handle_timer(now)
    assert total == WINDOW
    assert server.received_unconsumed() == WINDOW
    assert client.send_buffered(stream_id) == 3 * WINDOW  # one window delivered and acked
    # Consuming a quarter window releases exactly that much more.
    assert server.consume(stream_id, WINDOW // 4)
    total += _received(_shuttle(client, server, now + 0.01))
    assert total == WINDOW + WINDOW // 4
    # Consuming less than a quarter window sends no update yet (hysteresis)...
    assert not server.consume(stream_id, WINDOW // 8)
    total += _received(_shuttle(client, server, now + 0.02))
    assert total == WINDOW + WINDOW // 4
    # ...until the quarter is reached.
    assert server.consume(stream_id, WINDOW // 8)
    total += _received(_shuttle(client, server, now + 0.03))
    assert total == WINDOW + WINDOW // 2


def test_stock_aioquic_keeps_crediting_without_consumption() -> None:
    """The control: stock aioquic doubles its windows as bytes arrive."""
    client, server = _pair(stock_server=True)
    _shuttle(client, server, 0.0)
    stream_id = client.get_next_available_stream_id(is_unidirectional=True)
    client.send_stream_data(stream_id, bytes(4 * WINDOW))
    now, total = 0.0, 0
    for _ in range(20):
        now += 0.05
        total += _received(_shuttle(client, server, now))
        client.handle_timer(now)
        server.handle_timer(now)
    assert total == 4 * WINDOW


def test_a_received_batch_is_acknowledged_by_the_transmit_that_ends_it() -> None:
    """No delayed-ACK timer: the receiver's next transmit, at the same instant, carries the
    ACK (stock aioquic would wait 1 ms for its timer), and the sender's unacknowledged
    bytes drop at once."""
    for stock, expect_ack_now in ((False, True), (True, False)):
        client, server = _pair(stock_server=stock)
        _shuttle(client, server, 0.0)
        assert isinstance(client, SwactorConnection)
        stream_id = client.get_next_available_stream_id(is_unidirectional=True)
        client.send_stream_data(stream_id, bytes(1000))  # one packet: no pacing delay
        now = 1.0
        for data, _ in client.datagrams_to_send(now=now):
            server.receive_datagram(bytes(data), CLIENT_ADDR, now=now)
        for data, _ in server.datagrams_to_send(now=now):
            client.receive_datagram(data, SERVER_ADDR, now=now)
        assert (client.send_buffered(stream_id) == 0) is expect_ack_now


def test_a_due_ack_and_a_small_write_leave_in_one_datagram() -> None:
    """A token's exchange: the receiver of a small object answers with a small object of
    its own; the ACK of the first rides in the answer's datagram (the bulk path would
    send it alone, ahead of its sealed packet), and the first sender's bytes are acked."""
    client, server = _pair()
    _shuttle(client, server, 0.0)
    assert isinstance(client, SwactorConnection) and isinstance(server, SwactorConnection)
    now = 1.0
    out_id = client.get_next_available_stream_id(is_unidirectional=True)
    back_id = server.get_next_available_stream_id(is_unidirectional=True)
    for step in range(3):
        client.send_stream_data(out_id, bytes(44))
        for data, _ in client.datagrams_to_send(now=now):
            server.receive_datagram(bytes(data), CLIENT_ADDR, now=now)
        while server.next_event() is not None:
            pass
        server.send_stream_data(back_id, bytes(44))
        answer = server.datagrams_to_send(now=now)
        assert len(answer) == 1, f"step {step}: the ACK and the answer are one datagram"
        client.receive_datagram(bytes(answer[0][0]), SERVER_ADDR, now=now)
        got = [e for e in iter(client.next_event, None)
               if isinstance(e, events.StreamDataReceived)]
        assert sum(len(e.data) for e in got) == 44
        assert client.send_buffered(out_id) == 0, "the first object is acknowledged"
        now += 0.01
