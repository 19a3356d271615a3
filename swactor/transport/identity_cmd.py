"""`swactor node-id`: create (on first use) or load a node key and print its node id.

The node process will print the same id with `swactor node --show-id`; this subcommand
lets an operator provision keys and collect ids for the orchestrator's allow-list before
any node runs. Exit status 2 with a one-line message on a refused key file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from swactor.transport.errors import IdentityError
from swactor.transport.identity import NodeIdentity

DEFAULT_KEY = Path(os.environ.get("SWACTOR_NODE_KEY", "~/.config/swactor/node.key"))


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``node-id`` subcommand."""
    parser = subparsers.add_parser(
        "node-id",
        help="print this node's id (creates its Ed25519 key, mode 0600, on first use)",
        description="Load or create the node key and print the node id derived from it: "
        "the first 8 bytes of sha256(raw Ed25519 public key), little endian. The id names "
        "the key but does not prove it (64 bits can be ground): peers pin the full key "
        "with a pool file (`swactor pool add`).",
    )
    parser.add_argument(
        "--key", type=Path, default=DEFAULT_KEY, help=f"key file (default: {DEFAULT_KEY})"
    )
    parser.add_argument("--json", action="store_true", help='print {"node_id": ..., "hex": ...}')
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    path = Path(args.key).expanduser()
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        identity = NodeIdentity.load_or_create(path)
    except (IdentityError, OSError) as exc:
        print(f"swactor node-id: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"node_id": identity.node_id, "hex": f"{identity.node_id:016x}"}))
    else:
        print(f"{identity.node_id:016x}  ({identity.node_id})")
    return 0
