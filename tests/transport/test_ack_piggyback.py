"""A lone datagram's ACK waits for the work it set off, and rides with its answer.

Two real endpoints on loopback. The receiver's handler answers each small object on the
same link only a few event-loop turns later (as an orchestrator does: its recv pump,
token reader and run actor each take a turn before the next token is written). The
receiver then sends one datagram per exchange, holding the ACK and the answer; an ACK
transmitted at once, as for a batch, would be a datagram of its own ahead of it.
"""

from __future__ import annotations

import asyncio

import pytest

from swactor.transport.config import EDGE_ALPN, TransportConfig
from swactor.transport.endpoint import QuicEndpoint, QuicLink
from swactor.transport.identity import NodeIdentity
from swactor.transport.udp import Datagram, DatagramRun

pytestmark = pytest.mark.timeout(60)
CONFIG = TransportConfig(max_datagram_size=1452)
TURNS = 3
"""Event-loop turns between an object's arrival and its answer."""


class Counted:
    """An outbound path that counts UDP datagrams and sends them all."""

    def __init__(self) -> None:
        self.sent = 0

    def __call__(self, datagrams: list[Datagram]) -> list[Datagram]:
        self.sent += sum(d.count if type(d) is DatagramRun else 1 for d, _ in datagrams)
        return datagrams


class Answerer:
    """Answers every chunk of stream data with as many bytes, `TURNS` turns later."""

    def __init__(self) -> None:
        self.stream: int | None = None
        self.got = 0

    def stream_data(self, link: QuicLink, stream_id: int, data: bytes, end: bool) -> None:
        self.got += len(data)
        loop = asyncio.get_running_loop()

        def answer(turns: int) -> None:
            if turns:
                loop.call_soon(answer, turns - 1)
                return
            if self.stream is None:
                self.stream = link.open_uni_stream()
            link.send(self.stream, bytes(len(data)))

        loop.call_soon(answer, TURNS - 1)

    def stream_reset(self, link: QuicLink, stream_id: int, error_code: int) -> None:
        pass

    def stream_stopped(self, link: QuicLink, stream_id: int, error_code: int) -> None:
        pass

    def link_closed(self, link: QuicLink, reason: str) -> None:
        pass


class Reader:
    def __init__(self) -> None:
        self.got = 0
        self.changed = asyncio.Event()

    def stream_data(self, link: QuicLink, stream_id: int, data: bytes, end: bool) -> None:
        self.got += len(data)
        self.changed.set()

    def stream_reset(self, link: QuicLink, stream_id: int, error_code: int) -> None:
        pass

    def stream_stopped(self, link: QuicLink, stream_id: int, error_code: int) -> None:
        pass

    def link_closed(self, link: QuicLink, reason: str) -> None:
        pass


async def test_a_lone_datagrams_ack_rides_with_the_answer_it_set_off() -> None:
    asker_id, answerer_id = NodeIdentity.generate(), NodeIdentity.generate()
    counted = Counted()
    answerer = QuicEndpoint(answerer_id, CONFIG, allowed={asker_id.node_id}, outbound=counted)
    asker = QuicEndpoint(asker_id, CONFIG, allowed={answerer_id.node_id})
    answers, reader = Answerer(), Reader()
    answerer.register_handler(EDGE_ALPN, answers)
    asker.register_handler(EDGE_ALPN, reader)
    try:
        await answerer.start()
        await asker.start()
        link = await asker.connect(answerer_id.node_id, EDGE_ALPN, answerer.address)
        stream = link.open_uni_stream()
        sent: list[int] = []
        for n in range(1, 9):
            await asyncio.sleep(0.05)  # quiet: handshake leftovers and ACKs are done
            before = counted.sent
            link.send(stream, bytes(44))
            async with asyncio.timeout(10):
                while reader.got < 44 * n:
                    reader.changed.clear()
                    await reader.changed.wait()
            await asyncio.sleep(0.02)
            sent.append(counted.sent - before)
        assert answers.got == 44 * 8
        # one datagram per exchange: the answer, carrying the ACK of the object
        assert sent[2:] == [1] * 6, sent
    finally:
        await asker.close()
        await answerer.close()

