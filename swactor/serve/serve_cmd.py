"""`swactor serve`: N local nodes and an OpenAI-compatible HTTP server over them.

Theory of operation. `swactor serve --nodes N` walks the same path as `swactor run`
(`swactor.cluster.run_cmd`): a pinned pool of N local `swactor node` processes that
join SWIM through the orchestrator's participant, the `pool_readiness` gate, then the
serving session instead of one prompt. `swactor orchestrator --serve HOST:PORT` does the
same over a pool of running nodes (`--node` list or SWIM `--seed`) and calls
`serve_pool` here.

`serve_pool` is the serving half of both:

1. `LiveNodes` follows the pool: the discovery's SWIM events keep the set of usable
   nodes (alive, available, with an endpoint, pinned by the pool file), so every
   provisioning plans on the nodes that are there *now* (a fixed `--node` list is
   taken as it is). A node this command started itself (`swactor serve`) is also
   watched as a child process: its exit is known at once (the kernel tells the
   parent), so a killed local node leaves the set and faults its run
   (MembershipLost) within milliseconds, not SWIM's detection bound, which remains
   what finds a silent remote host;
2. a `ServeSession` (`swactor.serve.session`, the `serve_session` table) provisions the
   first run (`RunEngine.start` over the live nodes with `--slots` KV slots per stage)
   and, after a run's fault, tears it down and provisions the next one, at most
   `--max-restarts` attempts per recovery, `--retry-delay` seconds apart; the next
   run is planned (`RunEngine.prepare`) while the faulted run is still being torn
   down, so only greeting its nodes and provisioning it wait for the teardown;
3. once the first run serves, the HTTP front (`swactor.serve.server.ServeFront`,
   aiohttp) listens on `--host:--port`, and the URL, a `curl` line and the model are
   printed: the URL line on stdout (`serving on http://HOST:PORT`), the rest on stderr;
4. Ctrl-C or SIGTERM is the operator's stop: the session stops its run (in-flight
   streams end with an error naming it), the front closes, the nodes are stopped.
   Before the session starts, either signal cancels the command at its next await and
   its nodes are stopped (`swactor.serve.interrupts`).

The port is checked before anything starts, so a port already in use fails at once
(exit 2) instead of after the pipeline has loaded. Exit status: 0 after an operator
stop, 1 when the session gave up (its first provisioning failed, or a recovery ran out
of attempts; one line names why), 2 for bad flags or a pool that could not start, 130
for Ctrl-C or SIGTERM before the session started (while the nodes boot or the pool is
found).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import logging
import socket
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from swactor.cliargs import (
    add_device_argument,
    add_threads_argument,
    at_least,
    port_number,
    slot_count,
)
from swactor.model.paths import model_location
from swactor.serve.interrupts import Stops, run_stoppable
from swactor.serve.spares import WarmKey, place

if TYPE_CHECKING:
    from swactor.events.emitter import Emitter
    from swactor.membership import MemberChanged
    from swactor.orchestrator.discovery import Pool
    from swactor.orchestrator.run import RunHandle
    from swactor.orchestrator.session import PoolMember, SessionOptions
    from swactor.serve.pipeline import PreparedEngine
    from swactor.serve.session import RunEngine
    from swactor.transport.identity import NodeIdentity
    from swactor.wire import NodeId

log = logging.getLogger("swactor.serve")

DEFAULT_PORT = 8000
DEFAULT_SLOTS = 4
DEFAULT_WARM_PROMPT_TOKENS = 64
"""Prompt lengths a serving run's stages build prefill kernels for while they load."""
DEFAULT_BATCH_ROWS = 4
"""Decode rows per batch object by default (`--batch-rows`): the decode products widen
each weight block once for all of a step's rows (`swactor.model.decode_gemv`), so
`bench batch` (SmolLM2, one stage, 2 threads) measures a 4-row step at 1.5x a one-row
step (2.7x the tokens per CPU-second) and `bench serve` 4 rows per object above 2 at 4
clients; more rows add little (8 rows: 3.25x) while every step waits longer."""
DEFAULT_WARM_BATCH_ROWS = 4
"""Batch sizes 2..this whose decode kernels a serving run's stages build by default:
every size a default batch can have, so no batch runs in chunks."""
EXIT_STOPPED, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0.0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a finite number >= 0")
    return value


