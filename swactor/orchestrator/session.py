"""One orchestrated run against real nodes: tokenize, reach the pool, plan, run, report.

Theory of operation. `run_session(options, emitter, out, err)` is the whole job of
`swactor orchestrator` (and of the orchestrator half of `swactor run`):

1. prompt ids: the model's tokenizer encodes `--prompt` (or the file), after the chat
   template when `chat` is set; given token ids are used as they are;
2. the orchestrator's own QUIC endpoint (its identity; only the pool's nodes are
   admitted) and control channel; the token edges' arena, driver and EdgeEstablisher
   come with `NetworkRunPorts` once the run's actor runtime is up;
3. pool: each node is sent `AddressBook` (every node's and the orchestrator's address);
   a node that does not answer fails the session before anything is planned. A pool
   found by SWIM (`pool_gated`) already passed the `pool_readiness` machine, which
   emitted `pool_ready`; a fixed pool (`--node`) gets its `pool_ready` here, once every
   node has acknowledged;
4. plan (`plan_run`: even memory per node unless `--split`), then `start_run` with
   `NetworkRunPorts`; progress lines go to `err` as stages report ready, each accepted
   token's text goes to `out` as it arrives (`StreamDecoder`, special tokens skipped);
5. the `RunResult` becomes a `SessionReport`: the summary lines (stages and layer
   ranges, time to first token, tokens/s) or, with `json`, one JSON object.

Ctrl-C during the run is an operator stop (the run tears down and reports
OperatorStopped). Errors before the run (model, tokenizer, planner, unreachable node)
raise `SessionError` with one line naming the problem.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from swactor import faults
from swactor.actors import Runtime
from swactor.events.emitter import Emitter
from swactor.events.schema import LifecycleEvent, PoolReady, TokenReceived
from swactor.fsm.generated import orchestrator_run as orun
from swactor.membership.admission import ID_ONLY_REFUSAL, Admission
from swactor.model.fetch import OfferedFile
from swactor.orchestrator.inventory import DEFAULT_NODE_MEMORY_BYTES, NodeResources, PoolInventory
from swactor.orchestrator.model_info import StageMemory
from swactor.orchestrator.plan_cmd import footprint_text
from swactor.orchestrator.ports import RunResult
from swactor.orchestrator.real_ports import NetworkRunPorts
from swactor.orchestrator.run import RunHandle, RunTimeouts, start_run
from swactor.transport import ControlAuthority, ControlChannel
from swactor.transport.artifact_stream import ArtifactChannel, FileOffer
from swactor.transport.config import TransportConfig
from swactor.transport.endpoint import QuicEndpoint
from swactor.transport.factory import QuicTransport, Transport
from swactor.transport.identity import NodeIdentity
from swactor.transport.run_control import REGISTRY, AddressBook, PeerAddress
from swactor.wire import (
    GgufSource,
    NodeId,
    PromptSource,
    RunFaultError,
    RunId,
    RunPlan,
    SamplingPolicy,
    StageFootprint,
)
from swactor.wire.codec import WireStruct

if TYPE_CHECKING:
    from swactor.model.tokenizer import Tokenizer
    from swactor.orchestrator.planner import PlannedRun

TOKEN_ARENA_BYTES = 16 << 20
POOL_TIMEOUT_S = 60.0


class SessionError(Exception):
    """The session could not start its run; the message names the problem."""


@dataclass(frozen=True)
class PoolMember:
    """A stage node the orchestrator was told about: id and QUIC address."""

    node_id: NodeId
    host: str
    port: int


@dataclass(frozen=True)
class SessionOptions:
    identity: NodeIdentity
    nodes: tuple[PoolMember, ...]
    model: Path | str
    """A local GGUF, or an http(s) URL (a str) that each node reads by byte ranges."""
    prompt: str | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    chat: bool = False
    sampling: SamplingPolicy = field(default_factory=SamplingPolicy.greedy)
    max_tokens: int = 64
    max_seq_len: int | None = None
    split: tuple[int, ...] | None = None
    slots: int = 1
    """KV slots per stage (`PlanRequest.slots`): a serving run's sequences at once."""
    warm_prompt_tokens: int = 0
    """Prompt lengths each stage builds prefill kernels for before it is ready
    (`PlanRequest.warm_prompt_tokens`)."""
    warm_batch_rows: int = 0
    """Batch sizes 2..this whose decode kernels each stage builds before it is ready
    (`PlanRequest.warm_batch_rows`)."""
    mixed_steps: bool = False
    """A serving run's lone prompts ride with the decode rows in flight (`Serving.mixed`,
    `--mixed-steps`)."""
    warm_mixed_rows: int = 0
    """Decode rows 1..this whose mixed-step graphs each stage builds for its warm prefill
    buckets before it is ready (`PlanRequest.warm_mixed_rows`)."""
    bind_host: str = "127.0.0.1"
    advertise_host: str | None = None
    run_id: int | None = None
    stream: bool = True
    decode: bool = True
    """Use the model's tokenizer (False: token ids only, for a model without one)."""
    transport: TransportConfig = field(default_factory=TransportConfig)
    network: Transport | None = None
    """How to build the endpoint, driver and control channel (None: real QUIC)."""
    timeouts: RunTimeouts = field(default_factory=RunTimeouts)
    offer_model: bool = False
    """Offer the local model to the pool over QUIC (`orchestrator.offer`): the plan names
    this orchestrator and the file's digests, not a path, and each node fetches its own
    byte ranges into its model cache (False: every node reads the file at the same path).
    `swactor orchestrator` turns it on unless told `--no-offer-model`."""
    pool_gated: bool = False
    """The pool came from SWIM discovery, whose `pool_readiness` machine already emitted
    pool_ready: the session does not emit it again (False: a fixed `--node` list, whose
    pool_ready is emitted once every node acknowledged its AddressBook)."""
    admission: Admission | None = None
    """The pool file (`--pool`): the orchestrator's QUIC endpoint pins its members' full
    public keys, so a node is admitted by its key, not by the 64-bit id it hashes to.
    Every node of `nodes` must be one of its `node` entries. None is refused unless
    `open_pool` is set (`check_admission`)."""
    open_pool: bool = False
    """Run without a pool file (`--open-pool`): nodes are admitted by their 64-bit id
    alone, which names a key but does not prove it (`admission.ID_ONLY_REFUSAL`)."""


