"""Argument types the command-line tools share (`type=` callables for argparse).

Each turns one command-line string into a typed value or raises
`argparse.ArgumentTypeError` with a message naming the bad text, which argparse prints
after the flag's name. The node and orchestrator commands both use them, so this module
sits below both packages and imports neither.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable

from swactor.wire import NodeId

BYTE_UNITS: dict[str, int] = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}
"""Suffixes a byte count may carry (case-insensitive), and their multipliers."""

BYTE_COUNT_HELP = "an integer, or a number with B/KB/MB/GB/TB/KiB/MiB/GiB/TiB"

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


def byte_count(text: str) -> int | None:
    """`"8 GiB"`, `"512MB"`, `"4096"` -> bytes; None when `text` is no byte count."""
    match = _SIZE.fullmatch(text)
    if match is None or match.group(2).lower() not in BYTE_UNITS:
        return None
    return int(float(match.group(1)) * BYTE_UNITS[match.group(2).lower()])


def byte_count_arg(text: str) -> int:
    """argparse type: a byte count (`byte_count`)."""
    value = byte_count(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a byte count ({BYTE_COUNT_HELP})")
    return value


def at_least(bound: int) -> Callable[[str], int]:
    """argparse type: an integer of at least `bound` (`type=at_least(1)` for a count of
    one or more); a smaller one is refused as "V must be at least N", which argparse
    prints after the flag's name."""

    def integer(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < bound:
            raise argparse.ArgumentTypeError(f"{value} must be at least {bound}")
        return value

    return integer


def port_number(text: str) -> int:
    """argparse type: a TCP or UDP port, 0..65535 (0: the system picks a free one)."""
    value = at_least(0)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (0..65535)")
    return value


def slot_count(text: str) -> int:
    """argparse type: KV slots per stage, 1..MAX_STAGE_SLOTS (refused before any node starts)."""
    from swactor.wire.plan import MAX_STAGE_SLOTS

    value = at_least(1)(text)
    if value > MAX_STAGE_SLOTS:
        raise argparse.ArgumentTypeError(f"{value} is more than {MAX_STAGE_SLOTS} slots per stage")
    return value


def node_id(text: str) -> NodeId:
    """argparse type: a node id, decimal, `0x`-prefixed hex, or the 16 hex digits
    `swactor node-id` prints."""
    text = text.strip()
    try:
        if text.lower().startswith("0x") or (len(text) == 16 and not text.isdigit()):
            value = int(text, 16)
        else:
            value = int(text, 10)
        return NodeId(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a node id") from None


MAX_THREADS = 256
"""The most worker threads `--threads` accepts."""


def thread_count(text: str) -> int:
    """argparse type: CPU threads per stage worker, 1..MAX_THREADS."""
    value = at_least(1)(text)
    if value > MAX_THREADS:
        raise argparse.ArgumentTypeError(f"{value} is more than {MAX_THREADS} threads")
    return value


def add_device_argument(parser: argparse.ArgumentParser, whose: str) -> None:
    """`--device NAME` (default None: tinygrad's best available), for `whose` worker(s)."""
    parser.add_argument(
        "--device", default=None, metavar="NAME",
        help=f"the tinygrad device {whose} stage worker computes on (CPU, CUDA, NV, AMD, "
        "METAL, GPU, ...; default: tinygrad's best available, or what its DEV environment "
        "variable names); a device the worker cannot open fails the node's boot with the "
        "worker's reason")


def add_threads_argument(parser: argparse.ArgumentParser, whose: str,
                         default: str = "the CPUs the worker may use") -> None:
    """`--threads N` (default None: the worker's CPU count, or what `default` says),
    for `whose` worker(s)."""
    parser.add_argument(
        "--threads", type=thread_count, default=None, metavar="N",
        help=f"CPU threads {whose} stage worker runs a step's kernels on (CPU device): the "
        "slices tinygrad cuts big kernels into, and kernels over disjoint memory, run on "
        "the calling thread and N-1 pool threads, which spin at most 50 us for more work, "
        "then sleep; after a step in which a pool thread was descheduled holding work "
        "(other processes on the cores), the next steps run on one thread for a while. "
        f"1: every kernel on one core. Default: {default}")
