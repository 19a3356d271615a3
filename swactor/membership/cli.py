"""``swactor swim`` (or ``python -m swactor.membership``): one SWIM member, events as JSON lines.

Theory of operation
-------------------
A stand-alone member process for loopback and multi-host tests and for operators: it
loads (or creates, mode 0600) the node key, binds its UDP port, joins through the seeds
and writes one JSON object per line to stdout: ``started`` (node id, SWIM address),
``joined``, ``member`` (every state/incarnation change in its view), ``refuted`` and
``forged`` (a dropped datagram or update: claimed node id and reason). SIGTERM or
SIGINT leaves the pool gracefully and exits 0. Bad arguments exit 2 naming the problem.
`--pool FILE` admits only the pool file's keys (`swactor.membership.admission`); without
it this diagnostic member is open (`swactor node` and `swactor orchestrator`, which can
be planned on, refuse SWIM without `--pool` or an explicit `--open-pool`).

This module also holds the admission flags those two commands share
(`add_admission_arguments`, `admission_from_args`) and `swactor pool add|show`.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from swactor.membership.admission import (
    ID_ONLY_REFUSAL,
    OPEN_IDS_WARNING,
    OPEN_POOL_WARNING,
    ROLES,
    Admission,
    PoolFileError,
    add_member,
    load_pool,
)
from swactor.membership.config import SwimConfig
from swactor.membership.messages import (
    Address,
    BootHealth,
    ForgedMessage,
    Joined,
    MemberChanged,
    MemberMeta,
    MembershipEvent,
    Refuted,
)
from swactor.membership.udp import MembershipNode
from swactor.transport.errors import IdentityError
from swactor.transport.identity import NodeIdentity


def parse_address(text: str) -> Address:
    """``host:port`` -> (host, port); `argparse.ArgumentTypeError` naming the problem."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return (host, int(port))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The member's options (shared by `swactor swim` and `python -m swactor.membership`)."""
    parser.add_argument("--key", type=Path, required=True, help="node key file (created 0600)")
    parser.add_argument("--bind", type=parse_address, default=("127.0.0.1", 0))
    parser.add_argument("--seed", type=parse_address, action="append", default=[],
                        help="HOST:PORT of a member to join through (repeatable)")
    parser.add_argument("--quic", type=parse_address, default=None,
                        help="QUIC endpoint published in the metadata")
    parser.add_argument("--device-kind", default="cpu")
    parser.add_argument("--memory-bytes", type=int, default=0)
    parser.add_argument("--available", action="store_true",
                        help="publish boot health 'available' (default 'booting')")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply memberlist's periods and timeouts by this")
    parser.add_argument("--pool", type=Path, default=None, metavar="FILE",
                        help="admit only the full public keys of this pool file (swactor "
                        "pool add); default: any key (a diagnostic member only)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m swactor.membership",
                                     description="Run one SWIM member; events on stdout.")
    add_arguments(parser)
    return parser


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `swactor swim` and `swactor pool`."""
    parser = subparsers.add_parser(
        "swim", help="run one SWIM member (membership only); events as JSON lines",
        description="Run one SWIM member; events on stdout as JSON lines.")
    add_arguments(parser)
    parser.set_defaults(handler=run)
    register_pool(subparsers)


def add_admission_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--pool FILE` / `--open-pool` (shared by `swactor node` and `swactor orchestrator`)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--pool", type=Path, default=None, metavar="FILE",
                       help="pool file pinning the members' full public keys (swactor pool "
                       "add); required unless --open-pool, with SWIM or without (a node "
                       "id is a 64-bit hash of a key, not proof of it)")
    group.add_argument("--open-pool", action="store_true",
                       help="admit any key that reaches SWIM, or without SWIM any peer by "
                       "its node id alone (unsafe; prints a warning)")


def admission_from_args(args: argparse.Namespace, identity: NodeIdentity, role: str,
                        prog: str, swim: bool) -> Admission | None:
    """The pool admission the flags ask for (None: an open pool, after a warning on
    stderr); ValueError names a missing, unreadable or mismatched pool file, or no pool
    file at all: without one, SWIM admits any key and the fixed `--node` /
    `--trust-orchestrator` ids are checked by their 64 bits alone (admission module)."""
    if args.open_pool:
        warning = OPEN_POOL_WARNING if swim else OPEN_IDS_WARNING
        print(f"{prog}: warning: {warning}", file=sys.stderr, flush=True)
        return None
    if args.pool is None:
        if swim:
            raise ValueError("SWIM needs --pool FILE (the pool's pinned public keys; "
                             "`swactor pool add`), or --open-pool to admit any key")
        named = "--node ID@HOST:PORT" if role == "orchestrator" else "--trust-orchestrator ID"
        raise ValueError(f"{named} without --pool {ID_ONLY_REFUSAL}")
    admission = load_pool(args.pool)
    admission.require(identity, role)
    return admission


def register_pool(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `swactor pool add|show`."""
    parser = subparsers.add_parser(
        "pool", help="write or list a pool file (the keys admitted to a SWIM pool)",
        description="A pool file pins the full Ed25519 public keys allowed in a pool: one "
        "line per member, ROLE PUBLIC_KEY [NAME]. Copy it to every machine of the pool and "
        "pass it as --pool to `swactor node` and `swactor orchestrator`.")
    sub = parser.add_subparsers(dest="pool_command", metavar="ACTION", required=True)
    add = sub.add_parser("add", help="append a key's line (creating the key on first use)")
    add.add_argument("file", type=Path, help="pool file (created when missing)")
    add.add_argument("--key", type=Path, required=True, help="the member's key file")
    add.add_argument("--role", choices=ROLES, default="node",
                     help="node (a stage candidate; default) or orchestrator")
    add.add_argument("--name", default="", help="a label for people")
    add.set_defaults(handler=run_pool_add)
    show = sub.add_parser("show", help="list the members and their node ids")
    show.add_argument("file", type=Path)
    show.add_argument("--json", action="store_true", help="one JSON object per member")
    show.set_defaults(handler=run_pool_show)


