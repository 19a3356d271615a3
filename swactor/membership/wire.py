"""SWIM on the wire: signed UDP datagrams, each update signed by its author.

Theory of operation
-------------------
Why UDP on its own port rather than QUIC datagrams: SWIM's probe is a statement about
reachability *now*; a QUIC connection adds handshakes, retransmission, congestion
control and a connection cache whose state outlives the peer, and a busy QUIC event loop
is exactly what must not delay a probe answer. A plain socket owned by the membership
thread answers pings however busy the QUIC loop is. Authentication does not need TLS:
every datagram and every update is signed with the node's Ed25519 identity key (the key
`swactor.transport.identity` already manages), and the node id is derived from the key
it carries, so nobody can speak for another node id.

A datagram is::

    b"SWM1" | u32 body length (big endian) | body (UTF-8 JSON) | sender key (32) | sig (64)

signed (Ed25519, by the sender) over everything before the key. The body names the
sender's node id; the receiver checks that the key derives that id and that the
signature verifies, else it drops the datagram and reports `ForgedMessage`.

Every gossip update inside the body carries its *author's* key and signature over its
canonical JSON: an alive update is authored by the member itself (so no relay can fake
a member's metadata or incarnation), a suspect or dead update by its accuser. A relayed
update is forwarded with its original signature; one that fails is dropped alone and
reported. A verified update is cached under its whole (author key, signature, signed
body) triple, so an update gossiped many times is checked once and any change to any of
the three is checked afresh. When a pool allow-list is given (`allowed_keys`: the full
32-byte Ed25519 public keys of the pool, pinned, never the 64-bit node id derived from
them), anything authored or sent by a key outside it is rejected as `NotInPool`.

`encode` splits a message whose updates do not fit `max_datagram` bytes into several
datagrams (a `Sync` carrying a whole view); only the first keeps `reply`.
"""

from __future__ import annotations

import base64
import json
import struct
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from swactor.membership.core import _with_updates
from swactor.membership.messages import (
    Ack,
    Address,
    AliveUpdate,
    BootHealth,
    DeadUpdate,
    ForgedMessage,
    ForgeryReason,
    Gossip,
    MemberMeta,
    Message,
    Nack,
    Ping,
    PingReq,
    SuspectUpdate,
    Sync,
    Update,
)
from swactor.transport.identity import node_id_from_public_key
from swactor.wire import NodeId

MAGIC = b"SWM1"
_HEADER = struct.Struct(">4sI")
_KEY = 32
_SIG = 64
MAX_DATAGRAM = 8192
"""Largest datagram `encode` produces (IP fragments it on a 1500-byte LAN; fine for SWIM)."""


class MembershipWireError(ValueError):
    """A datagram that is not a well-formed SWIM message; `field` names the problem spot."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"SWIM datagram: {field}: {problem}")


@dataclass(frozen=True, slots=True)
class Decoded:
    """A verified message (None if the datagram itself was forged) and the forgeries found."""

    message: Message | None
    forged: tuple[ForgedMessage, ...]


def public_key_raw(key: Ed25519PrivateKey | Ed25519PublicKey) -> bytes:
    """The raw 32-byte Ed25519 public key: what a pool allow-list (`allowed_keys`) pins."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


