"""A lone packet's ACK waits for data to ride with (`SwactorConnection.hold_ack`).

Two real endpoints on loopback (aioquic, TLS). The receiving endpoint counts the UDP
datagrams it sends. A stage node answers a token object only after its worker computed
(milliseconds), and a middle stage never answers on the link the object came by: the
tests model both, and check what leaves per exchange and that the held ACK stays within
what the sender's loss recovery allows for (no probe, nothing left unacknowledged).
Holds are long (seconds) where a test counts what rides with an answer a few
milliseconds later, so that a slow machine cannot change the count.
"""

from __future__ import annotations

import asyncio

import pytest
from aioquic import tls

from swactor.transport.endpoint import IDLE_TURNS
from swactor.transport.flow import max_ack_delay_ms
from tests.transport.ack_rig import Handler, pair, quiet

pytestmark = pytest.mark.timeout(60)
EXCHANGES = 6
ANSWER_AFTER_S = 0.02
"""The answerer's "compute": its answer leaves this long after the object came."""
OBJECT = 44


async def turns(count: int = IDLE_TURNS + 4) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


async def answered_exchanges(hold: float, answer_after: float = ANSWER_AFTER_S
                             ) -> tuple[list[int], list[int]]:
    """Datagrams the answerer sends per exchange when it answers `answer_after` seconds
    after each object, and its count of held ACKs after each exchange."""
    per_exchange: list[int] = []
    held: list[int] = []
    async with pair(hold, Handler(answer_after)) as p:
        stream = p.link.open_uni_stream()
        for n in range(1, EXCHANGES + 1):
            await quiet()
            before = p.answerer_sent.sent
            p.link.send(stream, bytes(OBJECT))
            await p.asker.until(OBJECT * n)
            await quiet()
            per_exchange.append(p.answerer_sent.sent - before)
            assert p.answerer.link is not None
            held.append(p.answerer.link.quic.acks_held)
        assert p.link.quic.send_buffered(stream) == 0, "every object was acknowledged"
    return per_exchange, held


def test_the_ack_of_an_object_rides_with_the_answer_that_comes_later() -> None:
    held, _ = asyncio.run(answered_exchanges(hold=2.0))
    alone, _ = asyncio.run(answered_exchanges(hold=0.0))
    assert held[2:] == [1] * (EXCHANGES - 2), held  # the answer, carrying the ACK
    assert alone[2:] == [2] * (EXCHANGES - 2), alone  # the ACK, then the answer


def test_an_answer_later_than_the_hold_is_not_waited_for() -> None:
    """A stage computing longer than the hold: its ACKs leave at once, as without one
    (holding them would only add a timer wake-up per object)."""
    sent, held = asyncio.run(answered_exchanges(hold=0.05, answer_after=0.3))
    assert sent[2:] == [2] * (EXCHANGES - 2), sent  # the ACK, then the answer
    assert held[-1] == held[1], held


async def _unanswered(hold: float) -> tuple[list[int], list[int], int]:
    answerer_sent, asker_sent = [], []
    async with pair(hold, Handler()) as p:
        stream = p.link.open_uni_stream()
        for n in range(1, EXCHANGES + 1):
            await quiet()
            before, asker_before = p.answerer_sent.sent, p.asker_sent.sent
            p.link.send(stream, bytes(OBJECT))
            await p.answerer.until(OBJECT * n)
            await turns()
            assert p.link.quic.send_buffered(stream) == 0 or n == 1
            answerer_sent.append(p.answerer_sent.sent - before)
            asker_sent.append(p.asker_sent.sent - asker_before)
            assert p.answerer.link is not None
            if n == 1:  # the handshake's last packets were the answerer's: may be held
                first = p.answerer.link.quic.acks_held
        held = p.answerer.link.quic.acks_held - first
    return answerer_sent, asker_sent, held


def test_a_link_that_never_answers_acknowledges_once_idle() -> None:
    """A middle stage's inbound edge: holding its ACKs would only move them later."""
    answerer_sent, asker_sent, held = asyncio.run(_unanswered(hold=2.0))
    assert held == 0
    assert answerer_sent[2:] == [1] * (EXCHANGES - 2), answerer_sent  # the ACK
    assert asker_sent[2:] == [1] * (EXCHANGES - 2), asker_sent  # the object


async def _second_packet() -> None:
    async with pair(2.0, Handler()) as p:
        stream = p.link.open_uni_stream()
        count = answered = 0

        async def send(answer: bool = False, end: bool = False) -> None:
            nonlocal count, answered
            p.answerer.answer_after = 0.0 if answer else None
            p.link.send(stream, bytes(0 if end else OBJECT), end=end)
            if end:
                async with asyncio.timeout(10):
                    while not p.answerer.ended:
                        await asyncio.sleep(0)
            else:
                count += 1
                await p.answerer.until(OBJECT * count)
                if answer:
                    answered += 1
                    await p.asker.until(OBJECT * answered)
            await turns()

        await send(answer=True)  # the stream's first object (its ACK may ride a new limit)
        await send(answer=True)
        link = p.answerer.link
        assert link is not None
        space = link.quic._spaces[tls.Epoch.ONE_RTT]
        assert space.ack_at is None, "each answer carried the ACK"
        held = link.quic.acks_held
        await send()
        assert space.ack_at is not None, "the link answers: the ACK is held"
        assert link.quic.acks_held == held + 1
        await send()
        assert space.ack_at is None, "the second ack-eliciting packet's ACK left at once"
        await send()
        assert space.ack_at is None, "no answer since the last object: not held"
        await send(answer=True)
        await send()
        assert space.ack_at is not None, "answering again: held again"
        await send(end=True)
        assert space.ack_at is None, "a stream's end is acknowledged at once"


def test_the_second_packet_and_a_streams_end_are_acknowledged_at_once() -> None:
    asyncio.run(_second_packet())


async def _advertised() -> None:
    async with pair(0.1, Handler()) as p:
        assert max_ack_delay_ms(0.1) == 200
        assert p.link.quic._loss.max_ack_delay == pytest.approx(0.2), (
            "the peer's loss recovery allows for twice the hold")
    async with pair(0.0, Handler()) as p:
        assert p.link.quic._loss.max_ack_delay == pytest.approx(0.025), "aioquic's default"


def test_the_hold_is_advertised_as_max_ack_delay() -> None:
    asyncio.run(_advertised())