def run_pool_add(args: argparse.Namespace) -> int:
    try:
        args.key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        identity = NodeIdentity.load_or_create(args.key)
        entry = add_member(args.file, identity, args.role, args.name)
    except (PoolFileError, IdentityError, OSError) as error:
        print(f"swactor pool add: {error}", file=sys.stderr)
        return 2
    print(f"{entry.role} {int(entry.node_id):016x} added to {args.file}")
    return 0


def run_pool_show(args: argparse.Namespace) -> int:
    try:
        admission = load_pool(args.file)
    except PoolFileError as error:
        print(f"swactor pool show: {error}", file=sys.stderr)
        return 2
    for entry in admission.entries:
        if args.json:
            _line({"role": entry.role, "node_id": int(entry.node_id),
                   "hex": f"{int(entry.node_id):016x}", "public_key": entry.public_key.hex(),
                   "name": entry.name})
        else:
            print(f"{entry.role:<12} {int(entry.node_id):016x}  {entry.public_key.hex()}"
                  + (f"  {entry.name}" if entry.name else ""))
    return 0


def _line(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def event_json(event: MembershipEvent) -> dict[str, Any]:
    """The JSON line for one membership event."""
    match event:
        case MemberChanged(node_id=n, state=s, incarnation=i, meta=m, at=t):
            out: dict[str, Any] = {"event": "member", "node_id": int(n), "state": s.value,
                                   "incarnation": i, "at": t}
            if m is not None:
                out["boot_health"] = m.boot_health.value
                out["quic"] = f"{m.quic_host}:{m.quic_port}"
            return out
        case Joined(via=v, at=t):
            return {"event": "joined", "via": int(v), "at": t}
        case Refuted(accuser=a, incarnation=i, at=t):
            return {"event": "refuted", "accuser": int(a), "incarnation": i, "at": t}
        case ForgedMessage(claimed=c, reason=r, source=(host, port), at=t):
            return {"event": "forged", "claimed": int(c), "reason": r.value,
                    "source": f"{host}:{port}", "at": t}
    raise TypeError(f"not a membership event: {type(event).__name__}")


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Run the member until SIGTERM/SIGINT; 2 on a bad option."""
    if args.scale <= 0:
        print("swactor swim: --scale must be > 0", file=sys.stderr)
        return 2
    identity = NodeIdentity.load_or_create(args.key)
    quic_host, quic_port = args.quic if args.quic is not None else ("", 0)
    meta = MemberMeta(
        swim_host=args.bind[0], swim_port=0, quic_host=quic_host, quic_port=quic_port,
        boot_health=BootHealth.Available if args.available else BootHealth.Booting,
        device_kind=args.device_kind, memory_bytes=args.memory_bytes,
    )
    try:
        allowed_keys = None if args.pool is None else load_pool(args.pool).keys
    except PoolFileError as error:
        print(f"swactor swim: {error}", file=sys.stderr)
        return 2
    lock = threading.Lock()

    def on_event(event: MembershipEvent) -> None:
        with lock:
            _line(event_json(event))

    node = MembershipNode(identity, SwimConfig().scaled(args.scale), meta, seeds=args.seed,
                          allowed_keys=allowed_keys, on_event=on_event, bind=args.bind)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    with lock:
        _line({"event": "started", "node_id": int(node.node_id),
               "swim": f"{node.address[0]}:{node.address[1]}"})
    node.start()
    done.wait()
    node.stop(leave=True)
    return 0