class Signer:
    """Signs datagrams and this node's own updates with its identity key."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key
        self.public_raw = public_key_raw(private_key)
        self.node_id = NodeId(node_id_from_public_key(private_key.public_key()))
        self._own: dict[Update, dict[str, Any]] = {}

    def sign(self, data: bytes) -> bytes:
        return self._key.sign(data)

    def own_update(self, update: Update) -> dict[str, Any]:
        """The signed wire form of an update this node authored (memoised)."""
        wire = self._own.get(update)
        if wire is None:
            wire = _update_body(update)
            wire["p"] = _b64(self.public_raw)
            wire["g"] = _b64(self._key.sign(_canonical(wire)))
            if len(self._own) > 4096:
                self._own.clear()
            self._own[update] = wire
        return wire


class Codec:
    """Encodes messages for one node and verifies the datagrams it receives."""

    def __init__(self, signer: Signer, allowed: Collection[NodeId] | None = None,
                 max_datagram: int = MAX_DATAGRAM, *,
                 allowed_keys: Collection[bytes] | None = None) -> None:
        self.signer = signer
        self.allowed = None if allowed is None else frozenset(allowed)
        self.allowed_keys = None if allowed_keys is None else _pinned_keys(allowed_keys)
        self.max_datagram = max_datagram
        self._relayed: OrderedDict[Update, dict[str, Any]] = OrderedDict()
        self._verified: OrderedDict[bytes, None] = OrderedDict()

    # ------------------------------------------------------------ encode

    def encode(self, message: Message) -> list[bytes]:
        """One or more signed datagrams carrying `message`."""
        updates = [w for w in (self._update_wire(u) for u in message.updates) if w is not None]
        base = _message_body(message)
        datagrams: list[bytes] = []
        chunk: list[dict[str, Any]] = []
        first = True
        budget = self.max_datagram - 512
        size = 0
        for wire in updates:
            length = len(json.dumps(wire, separators=(",", ":")))
            if chunk and size + length > budget:
                datagrams.append(self._seal(base, chunk, first))
                first, chunk, size = False, [], 0
                if not isinstance(message, Sync):
                    break  # a probe carries what fits; the rest is gossiped later
            chunk.append(wire)
            size += length + 1
        if chunk or not datagrams:
            datagrams.append(self._seal(base, chunk, first))
        return datagrams

    def _seal(self, base: dict[str, Any], updates: list[dict[str, Any]], first: bool) -> bytes:
        body = dict(base)
        if not first and "r" in body:
            body["r"] = False
        body["u"] = updates
        raw = json.dumps(body, separators=(",", ":")).encode()
        head = _HEADER.pack(MAGIC, len(raw)) + raw
        return head + self.signer.public_raw + self.signer.sign(head)

    def _update_wire(self, update: Update) -> dict[str, Any] | None:
        """The signed form of `update`: ours, or the author's as verified on arrival.

        None when the author's signature is no longer cached: the update is left out
        (it is never re-signed by a relay).
        """
        if update.author == self.signer.node_id:
            return self.signer.own_update(update)
        return self._relayed.get(update)

    # ------------------------------------------------------------ decode

    def decode(self, datagram: bytes, source: Address, now: float) -> Decoded:
        """Parse and verify one datagram; raises `MembershipWireError` if malformed."""
        if len(datagram) < _HEADER.size + _KEY + _SIG:
            raise MembershipWireError("datagram", f"{len(datagram)} bytes is too short")
        magic, length = _HEADER.unpack_from(datagram)
        if magic != MAGIC:
            raise MembershipWireError("magic", "not a SWM1 datagram")
        end = _HEADER.size + length
        if end + _KEY + _SIG != len(datagram):
            raise MembershipWireError("length", f"body length {length} does not match datagram")
        try:
            body = json.loads(datagram[_HEADER.size:end])
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise MembershipWireError("body", f"not JSON ({exc.__class__.__name__})") from exc
        if not isinstance(body, dict):
            raise MembershipWireError("body", "not a JSON object")
        sender = _node(body, "s")
        key_raw = datagram[end:end + _KEY]
        reason = self._check(sender, key_raw, datagram[end + _KEY:], datagram[:end])
        if reason is not None:
            return Decoded(None, (ForgedMessage(sender, reason, source, now),))
        forged: list[ForgedMessage] = []
        updates: list[Update] = []
        raw_updates = body.get("u", [])
        if not isinstance(raw_updates, list):
            raise MembershipWireError("u", "not a list")
        for wire in raw_updates:
            update = _parse_update(wire)
            bad = self._check_update(update, wire)
            if bad is not None:
                forged.append(ForgedMessage(update.author, bad, source, now))
                continue
            self._remember(update, wire)
            updates.append(update)
        return Decoded(_parse_message(body, sender, tuple(updates)), tuple(forged))

    def _check(self, claimed: NodeId, key_raw: bytes, signature: bytes,
               signed: bytes) -> ForgeryReason | None:
        if self.allowed is not None and claimed not in self.allowed:
            return ForgeryReason.NotInPool
        if self.allowed_keys is not None and key_raw not in self.allowed_keys:
            return ForgeryReason.NotInPool
        try:
            key = Ed25519PublicKey.from_public_bytes(key_raw)
        except ValueError:
            return ForgeryReason.BadSignature
        if node_id_from_public_key(key) != claimed:
            return ForgeryReason.NodeIdMismatch
        try:
            key.verify(signature, signed)
        except InvalidSignature:
            return ForgeryReason.BadSignature
        return None

    def _check_update(self, update: Update, wire: dict[str, Any]) -> ForgeryReason | None:
        """Why `update` (parsed from `wire`) is refused, or None when its author signed it.

        The cache of verified updates is keyed on the whole (author key, signature, signed
        body) triple, and consulted only after the allow-list and the author's node id
        were checked against that key: a signature verified once proves nothing about
        any other key or body.
        """
        signature = _unb64(wire, "g", _SIG)
        key_raw = _unb64(wire, "p", _KEY)
        unsigned = {k: v for k, v in wire.items() if k != "g"}
        signed = _canonical(unsigned)
        if signed != _canonical(_update_body(update) | {"p": wire["p"]}):
            raise MembershipWireError("u", "update carries unknown or non-canonical fields")
        if self.allowed is not None and update.author not in self.allowed:
            return ForgeryReason.NotInPool
        if self.allowed_keys is not None and key_raw not in self.allowed_keys:
            return ForgeryReason.NotInPool
        triple = key_raw + signature + signed
        if triple in self._verified:
            self._verified.move_to_end(triple)
            return None
        reason = self._check(update.author, key_raw, signature, signed)
        if reason is None:
            self._verified[triple] = None
            if len(self._verified) > 8192:
                self._verified.popitem(last=False)
        return reason

    def _remember(self, update: Update, wire: dict[str, Any]) -> None:
        self._relayed[update] = wire
        self._relayed.move_to_end(update)
        if len(self._relayed) > 8192:
            self._relayed.popitem(last=False)


# ------------------------------------------------------------------ bodies


def _message_body(message: Message) -> dict[str, Any]:
    match message:
        case Ping(sender=s, seq=q, target=t):
            return {"t": "ping", "s": int(s), "q": q, "tg": int(t)}
        case Ack(sender=s, seq=q):
            return {"t": "ack", "s": int(s), "q": q}
        case Nack(sender=s, seq=q):
            return {"t": "nack", "s": int(s), "q": q}
        case PingReq(sender=s, seq=q, target=t, target_address=(host, port), nack=n):
            return {"t": "pingreq", "s": int(s), "q": q, "tg": int(t), "th": host, "tp": port,
                    "n": n}
        case Gossip(sender=s):
            return {"t": "gossip", "s": int(s)}
        case Sync(sender=s, reply=r):
            return {"t": "sync", "s": int(s), "r": r}
    raise TypeError(f"not a SWIM message: {type(message).__name__}")


def _parse_message(body: dict[str, Any], sender: NodeId, updates: tuple[Update, ...]) -> Message:
    kind = body.get("t")
    message: Message
    if kind == "ping":
        message = Ping(sender, _int(body, "q"), _node(body, "tg"))
    elif kind == "ack":
        message = Ack(sender, _int(body, "q"))
    elif kind == "nack":
        message = Nack(sender, _int(body, "q"))
    elif kind == "pingreq":
        message = PingReq(sender, _int(body, "q"), _node(body, "tg"),
                          (_str(body, "th"), _port(body, "tp")), _bool(body, "n"))
    elif kind == "gossip":
        message = Gossip(sender)
    elif kind == "sync":
        message = Sync(sender, _bool(body, "r"))
    else:
        raise MembershipWireError("t", f"unknown message type {str(kind)[:32]!r}")
    return _with_updates(message, updates) if updates else message


def _update_body(update: Update) -> dict[str, Any]:
    match update:
        case AliveUpdate(node_id=n, incarnation=i, meta=m):
            return {"k": "alive", "n": int(n), "i": i, "m": _meta_body(m)}
        case SuspectUpdate(node_id=n, incarnation=i, accuser=a):
            return {"k": "suspect", "n": int(n), "i": i, "a": int(a)}
        case DeadUpdate(node_id=n, incarnation=i, accuser=a):
            return {"k": "dead", "n": int(n), "i": i, "a": int(a)}
    raise TypeError(f"not a SWIM update: {type(update).__name__}")


def _parse_update(wire: object) -> Update:
    if not isinstance(wire, dict):
        raise MembershipWireError("u", "an update is not a JSON object")
    kind = wire.get("k")
    node = _node(wire, "n")
    incarnation = _int(wire, "i")
    if kind == "alive":
        meta = wire.get("m")
        if not isinstance(meta, dict):
            raise MembershipWireError("u.m", "metadata is not a JSON object")
        return AliveUpdate(node, incarnation, _parse_meta(meta))
    if kind == "suspect":
        return SuspectUpdate(node, incarnation, _node(wire, "a"))
    if kind == "dead":
        return DeadUpdate(node, incarnation, _node(wire, "a"))
    raise MembershipWireError("u.k", f"unknown update kind {str(kind)[:32]!r}")


def _meta_body(meta: MemberMeta) -> dict[str, Any]:
    return {"sh": meta.swim_host, "sp": meta.swim_port, "qh": meta.quic_host,
            "qp": meta.quic_port, "bh": meta.boot_health.value, "dk": meta.device_kind,
            "mb": meta.memory_bytes, "r": meta.role}


def _parse_meta(body: dict[str, Any]) -> MemberMeta:
    try:
        health = BootHealth(body.get("bh"))
    except ValueError as exc:
        raise MembershipWireError("u.m.bh", "unknown boot health") from exc
    return MemberMeta(
        swim_host=_str(body, "sh"), swim_port=_port(body, "sp"), quic_host=_str(body, "qh"),
        quic_port=_int(body, "qp"), boot_health=health, device_kind=_str(body, "dk"),
        memory_bytes=_int(body, "mb"), role=_str(body, "r"),
    )


# ------------------------------------------------------------------ field helpers


def _pinned_keys(keys: Collection[bytes]) -> frozenset[bytes]:
    """The allow-list as raw 32-byte Ed25519 public keys; `ValueError` names a bad one."""
    pinned = frozenset(bytes(key) for key in keys)
    for key in pinned:
        if len(key) != _KEY:
            raise ValueError(f"allowed_keys: a pinned key is {len(key)} bytes, expected {_KEY}"
                             " (raw Ed25519 public key)")
    return pinned


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _unb64(body: dict[str, Any], key: str, size: int) -> bytes:
    value = body.get(key)
    if not isinstance(value, str):
        raise MembershipWireError(f"u.{key}", "missing or not a string")
    try:
        raw = base64.b64decode(value, validate=True)
    except ValueError as exc:
        raise MembershipWireError(f"u.{key}", "not base64") from exc
    if len(raw) != size:
        raise MembershipWireError(f"u.{key}", f"{len(raw)} bytes, expected {size}")
    return raw


def _int(body: dict[str, Any], key: str) -> int:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MembershipWireError(key, "missing or not a non-negative integer")
    return value


def _node(body: dict[str, Any], key: str) -> NodeId:
    value = _int(body, key)
    if value >= 1 << 64:
        raise MembershipWireError(key, "node id outside u64")
    return NodeId(value)


def _port(body: dict[str, Any], key: str) -> int:
    value = _int(body, key)
    if value > 65535:
        raise MembershipWireError(key, "port outside 0..65535")
    return value


def _str(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or len(value) > 255:
        raise MembershipWireError(key, "missing or not a string of at most 255 characters")
    return value


def _bool(body: dict[str, Any], key: str) -> bool:
    value = body.get(key)
    if not isinstance(value, bool):
        raise MembershipWireError(key, "missing or not a boolean")
    return value
