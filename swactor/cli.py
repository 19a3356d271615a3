"""The `swactor` command line: one subcommand per job.

Each subcommand lives in the module that owns the job and registers itself here with a
`register(subparsers)` function, so this file stays a short index. A command line that
names a subcommand imports only that subcommand's module (`swactor tokenize` does not
load the QUIC stack); `swactor --help`, or anything else, imports them all.

A command whose reader goes away (`swactor events ... | head`) exits quietly with status
141, what a shell reports for a Unix tool that SIGPIPE ended, instead of a traceback.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
from collections.abc import Callable, Sequence

Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def _registrars(modules: Sequence[str]) -> list[Register]:
    """The registrars of `modules`, imported on demand so one subcommand loads only its own."""
    found: list[Register] = []
    for module_name in modules:
        module = __import__(module_name, fromlist=["register"])
        found.append(module.register)
    return found


# Subcommand -> the module whose `register(subparsers)` adds it.
SUBCOMMANDS: dict[str, str] = {
    "tokenize": "swactor.model.tokenize_cmd",
    "events": "swactor.events",
    "check": "swactor.check",
    "plan": "swactor.orchestrator.plan_cmd",
    "node-id": "swactor.transport.identity_cmd",
    "swim": "swactor.membership.cli",
    "node": "swactor.node.cli",
    "orchestrator": "swactor.serve.orchestrator_cmd",
    "run": "swactor.cluster.run_cmd",
    "serve": "swactor.serve.serve_cmd",
}
SUBCOMMAND_MODULES: list[str] = list(dict.fromkeys(SUBCOMMANDS.values()))


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with every subcommand, or only `command`'s when it is a known one."""
    parser = argparse.ArgumentParser(
        prog="swactor",
        description="Run one GGUF inference pipeline across a pool of machines.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    module = SUBCOMMANDS.get(command or "")
    for register in _registrars([module] if module else SUBCOMMAND_MODULES):
        register(sub)
    return parser


EXIT_READER_GONE = 128 + int(signal.SIGPIPE)
"""141: the status of a command whose stdout reader went away (as if SIGPIPE ended it)."""


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe or socket whose reading end is closed."""
    poller = select.poll()
    try:
        poller.register(sys.stdout.fileno(), select.POLLOUT)
    except (AttributeError, OSError, ValueError):  # no file descriptor (e.g. captured)
        return False
    return any(mask & (select.POLLERR | select.POLLHUP) for _, mask in poller.poll(0))


def _quiet_after_reader_gone() -> int:
    """Point stdout at /dev/null, so the interpreter's last flush of what the reader
    never took raises nothing either; the exit status of a closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_READER_GONE


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words[0] if words else None)
    args = parser.parse_args(words)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        result: int = handler(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
    except BrokenPipeError:
        if not _stdout_reader_gone():  # a broken socket or pipe of the command's own
            raise
        return _quiet_after_reader_gone()
    except Exception as exc:
        # only a command that loaded the transport can raise its config error
        errors = sys.modules.get("swactor.transport.errors")
        if errors is None or not isinstance(exc, errors.TransportConfigError):
            raise
        print(f"swactor: {exc}", file=sys.stderr)  # e.g. a bad SWACTOR_NATIVE_QUIC
        return 2
    return result


if __name__ == "__main__":
    sys.exit(main())