def warm_batch_rows(args: argparse.Namespace) -> int:
    """The batch sizes (2..this) whose decode kernels a serving run's stages build while
    they load: `--warm-batch-rows`, by default `DEFAULT_WARM_BATCH_ROWS` when batches
    hold that many rows (`--batch-rows`); never more than the slots."""
    warm = (args.warm_batch_rows if args.warm_batch_rows is not None
            else min(args.batch_rows, DEFAULT_WARM_BATCH_ROWS))
    warm = min(warm, args.slots)
    return warm if warm > 1 else 0


def warm_mixed_rows(args: argparse.Namespace) -> int:
    """The decode rows (1..this) whose mixed-step graphs a serving run's stages build
    for their warm prefill buckets while they load: with `--mixed-steps on`, every row
    count a mixed step can carry (a batch's rows, `--batch-rows`, beside the prompt's own
    slot, so at most the other slots); none with it off."""
    if args.mixed_steps != "on":
        return 0
    return max(0, min(int(args.batch_rows), int(args.slots) - 1))


def objects_in_flight_for(stages: int, batch_rows: int | None, asked: int | None,
                          shared_cpus: int | None) -> int | None:
    """The objects a run of `stages` stages keeps in flight: `asked`
    (`--objects-in-flight`) if given; else, for batched decode on stages that share
    `shared_cpus` CPUs (`swactor serve`'s local nodes), the stages plus one but no more
    than those CPUs: an object beyond the CPUs that compute them only waits for one,
    while fewer objects with more rows each cost less CPU per token (their per-object
    costs and the batched kernels); one object when the CPUs are fewer than the stages:
    then each stage computes on every CPU in turn, and no two stages' workers share a
    core while each streams its weights through the same memory (3 stages on 2 CPUs,
    measured side by side: one object on 2 threads served 1.3x the tokens per second
    of two objects on 1 thread each at 1, 2 and 4 clients); else None (the run's own
    default, the stages plus one, or with one row per object every sequence's step)."""
    if asked is not None:
        return asked
    if shared_cpus is None or batch_rows == 1:
        return None
    if shared_cpus < stages:
        return 1
    return max(1, min(stages + 1, shared_cpus))


