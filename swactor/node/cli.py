"""`swactor node`: boot one node and serve stages until SIGINT / SIGTERM.

Theory of operation. The command loads (or creates, mode 0600) the node key, boots a
`StageNode` (arena -> worker -> transport -> available) and prints one JSON line on
stdout, `{"kind": "available", "node_id", "hex", "quic": [host, port]}`, which is how
`swactor run` and operators learn the node's id and address. After every stage it
serves it prints `{"kind": "stage_finished", ...}` with the node's leak check (active
run, live ring leases, worker pid, runs served); SIGUSR1 prints the same check as
`{"kind": "status", ...}` at any time. The node trusts exactly one
orchestrator, named by `--trust-orchestrator` (a node id, decimal or hex); control
messages from any other node are refused. With `--swim HOST:PORT` (and `--seed`s) the
node also joins SWIM and publishes its QUIC address there, so an orchestrator can find
it by membership instead of being told its address. Serving needs the pinned pool,
`--pool FILE` (`swactor.membership.admission`: the node's own key must be pinned as a
`node`; only the file's keys are admitted to its SWIM view and its AddressBooks, and its
QUIC endpoint pins their full public keys; a file with exactly one orchestrator stands
in for `--trust-orchestrator`), with SWIM or without: a node id is a 64-bit hash of a
key, not proof of it. An explicit `--open-pool` warns and admits any key to SWIM, and
without SWIM the orchestrator and the AddressBook's peers by their ids alone.
SIGINT/SIGTERM stop the node cleanly (exit 0); a boot failure exits 1 with one line
naming the step, bad arguments exit 2.
`--show-id` only loads (or creates) the key, prints `HEX  (DECIMAL)` as `swactor node-id`
does, and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from pathlib import Path

from swactor import heap, memtrace
from swactor.cliargs import (
    add_device_argument,
    add_threads_argument,
    byte_count_arg,
    node_id,
    port_number,
)
from swactor.events.emitter import add_event_arguments, configure_from_args
from swactor.membership.admission import Admission
from swactor.membership.cli import add_admission_arguments, admission_from_args, parse_address
from swactor.model.paths import model_cache_dir
from swactor.node.node import DEFAULT_ARENA_CEILING, NodeBootError, NodeConfig, StageNode
from swactor.node.role_config import DEFAULT_WEIGHT_MODE, WEIGHT_MODES
from swactor.transport.identity import NodeIdentity
from swactor.wire import NodeId


def trusted_orchestrator(given: NodeId | None, admission: Admission | None) -> NodeId:
    """The orchestrator the node trusts: `--trust-orchestrator`, or the pool file's only
    orchestrator; ValueError when they disagree or neither names exactly one."""
    pinned = sorted(admission.orchestrator_ids) if admission is not None else []
    if given is not None:
        if admission is not None and given not in pinned:
            raise ValueError(f"--trust-orchestrator {int(given):016x} is not an orchestrator "
                             f"of the pool file {admission.source}")
        return given
    if len(pinned) != 1:
        raise ValueError("--trust-orchestrator is required: the pool file names "
                         f"{len(pinned)} orchestrators, not exactly one")
    return pinned[0]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "node", help="run one stage node (arena, worker, QUIC) until stopped",
        description="Boot a swactor node and serve pipeline stages for one orchestrator.")
    parser.add_argument("--key", type=Path, required=True, help="node key file (created 0600)")
    parser.add_argument("--bind", default="127.0.0.1", help="listen host (default 127.0.0.1)")
    parser.add_argument("--quic", type=port_number, default=0, metavar="PORT",
                        help="UDP port for QUIC (default: any free port)")
    parser.add_argument("--trust-orchestrator", type=node_id, default=None,
                        metavar="NODE_ID",
                        help="the only node allowed to provision and stop (required to serve, "
                        "unless --pool names exactly one orchestrator); its full key is "
                        "pinned by --pool (--open-pool: checked by this 64-bit id alone)")
    parser.add_argument("--show-id", action="store_true",
                        help="print the node id derived from --key (creating the key on "
                        "first use) and exit; `swactor node-id` does the same")
    parser.add_argument("--arena-ceiling", type=byte_count_arg, default=DEFAULT_ARENA_CEILING,
                        metavar="BYTES",
                        help=f"shared arena size (default {DEFAULT_ARENA_CEILING >> 20}MiB)")
    parser.add_argument("--swim", type=parse_address, default=None, metavar="HOST:PORT",
                        help="join SWIM membership on this UDP address (with --seed)")
    parser.add_argument("--seed", type=parse_address, action="append", default=[],
                        metavar="HOST:PORT", help="SWIM seed to join through (repeat)")
    add_admission_arguments(parser)
    parser.add_argument("--advertise", default=None, metavar="HOST",
                        help="QUIC host published to the pool (default: --bind)")
    parser.add_argument("--models-dir", type=Path, default=None,
                        help="the node's model cache (default: $SWACTOR_MODEL_CACHE or "
                        "~/.cache/swactor/models): CacheKey sources, a *.gguf with the "
                        "plan's SHA-256 used as it is, ranges fetched from the orchestrator "
                        "(fetched/<sha256>/) or read from a URL (http/<key>/)")
    parser.add_argument("--weights", choices=WEIGHT_MODES, default=DEFAULT_WEIGHT_MODE,
                        help="how the worker holds quantised matrices: blocks (default: "
                        "decode and prefill compute from the file's own blocks, Q2_K to Q6_K, "
                        "Q4_0 to Q8_0, F16, BF16: faster decode on CPU, memory about the "
                        "file's bytes) or "
                        "dense (dequantised once at load into the plan's dtype)")
    add_device_argument(parser, "the")
    add_threads_argument(parser, "the worker's")
    parser.add_argument("--log-level", default="WARNING",
                        help="Python logging level on stderr (default WARNING)")
    add_event_arguments(parser)
    parser.set_defaults(handler=run, node_parser=parser)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not args.show_id and args.trust_orchestrator is None and args.pool is None:
        args.node_parser.error("the following arguments are required to serve: "
                               "--trust-orchestrator (only --show-id runs without it)")
    try:
        args.key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        identity = NodeIdentity.load_or_create(args.key)
    except Exception as error:
        print(f"swactor node: key {args.key}: {error}", file=sys.stderr)
        return 2
    if args.show_id:
        print(f"{identity.node_id:016x}  ({identity.node_id})")
        return 0
    if args.swim is not None and args.bind in ("0.0.0.0", "") and not args.advertise:
        print("swactor node: --bind 0.0.0.0 with --swim needs --advertise HOST "
              "(the address the pool reaches this node at)", file=sys.stderr)
        return 2
    try:
        admission = admission_from_args(args, identity, "node", "swactor node",
                                        swim=args.swim is not None)
        orchestrator = trusted_orchestrator(args.trust_orchestrator, admission)
    except ValueError as error:
        print(f"swactor node: {error}", file=sys.stderr)
        return 2
    memtrace.install("node")  # SWACTOR_MEMTRACE (soak diagnosis; off by default)
    emitter = configure_from_args(args, f"node-{identity.node_id:016x}")
    config = NodeConfig(identity=identity, orchestrator=orchestrator,
                        bind_host=args.bind, quic_port=args.quic,
                        arena_ceiling=args.arena_ceiling,
                        models_dir=args.models_dir or model_cache_dir(),
                        weights=args.weights, device=args.device, threads=args.threads,
                        swim_bind=args.swim, seeds=tuple(args.seed),
                        advertise_host=args.advertise, admission=admission,
                        open_pool=admission is None)
    try:
        return asyncio.run(_serve(StageNode(config, emitter)))
    finally:
        emitter.close()


def _print(document: dict[str, object]) -> None:
    print(json.dumps(document), flush=True)


async def _serve(node: StageNode) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    # SIGUSR1: print the leak check now (tests/faults asks each node between runs)
    loop.add_signal_handler(signal.SIGUSR1,
                            lambda: _print({"kind": "status", **node.status()}))
    try:
        host, port = await node.start()
    except NodeBootError as error:
        print(f"swactor node: boot failed: {error}", file=sys.stderr)
        await node.stop()
        return 1
    heap.settle()  # booted: later per-run collections skip what exists now (swactor.heap)
    _print({"kind": "available", "node_id": int(node.node_id),
            "hex": f"{int(node.node_id):016x}", "quic": [host, port]})

    async def report_stages() -> None:
        while True:
            outcome = await node.finished.get()
            await asyncio.sleep(0.2)  # let the edge keeper release what the stage stopped
            _print({"kind": "stage_finished", "run_id": int(outcome.run_id or 0),
                    "clean": outcome.clean, **node.status()})

    reporter = asyncio.create_task(report_stages())
    await stop.wait()
    reporter.cancel()
    await node.stop()
    return 0