@dataclass
class SessionReport:
    result: RunResult
    text: str
    layer_ranges: list[tuple[int, int]]
    stage_nodes: list[int]
    timings: dict[str, float | None]
    token_leases_left: int = 0
    """Rings the orchestrator's token arena still had leased after the run (must be 0)."""
    weights_served_bytes: int = 0
    """Model bytes the nodes fetched from this orchestrator (`offer_model`)."""

    def to_json(self) -> dict[str, Any]:
        result = self.result
        return {
            "run_id": int(result.run_id),
            "outcome": result.outcome.value if result.outcome else None,
            "teardown": result.teardown.value if result.teardown else None,
            "fault": None if result.fault is None else {
                "reason": result.fault.reason.value,
                "component": result.fault.component.value,
                "stage_index": None if result.fault.stage_index is None
                else int(result.fault.stage_index),
            },
            "stop_cause": result.stop_cause.value if result.stop_cause else None,
            "prompt_token_ids": list(result.prompt_token_ids),
            "generated_token_ids": list(result.generated_token_ids),
            "text": self.text,
            "stages": [{"node_id": node, "layer_start": start, "layer_end_exclusive": end}
                       for node, (start, end) in zip(self.stage_nodes, self.layer_ranges,
                                                     strict=True)],
            "timings": self.timings,
            "token_leases_left": self.token_leases_left,
            "weights_served_bytes": self.weights_served_bytes,
        }

    def summary_lines(self) -> list[str]:
        result = self.result
        lines = [f"run {int(result.run_id)}: "
                 f"{result.outcome.value if result.outcome else 'no outcome'}"
                 f" (teardown {result.teardown.value if result.teardown else '?'})"]
        if result.fault is not None:
            lines.append(f"  fault: {result.fault.reason.value} in "
                         f"{result.fault.component.value}")
        for i, (node, (start, end)) in enumerate(zip(self.stage_nodes, self.layer_ranges,
                                                      strict=True)):
            lines.append(f"  stage {i}: node {node:016x} layers {start}..{end - 1}")
        t = self.timings
        lines.append(f"  prompt {len(result.prompt_token_ids)} tokens, generated "
                     f"{len(result.generated_token_ids)}"
                     + (f" (stop: {result.stop_cause.value})" if result.stop_cause else ""))
        after_first = max(len(result.generated_token_ids) - 1, 0)
        lines.append(f"  load {_fmt(t['load_s'], 's')} (pool ready to every stage ready), "
                     f"first token {_fmt(t['ttft_s'], 's')} after that, "
                     f"decode {_fmt(t['tokens_per_s'], ' tokens/s')} "
                     f"({after_first} tokens after the first)")
        return lines


