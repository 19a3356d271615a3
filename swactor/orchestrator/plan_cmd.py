"""`swactor plan`: build the run plan for a pool and a model and print it, without running.

Theory of operation. The command reads the model's header facts
(`model_info.model_info_from_gguf`, default: the embedded SmolLM2), takes the pool from
`--pool FILE.json` or makes `--nodes N` identical local nodes (default: one per entry
of `--split`, else 3), calls `planner.plan_run`, and prints either a table (stages with
node, device, layer range, memory estimate and edges; edges with kind, producer,
consumer, object and ring sizes) or, with `--json`, the `RunPlan` JSON exactly as the
orchestrator would send it. Every planning error (a split that does not sum to the
block count, more stages than blocks, a zero-memory node, an unreadable model or pool
file, ...) is one line on stderr and exit status 2, like argparse's own usage errors.

Only argparse is imported at registration; the planner, the GGUF reader and the wire
types load when the command runs, so `swactor --help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from swactor.cliargs import at_least, slot_count
from swactor.model.paths import model_location
from swactor.orchestrator.planner import DEFAULT_MAX_TOKENS

if TYPE_CHECKING:
    from swactor.orchestrator.model_info import StageMemory
    from swactor.orchestrator.planner import PlannedRun
    from swactor.wire import EdgeEndpoint, StageFootprint

EXIT_PLAN_ERROR = 2
DEFAULT_NODES = 3
DEFAULT_PROMPT = "hello world"


def _split_arg(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of block counts (e.g. 10,10,10)"
        ) from None
    return counts


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """The planning flags (shared with the commands that run a plan)."""
    group = parser.add_argument_group("planning")
    group.add_argument("--model", type=model_location, default=None,
                       help="GGUF file or http(s) URL (default: the embedded SmolLM2 in "
                       "the model cache)")
    pool = group.add_mutually_exclusive_group()
    pool.add_argument("--nodes", type=at_least(1), metavar="N",
                      help="N identical local nodes (default: one per --split entry, else 3)")
    pool.add_argument("--pool", type=Path, metavar="FILE.json",
                      help='pool inventory: {"nodes": [{"node_id": 1, "usable_memory_bytes": '
                           '"8 GiB", "device_kind": "cuda"}, ...]}')
    group.add_argument("--split", type=_split_arg, metavar="B0,B1,...",
                       help="explicit blocks per stage (default: proportional to node memory)")
    group.add_argument("--max-tokens", type=at_least(1), default=DEFAULT_MAX_TOKENS,
                       metavar="N",
                       help=f"tokens to generate at most (default {DEFAULT_MAX_TOKENS})")
    group.add_argument("--max-seq-len", type=at_least(1), default=None, metavar="N",
                       help="positions per run, prompt included (default: min(context, 2048))")
    group.add_argument("--dtype", choices=("f32", "f16"), default="f32",
                       help="activation and compute dtype (default f32)")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `plan` subcommand."""
    parser = subparsers.add_parser(
        "plan",
        help="print the run plan for a pool and a model without running it",
        description="Build the RunPlan (stage layer ranges, edges, object and ring specs) "
        "that the orchestrator would run, and print it as a table or as JSON.",
    )
    add_plan_arguments(parser)
    parser.add_argument("--prompt", default=DEFAULT_PROMPT,
                        help=f"prompt text stated in the plan (default {DEFAULT_PROMPT!r})")
    parser.add_argument("--node-memory", default="8 GiB", metavar="BYTES",
                        help="usable memory of each --nodes node (default '8 GiB')")
    parser.add_argument("--run-id", type=int, default=None, metavar="ID",
                        help="run id (default: random)")
    parser.add_argument("--first-edge-id", type=int, default=None, metavar="ID",
                        help="first edge id (default: a random 48-bit base)")
    parser.add_argument("--weights", choices=("dense", "blocks"), default="blocks",
                        help="the nodes' weight mode (swactor node --weights) the memory "
                        "prediction assumes (default blocks, as the node's)")
    parser.add_argument("--slots", type=slot_count, default=1, metavar="K",
                        help="KV slots per stage, one per sequence a serving run carries "
                        "at once (swactor serve --slots); the memory prediction counts K "
                        "KV caches (default 1, a single-prompt run)")
    parser.add_argument("--json", action="store_true", help="print the RunPlan as JSON")
    parser.set_defaults(handler=run)


def build_planned_run(args: argparse.Namespace) -> PlannedRun:
    """Plan from parsed `plan` arguments; raises PlannerError on bad input."""
    import secrets

    from swactor.model.paths import default_model_path
    from swactor.orchestrator.errors import PlannerError, PlanProblem
    from swactor.orchestrator.inventory import load_pool_file, parse_bytes, synthetic_pool
    from swactor.orchestrator.model_info import model_info_from_gguf
    from swactor.orchestrator.planner import ComputeDtype, PlanRequest, plan_run
    from swactor.wire import PromptSource, RunId
    from swactor.wire.errors import WireError

    if args.pool is not None:
        pool = load_pool_file(args.pool)
    else:
        count = args.nodes or (len(args.split) if args.split else DEFAULT_NODES)
        memory = parse_bytes(args.node_memory, "--node-memory")
        pool = synthetic_pool(count, memory)
    model = model_info_from_gguf(args.model or default_model_path())
    try:
        run_id = RunId(args.run_id if args.run_id is not None else secrets.randbits(63))
        prompt = PromptSource.from_text(args.prompt)
    except WireError as error:
        raise PlannerError(PlanProblem.PlanRejected, str(error)) from None
    request = PlanRequest(
        run_id=run_id,
        prompt=prompt,
        max_tokens=args.max_tokens,
        max_seq_len=args.max_seq_len,
        split=args.split,
        dtype=ComputeDtype[args.dtype],
        first_edge_id=args.first_edge_id,
        weights=getattr(args, "weights", "blocks"),
        slots=getattr(args, "slots", 1),
    )
    return plan_run(pool, model, request)


