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

Membership events (`MemberChanged`, `Joined`, `Refuted`, `ForgedMessage`) are what the
core and the wire layer report upward. Payload bytes never appear in any of them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from swactor.wire import NodeId

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
    """Ask the receiver to probe `target` on the sender's behalf (indirect probe `seq`)."""

    sender: NodeId
    seq: int
    target: NodeId
    target_address: Address
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
    """The author is not in the allowed pool."""


@dataclass(frozen=True, slots=True)
class ForgedMessage:
    """A datagram or update was dropped: its signature or node id did not match."""

    claimed: NodeId
    reason: ForgeryReason
    source: Address
    at: float


MembershipEvent = MemberChanged | Joined | Refuted | ForgedMessage
