"""Mail of the EdgeEstablisher and the Tx/Rx edge actors (spec §26, §27).

To the EdgeEstablisher (besides the arena's, worker's and driver's answers):

- `ProvisionEdge(provision, port_id, owner)` (ask or tell): `provision` is the wire
  `ProvisionTx` or `ProvisionRx`; `port_id` the worker role port the ring binds to;
  `owner` the `EdgeOwner` the edge actor reports to. The answer (ask) is
  `EdgeProvisioned(edge_id, edge_actor)`, or `EdgeRefused(edge_id, detail)` when the
  edge id already has a record on this node.
- `StopEdge(edge_id)`: stop the edge (the edge actor forwards its owner's).
- `EdgeStates()` (ask): `dict[int, edge_record.State]`, every record's state now.
- `EdgeReleases()` (ask): `list[tuple[int, QuiescenceProofKind]]`, every ring this
  establisher released so far and the kind of proof it carried (teardown audit).

From the EdgeEstablisher to an edge actor: `swactor.wire` `EdgeReady`, `EdgeFailed`,
`EdgeStopped`, the events its table takes.
To an edge actor from its owner: `swactor.wire.StopEdge`, the event its table takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from swactor.actors import ActorRef
from swactor.wire import EdgeId, PortId, ProvisionRx, ProvisionTx, RunId


@dataclass(frozen=True, slots=True)
class ProvisionEdge:
    """Provision one end of an edge on this node (§26)."""

    provision: ProvisionTx | ProvisionRx
    port_id: PortId
    owner: Any
    """The `EdgeOwner` the edge actor reports to."""
    run_id: RunId | None = None
    """The run, for the edge_ready lifecycle event (none emitted without it)."""


@dataclass(frozen=True, slots=True)
class EdgeProvisioned:
    """Answer to ProvisionEdge: the record exists and `edge_actor` is its Tx/Rx actor."""

    edge_id: EdgeId
    edge_actor: ActorRef[Any]


@dataclass(frozen=True, slots=True)
class EdgeRefused:
    """Answer to a ProvisionEdge this node cannot take (the edge id is already in use)."""

    edge_id: EdgeId
    detail: str


@dataclass(frozen=True, slots=True)
class EdgeStates:
    """Ask the EdgeEstablisher for every record's state (`dict[int, edge_record.State]`)."""


@dataclass(frozen=True, slots=True)
class EdgeReleases:
    """Ask the EdgeEstablisher which rings it released, with which proof kind."""
