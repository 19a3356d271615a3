"""SWIM messages, gossip updates, member metadata and membership events (sans-I/O).

Theory of operation
-------------------
The membership core speaks in these frozen dataclasses; the wire codec
(`swactor.membership.wire`) turns them into signed UDP datagrams and back, and the
simulator hands them over as objects. Three layers:

* `MemberMeta` is what a member says about itself: its SWIM address, the QUIC endpoint
  the orchestrator provisions edges to, its boot health and its resource inventory.
* Updates are the gossip: `AliveUpdate` (authored and signed by the member itself),
  `SuspectUpdate` and `DeadUpdate` (authored and signed by the accuser; a `DeadUpdate`
  whose accuser is the member itself is a graceful leave, memberlist's convention).
  Updates ride piggyback on every probe message and on gossip messages.
* Messages are what one member sends another: `Ping`, `Ack`, `Nack` (Lifeguard),
  `PingReq` (indirect probe), `Gossip` and `Sync` (state exchange on join and
  anti-entropy). Every message names its `sender`; the wire layer proves it.

Membership events (`MemberChanged`, `Joined`, `Refuted`, `ForgedMessage`, `Refused`) are
what the core and the wire layer report upward. Payload bytes never appear in any of them.

Integer limits every layer holds (the wire refuses anything outside them):
`MAX_INCARNATION` bounds incarnations, and a claim about a member is only taken when it
is at most `MAX_CLAIM_AHEAD` above the incarnation it is known at (a member's refutation
raises its incarnation to the claim + 1, so unbounded claims could push it past anything
encodable); `MAX_SEQ` bounds probe sequence numbers, which wrap to 1 after it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from swactor.wire import NodeId

MAX_INCARNATION = (1 << 63) - 1
"""Largest incarnation on the wire."""
MAX_CLAIM_AHEAD = 1 << 16
"""A suspect/dead/leave claim further above the member's known incarnation is refused."""
MAX_SEQ = (1 << 32) - 1
"""Largest probe sequence number on the wire."""

Address = tuple[str, int]
"""A SWIM address: (host, UDP port). The simulator uses ("sim", node_id)."""


class BootHealth(enum.Enum):
    """What a member reports about its own boot (spec §8)."""

    Booting = "booting"
    Available = "available"
    Unavailable = "unavailable"


class MemberState(enum.Enum):
    """A member's state in one participant's view (the swim_member table's states)."""

    Alive = "alive"
    Suspect = "suspect"
    Dead = "dead"
    Left = "left"
    Removed = "removed"


@dataclass(frozen=True, slots=True)
class MemberMeta:
    """What a member publishes about itself (carried in its signed alive updates)."""

    swim_host: str
    swim_port: int
    quic_host: str = ""
    quic_port: int = 0
    boot_health: BootHealth = BootHealth.Booting
    device_kind: str = ""
    memory_bytes: int = 0
    role: str = "node"

    @property
    def swim_address(self) -> Address:
        return (self.swim_host, self.swim_port)

    @property
    def has_endpoint(self) -> bool:
        """True when the QUIC endpoint the orchestrator provisions edges to is known."""
        return bool(self.quic_host) and 0 < self.quic_port < 65536


@dataclass(frozen=True, slots=True)
class AliveUpdate:
    """`node_id` is alive at `incarnation` with `meta`; authored by `node_id` itself."""

    node_id: NodeId
    incarnation: int
    meta: MemberMeta

    @property
    def author(self) -> NodeId:
        return self.node_id


@dataclass(frozen=True, slots=True)
class SuspectUpdate:
    """`accuser` suspects `node_id` at `incarnation`."""

    node_id: NodeId
    incarnation: int
    accuser: NodeId

    @property
    def author(self) -> NodeId:
        return self.accuser


@dataclass(frozen=True, slots=True)
class DeadUpdate:
    """`accuser` declares `node_id` dead at `incarnation` (a leave when accuser == node_id)."""

    node_id: NodeId
    incarnation: int
    accuser: NodeId

    @property
    def author(self) -> NodeId:
        return self.accuser

    @property
    def is_leave(self) -> bool:
        return self.accuser == self.node_id


Update = AliveUpdate | SuspectUpdate | DeadUpdate