def _fmt(value: float | None, unit: str) -> str:
    return "n/a" if value is None else f"{value:.2f}{unit}"


def prompt_ids(options: SessionOptions) -> tuple[tuple[int, ...], Tokenizer | None]:
    """(prompt token ids, tokenizer; None for a model without one, given token ids)."""
    from swactor.model.tokenizer import Tokenizer

    if options.prompt_token_ids is not None and not options.decode:
        return options.prompt_token_ids, None
    try:
        tokenizer = Tokenizer.from_gguf(options.model)
    except Exception as error:
        raise SessionError(f"tokenizer of {options.model}: {error}") from None
    if options.prompt_token_ids is not None:
        return options.prompt_token_ids, tokenizer
    text = options.prompt or ""
    try:
        if options.chat:
            text = tokenizer.apply_chat_template([{"role": "user", "content": text}])
            ids = tokenizer.encode(text, add_bos=False)
        else:
            ids = tokenizer.encode(text)
    except Exception as error:
        raise SessionError(f"prompt: {error}") from None
    if not ids:
        raise SessionError("the prompt encodes to no tokens")
    return tuple(ids), tokenizer


def check_admission(options: SessionOptions) -> None:
    """SessionError unless every node is pinned by its full key: `admission` names each
    node of `nodes` with role `node`, or the caller opened the pool (`open_pool`)."""
    if options.admission is None:
        if not options.open_pool:
            raise SessionError(f"no pool file: the session {ID_ONLY_REFUSAL} "
                               "(SessionOptions.admission, or open_pool)")
        return
    stages = options.admission.stage_ids
    strangers = [m for m in options.nodes if m.node_id not in stages]
    if strangers:
        raise SessionError(f"node {int(strangers[0].node_id):016x} is not a node of the "
                           f"pool file {options.admission.source}")


async def run_session(
    options: SessionOptions,
    emitter: Emitter,
    out: TextIO,
    err: TextIO,
    watch: Callable[[RunHandle], Awaitable[None]] | None = None,
) -> SessionReport:
    """Run one prompt through the pool (module doc); `watch(handle)` runs beside the run
    (membership: it tells the run MembershipLost) and is cancelled when it ends."""
    if not options.nodes:
        raise SessionError("the pool is empty: name at least one node")
    check_admission(options)
    ids, tokenizer = prompt_ids(options)
    run_id = RunId(options.run_id if options.run_id is not None else secrets.randbits(62) + 1)
    planned, offered = plan_for(options, run_id, ids, with_stop_ids=tokenizer is not None)
    plan = planned.plan
    me = NodeId(options.identity.node_id)
    pool = await Pool.open(options, run_id, offered)
    endpoint, control, offer, holder = pool.endpoint, pool.control, pool.offer, pool.holder
    stages = plan.stages
    decoder = tokenizer.stream(skip_special=True) if tokenizer is not None else None
    pieces: list[str] = []

    def on_token(token: int) -> None:
        if decoder is None:
            return
        piece = decoder.push(token)
        pieces.append(piece)
        if options.stream and piece:
            out.write(piece)
            out.flush()

    started = time.monotonic()
    try:
        await pool.greet(emitter)
        err.write(f"[swactor] pool ready: {len(options.nodes)} nodes; loading "
                  f"{len(stages)} stages\n")
        err.flush()
        async with Runtime(f"orchestrator-{int(me):x}") as runtime:
            try:
                ports = StreamingPorts(control, runtime, endpoint, pool.network.driver, emitter,
                                        run_id, me, TOKEN_ARENA_BYTES)
            except RunFaultError as error:
                raise SessionError(f"token endpoints: {error}") from None
            ports.on_token = on_token
            ports.on_stage = StageProgress(err, planned.stage_memory, len(stages))
            holder.append(ports)
            try:
                result = await _run(runtime, plan, ports, planned.stop_token_ids, ids,
                                    options.timeouts, watch)
                leases_left = len(await ports.live_leases())
            finally:
                await ports.close()
        tail = decoder.flush() if decoder is not None else ""
        pieces.append(tail)
        if options.stream and decoder is not None:
            out.write(tail + "\n")
            out.flush()
    finally:
        await pool.close()
    t = result.timings
    load = None if t.ready is None else t.ready - started
    return SessionReport(
        result=result,
        text="".join(pieces),
        layer_ranges=[(s.layer_start, s.layer_end_exclusive) for s in stages],
        stage_nodes=[int(s.node_id) for s in stages],
        token_leases_left=leases_left,
        weights_served_bytes=0 if offer is None else offer[0].served_bytes,
        timings={"load_s": load, "ttft_s": t.time_to_first_token_s,
                 "tokens_per_s": t.tokens_per_second(len(result.generated_token_ids)),
                 "total_s": time.monotonic() - started},
    )