def local_stage_threads(stages: int, batch_rows: int | None, asked: int | None,
                        cpus: int) -> int:
    """Replay threads per local node (`--threads`' default for `swactor serve`'s own
    nodes): the host's `cpus` over the stages that compute at once, which is the objects
    in flight (`objects_in_flight_for`; with one row per object, every stage) but no more
    than the stages. One stage, or one object at a time, gets every CPU (as a node's own
    default; 3 stages on 2 CPUs keep one object in flight, so 2 each); 3 stages with 4
    objects in flight on 16 CPUs get 5 each, so stages computing at once do not split
    each other's cores."""
    in_flight = objects_in_flight_for(stages, batch_rows, asked, cpus) or stages
    return max(1, cpus // max(1, min(stages, in_flight)))


def http_address(text: str) -> tuple[str, int]:
    """argparse type: `HOST:PORT` (`[::1]:8000` for IPv6) for the HTTP server."""
    host, colon, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not colon or not host:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:8000)")
    return host, port_number(port)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The serving flags `swactor serve` and `swactor orchestrator --serve` share."""
    group = parser.add_argument_group("serving")
    group.add_argument("--slots", type=slot_count, default=DEFAULT_SLOTS, metavar="K",
                       help=f"sequences served at once: each stage keeps K KV caches "
                       f"(default {DEFAULT_SLOTS}); more requests wait in the queue")
    group.add_argument("--warm-prompt-tokens", type=at_least(0),
                       default=DEFAULT_WARM_PROMPT_TOKENS, metavar="N",
                       help="each stage builds the prefill kernels of every prompt length up "
                       "to N tokens while it loads, so no request waits for a kernel build "
                       f"(default {DEFAULT_WARM_PROMPT_TOKENS}; longer prompts build theirs "
                       "on first use, kept in the kernel cache for later runs; 0: only "
                       "what the cache holds). A stage keeps at most 320 MiB of prefill "
                       "kernels (PREFILL_KEEP_BYTES in swactor/model/llama_role.py; "
                       "SmolLM2 at f32: every length up to about 416 tokens): past it, "
                       "warm-up builds only the shortest and logs where it stopped")
    group.add_argument("--batch-rows", type=at_least(1), default=DEFAULT_BATCH_ROWS,
                       metavar="B",
                       help="decode steps of up to B sequences travel through the "
                       "pipeline as one object, paying its per-object cost once and "
                       "widening each weight once for all its rows (default "
                       f"{DEFAULT_BATCH_ROWS}: the most tokens per CPU-second measured "
                       "for a step that stays short; 1: every step its own object)")
    group.add_argument("--objects-in-flight", type=at_least(1), default=None, metavar="N",
                       help="decode objects in flight through the pipeline at once; "
                       "decode rows that come back meanwhile wait and travel together in "
                       "the next batch object (default: the stages plus one, so every "
                       "stage and the orchestrator's own hop hold one, and for `swactor "
                       "serve`'s local nodes no more than this host's CPUs, which they "
                       "share, and one if the CPUs are fewer than the stages: each stage "
                       "then computes on every CPU in turn; with --batch-rows 1 every "
                       "sequence's step is in flight)")
    group.add_argument("--mixed-steps", choices=("on", "off"), default="off",
                       help="on: a prompt that arrives alone while decode steps are in "
                       "flight waits for them (at most one step and a hop) and goes with "
                       "their rows as one step, so the decoding sequences do not wait a "
                       "whole prefill and then pay a step of their own; every token is the "
                       "one it would be alone. Each stage builds the steps' graphs while "
                       "it loads (every prompt length up to --warm-prompt-tokens beside 1 "
                       "to --batch-rows rows: about 2 min on a small CPU the first time, "
                       "15 s from the kernel cache, 134 MiB more per stage for SmolLM2). "
                       "Default off: measured side by side at 4 clients on one 2-CPU "
                       "stage it gained no tokens per second beyond the noise, since the "
                       "held prompt leaves the stage idle for the hop it would have "
                       "prefilled in, and it costs time to first token")
    group.add_argument("--warm-batch-rows", type=at_least(0), default=None,
                       metavar="B",
                       help="each stage builds the batched decode kernels of every batch "
                       "size 2..B while it loads; a batch of another size runs row "
                       "after row (default: the smaller of --batch-rows and "
                       f"{DEFAULT_WARM_BATCH_ROWS}, so none with --batch-rows 1; never "
                       "more than --slots; minutes per size on a small CPU the first time, then "
                       "kept in the kernel cache; 0: only what the cache holds)")
    group.add_argument("--max-queue", type=at_least(0), default=64, metavar="N",
                       help="requests that may wait for a slot; one more is answered 429 "
                       "(default 64)")
    group.add_argument("--max-restarts", type=at_least(1), default=3, metavar="N",
                       help="after a run faults, provisioning attempts before the server "
                       "gives up (default 3; a run that comes up resets the count)")
    group.add_argument("--retry-delay", type=_non_negative_float, default=2.0, metavar="S",
                       help="seconds between failed provisioning attempts (default 2)")
    group.add_argument("--spares", type=at_least(0), default=0, metavar="N",
                       help="keep N of the pool's nodes out of the run as warm spares: "
                       "each preloads a stage's weights and kernels while the run "
                       "serves, so the run after a stage node's loss starts without "
                       "loading (default 0)")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from swactor.node.role_config import DEFAULT_WEIGHT_MODE, WEIGHT_MODES
    from swactor.orchestrator.orchestrate_cmd import split_arg

    parser = subparsers.add_parser(
        "serve", help="start N local nodes and serve an OpenAI-compatible API over them",
        description="Start N local node processes, provision one warm pipeline over them "
        "and answer OpenAI-style HTTP requests (POST /v1/completions, POST "
        "/v1/chat/completions, both with stream=true; GET /v1/models, /health, /metrics) "
        "until Ctrl-C. After a stage fault the server provisions a new pipeline on the "
        "live nodes (spares included) and continues the requests in flight on it: each "
        "stream pauses, then goes on with no token lost or repeated.",
        epilog="example: swactor serve --nodes 3 --port 8000, then "
        "curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' "
        "-d '{\"prompt\": \"The capital of France is\", \"max_tokens\": 16}'")
    parser.add_argument("--nodes", type=at_least(1), default=1, metavar="N",
                        help="stage nodes to start; the model's layers are split across "
                        "them (default 1)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="HTTP listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=port_number, default=DEFAULT_PORT,
                        help=f"HTTP port (default {DEFAULT_PORT}; 0 picks a free one)")
    parser.add_argument("--model", type=model_location, default=None,
                        help="GGUF file or http(s) URL (default: the embedded SmolLM2 in "
                        "the model cache)")
    parser.add_argument("--max-seq-len", type=at_least(1), default=None, metavar="N",
                        help="positions per sequence, prompt included (default: "
                        "min(context, 2048))")
    parser.add_argument("--stages", type=at_least(1), default=None, metavar="S",
                        help="stages of each run (default: --nodes minus --spares); the "
                        "other nodes are spares a run re-planned after a fault may use")
    parser.add_argument("--split", type=split_arg, default=None, metavar="B0,B1,...",
                        help="explicit blocks per stage (default: even)")
    add_serve_arguments(parser)
    parser.add_argument("--events-dir", type=Path, default=None, metavar="DIR",
                        help="every process writes its JSON Lines event log here")
    parser.add_argument("--keys-dir", type=Path, default=None, metavar="DIR",
                        help="node and orchestrator keys (default: a temporary directory)")
    parser.add_argument("--arena-ceiling", default="256MiB",
                        help="each node's arena size (default 256MiB)")
    parser.add_argument("--weights", choices=WEIGHT_MODES, default=DEFAULT_WEIGHT_MODE,
                        help="each node's weight mode (swactor node --weights)")
    add_device_argument(parser, "each local node's")
    add_threads_argument(parser, "each local node's",
                         "the CPUs over the stages that compute at once "
                         "(the objects in flight, at most the stages): 2 for 3 stages on 2 "
                         "CPUs (one object in flight), 5 for 3 stages on 16 CPUs")
    parser.add_argument("--verbose", action="store_true",
                        help="echo the nodes' stderr and the orchestrator's events")
    parser.add_argument("--log-level", default="WARNING",
                        help="Python logging level on stderr (default WARNING)")
    parser.set_defaults(handler=run)


def serve_options(identity: NodeIdentity, nodes: tuple[PoolMember, ...], model: str | None,
                  *, max_seq_len: int | None, split: tuple[int, ...] | None,
                  offer_model: bool, bind_host: str = "127.0.0.1",
                  advertise_host: str | None = None) -> SessionOptions:
    """The run options of a serving session; ValueError names a bad model or flag."""
    from swactor.model.paths import default_model_path
    from swactor.model.source import is_url
    from swactor.orchestrator.errors import PlannerError
    from swactor.orchestrator.model_info import model_info_from_gguf
    from swactor.orchestrator.session import SessionOptions

    location = model or default_model_path()
    url = is_url(location)
    if not url and not Path(location).is_file():
        raise ValueError(f"model {location} not found (run scripts/setup.sh, or pass --model)")
    try:  # an architecture, tensor type or tokenizer no stage runs: refused before any node
        info = model_info_from_gguf(location, with_stop_ids=False)
    except PlannerError as error:
        raise ValueError(str(error)) from None
    if max_seq_len is not None and max_seq_len > info.context_length:
        raise ValueError(f"--max-seq-len {max_seq_len} exceeds the model's context "
                         f"({info.context_length})")
    return SessionOptions(
        identity=identity, nodes=nodes, model=location if url else Path(location),
        max_seq_len=max_seq_len, split=split, bind_host=bind_host,
        advertise_host=advertise_host, offer_model=offer_model and not url, stream=False)


def check_port(host: str, port: int) -> None:
    """ValueError naming the problem when `host:port` cannot be listened on now."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise ValueError(f"--host {host}: {error.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            why = ("is already in use" if error.errno == errno.EADDRINUSE
                   else f"cannot be bound: {error.strerror}")
            raise ValueError(f"{host}:{port} {why} (pick another --port)") from None


# ------------------------------------------------------------------ the live pool


class LiveNodes:
    """The pool's usable stage nodes now, for the next plan (module doc, step 1)."""

    def __init__(self, members: tuple[PoolMember, ...], *, pool: Pool | None = None,
                 admitted: frozenset[NodeId] | None = None, count: int | None = None,
                 alive: Callable[[NodeId], bool] | None = None) -> None:
        self._members = {m.node_id: m for m in members}
        self._pool = pool
        self._admitted = admitted
        self._count = count or len(members)
        self._alive = alive
        self._task: asyncio.Task[None] | None = None
        self._exits: list[asyncio.Future[None]] = []
        self._exited: set[NodeId] = set()
        """Nodes whose process exited (`follow_exit`): never usable again."""
        self._runs: list[tuple[RunHandle, frozenset[NodeId]]] = []
        self.previous: tuple[NodeId, ...] = ()
        """The last run's node of each stage, in stage order."""
        self.on_join: Callable[[NodeId], None] | None = None
        """Told each node that joins the usable set: added, or back after it left it (a
        spare to warm, a faulted node to forget)."""

    def _usable(self) -> list[NodeId]:
        return sorted(m for m in self._members if self._alive is None or self._alive(m))

    def members(self) -> tuple[PoolMember, ...]:
        """The usable nodes, in node-id order (the stage order), at most `count`."""
        return tuple(self._members[n] for n in self._usable()[:self._count])

    def place(self, warm: Mapping[NodeId, frozenset[WarmKey]],
              avoid: frozenset[NodeId] = frozenset()
              ) -> tuple[tuple[PoolMember, ...], list[str]]:
        """The next run's nodes in stage order: the last run's survivors at their stages,
        a spare (warm for the stage when one is) for each lost one, and for each one in
        `avoid` (a node that faulted a run) while another node can take it (`spares.place`)."""
        nodes, words = place(self.previous, self._usable(), warm, self._count, avoid)
        return tuple(self._members[n] for n in nodes), words

    def idle(self, in_run: frozenset[NodeId]) -> tuple[PoolMember, ...]:
        """The usable nodes outside the run, in node-id order (the spares)."""
        return tuple(self._members[n] for n in self._usable() if n not in in_run)

    def observe(self, change: MemberChanged) -> None:
        """One SWIM change: a usable node (re)joins the set; a dead, left or unavailable
        one leaves it; a suspect stays (SWIM refutes it or declares it dead)."""
        from swactor.membership import BootHealth, MemberState
        from swactor.orchestrator.session import PoolMember

        node, meta = change.node_id, change.meta
        if self._admitted is not None and node not in self._admitted:
            return
        if change.state in (MemberState.Dead, MemberState.Left, MemberState.Removed) or (
                meta is not None and meta.boot_health is not BootHealth.Available):
            self._members.pop(node, None)
            self._lost(node)
        elif (change.state is MemberState.Alive and meta is not None and meta.role == "node"
              and meta.has_endpoint and node not in self._exited):
            joined = node not in self._members
            self._members[node] = PoolMember(node, meta.quic_host, meta.quic_port)
            if joined and self.on_join is not None:
                self.on_join(node)

    async def watch(self, handle: RunHandle, nodes: frozenset[NodeId]) -> None:
        """Beside a run on `nodes` until it ends: each of them that leaves the usable set
        (dead, left or unavailable in SWIM's view; a suspicion is not a loss) is told to
        the run as MembershipLost, so a killed node faults the run within SWIM's
        detection bound instead of its peers' QUIC idle timeout."""
        from swactor.fsm.generated import orchestrator_run as orun

        watched = (handle, nodes)
        self._runs.append(watched)
        try:
            for node in nodes - set(self._members):  # lost before the run began
                handle.tell(orun.MembershipLost(node))
            await asyncio.shield(handle.future)
        finally:
            self._runs.remove(watched)

    def follow_exit(self, node: NodeId, exited: Awaitable[object]) -> None:
        """Watch the process of a node this command started: once `exited` (its
        `wait()`) returns, the node leaves the usable set for good and every run on it
        is told MembershipLost (module doc, step 1). `close()` stops watching."""
        self._exits.append(asyncio.ensure_future(self._on_exit(node, exited)))

    async def _on_exit(self, node: NodeId, exited: Awaitable[object]) -> None:
        await exited
        log.info("node %#x: its process exited", int(node))
        self._exited.add(node)
        self._members.pop(node, None)
        self._lost(node)

    def _lost(self, node: NodeId) -> None:
        from swactor.fsm.generated import orchestrator_run as orun

        for handle, nodes in self._runs:
            if node in nodes:
                handle.tell(orun.MembershipLost(node))

    def follow(self) -> None:
        """Start reading the pool's SWIM events (a discovered pool; no-op otherwise)."""
        if self._pool is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._read(self._pool))

    async def _read(self, pool: Pool) -> None:
        from swactor.membership import MemberChanged

        while True:
            event = await pool.events.get()
            if isinstance(event, MemberChanged):
                self.observe(event)

    async def close(self) -> None:
        watchers, self._exits = self._exits, []
        if self._task is not None:
            watchers.append(self._task)
            self._task = None
        for task in watchers:
            task.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)