@dataclass(frozen=True, slots=True)
class Ping:
    """Direct probe `seq` of `target`; answered by Ack(seq) to `reply_to`."""

    sender: NodeId
    seq: int
    target: NodeId
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True, slots=True)
class Ack:
    """Answer to a Ping (or, relayed by an intermediary, to a PingReq) with the same seq."""

    sender: NodeId
    seq: int
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True, slots=True)
class Nack:
    """Lifeguard: the intermediary of PingReq `seq` got no ack from the target in time."""

    sender: NodeId
    seq: int
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True, slots=True)
class PingReq:
    """Ask the receiver to probe `target` on the sender's behalf (indirect probe `seq`).

    The receiver probes the address its own view holds for `target`, and only a member it
    knows alive or suspect: nobody can make a member ping an address of their choosing.
    """

    sender: NodeId
    seq: int
    target: NodeId
    nack: bool = True
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True, slots=True)
class Gossip:
    """Updates only (sent every gossip interval to a few random members)."""

    sender: NodeId
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True, slots=True)
class Sync:
    """State exchange: the sender's alive view; `reply` asks the receiver for its own."""

    sender: NodeId
    reply: bool
    updates: tuple[Update, ...] = ()


Message = Ping | Ack | Nack | PingReq | Gossip | Sync


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A message the core wants sent to `address` (the member `to`, when known)."""

    address: Address
    message: Message
    to: NodeId | None = None
    budget: int | None = None
    """At most this many bytes on the wire (an answer to an unauthenticated datagram of
    that size): updates that do not fit are left out, and a message that does not fit
    at all is not sent."""


# ------------------------------------------------------------------ events


@dataclass(frozen=True, slots=True)
class MemberChanged:
    """A member's state, incarnation or metadata changed in the local view."""

    node_id: NodeId
    state: MemberState
    incarnation: int
    meta: MemberMeta | None
    at: float
    """Time of the change on the core's clock (seconds)."""


@dataclass(frozen=True, slots=True)
class Joined:
    """The local member's join was answered by a member of the pool."""

    via: NodeId
    at: float


@dataclass(frozen=True, slots=True)
class Refuted:
    """The local member refuted a suspect/dead claim about itself."""

    accuser: NodeId
    incarnation: int
    at: float


class ForgeryReason(enum.Enum):
    """Why a datagram or update was rejected as forged."""

    NodeIdMismatch = "NodeIdMismatch"
    """The public key it carries does not derive the node id it claims."""
    BadSignature = "BadSignature"
    """The signature does not verify with the claimed member's key."""
    NotInPool = "NotInPool"
    """The author's key is not pinned in the pool's allow-list."""
    Misdirected = "Misdirected"
    """The datagram was addressed to another member (re-targeted)."""
    Stale = "Stale"
    """The datagram's counter (its sender's clock) is outside the freshness window."""
    Replayed = "Replayed"
    """The datagram's counter was already seen from that key (a captured datagram)."""
    Flooded = "Flooded"
    """The table of recent senders is full of fresh ones: a new sender is refused."""


@dataclass(frozen=True, slots=True)
class ForgedMessage:
    """A datagram or update was dropped: its signature or node id did not match."""

    claimed: NodeId
    reason: ForgeryReason
    source: Address
    at: float


class RefusalReason(enum.Enum):
    """Why the core refused a verified message or update (see `Refused`)."""

    TableFull = "TableFull"
    """A new member while the member table holds `SwimConfig.max_members`."""
    ClaimTooFarAhead = "ClaimTooFarAhead"
    """A suspect/dead/leave claim more than `MAX_CLAIM_AHEAD` above the known incarnation."""
    UnknownTarget = "UnknownTarget"
    """A PingReq for a member not alive or suspect in this view, or from a non-member."""
    RelayLimit = "RelayLimit"
    """A PingReq while `SwimConfig.max_relays` indirect probes are already running."""
    WrongResponder = "WrongResponder"
    """An Ack or Nack whose sequence number matches a probe but whose sender does not."""


@dataclass(frozen=True, slots=True)
class Refused:
    """The core refused a verified message or update from `sender` about `node_id`."""

    sender: NodeId
    node_id: NodeId
    reason: RefusalReason
    at: float


MembershipEvent = MemberChanged | Joined | Refuted | ForgedMessage | Refused
