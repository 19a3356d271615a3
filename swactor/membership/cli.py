"""``swactor swim`` (or ``python -m swactor.membership``): one SWIM member, events as JSON lines.

Theory of operation
-------------------
A stand-alone member process for loopback and multi-host tests and for operators: it
loads (or creates, mode 0600) the node key, binds its UDP port, joins through the seeds
and writes one JSON object per line to stdout: ``started`` (node id, SWIM address),
``joined``, ``member`` (every state/incarnation change in its view), ``refuted`` and
``forged`` (a dropped datagram or update: claimed node id and reason). SIGTERM or
SIGINT leaves the pool gracefully and exits 0. Bad arguments exit 2 naming the problem.
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
from swactor.transport.identity import NodeIdentity
from swactor.wire import NodeId


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
    parser.add_argument("--allow", type=int, action="append", default=None,
                        help="node id allowed in the pool (repeatable; default: any)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m swactor.membership",
                                     description="Run one SWIM member; events on stdout.")
    add_arguments(parser)
    return parser


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `swactor swim`."""
    parser = subparsers.add_parser(
        "swim", help="run one SWIM member (membership only); events as JSON lines",
        description="Run one SWIM member; events on stdout as JSON lines.")
    add_arguments(parser)
    parser.set_defaults(handler=run)


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
    allowed = None if args.allow is None else [NodeId(n) for n in args.allow]
    lock = threading.Lock()

    def on_event(event: MembershipEvent) -> None:
        with lock:
            _line(event_json(event))

    node = MembershipNode(identity, SwimConfig().scaled(args.scale), meta, seeds=args.seed,
                          allowed=allowed, on_event=on_event, bind=args.bind)
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
