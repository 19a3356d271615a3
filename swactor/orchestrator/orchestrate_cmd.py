"""`swactor orchestrator`: run one prompt through a pool of running nodes.

Theory of operation. The command takes the pool either as `--node ID@HOST:PORT`,
repeated (the ids and QUIC addresses that `swactor node` printed, in stage order), or
finds it by SWIM (`--seed HOST:PORT --nodes N`: the first N available nodes by id, see
`discovery`). SWIM needs the pinned pool, `--pool FILE` (`swactor.membership.admission`:
the orchestrator's own key must be pinned as `orchestrator`, only the file's `node` keys
can join its SWIM view or be chosen as stages; `--nodes` defaults to all of them), or
an explicit `--open-pool`, which warns that any key may join. `--node` needs `--pool`
too, and each listed node must be one of its `node` keys (the endpoint then pins each
node's full public key): a node id is a 64-bit hash of a key, not proof of it, so
without a pool file only `--open-pool`, with a warning, dials nodes by their ids alone.
Then the model, the prompt and the sampling flags, then runs `session.run_session`. A
local model is offered to the pool by default (`--offer-model`; `--no-offer-model`
plans the path instead), since the nodes of a pool named here may not hold the file;
`--model URL` plans the URL, which each node reads by byte ranges. Then: generated
text streams to stdout as tokens arrive, progress and the summary go to stderr; with
`--json` nothing streams and stdout gets one JSON object (run id, outcome, prompt and
generated token ids, text, stage layer ranges, timings). Exit status: 0 for a Completed
run, 1 for a run that faulted or was stopped, 2 for bad arguments or a session that
could not start (one line on stderr naming the problem).

`add_run_arguments` is shared with `swactor run`, which adds its own pool; `swactor
orchestrator --serve HOST:PORT` (`swactor.serve.orchestrator_cmd`, which registers this
command with its serving flags added) finds the pool with `pool_from_args` and serves.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from swactor.cliargs import at_least, node_id
from swactor.events.emitter import add_event_arguments, configure_from_args
from swactor.membership.cli import add_admission_arguments, admission_from_args
from swactor.model.paths import model_location
from swactor.orchestrator.plan_cmd import DEFAULT_PROMPT

if TYPE_CHECKING:
    from swactor.events.emitter import Emitter
    from swactor.membership.admission import Admission
    from swactor.orchestrator.session import PoolMember, SessionOptions, SessionReport
    from swactor.transport.identity import NodeIdentity


def split_arg(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of block counts (e.g. 10,10,10)") from None


def _address(text: str) -> tuple[str, int]:
    from swactor.membership.cli import parse_address

    return parse_address(text)


def parse_member(text: str) -> PoolMember:
    """`NODE_ID@HOST:PORT` -> PoolMember (node id decimal, 0x-hex or 16 hex digits)."""
    from swactor.orchestrator.session import PoolMember

    node, at, address = text.partition("@")
    host, colon, port = address.rpartition(":")
    if not at or not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not NODE_ID@HOST:PORT")
    return PoolMember(node_id(node), host, int(port))


def add_run_arguments(parser: argparse.ArgumentParser, *, offer_default: bool = True
                      ) -> None:
    """Model, prompt, sampling and output flags (shared with `swactor run`);
    `offer_default`: whether the command offers a local model to the pool unless told
    `--no-offer-model` (`swactor orchestrator`: yes, its nodes may not have the file;
    `swactor run`: no, its nodes share this machine's disk)."""
    parser.set_defaults(offer_default=offer_default)
    group = parser.add_argument_group("run")
    group.add_argument("--model", type=model_location, default=None,
                       help="GGUF file, or an http(s) URL whose server answers Range "
                       "requests: each node reads only its own layers' byte ranges there "
                       "into its model cache (default: the embedded SmolLM2 in the model "
                       "cache)")
    prompt = group.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", default=None,
                        help=f"prompt text (default {DEFAULT_PROMPT!r})")
    prompt.add_argument("--prompt-file", type=Path, default=None, help="read the prompt here")
    group.add_argument("--offer-model", action=argparse.BooleanOptionalAction,
                       default=None,
                       help="serve a local --model file to the pool over its QUIC links: "
                       "each node fetches only its own layers' byte ranges, verified chunk "
                       "by chunk against the plan's digests, into its model cache, and "
                       "reuses them next run; a node whose models folder already holds a "
                       "file with the same SHA-256 fetches nothing (default: on for "
                       "`swactor orchestrator`, whose nodes may not have the file; off for "
                       "`swactor run`, whose nodes share this machine's disk; "
                       "--no-offer-model: every node reads the file at this path)")
    group.add_argument("--chat", action="store_true",
                       help="wrap the prompt in the model's chat template (one user turn)")
    group.add_argument("--max-tokens", type=at_least(1), default=32, metavar="N",
                       help="tokens to generate at most (default 32)")
    group.add_argument("--max-seq-len", type=at_least(1), default=None, metavar="N",
                       help="positions per run, prompt included (default: min(context, 2048))")
    group.add_argument("--split", type=split_arg, default=None, metavar="B0,B1,...",
                       help="explicit blocks per stage (default: even)")
    group.add_argument("--temperature", type=float, default=None,
                       help="sample at this temperature (default: greedy)")
    group.add_argument("--top-k", type=int, default=0, help="top-k with --temperature")
    group.add_argument("--top-p", type=float, default=1.0, help="top-p with --temperature")
    group.add_argument("--sample-seed", type=int, default=0, metavar="N",
                       help="sampling seed with --temperature")
    group.add_argument("--json", action="store_true",
                       help="print one JSON object instead of streaming text and a summary")
    group.add_argument("--run-id", type=int, default=None, help="run id (default: random)")
    group.add_argument("--log-level", default="WARNING",
                       help="Python logging level on stderr (default WARNING)")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "orchestrator", help="run one prompt through a pool of running nodes",
        description="Plan a run over the given nodes, stream the generated text, summarise.")
    parser.add_argument("--key", type=Path, required=True,
                        help="orchestrator key file (created 0600); nodes must trust its id")
    pool = parser.add_argument_group("pool (either --node ... or --seed ... --nodes N)")
    pool.add_argument("--node", type=parse_member, action="append", default=[],
                      metavar="ID@HOST:PORT", dest="members",
                      help="a stage node, in stage order (repeat); a node of --pool, which "
                      "pins its full key (--open-pool: checked by this 64-bit id alone)")
    pool.add_argument("--seed", type=_address, action="append", default=[],
                      metavar="HOST:PORT", help="find the pool by SWIM through this seed")
    pool.add_argument("--nodes", type=at_least(1), default=None, metavar="N",
                      help="with --seed: wait for N available nodes (default: every node "
                      "of --pool; 3 with --open-pool)")
    pool.add_argument("--swim", type=_address, default=None, metavar="HOST:PORT",
                      help="with --seed: the SWIM address to bind (default: --bind, any port)")
    add_admission_arguments(pool)
    parser.add_argument("--bind", default="127.0.0.1", help="listen host")
    parser.add_argument("--advertise", default=None,
                        help="host the nodes reach this orchestrator at (default: --bind)")
    add_run_arguments(parser)
    add_event_arguments(parser)
    parser.set_defaults(handler=run)


