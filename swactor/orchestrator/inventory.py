"""The pool's resource inventory as the planner sees it: nodes, usable memory, device kind.

Theory of operation. Membership (spec §9) reports each member's device kind and memory;
the planner needs only `NodeResources` per stage-capable node, in pool order (stage `i`
goes to the `i`-th node). Three ways in:

- `NodeResources(...)` built by the caller (the orchestrator, from the membership view);
- `load_pool_file(path)`: a JSON file, for `swactor plan --pool FILE.json`::

      {"orchestrator_node_id": 1000,
       "nodes": [{"node_id": 1, "usable_memory_bytes": "8 GiB", "device_kind": "cuda"},
                 {"node_id": 2, "usable_memory_bytes": 4294967296, "device_kind": "cpu"}]}

  (`orchestrator_node_id` optional; memory as an integer or a string with a unit B, KB,
  MB, GB, TB, KiB, MiB, GiB, TiB);
- `synthetic_pool(n)`: `n` identical nodes, for `swactor plan --nodes N` and local trials;
- `inventory_from_view(view, orchestrator)`: from a SWIM membership view, the members
  that are alive, published boot health `available` and the role `node`, in node-id
  order (so the same pool always gives the same plan), with the device kind and memory
  they publish.

Every malformed entry is a `PlannerError` naming the file, the entry and the field.
Whether a node's memory is zero or too small is the planner's check, not this module's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from swactor.cliargs import BYTE_COUNT_HELP, byte_count
from swactor.orchestrator.errors import PlannerError, PlanProblem
from swactor.wire import NodeId
from swactor.wire.errors import WireError

if TYPE_CHECKING:
    from swactor.membership.core import MemberView

DEFAULT_NODE_MEMORY_BYTES = 8 << 30
DEFAULT_DEVICE_KIND = "cpu"
DEFAULT_ORCHESTRATOR_NODE = NodeId(1000)
SYNTHETIC_FIRST_NODE = 1

@dataclass(frozen=True, slots=True)
class NodeResources:
    """One stage-capable node: its id, the memory a stage may use, and its device kind."""

    node_id: NodeId
    usable_memory_bytes: int
    device_kind: str = DEFAULT_DEVICE_KIND


@dataclass(frozen=True, slots=True)
class PoolInventory:
    """The stage nodes in pool order, and the orchestrator's own node id."""

    nodes: tuple[NodeResources, ...]
    orchestrator_node_id: NodeId = DEFAULT_ORCHESTRATOR_NODE


def parse_bytes(value: object, where: str) -> int:
    """An integer byte count, or a string such as "8 GiB"; PlannerError otherwise."""
    if isinstance(value, bool):
        raise PlannerError(PlanProblem.PoolFileInvalid, f"{where}: a byte count, not a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and (count := byte_count(value)) is not None:
        return count
    raise PlannerError(
        PlanProblem.PoolFileInvalid, f"{where}: {value!r} is not a byte count ({BYTE_COUNT_HELP})"
    )


def _node_id(value: object, where: str) -> NodeId:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlannerError(PlanProblem.PoolFileInvalid, f"{where}: must be an integer")
    try:
        return NodeId(value)
    except WireError as error:
        raise PlannerError(PlanProblem.PoolFileInvalid, f"{where}: {error.rule}") from None


def _node(entry: object, where: str) -> NodeResources:
    if not isinstance(entry, dict):
        raise PlannerError(PlanProblem.PoolFileInvalid, f"{where}: must be an object")
    unknown = set(entry) - {"node_id", "usable_memory_bytes", "device_kind"}
    if unknown:
        raise PlannerError(
            PlanProblem.PoolFileInvalid, f"{where}: unknown keys {', '.join(sorted(unknown))}"
        )
    for key in ("node_id", "usable_memory_bytes"):
        if key not in entry:
            raise PlannerError(PlanProblem.PoolFileInvalid, f"{where}: missing {key!r}")
    kind = entry.get("device_kind", DEFAULT_DEVICE_KIND)
    if not isinstance(kind, str) or not kind:
        raise PlannerError(
            PlanProblem.PoolFileInvalid, f"{where}.device_kind: must be a non-empty string"
        )
    return NodeResources(
        _node_id(entry["node_id"], f"{where}.node_id"),
        parse_bytes(entry["usable_memory_bytes"], f"{where}.usable_memory_bytes"),
        kind,
    )


def pool_from_json(document: object, source: str) -> PoolInventory:
    """Parse a pool document (see the module doc); `source` names it in errors."""
    if isinstance(document, list):
        document = {"nodes": document}
    if not isinstance(document, dict):
        raise PlannerError(PlanProblem.PoolFileInvalid, f"{source}: must be a JSON object")
    unknown = set(document) - {"nodes", "orchestrator_node_id"}
    if unknown:
        raise PlannerError(
            PlanProblem.PoolFileInvalid, f"{source}: unknown keys {', '.join(sorted(unknown))}"
        )
    entries = document.get("nodes")
    if not isinstance(entries, list):
        raise PlannerError(PlanProblem.PoolFileInvalid, f"{source}: 'nodes' must be a list")
    nodes = tuple(_node(entry, f"{source}: nodes[{i}]") for i, entry in enumerate(entries))
    orchestrator = document.get("orchestrator_node_id", int(DEFAULT_ORCHESTRATOR_NODE))
    return PoolInventory(nodes, _node_id(orchestrator, f"{source}: orchestrator_node_id"))


def load_pool_file(path: str | Path) -> PoolInventory:
    """Read a pool JSON file; a missing, unreadable or malformed file is a PlannerError."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise PlannerError(
            PlanProblem.PoolFileInvalid, f"{path}: cannot read ({error.strerror or error})"
        ) from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise PlannerError(
            PlanProblem.PoolFileInvalid, f"{path}: not JSON (line {error.lineno}: {error.msg})"
        ) from None
    return pool_from_json(document, str(path))


def synthetic_pool(
    count: int,
    memory_bytes: int = DEFAULT_NODE_MEMORY_BYTES,
    device_kind: str = DEFAULT_DEVICE_KIND,
) -> PoolInventory:
    """`count` identical nodes with ids 1..count (a local trial's pool)."""
    if count < 1:
        raise PlannerError(PlanProblem.EmptyPool, f"--nodes must be at least 1, not {count}")
    return PoolInventory(
        tuple(
            NodeResources(NodeId(SYNTHETIC_FIRST_NODE + i), memory_bytes, device_kind)
            for i in range(count)
        )
    )


def inventory_from_view(
    view: Mapping[NodeId, MemberView],
    orchestrator_node_id: NodeId,
    candidates: Iterable[NodeId] | None = None,
) -> PoolInventory:
    """The stage nodes of a membership view (alive, available, role "node"), by node id.

    `candidates`, when given, limits the pool to those ids (the PoolReady candidate set).
    """
    from swactor.membership.messages import BootHealth, MemberState

    allowed = None if candidates is None else set(candidates)
    nodes = tuple(
        NodeResources(member.node_id, member.meta.memory_bytes,
                      member.meta.device_kind or DEFAULT_DEVICE_KIND)
        for member in sorted(view.values(), key=lambda m: int(m.node_id))
        if member.state is MemberState.Alive
        and member.meta.boot_health is BootHealth.Available
        and member.meta.role == "node"
        and member.node_id != orchestrator_node_id
        and (allowed is None or member.node_id in allowed)
    )
    return PoolInventory(nodes, orchestrator_node_id)