def plan_for(
    options: SessionOptions, run_id: RunId, ids: tuple[int, ...], *, with_stop_ids: bool,
    serving: bool = False,
) -> tuple[PlannedRun, OfferedFile | None]:
    """Plan a run of `options` over its pool (`serving`: a serving run, `ids` a
    placeholder); the model's source as `options` say (a URL, offered, or a path)."""
    from swactor.model.source import local_sha256
    from swactor.orchestrator.errors import PlannerError
    from swactor.orchestrator.model_info import model_info_from_gguf
    from swactor.orchestrator.offer import offered_source
    from swactor.orchestrator.planner import PlanRequest, plan_run

    me = NodeId(options.identity.node_id)
    offered: OfferedFile | None = None
    try:
        model = model_info_from_gguf(options.model, with_stop_ids=with_stop_ids)
        if isinstance(options.model, str):  # a URL: each node reads its ranges there
            if options.offer_model:
                raise SessionError(f"model {options.model}: only a local file is offered")
            source = GgufSource.http_url(options.model, sha256=model.url_sha256)
        elif options.offer_model:  # nodes fetch their ranges from us (orchestrator.offer)
            source, offered = offered_source(options.model, int(me))
        else:
            source = GgufSource.local_path(str(options.model.resolve()),
                                           sha256=local_sha256(options.model))
        pool = PoolInventory(
            tuple(NodeResources(m.node_id, DEFAULT_NODE_MEMORY_BYTES) for m in options.nodes),
            orchestrator_node_id=me)
        planned = plan_run(pool, model, PlanRequest(
            run_id=run_id, prompt=PromptSource.from_token_ids(ids),
            max_tokens=options.max_tokens, max_seq_len=options.max_seq_len,
            split=options.split, sampling=options.sampling,
            gguf_source=source,
            prompt_token_count=None if serving else len(ids), serving=serving,
            slots=options.slots, warm_prompt_tokens=options.warm_prompt_tokens,
            warm_batch_rows=options.warm_batch_rows,
            warm_mixed_rows=options.warm_mixed_rows))
    except PlannerError as error:
        raise SessionError(f"plan: {error}") from None
    except SessionError:
        raise
    except Exception as error:  # the model file: unreadable, not a GGUF, bad header
        raise SessionError(f"model {options.model}: {error}") from None
    return planned, offered