def prompt_text(args: argparse.Namespace) -> str:
    """The run's prompt: `--prompt-file`'s text, `--prompt`, else `DEFAULT_PROMPT`;
    ValueError names a prompt file that cannot be read."""
    if args.prompt_file is not None:
        try:
            return str(args.prompt_file.read_text())
        except OSError as error:
            raise ValueError(f"--prompt-file {args.prompt_file}: {error.strerror}") from None
    return str(args.prompt) if args.prompt is not None else DEFAULT_PROMPT


def session_options(
    args: argparse.Namespace, identity: NodeIdentity, nodes: tuple[PoolMember, ...]
) -> SessionOptions:
    """SessionOptions from parsed `add_run_arguments` flags; ValueError names a bad flag.
    A local model is offered to the pool when `--offer-model` is given, or when neither
    it nor `--no-offer-model` is and the command's `offer_default` (`add_run_arguments`)
    is set; a URL never is."""
    from swactor.model.paths import default_model_path
    from swactor.model.source import is_url
    from swactor.orchestrator.errors import PlannerError
    from swactor.orchestrator.model_info import model_info_from_gguf
    from swactor.orchestrator.session import SessionOptions
    from swactor.wire import SamplingPolicy

    prompt = prompt_text(args)
    if args.temperature is None:
        sampling = SamplingPolicy.greedy()
    else:
        try:
            sampling = SamplingPolicy.temperature_sampling(args.temperature, args.sample_seed,
                                                           args.top_k, args.top_p)
        except Exception as error:
            raise ValueError(f"sampling flags: {error}") from None
    model = args.model or default_model_path()
    url = is_url(model)
    if not url and not Path(model).is_file():
        raise ValueError(f"model {model} not found (run scripts/setup.sh, or pass --model)")
    offer = args.offer_model
    if offer and url:
        raise ValueError(f"--offer-model serves a local file; with --model {model} each "
                         "node reads its own byte ranges from that URL")
    if offer is None:
        offer = bool(getattr(args, "offer_default", True)) and not url
    try:  # an architecture, tensor type or tokenizer no stage runs: refused before any node
        model_info_from_gguf(model, with_stop_ids=False)
    except PlannerError as error:
        raise ValueError(str(error)) from None
    return SessionOptions(
        identity=identity, nodes=nodes, model=model if url else Path(model), prompt=prompt,
        chat=args.chat,
        sampling=sampling, max_tokens=args.max_tokens, max_seq_len=args.max_seq_len,
        split=args.split, bind_host=getattr(args, "bind", "127.0.0.1"),
        advertise_host=getattr(args, "advertise", None), run_id=args.run_id,
        stream=not args.json, offer_model=offer)


