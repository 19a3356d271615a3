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

    b"SWM2" | to (u64) | n (u64) | body length (u16) | body (UTF-8 JSON)
            | sender key (32) | signature (64)

big endian, signed (Ed25519, by the sender) over everything before the key. `to` is the
node id of the recipient (0 only for a `Sync` sent to a seed address whose member is not
known yet), so a captured datagram cannot be re-aimed at another member; `n` is the
sender's datagram counter, which doubles as its clock: each datagram takes
max(previous n + 1, wall-clock microseconds), so it only grows, across restarts too.

`decode` checks, in this order; each failure is a typed refusal that costs at most one
signature verification and never memory proportional to anything the sender chose:

1. size (at most `max_datagram` bytes), magic and version (`SWM2`), body length: a
   `MembershipWireError` naming the field;
2. the sender key against the pool's allow-list, when one is pinned: `NotInPool`;
3. `to` is this node (or 0): `Misdirected`; `n` within `freshness_s` of this node's wall
   clock: `Stale`;
4. the signature: `BadSignature`;
5. `n` not seen before from this key (a window of the last 32 counters per key, so
   reordering within it is fine): `Replayed`. The table of keys is bounded
   (`max_senders`): keys that sent nothing fresh are dropped first, and when every entry
   is fresh a new key is refused (`Flooded`) rather than one forgotten, which would let
   its datagrams be replayed;
6. only then is the body parsed, as bounded JSON (nesting depth 4, integers of at most
   20 digits, no floats, NaN or Infinity; the depth is measured before parsing), every
   integer is range-checked (node ids u64, sequence numbers up to `MAX_SEQ`,
   incarnations up to `MAX_INCARNATION`, ports u16), at most `MAX_UPDATES` updates, and
   the body must name the node id of the key (`NodeIdMismatch`).

Freshness needs the members' wall clocks within `freshness_s` (30 s) of each other (NTP).

