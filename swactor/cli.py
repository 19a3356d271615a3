"""The `swactor` command line: one subcommand per job.

Each subcommand lives in the module that owns the job and registers itself here with a
`register(subparsers)` function, so this file stays a short index.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def _registrars() -> list[Register]:
    """Subcommand registrars, imported lazily so `swactor --help` stays fast."""
    found: list[Register] = []
    for module_name in SUBCOMMAND_MODULES:
        module = __import__(module_name, fromlist=["register"])
        found.append(module.register)
    return found


# Modules that provide `register(subparsers)`; each adds one or more subcommands.
SUBCOMMAND_MODULES: list[str] = [
    "swactor.model.tokenize_cmd",
    "swactor.events",
    "swactor.orchestrator.plan_cmd",
    "swactor.transport.identity_cmd",
    "swactor.membership.cli",
    "swactor.node.cli",
    "swactor.orchestrator.orchestrate_cmd",
    "swactor.cluster.run_cmd",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swactor",
        description="Run one GGUF inference pipeline across a pool of machines.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in _registrars():
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from swactor.transport.errors import TransportConfigError

    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        result: int = handler(args)
    except TransportConfigError as exc:  # e.g. a bad SWACTOR_NATIVE_QUIC
        print(f"swactor: {exc}", file=sys.stderr)
        return 2
    return result


if __name__ == "__main__":
    sys.exit(main())