@dataclass
class Pool:
    """The orchestrator's side of one run's pool: its QUIC endpoint (admitting the pool's
    nodes only), the control channel whose requests go to `holder[0]` (the run's ports,
    once made), and the model offer if any."""

    options: SessionOptions
    network: Transport
    endpoint: QuicEndpoint
    control: ControlChannel
    holder: list[NetworkRunPorts]
    address: tuple[str, int]
    offer: tuple[ArtifactChannel, FileOffer] | None

    @classmethod
    async def open(cls, options: SessionOptions, run_id: RunId,
                   offered: OfferedFile | None) -> Pool:
        from swactor.orchestrator.offer import serve_offer

        check_admission(options)  # every endpoint pins its nodes' keys (or was opened)
        me = NodeId(options.identity.node_id)
        network = options.network or QuicTransport(faults.from_env())
        endpoint = network.endpoint(options.identity, options.transport,
                                    {int(m.node_id) for m in options.nodes},
                                    None if options.admission is None
                                    else options.admission.pinned_keys)
        address = await endpoint.start(options.bind_host, 0)
        for member in options.nodes:
            endpoint.address_book[int(member.node_id)] = (member.host, member.port)
        offer = None if offered is None else serve_offer(endpoint, offered)
        holder: list[NetworkRunPorts] = []

        async def handler(peer: int, message: WireStruct) -> WireStruct | None:
            return await holder[0].on_request(peer, message) if holder else None

        control = network.control(endpoint, REGISTRY, handler,
                                  ControlAuthority(orchestrator_id=int(me),
                                                   active_run_id=int(run_id)))
        return cls(options, network, endpoint, control, holder, address, offer)

    async def greet(self, emitter: Emitter) -> None:
        """Send every node the AddressBook; pool_ready once all answered (a fixed pool)."""
        await self.introduce()
        if not self.options.pool_gated:
            emitter.emit(PoolReady(node_id=NodeId(self.options.identity.node_id)))

    async def introduce(self) -> None:
        """Send every node the AddressBook: the pool's nodes and this endpoint's address,
        where a node fetches an offered model's ranges from (`SessionError` when a node
        does not answer)."""
        options = self.options
        me = NodeId(options.identity.node_id)
        host = options.advertise_host or self.address[0]
        book = AddressBook((*(PeerAddress(m.node_id, m.host, m.port) for m in options.nodes),
                            PeerAddress(me, host, self.address[1])))
        try:
            await asyncio.gather(*(self.control.request(int(m.node_id), book,
                                                        timeout=POOL_TIMEOUT_S)
                                   for m in options.nodes))
        except Exception as error:
            raise SessionError(f"pool: a node did not answer: {error}") from None

    async def close(self) -> None:
        await self.endpoint.close()
        if self.offer is not None:
            self.offer[1].close()


async def _run(
    runtime: Runtime,
    plan: RunPlan,
    ports: NetworkRunPorts,
    stop_token_ids: frozenset[int],
    ids: tuple[int, ...],
    timeouts: RunTimeouts,
    watch: Callable[[RunHandle], Awaitable[None]] | None,
) -> RunResult:
    """Start the run on `ports` and wait for its result; Ctrl-C is an operator stop and
    `watch(handle)` runs beside it until it ends."""
    handle = start_run(runtime, plan, ports, stop_token_ids=stop_token_ids,
                       prompt_token_ids=ids, timeouts=timeouts)
    ports.handle = handle
    watcher = asyncio.ensure_future(watch(handle)) if watch is not None else None
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, handle.stop)
    try:
        return await handle.result()
    finally:
        if watcher is not None:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)


class StageProgress:
    """Prints each stage's report while a run starts, as `swactor run` and `swactor serve`
    show it: "[swactor] stage i ready (n/N): " with the memory the stage's worker measured
    beside the plan's prediction (`footprint_text`), or the stage's fault."""

    def __init__(self, out: TextIO, stage_memory: Sequence[StageMemory],
                 stage_count: int) -> None:
        self.out = out
        self.stage_memory = stage_memory
        self.stage_count = stage_count
        self.ready = 0

    def __call__(self, event: orun.Event, footprint: StageFootprint | None) -> None:
        if isinstance(event, orun.StageReady):
            self.ready += 1
            index = int(event.stage_index)
            predicted = self.stage_memory[index] if index < len(self.stage_memory) else None
            memory = footprint_text(footprint, predicted)
            self.out.write(f"[swactor] stage {index} ready ({self.ready}/{self.stage_count})"
                           f"{': ' + memory if memory else ''}\n")
        elif isinstance(event, orun.StageFault):
            self.out.write(f"[swactor] stage {int(event.stage_index)} fault: "
                           f"{event.reason.value} ({event.component.value})\n")
        else:
            return
        self.out.flush()


class StreamingPorts(NetworkRunPorts):
    """`NetworkRunPorts` that also tells the session of tokens and stage reports."""

    on_stage: Callable[[orun.Event, StageFootprint | None], None] | None = None
    """Told each stage report, with a StageReady's measured footprint (None otherwise)."""

    def emit(self, event: LifecycleEvent) -> None:
        super().emit(event)
        if isinstance(event, TokenReceived) and event.token is not None and self.on_token:
            self.on_token(event.token)

    async def on_request(self, peer: int, message: WireStruct) -> WireStruct | None:
        from swactor.transport.run_control import StageReadyReport, report_event

        event = report_event(message)
        if event is not None and self.on_stage is not None:
            self.on_stage(event, message.footprint if isinstance(message, StageReadyReport)
                          else None)
        return await super().on_request(peer, message)


def report_json(report: SessionReport) -> str:
    return json.dumps(report.to_json())