Every gossip update inside the body carries its *author's* key and signature over its
canonical JSON: an alive update is authored by the member itself (so no relay can fake
a member's metadata or incarnation), a suspect or dead update by its accuser. A relayed
update is forwarded with its original signature; one that fails is dropped alone and
reported. A verified update is cached under its whole (author key, signature, signed
body) triple, so an update gossiped many times is checked once and any change to any of
the three is checked afresh. When a pool allow-list is given (`allowed_keys`: the full
32-byte Ed25519 public keys of the pool, pinned, never the 64-bit node id derived from
them), anything authored or sent by a key outside it is refused as `NotInPool` before
any signature is verified.

Amplification: `Decoded.authenticated` is true only for a datagram from a pinned key
addressed to this node. The runner caps every answer to anything else at the size of
the datagram that asked (`encode(..., budget=)` leaves out updates that do not fit and
returns nothing when even the bare message does not), so a spoofed source address gets
no more bytes than the spoofer sent. A `Sync` asking for a reply that may be treated as
unauthenticated (an open pool, or sent to a seed address) is padded to `max_datagram`,
so that the answer can still carry a datagram's worth of the view.

`encode` splits a `Sync` whose updates do not fit `max_datagram` bytes into several
datagrams (a whole view); only the first keeps `reply`. Other messages carry what fits.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import json
import re
import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
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
    MAX_INCARNATION,
    MAX_SEQ,
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
from swactor.wire import NodeId

MAGIC = b"SWM2"
_HEADER = struct.Struct(">4sQQH")
_KEY = 32
_SIG = 64
MAX_DATAGRAM = 8192
"""Largest datagram `encode` produces and `decode` accepts (IP fragments it on a
1500-byte LAN; fine for SWIM)."""
MAX_UPDATES = 32
"""Most gossip updates one datagram may carry (each may cost a signature check)."""
FRESHNESS_S = 30.0
"""How far a datagram's counter (its sender's clock) may be from this node's clock."""
MAX_SENDERS = 4096
"""Sender keys whose recent counters are kept for replay detection."""
_REPLAY_WINDOW = 32
_MAX_DEPTH = 4  # body {} > "u" [] > update {} > "m" {}
_MAX_DIGITS = 20  # 2**64 - 1 has 20
_U64 = (1 << 64) - 1
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_MAX_BRACKETS = 4 * MAX_UPDATES + 16  # body, "u", and per update its object and "m"
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_PAD = len(',"x":""')


class MembershipWireError(ValueError):
    """A datagram that is not a well-formed SWIM message; `field` names the problem spot."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"SWIM datagram: {field}: {problem}")


@dataclass(frozen=True, slots=True)
class Decoded:
    """A verified message (None if the datagram itself was refused) and the refusals found.

    `authenticated`: the sender's key is pinned in the pool's allow-list and the datagram
    was addressed to this node; an answer to anything else is capped at `size` bytes.
    """

    message: Message | None
    forged: tuple[ForgedMessage, ...]
    authenticated: bool = False
    size: int = 0


def public_key_raw(key: Ed25519PrivateKey | Ed25519PublicKey) -> bytes:
    """The raw 32-byte Ed25519 public key: what a pool allow-list (`allowed_keys`) pins."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def node_id_of_key(key_raw: bytes) -> NodeId:
    """The node id a raw public key derives (as `identity.node_id_from_public_key`)."""
    return NodeId(int.from_bytes(hashlib.sha256(key_raw).digest()[:8], "little"))


def seal(body: bytes, private_key: Ed25519PrivateKey, *, to: int, n: int) -> bytes:
    """One signed datagram around an already serialised `body` (the codec's last step)."""
    head = _HEADER.pack(MAGIC, to, n, len(body)) + body
    return head + public_key_raw(private_key) + private_key.sign(head)


class Signer:
    """Signs datagrams and this node's own updates with its identity key."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key
        self.public_raw = public_key_raw(private_key)
        self.node_id = node_id_of_key(self.public_raw)
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
    """Encodes messages for one node and checks the datagrams it receives."""

    def __init__(self, signer: Signer, allowed: Collection[NodeId] | None = None,
                 max_datagram: int = MAX_DATAGRAM, *,
                 allowed_keys: Collection[bytes] | None = None,
                 freshness_s: float = FRESHNESS_S, max_senders: int = MAX_SENDERS,
                 clock: Callable[[], float] = time.time) -> None:
        if not 1024 <= max_datagram <= 65000:
            raise ValueError(f"max_datagram must be in 1024..65000, got {max_datagram}")
        if not freshness_s > 0 or max_senders < 1:
            raise ValueError("freshness_s must be > 0 and max_senders >= 1")
        self.signer = signer
        self.allowed = None if allowed is None else frozenset(allowed)
        self.allowed_keys = None if allowed_keys is None else _pinned_keys(allowed_keys)
        self.max_datagram = max_datagram
        self.freshness_s = freshness_s
        self.max_senders = max_senders
        self._clock = clock
        self._n = 0
        self._relayed: OrderedDict[Update, dict[str, Any]] = OrderedDict()
        self._verified: OrderedDict[bytes, None] = OrderedDict()
        self._seen: dict[bytes, list[int]] = {}
        """Per sender key: the last `_REPLAY_WINDOW` counters accepted, ascending."""

    # ------------------------------------------------------------ encode

    def encode(self, message: Message, to: NodeId | None = None,
               budget: int | None = None) -> list[bytes]:
        """Signed datagrams carrying `message` to member `to` (None: not known yet).

        With a `budget` (an answer to an unauthenticated datagram of that size): one
        datagram of at most `budget` bytes, updates that do not fit left out, and none at
        all when the bare message does not fit.
        """
        updates = [w for w in (self._update_wire(u) for u in message.updates) if w is not None]
        base = _message_body(message)
        target = 0 if to is None else int(to)
        limit = self.max_datagram if budget is None else min(budget, self.max_datagram)
        room = limit - self._bare_size(base) - 8  # 8: "false" for "true" in later chunks
        if room < 0:
            return []
        split = isinstance(message, Sync) and budget is None
        pad = (isinstance(message, Sync) and message.reply and budget is None
               and (self.allowed_keys is None or target == 0))
        datagrams: list[bytes] = []
        chunk: list[dict[str, Any]] = []
        size = 0
        for wire in updates:
            length = len(json.dumps(wire, separators=(",", ":"))) + 1
            if length > room:
                continue  # cannot fit any datagram of this size
            if size + length > room or len(chunk) == MAX_UPDATES:
                if not split:
                    break  # a probe carries what fits; the rest is gossiped later
                datagrams.append(self._seal(base, chunk, not datagrams, target, pad))
                chunk, size = [], 0
            chunk.append(wire)
            size += length
        if chunk or not datagrams:
            datagrams.append(self._seal(base, chunk, not datagrams, target, pad))
        return datagrams

    @staticmethod
    def _bare_size(base: dict[str, Any]) -> int:
        body = dict(base)
        body["u"] = []
        return _HEADER.size + len(json.dumps(body, separators=(",", ":"))) + _KEY + _SIG

    def _seal(self, base: dict[str, Any], updates: list[dict[str, Any]], first: bool,
              to: int, pad: bool) -> bytes:
        body = dict(base)
        if not first and "r" in body:
            body["r"] = False
        body["u"] = updates
        raw = json.dumps(body, separators=(",", ":")).encode()
        spare = self.max_datagram - (_HEADER.size + len(raw) + _KEY + _SIG) - _PAD
        if pad and first and spare > 0:
            body["x"] = "0" * spare
            raw = json.dumps(body, separators=(",", ":")).encode()
        self._n = max(self._n + 1, int(self._clock() * 1e6))
        head = _HEADER.pack(MAGIC, to, self._n, len(raw)) + raw
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
        """Check and parse one datagram (in the order of the module docstring).

        Raises `MembershipWireError` when it is malformed; one that is well formed but
        refused, or an update inside it that is, comes back in `Decoded.forged`.
        """
        size = len(datagram)
        if size > self.max_datagram:
            raise MembershipWireError(
                "datagram", f"{size} bytes is over the {self.max_datagram}-byte limit")
        if size < _HEADER.size + _KEY + _SIG:
            raise MembershipWireError("datagram", f"{size} bytes is too short")
        magic, to, n, length = _HEADER.unpack_from(datagram)
        if magic != MAGIC:
            if magic[:3] == MAGIC[:3]:
                raise MembershipWireError("version", "not SWIM wire version 2")
            raise MembershipWireError("magic", "not a SWIM datagram")
        end = _HEADER.size + length
        if end + _KEY + _SIG != size:
            raise MembershipWireError("length", f"body length {length} does not match datagram")
        key_raw = datagram[end:end + _KEY]
        claimed = node_id_of_key(key_raw)

        def refused(reason: ForgeryReason, who: NodeId = claimed) -> Decoded:
            return Decoded(None, (ForgedMessage(who, reason, source, now),), size=size)

        if self.allowed is not None and claimed not in self.allowed:
            return refused(ForgeryReason.NotInPool)
        if self.allowed_keys is not None and key_raw not in self.allowed_keys:
            return refused(ForgeryReason.NotInPool)
        if to not in (0, self.signer.node_id):
            return refused(ForgeryReason.Misdirected)
        wall_us = int(self._clock() * 1e6)
        if abs(n - wall_us) > self.freshness_s * 1e6:
            return refused(ForgeryReason.Stale)
        if not _verifies(key_raw, datagram[end + _KEY:], datagram[:end]):
            return refused(ForgeryReason.BadSignature)
        replay = self._fresh(key_raw, n, wall_us)
        if replay is not None:
            return refused(replay)
        body = _bounded_json(datagram[_HEADER.size:end])
        if not isinstance(body, dict):
            raise MembershipWireError("body", "not a JSON object")
        sender = _node(body, "s")
        if sender != claimed:
            return refused(ForgeryReason.NodeIdMismatch, sender)
        raw_updates = body.get("u", [])
        if not isinstance(raw_updates, list):
            raise MembershipWireError("u", "not a list")
        if len(raw_updates) > MAX_UPDATES:
            raise MembershipWireError("u", f"more than {MAX_UPDATES} updates")
        parsed = [_parse_update(wire) for wire in raw_updates]
        message = _parse_message(body, sender, ())
        if to == 0 and not isinstance(message, Sync):
            return refused(ForgeryReason.Misdirected)
        forged: list[ForgedMessage] = []
        updates: list[Update] = []
        for update, wire in zip(parsed, raw_updates, strict=True):
            bad = self._check_update(update, wire)
            if bad is not None:
                forged.append(ForgedMessage(update.author, bad, source, now))
                continue
            self._remember(update, wire)
            updates.append(update)
        if updates:
            message = _with_updates(message, tuple(updates))
        authenticated = self.allowed_keys is not None and to == self.signer.node_id
        return Decoded(message, tuple(forged), authenticated, size)

    def _fresh(self, key_raw: bytes, n: int, wall_us: int) -> ForgeryReason | None:
        """Record counter `n` from `key_raw`, or say why it is refused."""
        seen = self._seen.get(key_raw)
        if seen is None:
            if len(self._seen) >= self.max_senders:
                horizon = wall_us - self.freshness_s * 1e6
                for key in [k for k, v in self._seen.items() if v[-1] < horizon]:
                    del self._seen[key]  # anything it sent is refused as stale anyway
                if len(self._seen) >= self.max_senders:
                    return ForgeryReason.Flooded
            self._seen[key_raw] = [n]
            return None
        if len(seen) >= _REPLAY_WINDOW and n <= seen[0]:
            return ForgeryReason.Replayed
        at = bisect.bisect_left(seen, n)
        if at < len(seen) and seen[at] == n:
            return ForgeryReason.Replayed
        seen.insert(at, n)
        if len(seen) > _REPLAY_WINDOW:
            del seen[0]
        return None

    def _check_update(self, update: Update, wire: dict[str, Any]) -> ForgeryReason | None:
        """Why `update` (parsed from `wire`) is refused, or None when its author signed it.

        The cache of verified updates is keyed on the whole (author key, signature, signed
        body) triple and consulted only after the allow-list and the author's node id
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
        if node_id_of_key(key_raw) != update.author:
            return ForgeryReason.NodeIdMismatch
        triple = key_raw + signature + signed
        if triple in self._verified:
            self._verified.move_to_end(triple)
            return None
        if not _verifies(key_raw, signature, signed):
            return ForgeryReason.BadSignature
        self._verified[triple] = None
        if len(self._verified) > 8192:
            self._verified.popitem(last=False)
        return None

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
        case PingReq(sender=s, seq=q, target=t, nack=n):
            return {"t": "pingreq", "s": int(s), "q": q, "tg": int(t), "n": n}
        case Gossip(sender=s):
            return {"t": "gossip", "s": int(s)}
        case Sync(sender=s, reply=r):
            return {"t": "sync", "s": int(s), "r": r}
    raise TypeError(f"not a SWIM message: {type(message).__name__}")


def _parse_message(body: dict[str, Any], sender: NodeId, updates: tuple[Update, ...]) -> Message:
    kind = body.get("t")
    message: Message
    if kind == "ping":
        message = Ping(sender, _seq(body, "q"), _node(body, "tg"))
    elif kind == "ack":
        message = Ack(sender, _seq(body, "q"))
    elif kind == "nack":
        message = Nack(sender, _seq(body, "q"))
    elif kind == "pingreq":
        message = PingReq(sender, _seq(body, "q"), _node(body, "tg"), _bool(body, "n"))
    elif kind == "gossip":
        message = Gossip(sender)
    elif kind == "sync":
        message = Sync(sender, _bool(body, "r"))
    else:
        raise MembershipWireError("t", "unknown message type")
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
    incarnation = _int(wire, "i", MAX_INCARNATION)
    if kind == "alive":
        meta = wire.get("m")
        if not isinstance(meta, dict):
            raise MembershipWireError("u.m", "metadata is not a JSON object")
        return AliveUpdate(node, incarnation, _parse_meta(meta))
    if kind == "suspect":
        return SuspectUpdate(node, incarnation, _node(wire, "a"))
    if kind == "dead":
        return DeadUpdate(node, incarnation, _node(wire, "a"))
    raise MembershipWireError("u.k", "unknown update kind")


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
        quic_port=_port(body, "qp"), boot_health=health, device_kind=_str(body, "dk"),
        memory_bytes=_int(body, "mb", _U64), role=_str(body, "r"),
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


def _verifies(key_raw: bytes, signature: bytes, signed: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(key_raw).verify(signature, signed)
    except (ValueError, InvalidSignature):
        return False
    return True


def _bounded_json(raw: bytes) -> Any:
    """`raw` parsed as JSON nested at most 4 deep, with integers of at most 20 digits.

    `MembershipWireError("body", ...)` for anything else (deep nesting, a huge number, a
    float, NaN, bad UTF-8, bad JSON). The depth is measured before parsing: strings and
    everything but brackets cut out, then four passes that each delete the innermost
    bracket pairs must leave nothing (linear scans in C, no recursion).
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MembershipWireError("body", "not UTF-8") from exc
    shape = _STRINGS.sub(b"", raw).translate(None, _NOT_BRACKETS)
    if len(shape) > _MAX_BRACKETS:
        raise MembershipWireError("body", f"more than {_MAX_BRACKETS} brackets (nested deeper"
                                  f" than {_MAX_DEPTH} or too many objects)")
    for _ in range(_MAX_DEPTH):  # each pass deletes one level: the innermost pairs
        shape = shape.replace(b"[]", b"\0").replace(b"{}", b"\0").replace(b"\0", b"")
    if shape:
        raise MembershipWireError("body", f"nested deeper than {_MAX_DEPTH} (or unbalanced)")
    try:
        return json.loads(text, parse_int=_bounded_int, parse_float=_no_float,
                          parse_constant=_no_float)
    except MembershipWireError:
        raise
    except (ValueError, RecursionError) as exc:
        raise MembershipWireError("body", f"not JSON ({exc.__class__.__name__})") from exc


def _bounded_int(digits: str) -> int:
    if len(digits) > _MAX_DIGITS + 1:
        raise MembershipWireError("body", f"an integer of more than {_MAX_DIGITS} digits")
    return int(digits)


def _no_float(text: str) -> float:
    raise MembershipWireError("body", "a float, NaN or Infinity (SWIM sends integers only)")


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


def _int(body: dict[str, Any], key: str, top: int) -> int:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MembershipWireError(key, "missing or not a non-negative integer")
    if value > top:
        raise MembershipWireError(key, f"integer above its limit {top}")
    return value


def _node(body: dict[str, Any], key: str) -> NodeId:
    return NodeId(_int(body, key, _U64))


def _seq(body: dict[str, Any], key: str) -> int:
    return _int(body, key, MAX_SEQ)


def _port(body: dict[str, Any], key: str) -> int:
    return _int(body, key, 65535)


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
