"""Two real endpoints on loopback that count the UDP datagrams each sends.

The ACK tests (`test_ack_hold`, `test_ack_piggyback`) model one edge of a pipeline: an
*asker* writes small objects on a stream, an *answerer* answers each on a stream of its
own after some work (seconds of "compute", or a few event-loop turns, as an
orchestrator's pumps take), or never (a middle stage's inbound edge). What they check is
how many datagrams leave each end per exchange, so both ends' outbound paths count.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from swactor.transport.config import EDGE_ALPN, TransportConfig
from swactor.transport.endpoint import QuicEndpoint, QuicLink
from swactor.transport.identity import NodeIdentity
from swactor.transport.udp import Datagram, DatagramRun


class Counted:
    """An outbound path that counts UDP datagrams and sends them all."""

    def __init__(self) -> None:
        self.sent = 0

    def __call__(self, datagrams: list[Datagram]) -> list[Datagram]:
        self.sent += sum(d.count if type(d) is DatagramRun else 1 for d, _ in datagrams)
        return datagrams


class QuietLinkHandler:
    """A link handler's callbacks for stream resets, stops and link closes that a test
    does not watch: each does nothing."""

    def stream_reset(self, link: QuicLink, stream_id: int, error_code: int) -> None:
        pass

    def stream_stopped(self, link: QuicLink, stream_id: int, error_code: int) -> None:
        pass

    def link_closed(self, link: QuicLink, reason: str) -> None:
        pass


class Handler(QuietLinkHandler):
    """Counts stream bytes; answers each chunk with as many bytes on a stream of its own,
    `answer_after` seconds later, or `answer_turns` event-loop turns later; never when
    both are None."""

    def __init__(self, answer_after: float | None = None,
                 answer_turns: int | None = None) -> None:
        self.answer_after = answer_after
        self.answer_turns = answer_turns
        self.stream: int | None = None
        self.got = 0
        self.link: QuicLink | None = None
        self.ended = False
        self.changed = asyncio.Event()

    def stream_data(self, link: QuicLink, stream_id: int, data: bytes, end: bool) -> None:
        self.got += len(data)
        self.link = link
        self.ended = self.ended or end
        self.changed.set()
        loop = asyncio.get_running_loop()
        if self.answer_after is not None:
            loop.call_later(self.answer_after, self._answer, link, len(data))
        elif self.answer_turns is not None:
            loop.call_soon(self._answer_in, self.answer_turns - 1, link, len(data))

    def _answer_in(self, turns: int, link: QuicLink, size: int) -> None:
        if turns:
            asyncio.get_running_loop().call_soon(self._answer_in, turns - 1, link, size)
        else:
            self._answer(link, size)

    def _answer(self, link: QuicLink, size: int) -> None:
        if self.stream is None:
            self.stream = link.open_uni_stream()
        link.send(self.stream, bytes(size))

    async def until(self, total: int) -> None:
        async with asyncio.timeout(10):
            while self.got < total:
                self.changed.clear()
                await self.changed.wait()


@dataclass
class Pair:
    link: QuicLink
    """The asker's link to the answerer."""
    asker: Handler
    answerer: Handler
    answerer_sent: Counted
    asker_sent: Counted


@asynccontextmanager
async def pair(hold: float, answerer: Handler) -> AsyncIterator[Pair]:
    """An asker linked to an answerer (`answerer` handles its edge streams), both with
    `ack_hold` `hold`."""
    asker_id, answerer_id = NodeIdentity.generate(), NodeIdentity.generate()
    answerer_out, asker_out = Counted(), Counted()
    config = TransportConfig(max_datagram_size=1452, ack_hold=hold)
    answering = QuicEndpoint(answerer_id, config, allowed={asker_id.node_id},
                             outbound=answerer_out)
    asking = QuicEndpoint(asker_id, config, allowed={answerer_id.node_id},
                          outbound=asker_out)
    got = Handler()
    answering.register_handler(EDGE_ALPN, answerer)
    asking.register_handler(EDGE_ALPN, got)
    try:
        await answering.start()
        await asking.start()
        link = await asking.connect(answerer_id.node_id, EDGE_ALPN, answering.address)
        yield Pair(link, got, answerer, answerer_out, asker_out)
    finally:
        await asking.close()
        await answering.close()


async def quiet() -> None:
    """Handshake leftovers and ACKs are done (nothing in flight either way)."""
    await asyncio.sleep(0.05)
