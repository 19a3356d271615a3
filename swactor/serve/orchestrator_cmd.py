"""`swactor orchestrator --serve HOST:PORT`: serve an OpenAI-compatible API over a pool
of running nodes.

Theory of operation. The `orchestrator` subcommand is `swactor.orchestrator.
orchestrate_cmd`'s; this module registers it (so the orchestrator package does not
import the serving one, which builds on it), adds `--serve HOST:PORT` and the serving
flags (`serve_cmd.add_serve_arguments`), and routes a command line with `--serve` here.
The pool is found exactly as for one prompt (`orchestrate_cmd.pool_from_args`: the
`--node` list, or SWIM through `--seed` with `--nodes N`, pinned by `--pool`), then
`serve_cmd.serve_pool` serves over it until Ctrl-C or SIGTERM. The flags that shape one
prompt (`--prompt`, `--prompt-file`, `--temperature`, `--chat`, `--json`, `--run-id`)
have no meaning there and are refused (exit 2): each request brings its own. A local
model is offered to the pool unless `--no-offer-model`, as for one prompt.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from swactor.orchestrator import orchestrate_cmd
from swactor.serve.interrupts import Stops, run_stoppable
from swactor.serve.serve_cmd import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    LiveNodes,
    add_serve_arguments,
    check_port,
    http_address,
    serve_options,
    serve_pool,
    warm_batch_rows,
    warm_mixed_rows,
)

if TYPE_CHECKING:
    from swactor.events.emitter import Emitter
    from swactor.orchestrator.orchestrate_cmd import Discovery
    from swactor.orchestrator.session import SessionOptions

_PROMPT_FLAGS = (("prompt", "--prompt"), ("prompt_file", "--prompt-file"),
                 ("temperature", "--temperature"), ("chat", "--chat"), ("json", "--json"),
                 ("run_id", "--run-id"))


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    orchestrate_cmd.register(subparsers)
    parser = subparsers.choices["orchestrator"]
    parser.description = (f"{parser.description} With --serve HOST:PORT: serve an "
                          "OpenAI-compatible HTTP API over the pool until Ctrl-C instead.")
    group = parser.add_argument_group("serve (instead of one prompt)")
    group.add_argument("--serve", type=http_address, default=None, metavar="HOST:PORT",
                       help="provision one warm pipeline over the pool and answer "
                       "OpenAI-style requests on HOST:PORT until Ctrl-C; a faulted run is "
                       "replaced by a new one on the live nodes (see swactor serve --help)")
    add_serve_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.serve is None:
        return orchestrate_cmd.run(args)
    from dataclasses import replace

    from swactor.events.emitter import configure_from_args

    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    try:
        for name, flag in _PROMPT_FLAGS:
            if getattr(args, name) not in (None, False):
                raise ValueError(f"{flag} shapes one prompt; with --serve each request "
                                 "brings its own (drop one of them)")
        check_port(*args.serve)
        identity, admission, discovery = orchestrate_cmd.pool_from_args(args)
        offer = args.offer_model if args.offer_model is not None else True
        options = replace(serve_options(identity, tuple(args.members), args.model,
                                        max_seq_len=args.max_seq_len, split=args.split,
                                        offer_model=offer, bind_host=args.bind,
                                        advertise_host=args.advertise),
                          admission=admission, open_pool=admission is None)
    except Exception as error:
        print(f"swactor orchestrator: {error}", file=sys.stderr)
        return EXIT_USAGE
    emitter = configure_from_args(args, f"orchestrator-{identity.node_id:016x}")
    try:
        return run_stoppable(lambda stops: _serve(args, options, emitter, discovery, stops))
    except KeyboardInterrupt:  # Ctrl-C before the pool was found (later: operator stop)
        print("swactor orchestrator: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        emitter.close()


async def _serve(args: argparse.Namespace, options: SessionOptions, emitter: Emitter,
                 discovery: Discovery | None, stops: Stops) -> int:
    from dataclasses import replace

    from swactor.orchestrator.discovery import DiscoveryError, discover_pool

    async def serve(options: SessionOptions, live: LiveNodes) -> int:
        host, port = args.serve
        options = replace(options, warm_prompt_tokens=args.warm_prompt_tokens,
                          warm_batch_rows=warm_batch_rows(args),
                          mixed_steps=args.mixed_steps == "on",
                          warm_mixed_rows=warm_mixed_rows(args))
        return await serve_pool(options, live, emitter, host=host, port=port,
                                slots=args.slots, max_queue=args.max_queue,
                                batch_rows=args.batch_rows,
                                objects_in_flight=args.objects_in_flight,
                                restart_limit=args.max_restarts,
                                retry_delay_s=args.retry_delay, out=sys.stdout,
                                err=sys.stderr, stops=stops, spares=args.spares)

    if discovery is None:
        if args.spares >= len(options.nodes):
            print(f"swactor orchestrator: --spares {args.spares} leaves no node of the "
                  f"{len(options.nodes)} for the run's stages", file=sys.stderr)
            return EXIT_USAGE
        return await serve(options, LiveNodes(options.nodes,
                                              count=len(options.nodes) - args.spares))
    swim, seeds, count, admission = discovery
    print(f"[swactor] waiting for {count} nodes via SWIM ...", file=sys.stderr, flush=True)
    try:
        pool = await discover_pool(
            options.identity, swim, seeds, count,
            idle_timeout_s=options.transport.idle_timeout,
            warn=lambda text: print(f"[swactor] warning: {text}", file=sys.stderr, flush=True),
            admission=admission, emitter=emitter)
    except DiscoveryError as error:
        print(f"swactor orchestrator: {error}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.spares >= count:
            print(f"swactor orchestrator: --spares {args.spares} leaves no node of the "
                  f"{count} for the run's stages", file=sys.stderr)
            return EXIT_USAGE
        live = LiveNodes(pool.members, pool=pool, count=count - args.spares,
                         admitted=None if admission is None else admission.stage_ids)
        return await serve(replace(options, nodes=pool.members, pool_gated=True), live)
    finally:
        await pool.stop()
