"""Batched decode on SmolLM2: CPU time per step and tokens/s for B rows per step, side by side.

Theory of operation
-------------------
One single-stage role (all 30 blocks, ``--dtype``/``--weights``, default f32 blocks as
a plan's defaults) with 8 KV slots (or ``max(--sizes)``), slots ``0..max(--sizes)-1``
each prefilled with its own prompt. ``StageRole.warm_up(rows=...)`` builds (or loads
from the kernel cache) the decode JIT of every batch size first, so no build is timed.
Then ``--rounds`` rounds; each round runs ``--steps`` decode steps of every batch size ``B`` in turn
(``StageRole.run_batch`` with the decode rows of slots ``0..B-1``; ``B = 1`` is the
one-row decode), so every size sees the same machine load and the same positions.
Decode replays run on ``--threads`` threads (default the CPU count, as nodes run).
Per size: the median step's wall time, CPU time per step (this process, all threads:
a figure the machine's load barely moves), tokens/s (``B`` over the median step) and the
ratios to ``B = 1``: tokens per CPU second, and tokens/s. A batch reads every weight once
for all its rows, so the CPU ratio is what batching buys a stage; the attention and the
per-row kernels grow with ``B``.

The role runs on tinygrad's default device (``DEV``): on a GPU, the GPU path. With
``--portable`` a CPU device runs that path too (tinygrad's own kernels, no C kernel:
``StageRole(portable=True)``). ``DEV=NULL NULL_ALLOW_COPYOUT=1`` runs it on tinygrad's
NULL device, whose kernels do nothing and whose copies return garbage: the figures are
then the host side of a GPU's step alone (Python, the JIT's replay, the copies' calls),
the part that bounds a small model's decode on a fast GPU. Away from the CPU path each
size also says how many kernels its step's graph launches and how many of them are graph
nodes whose arguments tinygrad rewrites at every replay (those reading the position, a
slot or an input buffer: :func:`graph_nodes`), one driver call each on a GPU.

The machine is shared: the load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
from tinygrad.engine.jit import CapturedJit, GraphRunner
from tinygrad.engine.realize import graph_cache
from tinygrad.tensor import Tensor
from tinygrad.uop import Ops

from swactor.model import cpu_graph
from swactor.model.gguf_range import open_reader
from swactor.model.llama_role import StageRole
from swactor.model.paths import default_model_path
from swactor.wire.tags import SequenceTag


def graph_nodes(captured: CapturedJit[Tensor]) -> tuple[int, int]:
    """The kernels one replay of ``captured`` launches, and how many of them it updates:
    in a device graph, the nodes tinygrad's ``GraphRunner`` lists for new input buffers,
    variable values or launch sizes at each replay; outside any graph, every kernel (each
    launched with its arguments). Read after a replay: graphs are built on the first."""
    kernels = updated = 0
    for call in captured.linear.src:
        head = call.src[0]
        runner = (graph_cache.get(head)
                  if head.op is Ops.CUSTOM_FUNCTION and head.arg == "graph" else None)
        if isinstance(runner, GraphRunner):
            kernels += len(runner.calls)
            updated += len({j for j, replace in enumerate(runner.uop_replace) if replace}
                           | runner.var_vals_replace.keys() | runner.launch_dims_replace.keys())
        elif head.op is Ops.PROGRAM:
            kernels += 1
            updated += 1
    return kernels, updated


def add_threads_option(parser: argparse.ArgumentParser) -> None:
    """``--threads``: the replay threads a single-process benchmark steps on."""
    parser.add_argument("--threads", type=int, default=None,
                        help="replay threads (default: the CPU count, as nodes run)")


def apply_threads_option(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Set the replay threads ``--threads`` asked for (a usage error below 1)."""
    if args.threads is not None:
        if args.threads < 1:
            parser.error("--threads must be a positive integer")
        cpu_graph.set_threads(args.threads)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench batch", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1,2,4,8", help="rows per step (comma-separated)")
    parser.add_argument("--steps", type=int, default=4, help="steps per size per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtype", choices=("f32", "f16"), default="f32")
    parser.add_argument("--weights", choices=("blocks", "dense"), default="blocks")
    parser.add_argument("--portable", action="store_true",
                        help="on a CPU device, run the path every other device runs "
                             "(tinygrad's own kernels, no C kernel)")
    add_threads_option(parser)
    args = parser.parse_args(argv)
    apply_threads_option(parser, args)
    sizes = sorted({int(s) for s in args.sizes.split(",")})
    if not sizes or sizes[0] < 1:
        parser.error("--sizes must be positive integers")
    path = default_model_path()
    if not path.is_file():
        print(f"bench batch: {path} missing; run scripts/setup.sh", file=sys.stderr)
        return 1
    slots = max(8, *sizes)
    prompt_len = 8
    # 64 positions, as tests/model/test_batch_decode.py's role: their kernel cache entries
    # are shared (same role structure)
    max_seq = max(64, prompt_len + args.rounds * args.steps * len(sizes) + 1)
    blocks = args.weights == "blocks"
    t0 = time.perf_counter()
    weights = open_reader(path).load_stage(0, 30, is_first=True, is_last=True,
                                           dtype=args.dtype, keep_blocks=blocks)
    role = StageRole(weights, max_seq_len=max_seq, quantised=blocks, slots=slots,
                     portable=args.portable)
    device = role.device + (" (portable path)" if args.portable else "")
    if role.device.startswith("NULL"):
        device += " (kernels do nothing: host time only, tokens are garbage)"
        np.seterr(all="ignore")  # the garbage the NULL device copies out
    print(f"SmolLM2 single stage on {device}, {args.dtype} {args.weights}, {slots} slots "
          f"of {max_seq} positions, {cpu_graph.threads()} replay threads, load "
          f"{time.perf_counter() - t0:.1f} s, load average {os.getloadavg()[0]:.1f}",
          flush=True)
    t0 = time.perf_counter()
    role.warm_up(rows=[s for s in sizes if s > 1])
    print(f"  decode JITs for {sizes} rows ready in {time.perf_counter() - t0:.1f} s "
          f"(built, or loaded from the kernel cache)", flush=True)
    ids: list[int] = []
    for slot in range(max(sizes)):
        prompt = np.array([1, *range(1000 + 37 * slot, 1000 + 37 * slot + prompt_len - 1)],
                          dtype=np.int32)
        ids.append(int(role.run_tagged(SequenceTag(slot, 0), prompt)[0]))
    positions = [prompt_len] * max(sizes)
    walls: dict[int, list[float]] = {s: [] for s in sizes}
    cpus: dict[int, list[float]] = {s: [] for s in sizes}
    for _ in range(args.rounds):
        for size in sizes:
            for _ in range(args.steps):
                tags = [SequenceTag(s, positions[s]) for s in range(size)]
                rows = np.array(ids[:size], dtype=np.int32)
                c0, w0 = time.process_time(), time.perf_counter()
                out = role.run_batch(tags, rows)
                walls[size].append(time.perf_counter() - w0)
                cpus[size].append(time.process_time() - c0)
                for s in range(size):
                    ids[s], positions[s] = int(out[s]), positions[s] + 1
    print(f"  {args.rounds} rounds x {args.steps} steps per size, positions "
          f"{prompt_len}..{max(positions) - 1}, load average {os.getloadavg()[0]:.1f}:")
    base_cpu = statistics.mean(cpus[sizes[0]]) / sizes[0]
    base_tok_s = sizes[0] / statistics.median(walls[sizes[0]])
    for size in sizes:
        wall = statistics.median(walls[size])
        cpu = statistics.mean(cpus[size])
        tok_s = size / wall
        print(f"  B={size}: step {wall * 1e3:6.1f} ms median, CPU {cpu * 1e3:6.1f} ms/step "
              f"= {cpu * 1e3 / size:5.1f} ms/token, {tok_s:5.1f} tok/s; vs B={sizes[0]}: "
              f"tokens per CPU s {base_cpu / (cpu / size):4.2f}x, tok/s "
              f"{tok_s / base_tok_s:4.2f}x")
        graph = role.decode_graph(size)
        if role.portable and graph is not None:
            kernels, updated = graph_nodes(graph)
            print(f"         graph: {kernels} kernels, {updated} updated at each replay")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
