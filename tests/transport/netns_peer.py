"""One end of an edge for the network-namespace test: `python -m tests.transport.netns_peer`.

`rx`: bind, print {"port"}, receive one edge into a ring, print {"bytes", "digest"}.
`tx`: connect to the receiver, stream MIB MiB of seeded random bytes through a ring,
wait until the peer acknowledged everything, print {"bytes", "digest"}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from swactor.transport.config import TransportConfig
from swactor.transport.identity import NodeIdentity
from swactor.transport.messages import EstablishRecv, EstablishSend, PumpStopped
from tests.transport.harness import Consumer, make_node, payload_chunks, produce

CONFIG = TransportConfig(max_datagram_size=1452, idle_timeout=10.0, keepalive_interval=2.0)


async def run(args: argparse.Namespace) -> dict[str, object]:
    identity = NodeIdentity.load(args.key)
    node = await make_node(CONFIG, identity, allowed=(args.peer_id,), host=args.bind)
    ring_id, layout, ring = node.new_ring(1 << 20)
    if args.role == "rx":
        print(json.dumps({"port": node.endpoint.address[1]}), flush=True)
        node.driver.handle(EstablishRecv(1, args.peer_id, ring_id, layout))
        consumer = Consumer(node, ring, ring_id)
        digest = await consumer.drain()
        result: dict[str, object] = {"bytes": consumer.received, "digest": digest}
    else:
        host, port = args.connect.rsplit(":", 1)
        node.endpoint.address_book[args.peer_id] = (host, int(port))
        node.driver.handle(EstablishSend(1, args.peer_id, ring_id, layout))
        digest = await produce(node, ring, ring_id, payload_chunks(args.mib << 20, seed=5))
        await node.wait_for(PumpStopped, timeout=120)
        send = node.driver.send_edges[1]
        while send.link is not None and not send.link.closed:
            if send.stream_id is None or send.link.quic.send_buffered(send.stream_id) == 0:
                break
            await asyncio.sleep(0.02)
        result = {"bytes": args.mib << 20, "digest": digest, "events": len(node.events)}
    await asyncio.sleep(0.2)
    await node.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["rx", "tx"])
    parser.add_argument("--key", type=Path, required=True)
    parser.add_argument("--peer-id", type=int, required=True)
    parser.add_argument("--bind", default="0.0.0.0")
    parser.add_argument("--connect", default="")
    parser.add_argument("--mib", type=int, default=8)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args))), flush=True)


if __name__ == "__main__":
    main()