# ----------------------------------------------------------------------- serving


def _say(err: TextIO, text: str) -> None:
    print(f"[swactor] {text}", file=err, flush=True)


async def serve_pool(
    options: SessionOptions,
    live: LiveNodes,
    emitter: Emitter,
    *,
    host: str,
    port: int,
    slots: int,
    max_queue: int,
    batch_rows: int | None = 1,
    objects_in_flight: int | None = None,
    shared_cpus: int | None = None,
    restart_limit: int,
    retry_delay_s: float,
    out: TextIO,
    err: TextIO,
    stops: Stops,
    spares: int = 0,
) -> int:
    """Serve until the operator stops (module doc, steps 2-4); the exit status. While
    the session serves, `stops` routes Ctrl-C and SIGTERM to its operator stop.
    `shared_cpus`: the CPUs every stage of a run shares (local nodes on this host), which
    bound the objects in flight unless `objects_in_flight` says (`objects_in_flight_for`)."""
    from swactor.orchestrator.session import SessionError
    from swactor.serve.engine import HealthState
    from swactor.serve.pipeline import NodeHolds
    from swactor.serve.server import ServeConfig, ServeFront
    from swactor.serve.session import ServeSession
    from swactor.serve.spares import SpareWarmer

    warmer = SpareWarmer(spares, options, live.idle, emitter) if spares > 0 else None
    holds = NodeHolds()  # every run of this session: none greets a node another holds

    class Prepared:
        """The next run planned on the live nodes (`session.PreparedRun`)."""

        def __init__(self, engine: PreparedEngine, nodes: tuple[PoolMember, ...],
                     words: list[str]) -> None:
            self.engine, self.nodes, self.words = engine, nodes, words

        async def open(self) -> RunEngine:
            chosen = frozenset(m.node_id for m in self.nodes)
            engine = await self.engine.open(lambda handle: live.watch(handle, chosen))
            live.previous = engine.stage_nodes
            reused = len(engine.reused_stages)
            engine.placement = "; ".join([*self.words, f"{reused} of {len(self.nodes)} "
                                          "stage(s) served by a role already loaded"])
            return engine

        async def close(self) -> None:
            await self.engine.close()

    async def prepare() -> Prepared:
        from swactor.serve.pipeline import RunEngine as PipelineEngine

        nodes, words = live.place(warmer.warm if warmer is not None else {}, holds.faulted)
        if not nodes:
            raise SessionError("no live node left in the pool")
        _say(err, f"provisioning a run on {len(nodes)} node(s), {slots} slots ...")
        in_flight = objects_in_flight_for(len(nodes), batch_rows, objects_in_flight,
                                          shared_cpus)
        engine = await PipelineEngine.prepare(replace(options, nodes=nodes), slots=slots,
                                              batch_rows=batch_rows,
                                              objects_in_flight=in_flight,
                                              emitter=emitter, progress=err, holds=holds)
        return Prepared(engine, nodes, words)

    async def starter() -> RunEngine:
        return await (await prepare()).open()

    async def warm(run: RunEngine) -> tuple[int, int]:
        from swactor.serve.pipeline import RunEngine as PipelineEngine

        assert warmer is not None and isinstance(run, PipelineEngine)
        return await warmer(run)

    session = ServeSession(starter, node_id=options.identity.node_id, emitter=emitter,
                           restart_limit=restart_limit, retry_delay_s=retry_delay_s,
                           notify=lambda text: _say(err, text),
                           warmer=warm if warmer is not None else None, preparer=prepare,
                           forget_fault=holds.forget)
    live.on_join = session.node_joined
    live.follow()
    front: ServeFront | None = None
    with stops.serving(session.request_stop):
        try:
            health = await session.start()
            if health.state is HealthState.SERVING:
                front = ServeFront(session, ServeConfig(max_queue=max_queue))
                try:
                    url = await front.start(host, port)
                except OSError as error:
                    _say(err, f"cannot listen on {host}:{port}: {error.strerror}")
                    await session.stop()
                    return EXIT_USAGE
                print(f"serving on {url}", file=out, flush=True)
                _say(err, f"model {session.model_id}, {session.slots} slots, context "
                     f"{session.context_length}; Ctrl-C stops")
                _say(err, f"try: curl {url}/v1/completions -H 'Content-Type: application/json' "
                     "-d '{\"prompt\": \"The capital of France is\", \"max_tokens\": 16}'")
            health = await session.wait()
        finally:
            if front is not None:
                await front.close()
            await live.close()
    if health.state is HealthState.FAILED:
        print(f"swactor serve: {health.detail}", file=err, flush=True)
        return EXIT_FAILED
    _say(err, f"stopped ({session.restarts} restart(s))")
    return EXIT_STOPPED


