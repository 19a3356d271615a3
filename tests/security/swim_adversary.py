"""An adversary for the SWIM tests, built from our own codec and keys.

`Adversary` holds its own Ed25519 key and a `Codec`, so it can send everything a
member can (correctly signed datagrams of its own, updates it authored), and also what
a member never would: arbitrary bodies sealed with its key (`raw`), other members'
captured datagrams replayed or re-aimed, and updates with foreign keys or signatures
spliced in. `members(k)` makes k self-signed identities with their alive updates, for
table floods. Nothing here is a fake of the code under test.
"""

from __future__ import annotations

import itertools
import json
import socket
import time
from collections.abc import Callable
from typing import Any

from swactor.membership.messages import AliveUpdate, BootHealth, MemberMeta, Message, Update
from swactor.membership.wire import Codec, Signer, public_key_raw, seal
from swactor.transport.identity import NodeIdentity
from swactor.wire import NodeId


def meta(port: int, host: str = "127.0.0.1") -> MemberMeta:
    return MemberMeta(host, port, host, 7000, BootHealth.Available, "cpu", 1 << 30, "node")


def key_of(identity: NodeIdentity) -> bytes:
    return public_key_raw(identity.private_key)


class Adversary:
    """Someone with a key of their own (maybe a pool member's) and a UDP socket."""

    def __init__(self, identity: NodeIdentity | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.identity = identity or NodeIdentity.generate()
        self.node_id = NodeId(self.identity.node_id)
        self.signer = Signer(self.identity.private_key)
        self.codec = Codec(self.signer, clock=clock)
        self._clock = clock
        self._n = itertools.count(int(clock() * 1e6) + 1_000_000)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.address = self.sock.getsockname()

    def close(self) -> None:
        self.sock.close()

    @property
    def key(self) -> bytes:
        return self.signer.public_raw

    def encode(self, message: Message, to: int | None) -> list[bytes]:
        """What a well-behaved member would send (our codec, our key)."""
        return self.codec.encode(message, None if to is None else NodeId(to))

    def raw(self, body: dict[str, Any] | bytes, to: int, n: int | None = None) -> bytes:
        """Any body, sealed (signed) with the adversary's key."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return seal(data, self.identity.private_key, to=to,
                    n=next(self._n) if n is None else n)

    def own(self, update: Update) -> dict[str, Any]:
        """An update the adversary authored, in its signed wire form."""
        return dict(self.signer.own_update(update))

    def send(self, datagram: bytes, address: tuple[str, int]) -> None:
        self.sock.sendto(datagram, address)

    def received(self, wait_s: float = 1.0) -> list[bytes]:
        """Every datagram that arrives within `wait_s` seconds."""
        got: list[bytes] = []
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                got.append(self.sock.recv(65536))
            except TimeoutError:
                continue
        return got


def members(count: int, port: int = 9) -> list[tuple[NodeIdentity, dict[str, Any]]]:
    """`count` fresh identities, each with its self-signed alive update (wire form)."""
    out = []
    for _ in range(count):
        identity = NodeIdentity.generate()
        node = NodeId(identity.node_id)
        update = AliveUpdate(node, 0, meta(port))
        out.append((identity, dict(Signer(identity.private_key).own_update(update))))
    return out
