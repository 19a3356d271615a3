"""`swactor run --nodes N`: a one-machine trial — N local nodes plus the orchestrator.

Theory of operation. The command walks the multi-machine path on loopback: it pins a
pool (the orchestrator's and N node keys in `--keys-dir/pool.txt`, keys made on first
use; default a fresh temporary directory), binds the orchestrator's SWIM participant,
starts a `LocalCluster` of N `swactor node` processes that join SWIM through it with
that pool file (events in `--events-dir DIR/node-<i>.jsonl` when given), and waits for
the `pool_readiness` machine's PoolReady (spec §9; its convergence window is
`LOCAL_CONVERGENCE_WINDOW_S`, the machine emits `pool_ready`). Then it runs the
orchestrator session in this process with every `swactor orchestrator` flag (events in
`DIR/orchestrator.jsonl`) while SWIM watches the chosen nodes (a node lost mid-run is
the run's MembershipLost), streams the text, prints the summary (or `--json`), and
stops the nodes. Exit status as `swactor orchestrator`; a cluster that cannot boot
exits 2 naming the node.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from swactor.cliargs import add_device_argument, add_threads_argument, at_least
from swactor.node.role_config import DEFAULT_WEIGHT_MODE, WEIGHT_MODES
from swactor.orchestrator.orchestrate_cmd import add_run_arguments

LOCAL_CONVERGENCE_WINDOW_S = 0.25
"""The `pool_readiness` convergence window of a loopback pool: its members share one
machine, so a view that stayed complete for a quarter of a second is stable (a
multi-machine pool waits `discovery.DEFAULT_SETTLE_S`)."""
POOL_TIMEOUT_S = 60.0
"""How long the orchestrator waits for PoolReady once every node printed `available`
(each already joined SWIM through the orchestrator)."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "run", help="start N local nodes and run one prompt through them",
        description="A one-machine trial: N node processes on loopback and an orchestrator.")
    parser.add_argument("--nodes", type=at_least(1), default=3, metavar="N",
                        help="stage nodes to start (default 3)")
    parser.add_argument("--events-dir", type=Path, default=None, metavar="DIR",
                        help="every process writes its JSON Lines event log here")
    parser.add_argument("--keys-dir", type=Path, default=None, metavar="DIR",
                        help="node and orchestrator keys (default: a temporary directory)")
    parser.add_argument("--arena-ceiling", default="256MiB",
                        help="each node's arena size (default 256MiB)")
    parser.add_argument("--weights", choices=WEIGHT_MODES, default=DEFAULT_WEIGHT_MODE,
                        help="each node's weight mode (swactor node --weights): blocks "
                        "(default: faster CPU decode from the file's blocks) or dense")
    add_device_argument(parser, "each node's")
    add_threads_argument(parser, "each node's")
    parser.add_argument("--verbose", action="store_true",
                        help="echo the nodes' stderr and the orchestrator's events")
    add_run_arguments(parser, offer_default=False)  # its nodes share this machine's disk
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    with contextlib.ExitStack() as stack:
        keys = args.keys_dir or Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="swactor-run-")))
        try:
            return asyncio.run(_run(args, keys))
        except KeyboardInterrupt:  # Ctrl-C before the run started; the nodes are stopped
            print("swactor run: interrupted", file=sys.stderr)
            return 130
    return 2  # pragma: no cover - ExitStack does not swallow


async def _run(args: argparse.Namespace, keys: Path) -> int:
    import os

    from swactor.cluster.launcher import ClusterError, LocalCluster
    from swactor.events.emitter import configure
    from swactor.orchestrator.discovery import DiscoveryError, Pool, PoolDiscovery
    from swactor.orchestrator.orchestrate_cmd import session_options
    from swactor.orchestrator.session import SessionError, run_session
    from swactor.wire import RunOutcome

    if args.verbose:
        os.environ["SWACTOR_CLUSTER_ECHO"] = "1"
    cluster = LocalCluster(args.nodes, keys, args.events_dir, args.arena_ceiling,
                           args.log_level, weights=args.weights, swim=True,
                           threads=args.threads, device=args.device)
    try:
        options = session_options(args, cluster.orchestrator, ())
    except ValueError as error:
        print(f"swactor run: {error}", file=sys.stderr)
        return 2
    events = str(args.events_dir / "orchestrator.jsonl") if args.events_dir else None
    emitter = configure(f"orchestrator-{cluster.orchestrator.node_id:016x}", events,
                        verbosity=1 if args.verbose else None)
    print(f"[swactor] starting {args.nodes} nodes ...", file=sys.stderr, flush=True)
    admission = cluster.write_pool()
    options = replace(options, admission=admission)  # its endpoint pins the pool's keys
    discovery = PoolDiscovery(
        cluster.orchestrator, ("127.0.0.1", 0), (), args.nodes,
        admission=admission, settle_s=LOCAL_CONVERGENCE_WINDOW_S, emitter=emitter,
        warn=lambda text: print(f"[swactor] warning: {text}", file=sys.stderr, flush=True))
    cluster.seed = discovery.address
    pool: Pool | None = None
    try:  # whatever happens (Ctrl-C while booting included), the nodes are stopped
        try:
            discovery.start()
            await cluster.start()
            pool = await discovery.wait(POOL_TIMEOUT_S)
        except (ClusterError, DiscoveryError) as error:
            print(f"swactor run: {error}", file=sys.stderr)
            return 2
        try:
            report = await run_session(replace(options, nodes=pool.members, pool_gated=True),
                                       emitter, sys.stdout, sys.stderr, watch=pool.watch)
        except SessionError as error:
            print(f"swactor run: {error}", file=sys.stderr)
            return 2
    finally:
        await (pool.stop() if pool is not None else discovery.close())
        await cluster.stop()
        emitter.close()
    if args.json:
        print(json.dumps(report.to_json()), flush=True)
    else:
        for line in report.summary_lines():
            print(line, file=sys.stderr)
    return 0 if report.result.outcome is RunOutcome.Completed else 1
