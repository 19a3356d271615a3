"""ChunkedSender (sendbuf.py) against aioquic's own QuicStreamSender, and its installation."""

from __future__ import annotations

import random
from typing import cast

from aioquic.quic.packet_builder import QuicDeliveryState
from aioquic.quic.stream import QuicStreamSender

from swactor.transport.config import TransportConfig
from swactor.transport.flow import SwactorConnection
from swactor.transport.identity import NodeIdentity
from swactor.transport.sendbuf import ChunkedSender, held_bytes


def _drive(sender: QuicStreamSender, seed: int, payload: bytes) -> list[tuple[int, bytes, bool]]:
    """Write `payload` in random pieces (then FIN), take frames of random sizes, and
    acknowledge or lose each at random, until every byte and the FIN are acknowledged.
    Returns every frame (offset, bytes, fin) in the order it was built."""
    rng = random.Random(seed)
    frames: list[tuple[int, bytes, bool]] = []
    in_flight: list[tuple[int, int, bool]] = []
    written = 0
    for _ in range(100_000):  # a sender that never finishes fails, not hangs
        if sender.is_finished:
            return frames
        if written < len(payload) and rng.random() < 0.3:
            n = rng.randint(1, 200_000)
            end = written + n >= len(payload)
            sender.write(cast(bytes, memoryview(payload)[written : written + n]), end_stream=end)
            written = min(len(payload), written + n)
        for _ in range(rng.randint(0, 6)):
            frame = sender.get_frame(rng.randint(1, 16_000), max_offset=None)
            if frame is None:
                break
            data = bytes(frame.data)
            frames.append((frame.offset, data, frame.fin))
            in_flight.append((frame.offset, frame.offset + len(data), frame.fin))
        rng.shuffle(in_flight)
        for _ in range(rng.randint(0, len(in_flight))):
            start, stop, fin = in_flight.pop()
            lost = rng.random() < 0.1
            state = QuicDeliveryState.LOST if lost else QuicDeliveryState.ACKED
            sender.on_data_delivery(state, start, stop, fin)
    raise AssertionError("the sender never finished")


def test_same_frames_as_aioquic_sender() -> None:
    payload = random.Random(7).randbytes(1_500_000)
    for seed in range(4):
        stock = _drive(QuicStreamSender(2, True), seed, payload)
        chunked = _drive(ChunkedSender(2, True), seed, payload)
        assert chunked == stock
        rebuilt = bytearray(len(payload))
        for offset, data, _ in chunked:
            rebuilt[offset : offset + len(data)] = data
        assert rebuilt == payload
        assert chunked[-1][2] or any(fin for _, _, fin in chunked)


def test_acknowledged_chunks_are_dropped() -> None:
    sender = ChunkedSender(2, True)
    for _ in range(3):
        sender.write(b"x" * 1000)
    frame = sender.get_frame(2500)
    assert frame is not None and frame.offset == 0 and len(frame.data) == 2500
    assert held_bytes(sender) == 3000
    sender.on_data_delivery(QuicDeliveryState.ACKED, 0, 2500, False)
    assert held_bytes(sender) == 500
    assert len(sender._chunks) == 1  # the two chunks wholly below offset 2500 are gone


def test_connection_sends_through_chunked_sender() -> None:
    config = TransportConfig().quic_configuration(NodeIdentity.generate(), is_client=True)
    conn = SwactorConnection(configuration=config, stream_window=1 << 16, connection_window=1 << 20)
    stream_id = conn.get_next_available_stream_id(is_unidirectional=True)
    conn.send_stream_data(stream_id, cast(bytes, memoryview(b"abc" * 100)))
    assert isinstance(conn._streams[stream_id].sender, ChunkedSender)
    assert conn.send_buffered(stream_id) == 300
