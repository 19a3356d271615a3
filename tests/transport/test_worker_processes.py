"""Edge end to end with worker processes: producer process -> egress ring -> QUIC ->
ingress ring -> consumer process, eventfd doorbells, digests compared."""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest

from swactor.testing.ring_rig import RingRig
from swactor.transport.config import TransportConfig
from swactor.transport.doorbells import DoorbellRouter
from swactor.transport.driver import Driver
from swactor.transport.endpoint import QuicEndpoint
from swactor.transport.identity import NodeIdentity
from swactor.transport.messages import (
    DriverEvent,
    EstablishRecv,
    EstablishSend,
    StreamClosed,
    StreamFault,
)

CONFIG = TransportConfig(max_datagram_size=16383, stream_window=512 << 10,
                         edges_per_connection=2, connection_window=1 << 20)
TOTAL = 24 << 20


async def _finish(proc: subprocess.Popen[str]) -> dict[str, object]:
    out, _ = await asyncio.to_thread(proc.communicate, timeout=120)
    assert proc.returncode == 0, out
    result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return result


@pytest.mark.timeout(180)
async def test_worker_processes_stream_through_quic_with_doorbells() -> None:
    ids = NodeIdentity.generate(), NodeIdentity.generate()
    sender_ep = QuicEndpoint(ids[0], CONFIG, allowed=[ids[1].node_id])
    receiver_ep = QuicEndpoint(ids[1], CONFIG, allowed=[ids[0].node_id])
    await sender_ep.start()
    await receiver_ep.start()
    sender_ep.address_book[ids[1].node_id] = receiver_ep.address
    egress, ingress = RingRig(1 << 20), RingRig(1 << 20)
    events: list[DriverEvent] = []
    routers = DoorbellRouter(), DoorbellRouter()
    tx = Driver(sender_ep, egress.arena, events.append, routers[0].wake)
    rx = Driver(receiver_ep, ingress.arena, events.append, routers[1].wake)
    routers[0].bind(tx)
    routers[1].bind(rx)
    routers[0].attach_egress(1, egress.readable, egress.writable)  # type: ignore[arg-type]
    routers[1].attach_ingress(1, ingress.readable, ingress.writable)  # type: ignore[arg-type]
    producer = egress.spawn("producer", "--total", str(TOTAL), "--timeout", "60", barrier=False)
    consumer = ingress.spawn("consumer", "--timeout", "60", barrier=False)
    try:
        rx.handle(EstablishRecv(7, ids[0].node_id, 1, ingress.layout))
        tx.handle(EstablishSend(7, ids[1].node_id, 1, egress.layout))
        produced, consumed = await asyncio.gather(_finish(producer), _finish(consumer))
        assert produced["bytes"] == consumed["bytes"] == TOTAL
        assert produced["digest"] == consumed["digest"] and produced["digest"]
        assert StreamClosed(7, TOTAL) in events
        assert not [e for e in events if isinstance(e, StreamFault)]
    finally:
        for proc in (producer, consumer):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        await tx.close()
        await rx.close()
        routers[0].detach(1)
        routers[1].detach(1)
        await sender_ep.close()
        await receiver_ep.close()
        egress.close()
        ingress.close()