# --------------------------------------------------------------- swactor serve


def run(args: argparse.Namespace) -> int:
    import tempfile

    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    stages = args.nodes - args.spares if args.stages is None else args.stages
    if stages < 1:
        print(f"swactor serve: --spares {args.spares} leaves no node of the {args.nodes} "
              "for the run's stages", file=sys.stderr)
        return EXIT_USAGE
    if stages + args.spares > args.nodes:
        need = (f"--stages {stages} needs at least as many --nodes" if not args.spares else
                f"--stages {stages} and --spares {args.spares} need "
                f"{stages + args.spares} --nodes")
        print(f"swactor serve: {need}, got {args.nodes}", file=sys.stderr)
        return EXIT_USAGE
    if args.split is not None and len(args.split) != stages:
        print(f"swactor serve: --split names {len(args.split)} stages but "
              f"{'--stages' if args.stages is not None else '--nodes'} is {stages}",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        check_port(args.host, args.port)
    except ValueError as error:
        print(f"swactor serve: {error}", file=sys.stderr)
        return EXIT_USAGE
    with contextlib.ExitStack() as stack:
        keys = args.keys_dir or Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="swactor-serve-")))
        try:
            return run_stoppable(lambda stops: _serve_local(args, keys, stops))
        except KeyboardInterrupt:  # Ctrl-C before the pool was found; the nodes are stopped
            print("swactor serve: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
    return EXIT_USAGE  # pragma: no cover - ExitStack does not swallow


async def _serve_local(args: argparse.Namespace, keys: Path, stops: Stops) -> int:
    import os

    from swactor.cluster.launcher import ClusterError, LocalCluster
    from swactor.cluster.run_cmd import LOCAL_CONVERGENCE_WINDOW_S, POOL_TIMEOUT_S
    from swactor.events.emitter import configure
    from swactor.orchestrator.discovery import DiscoveryError, PoolDiscovery

    if args.verbose:
        os.environ["SWACTOR_CLUSTER_ECHO"] = "1"
    stages = args.nodes - args.spares if args.stages is None else args.stages
    threads = args.threads or local_stage_threads(stages, args.batch_rows,
                                                  args.objects_in_flight, os.cpu_count() or 1)
    cluster = LocalCluster(args.nodes, keys, args.events_dir, args.arena_ceiling,
                           args.log_level, weights=args.weights, swim=True,
                           threads=threads, device=args.device)
    try:
        options = serve_options(cluster.orchestrator, (), args.model,
                                max_seq_len=args.max_seq_len, split=args.split,
                                offer_model=False)  # the nodes share this machine's disk
    except ValueError as error:
        print(f"swactor serve: {error}", file=sys.stderr)
        return EXIT_USAGE
    events = str(args.events_dir / "orchestrator.jsonl") if args.events_dir else None
    emitter = configure(f"orchestrator-{cluster.orchestrator.node_id:016x}", events,
                        verbosity=1 if args.verbose else None)
    _say(sys.stderr, f"starting {args.nodes} node(s) ...")
    admission = cluster.write_pool()
    options = replace(options, admission=admission)
    discovery = PoolDiscovery(
        cluster.orchestrator, ("127.0.0.1", 0), (), args.nodes, admission=admission,
        settle_s=LOCAL_CONVERGENCE_WINDOW_S, emitter=emitter,
        warn=lambda text: _say(sys.stderr, f"warning: {text}"))
    cluster.seed = discovery.address
    pool: Pool | None = None
    try:  # whatever happens (Ctrl-C while booting included), the nodes are stopped
        try:
            discovery.start()
            await cluster.start()
            pool = await discovery.wait(POOL_TIMEOUT_S)
        except (ClusterError, DiscoveryError) as error:
            print(f"swactor serve: {error}", file=sys.stderr)
            return EXIT_USAGE
        processes = {n.member.node_id: n.process for n in cluster.nodes if n.member}
        live = LiveNodes(pool.members, pool=pool, admitted=admission.stage_ids,
                         count=args.nodes - args.spares if args.stages is None
                         else args.stages,
                         alive=lambda node: node in processes
                         and processes[node].returncode is None)
        for node_id, process in processes.items():
            live.follow_exit(node_id, process.wait())
        return await serve_pool(
            replace(options, pool_gated=True, warm_prompt_tokens=args.warm_prompt_tokens,
                    warm_batch_rows=warm_batch_rows(args),
                    mixed_steps=args.mixed_steps == "on",
                    warm_mixed_rows=warm_mixed_rows(args)),
            live, emitter, host=args.host,
            port=args.port, slots=args.slots, max_queue=args.max_queue,
            batch_rows=args.batch_rows, objects_in_flight=args.objects_in_flight,
            shared_cpus=os.cpu_count(),
            restart_limit=args.max_restarts, retry_delay_s=args.retry_delay,
            out=sys.stdout, err=sys.stderr, stops=stops, spares=args.spares)
    finally:
        await (pool.stop() if pool is not None else discovery.close())
        await cluster.stop()
        emitter.close()