def pool_from_args(args: argparse.Namespace
                   ) -> tuple[NodeIdentity, Admission | None, Discovery | None]:
    """The orchestrator's identity, the pinned pool (`--pool`) and, with `--seed`, how to
    discover the pool by SWIM (None: the `--node` list); ValueError names a bad flag.
    Shared with `swactor orchestrator --serve` (`swactor.serve.orchestrator_cmd`)."""
    from swactor.transport.identity import NodeIdentity

    args.key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    identity = NodeIdentity.load_or_create(args.key)
    if args.bind in ("0.0.0.0", "") and not args.advertise:
        raise ValueError("--bind 0.0.0.0 needs --advertise HOST (the address the nodes "
                         "reach this orchestrator at)")
    if bool(args.members) == bool(args.seed):
        raise ValueError("name the pool with --node ID@HOST:PORT ... or find it with "
                         "--seed HOST:PORT (and --nodes N), not both")
    admission = admission_from_args(args, identity, "orchestrator",
                                    "swactor orchestrator", swim=bool(args.seed))
    if admission is not None:
        strangers = [m for m in args.members if m.node_id not in admission.stage_ids]
        if strangers:
            raise ValueError(f"--node {int(strangers[0].node_id):016x} is not a node of "
                             f"the pool file {admission.source}")
    swim = args.swim or (args.bind, 0)
    count = args.nodes or (len(admission.stage_ids) if admission is not None else 3)
    discovery = (swim, tuple(args.seed), count, admission) if args.seed else None
    return identity, admission, discovery


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    try:
        identity, admission, discovery = pool_from_args(args)
        options = replace(session_options(args, identity, tuple(args.members)),
                          admission=admission, open_pool=admission is None)
    except Exception as error:
        print(f"swactor orchestrator: {error}", file=sys.stderr)
        return 2
    emitter = configure_from_args(args, f"orchestrator-{identity.node_id:016x}")
    try:
        return execute(options, emitter, args.json, discovery)
    finally:
        emitter.close()


Discovery = tuple[tuple[str, int], tuple[tuple[str, int], ...], int, "Admission | None"]


def execute(
    options: SessionOptions, emitter: object, as_json: bool, discovery: Discovery | None = None
) -> int:
    """Run the session (after finding the pool by SWIM) and print its output; exit status."""
    from swactor.events.emitter import Emitter
    from swactor.orchestrator.discovery import DiscoveryError
    from swactor.orchestrator.session import SessionError
    from swactor.wire import RunOutcome

    assert isinstance(emitter, Emitter)
    try:
        report = asyncio.run(_session(options, emitter, discovery))
    except (SessionError, DiscoveryError) as error:
        print(f"swactor orchestrator: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before the run started (during it: operator stop)
        print("swactor orchestrator: interrupted", file=sys.stderr)
        return 130
    if as_json:
        print(json.dumps(report.to_json()), flush=True)
    else:
        for line in report.summary_lines():
            print(line, file=sys.stderr)
    return 0 if report.result.outcome is RunOutcome.Completed else 1


async def _session(options: SessionOptions, emitter: Emitter, discovery: Discovery | None
                   ) -> SessionReport:
    from dataclasses import replace

    from swactor.orchestrator.discovery import discover_pool
    from swactor.orchestrator.session import run_session

    if discovery is None:
        return await run_session(options, emitter, sys.stdout, sys.stderr)
    swim, seeds, count, admission = discovery
    print(f"[swactor] waiting for {count} nodes via SWIM ...", file=sys.stderr, flush=True)
    pool = await discover_pool(
        options.identity, swim, seeds, count, idle_timeout_s=options.transport.idle_timeout,
        warn=lambda text: print(f"[swactor] warning: {text}", file=sys.stderr, flush=True),
        admission=admission, emitter=emitter)
    try:
        return await run_session(replace(options, nodes=pool.members, pool_gated=True),
                                 emitter, sys.stdout, sys.stderr, watch=pool.watch)
    finally:
        await pool.stop()