def run(args: argparse.Namespace) -> int:
    from swactor.orchestrator.errors import PlannerError

    try:
        planned = build_planned_run(args)
    except PlannerError as error:
        print(f"swactor plan: {error}", file=sys.stderr)
        return EXIT_PLAN_ERROR
    if args.json:
        print(json.dumps(planned.plan.to_json(), indent=2))
    else:
        print(render_plan(planned))
    return 0


def human_bytes(count: int) -> str:
    """`count` bytes as B / KiB / MiB / GiB with one decimal."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def footprint_text(actual: StageFootprint | None, predicted: StageMemory | None) -> str:
    """A stage's memory at ready as its worker measured it, beside the plan's prediction
    ("" when the worker reported none): what `swactor run` prints per stage."""
    if actual is None:
        return ""
    ratio = actual.weights_bytes / actual.file_bytes if actual.file_bytes else 0.0
    weights = (f"{human_bytes(actual.weights_bytes)} = {ratio:.2f}x its "
               f"{human_bytes(actual.file_bytes)} in the file")
    kv_cache = human_bytes(actual.kv_cache_bytes)
    if predicted is not None:
        weights += f" (predicted {human_bytes(predicted.weights)})"
        kv_cache += f" (predicted {human_bytes(predicted.kv_cache)})"
    return (f"weights {weights}, KV cache {kv_cache}, "
            f"worker RSS {human_bytes(actual.rss_bytes)}")


def _endpoint(endpoint: EdgeEndpoint) -> str:
    if endpoint.stage_index is None:
        return f"orchestrator@{endpoint.node_id}"
    return f"stage {endpoint.stage_index}@{endpoint.node_id}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in [header, *rows]]


def render_plan(planned: PlannedRun) -> str:
    """The plan as a readable text table."""
    plan = planned.plan
    model = plan.model
    dtype = f"{model.dtype_family.value.lower()}{8 * model.dtype_width_bytes}"
    sampling = plan.runtime.sampling
    sampling_text = sampling.mode.value.lower()
    if sampling.temperature is not None:
        sampling_text += (f" (temperature {sampling.temperature}, top_k {sampling.top_k}, "
                          f"top_p {sampling.top_p}, seed {sampling.seed})")
    stops = " ".join(str(i) for i in sorted(planned.stop_token_ids))
    lines = [
        f"run {plan.run_id}: model {model.model_id} ({model.num_layers} blocks, hidden "
        f"{model.hidden_dim}, {dtype}), {len(plan.stages)} stages",
        f"source {model.gguf_source.kind.value} {model.gguf_source.location}",
        f"max_seq_len {model.max_seq_len}, slots {model.slots}, max_tokens "
        f"{plan.max_tokens}, sampling {sampling_text}, eos {model.eos_token_id}, stop ids {stops}",
        "",
    ]
    stage_rows = []
    for stage, node, need in zip(plan.stages, planned.nodes, planned.stage_memory,
                                 strict=True):
        stage_rows.append([
            str(stage.stage_index), str(stage.node_id), node.device_kind,
            f"{stage.layer_start}..{stage.layer_end_exclusive}",
            str(stage.layer_end_exclusive - stage.layer_start),
            human_bytes(need.file_bytes), human_bytes(need.weights), f"{need.ratio:.2f}x",
            human_bytes(need.kv_cache), human_bytes(need.total),
            human_bytes(node.usable_memory_bytes),
            str(stage.inbound_edge), str(stage.outbound_edge),
        ])
    lines += _table(["stage", "node", "device", "layers", "blocks", "in file", "weights",
                     "x file", "kv cache", "est. memory", "node memory", "in edge",
                     "out edge"], stage_rows)
    lines.append(f"memory predicted for --weights {planned.weights}: weights as the stage "
                 "holds them, KV cache for slots x max_seq_len; Python and tinygrad add "
                 "~0.3-0.5 GiB per node")
    lines.append("")
    edge_rows = []
    for edge in plan.edges:
        spec = edge.object_spec
        edge_rows.append([
            str(edge.edge_id), edge.kind.value, _endpoint(edge.producer),
            _endpoint(edge.consumer),
            f"{spec.kind.value} {spec.dtype_family.value.lower()}{8 * spec.dtype_width_bytes}",
            human_bytes(spec.max_extent), human_bytes(edge.ring_spec.data_capacity),
        ])
    lines += _table(["edge", "kind", "producer", "consumer", "object", "max extent",
                     "ring"], edge_rows)
    return "\n".join(lines)
