"""SmolLM2-135M on this machine: decode and prefill tokens/s, bytes read per stage.

Theory of operation
-------------------
One run, CPU (or whatever ``tinygrad.Device.DEFAULT`` is):

1. **Bytes per stage.** The model is split 10/10/10 blocks; each stage opens its own
   :class:`LocalFileSource`, reads the header and its tensors, and we print bytes read
   over its *share* (the bytes of the tensors it needs) and over the whole file.
2. **Single stage, per variant** (``--variants``, each ``dtype:weights[:nograph]``):
   ``dtype`` is the plan's compute dtype (f16/f32); ``weights`` ``dense`` decodes from
   weights dequantised at load, ``blocks`` from the file's quantised blocks; ``nograph``
   replays the decode JIT kernel by kernel from Python instead of through
   :class:`~swactor.model.cpu_graph.CpuGraph` (the step before it). Load, prefill a
   ``--prompt-len`` prompt three times (the first run builds kernels, the second captures
   the prefill JIT; the third, a replay, is reported as warm),
   then greedy-decode ``--tokens`` tokens through the decode JIT; the first three decode
   steps (kernel build, JIT capture) are excluded. Each variant is run ``--repeat`` times
   and the median of the runs' median decode step is printed, with prefill tokens/s,
   kernels per decode step, CPU ms per decode step and the weight bytes the decode reads
   per token over the step time (decode reads every weight once per token). The greedy
   tokens of every variant are compared with the first one's.
   Decode is measured at every ``--threads`` count (default 1 and the CPU count): the
   counts take turns step by step in one greedy sequence, each step's phases running on
   that many threads (:func:`~swactor.model.cpu_graph.set_threads`), so the machine's load
   falls on every count alike. The variant's line shows the default count (the CPU count,
   what nodes run); a second line gives every count side by side, and whether the
   sequence's greedy tokens equal those of the same sequence decoded again on the first
   count alone (they must: a row computes the same on any thread); a third the pool's
   counts (replays shared with the workers, stalls).
   ``--profile`` also traces one decode step with every slice on one thread and prints
   the kernels tinygrad cut into ``core_id`` slices: how many, and their share of the
   step.
3. **llama.cpp** — when ``llama_cpp`` imports here, or the reference venv (built by
   ``just reference`` in ``~/.cache/swactor/venv-reference``) exists, its decode tokens/s
   on the same file and thread count, after the same ``--prompt-len`` prompt ids (so both
   decode at the same depth: attention grows with it), and the ratio (goal 0.8x), and on
   one thread against ours on one thread; then its warm prefill of
   the same ``--prompt-len`` prompt ids (the median of three after a first evaluation,
   logits of the last position only, as a stage computes them) against the fastest
   variant's warm prefill (goal 0.5x). Otherwise the column is skipped with a note.

The machine is shared: the load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from swactor.model import cpu_graph
from swactor.model.gguf_range import GgufRangeReader
from swactor.model.llama_role import StageRole
from swactor.model.paths import default_model_path
from swactor.model.source import LocalFileSource

TEXT = (
    "The history of computing is a story of abstractions piled on abstractions: relays "
    "became vacuum tubes, tubes became transistors, and transistors became the integrated "
    "circuits that now fill every pocket. Each layer hid the one below it, and each made "
    "the next possible. Programmers who once wired plugboards by hand now describe whole "
    "distributed systems in a few lines of configuration."
)

# the per-kernel replay (the step before CpuGraph), then the graph with dense and block weights
DEFAULT_VARIANTS = "f16:dense:nograph,f16:dense,f16:blocks,f32:dense,f32:blocks"

_LLAMA_CPP_SCRIPT = r"""
import sys, time, llama_cpp, numpy as np
path, threads, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
prompt = [int(i) for i in sys.argv[4].split(",")] if len(sys.argv) > 4 else []
llm = llama_cpp.Llama(model_path=path, n_ctx=max(512, len(prompt) + n + 8), n_batch=512,
                      n_threads=threads, verbose=False,
                      logits_all=True)  # else llm.scores stays zero (0.3.x): token 0 fed back
ids = prompt or llm.tokenize(b"hello world", add_bos=False)
llm.eval(ids)
times = []
for _ in range(n):
    tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    t = time.perf_counter(); llm.eval([tok]); times.append(time.perf_counter() - t)
times = sorted(times[3:])
print(1.0 / times[len(times) // 2])
"""


_LLAMA_CPP_PREFILL = r"""
import sys, time, llama_cpp
path, threads, ids = sys.argv[1], int(sys.argv[2]), [int(i) for i in sys.argv[3].split(",")]
# logits for the last position only, as a stage computes them; a context that holds
# the prompt (llama.cpp refuses a longer one), taken in batches of 512
llm = llama_cpp.Llama(model_path=path, n_ctx=max(512, len(ids)), n_batch=512,
                      n_threads=threads, verbose=False)
llm.eval(ids)  # the first evaluation: buffers and repacked weights
times = []
for _ in range(3):
    llm.reset()
    t = time.perf_counter(); llm.eval(ids); times.append(time.perf_counter() - t)
print(len(ids) / sorted(times)[1])
"""


def _prompt(length: int) -> list[int]:
    try:
        from swactor.model.tokenizer import Tokenizer

        ids = list(Tokenizer.from_gguf(default_model_path()).encode(TEXT))
    except Exception:  # the tokenizer is optional for this figure
        ids = list(range(1000, 1000 + length))
    while len(ids) < length:
        ids += ids
    return ids[:length]


def bytes_per_stage(path: Path) -> None:
    size = path.stat().st_size
    print(f"3-stage split of {path.name} ({size / 1e6:.1f} MB):")
    for index, (start, end) in enumerate([(0, 10), (10, 20), (20, 30)]):
        source = LocalFileSource(path)
        reader = GgufRangeReader(source)
        weights = reader.load_stage(start, end, is_first=index == 0, is_last=index == 2)
        share = weights.tensor_bytes
        print(
            f"  stage {index} blocks [{start:2d},{end:2d}): read {source.bytes_read / 1e6:6.1f} MB"
            f" (header {reader.header_bytes / 1e6:.1f} MB + tensors "
            f"{weights.bytes_read / 1e6:.1f} MB) = {source.bytes_read / share:.3f}x its share "
            f"of {share / 1e6:.1f} MB, {source.bytes_read / size:.2f} of the file"
        )


@dataclass
class Run:
    """One single-stage run of a variant."""

    load_s: float
    cold_prefill_s: float
    prefill_tok_s: float
    decode_s: dict[int, float]  # median step by replay threads
    cpu_ms: dict[int, float]  # per decode step, all threads of the process
    kernels: int | None
    decode_bytes: int  # weight bytes one decode step reads
    tokens: dict[int, list[int]]
    profile: list[str]  # --profile's lines
    pools: dict[int, dict[str, int]]  # replay pool counts over the decode, by threads


def _decode_bytes(role: StageRole) -> int:
    """Weight bytes a decode step reads: every weight the role holds on the device (block
    matrices as held), not the host embedding (a row gather)."""
    weights, _ = role.memory_bytes()
    embedding = role.token_embd
    return weights - (0 if embedding is None else int(embedding.nbytes))


def single_stage(
    path: Path, variant: str, args: argparse.Namespace, thread_counts: list[int]
) -> Run:
    """Load, prefill and decode ``variant`` once; decode again at each thread count
    (a graph-less variant: only the first, its slices run one after another anyway)."""
    tokens, prompt_len = args.tokens, args.prompt_len
    dtype, weights_mode, *rest = variant.split(":")
    blocks = weights_mode == "blocks"
    graph = "nograph" not in rest
    reader = GgufRangeReader(LocalFileSource(path))
    t0 = time.perf_counter()
    weights = reader.load_stage(0, 30, is_first=True, is_last=True, dtype=dtype,
                                keep_blocks=blocks)
    role = StageRole(weights, max_seq_len=prompt_len + tokens + 8, beam=args.beam,
                     cpu_graph=graph, quantised=blocks)
    load_s = time.perf_counter() - t0
    prompt = np.array(_prompt(prompt_len), dtype=np.int32)
    t0 = time.perf_counter()
    role.step(0, prompt)
    cold_prefill_s = time.perf_counter() - t0
    role.step(0, prompt)  # the prefill JIT's capture
    t0 = time.perf_counter()
    role.step(0, prompt)  # replayed
    prefill_s = time.perf_counter() - t0
    counts = thread_counts if graph else thread_counts[:1]
    default = cpu_graph.threads()
    steps: dict[int, list[float]] = {t: [] for t in counts}
    cpus: dict[int, list[float]] = {t: [] for t in counts}
    pools: dict[int, dict[str, int]] = {}
    generated: dict[int, list[int]] = {}
    try:
        # the counts take turns step by step in one sequence (slices compute the same
        # numbers on any count), so the machine's load falls on all of them alike
        out = role.step(0, prompt)  # a replayed prefill restarts the sequence
        before = {}
        for t in counts:
            cpu_graph.set_threads(t)
            before[t] = cpu_graph.pool_stats()
        mixed = [int(out[0])]
        for sequence in range(1, tokens + 1):
            threads = counts[sequence % len(counts)]
            cpu_graph.set_threads(threads)
            t0, c0 = time.perf_counter(), time.process_time()
            out = role.step(sequence, out)
            if sequence > 3:  # kernel build and JIT capture before
                steps[threads].append(time.perf_counter() - t0)
                cpus[threads].append(time.process_time() - c0)
            mixed.append(int(out[0]))
        for t in counts:
            cpu_graph.set_threads(t)
            after = cpu_graph.pool_stats()
            pools[t] = {k: after[k] - before[t][k] for k in after}
            generated[t] = mixed
        if len(counts) > 1:  # the same sequence on one count alone: the same tokens
            cpu_graph.set_threads(counts[0])
            out = role.step(0, prompt)
            alone = [int(out[0])]
            for sequence in range(1, tokens + 1):
                out = role.step(sequence, out)
                alone.append(int(out[0]))
            generated[counts[0]] = alone
    finally:
        cpu_graph.set_threads(default)
    decode = {t: statistics.median(steps[t]) for t in counts}
    cpu_ms = {t: 1e3 * statistics.mean(cpus[t]) for t in counts}
    profile = _profile(role, tokens) if args.profile and graph else []
    return Run(load_s, cold_prefill_s, prompt_len / prefill_s, decode, cpu_ms,
               role.decode_kernel_count(), _decode_bytes(role), generated, profile, pools)


def _profile(role: StageRole, position: int) -> list[str]:
    """One decode step traced with every slice on the calling thread: the kernels cut
    into ``core_id`` slices and the phases of 2+ rows (what runs on several threads),
    their shares of the step, the slowest kernels."""
    replay = role._decode_runner.replay
    if replay is None:
        return ["    profile: the decode step has no CpuGraph replay (graph off or not CPU)"]
    times = []
    phases: list[tuple[int, int]] = []  # rows, ns
    for graph in replay.graphs:
        trace = graph.trace({"start_pos": position}, sequential=True)
        times += graph.kernel_times(trace)
        phases += [(rows, int(trace[first : first + rows, 4].sum()))
                   for first, rows in graph.phases.tolist()]
    total = sum(t.ns for t in times) or 1
    sliced = [t for t in times if t.slices > 1]
    share = sum(t.ns for t in sliced) / total
    by_slices = sorted({t.slices for t in sliced})
    wide = [ns for rows, ns in phases if rows > 1]
    lines = [f"    profile (one step, slices in turn): {len(times)} kernels, {total / 1e6:.2f} "
             f"ms; {len(sliced)} cut into slices ({', '.join(map(str, by_slices)) or '-'}) "
             f"= {share:.0%} of the step; {len(phases)} phases, {len(wide)} of 2+ rows = "
             f"{sum(wide) / total:.0%} of the step"]
    for t in sorted(times, key=lambda t: -t.ns)[:8]:
        lines.append(f"      {t.ns / 1e3:7.1f} us  {t.slices:2d} slice(s)  {t.name}")
    return lines


def run_variant(
    path: Path, variant: str, args: argparse.Namespace, first_tokens: list[int] | None,
    thread_counts: list[int],
) -> tuple[dict[int, float], float, list[int]]:
    """Run ``variant`` ``--repeat`` times; print its lines; return (decode tok/s by
    threads, warm prefill tok/s, tokens at the default threads)."""
    runs = [single_stage(path, variant, args, thread_counts) for _ in range(args.repeat)]
    measured = list(runs[0].decode_s)
    default = cpu_graph.threads() if cpu_graph.threads() in measured else measured[-1]
    rates = {t: 1 / statistics.median(r.decode_s[t] for r in runs) for t in measured}
    decode_s = 1 / rates[default]
    prefill = statistics.median(r.prefill_tok_s for r in runs)
    cpu_ms = statistics.median(r.cpu_ms[default] for r in runs)
    tokens = runs[0].tokens[default]
    same = "" if first_tokens is None else (
        "; greedy tokens = first variant's" if tokens == first_tokens
        else "; greedy tokens DIFFER from the first variant's")
    # "<name> (beam N): ... decode X tok/s median" is the line bench/report.py parses
    print(
        f"  {variant.replace(':', '_')} (beam {args.beam}): decode {1 / decode_s:6.1f} tok/s "
        f"median ({decode_s * 1e3:5.1f} ms, "
        f"CPU {cpu_ms:5.1f} ms/token, {runs[0].kernels} kernels/token, reads "
        f"{runs[0].decode_bytes / 1e6:.0f} MB/token = {runs[0].decode_bytes / decode_s / 1e9:.1f}"
        f" GB/s); prefill {args.prompt_len} tokens {prefill:6.1f} tok/s warm "
        f"({runs[0].cold_prefill_s:.1f} s cold); load {runs[0].load_s:.1f} s{same}"
    )
    if len(measured) > 1:
        # the counts in turn vs the first count alone
        equal = all(r.tokens[t] == r.tokens[measured[0]] for r in runs for t in measured)
        side = ", ".join(f"{t} thread{'s' if t > 1 else ''} {rates[t]:.1f} tok/s "
                         f"(CPU {statistics.median(r.cpu_ms[t] for r in runs):.1f} ms/token)"
                         for t in measured)
        print(f"    decode by threads: {side}; {measured[-1]}/{measured[0]} = "
              f"{rates[measured[-1]] / rates[measured[0]]:.2f}x; greedy tokens "
              f"{'equal' if equal else 'DIFFER'} (counts in turn / {measured[0]} alone)")
        pool = runs[0].pools[measured[-1]]
        if pool["replays"]:
            print(f"    {measured[-1]} threads: {pool['shared']} of {pool['replays']} replays "
                  f"shared with the workers, {pool['stalls']} stalls (a worker off its core "
                  f"holding a row), {pool['worker_rows']} rows run by workers")
    for line in runs[0].profile:
        print(line)
    return rates, prefill, tokens


def reference_venv() -> Path:
    """Where ``just reference`` builds llama.cpp's binding (outside the checkout)."""
    configured = os.environ.get("SWACTOR_REFERENCE_VENV")
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "swactor" / "venv-reference"


def llama_cpp_decode(path: Path, threads: int, tokens: int,
                     prompt: list[int] | None = None) -> float | None:
    """llama.cpp's median decode tok/s on ``path`` with ``threads`` (None: not built),
    decoding after ``prompt`` (default: the two tokens of "hello world")."""
    extra = [",".join(str(i) for i in prompt)] if prompt else []
    return _llama_cpp(_LLAMA_CPP_SCRIPT, [str(path), str(threads), str(tokens), *extra])


def llama_cpp_prefill(path: Path, threads: int, prompt: list[int]) -> float | None:
    """llama.cpp's warm prefill tok/s of ``prompt`` (median of 3; None: not built)."""
    return _llama_cpp(_LLAMA_CPP_PREFILL, [str(path), str(threads),
                                           ",".join(str(i) for i in prompt)])


def _llama_cpp(script: str, args: list[str]) -> float | None:
    """Run ``script`` where llama_cpp imports; the float on its last line."""
    candidates = []
    try:
        import llama_cpp  # type: ignore[import-not-found]  # noqa: F401

        candidates.append(sys.executable)
    except ImportError:
        pass
    reference = reference_venv() / "bin" / "python"
    if reference.exists():
        candidates.append(str(reference))
    for python in candidates:
        result = subprocess.run(
            [python, "-c", script, *args],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if result.returncode == 0:
            return float(result.stdout.strip().splitlines()[-1])
        print(f"  llama.cpp via {python} failed: {result.stderr.strip().splitlines()[-1:]}")
    return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench model")
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--prompt-len", type=int, default=64)
    # BEAM=2 searched SmolLM2's decode kernels for 15 min on 2 shared cores and then decoded
    # within 5% of the hand-shaped kernels (34.0 vs 35.9 CPU ms/token), so it is opt-in
    parser.add_argument("--beam", type=int, default=0, help="tinygrad BEAM for decode kernels")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS,
                        help="comma-separated dtype:weights[:nograph] (module doc)")
    parser.add_argument("--dtypes", help="shorthand: dtype:dense and dtype:blocks for each")
    parser.add_argument("--repeat", type=int, default=3, help="runs per variant (median)")
    parser.add_argument("--threads", default=None, metavar="N,M,...",
                        help="replay thread counts to decode with, side by side (default: "
                        "1 and the CPU count); the variant line shows the CPU count's")
    parser.add_argument("--profile", action="store_true",
                        help="trace one decode step: kernels cut into thread slices and "
                        "their share of the step")
    args = parser.parse_args(argv)
    if args.dtypes:
        args.variants = ",".join(f"{d}:{w}" for d in args.dtypes.split(",")
                                 for w in ("dense", "blocks"))
    path = default_model_path()
    if not path.is_file():
        print(f"bench model: {path} missing; run scripts/setup.sh", file=sys.stderr)
        return 1
    from tinygrad.device import Device

    threads = cpu_graph.threads()  # the replay's default: the CPUs this process may use
    counts = ([int(t) for t in args.threads.split(",")] if args.threads
              else sorted({1, threads}))
    print(f"device {Device.DEFAULT}, {cpu_graph.cpu_count()} CPUs, replay threads "
          f"{threads}{'' if cpu_graph.NATIVE else ' (no native replay pool: 1)'}, load "
          f"average {os.getloadavg()[0]:.1f}")
    bytes_per_stage(path)
    print(f"single stage, SmolLM2-135M (30 blocks), median of {args.repeat} runs, beam "
          f"{args.beam}:")
    ours: dict[str, dict[int, float]] = {}
    prefills: dict[str, float] = {}
    first_tokens: list[int] | None = None
    for variant in args.variants.split(","):
        ours[variant], prefills[variant], tokens = run_variant(path, variant, args,
                                                                first_tokens, counts)
        first_tokens = first_tokens or tokens

    def rate(variant: str, count: int) -> float:
        rates = ours[variant]
        return rates.get(count, rates[min(rates)])  # graph-less: its one measured count

    best_variant = max(ours, key=lambda v: rate(v, threads))
    best = rate(best_variant, threads)
    print(f"  fastest: {best_variant}")
    prompt = _prompt(args.prompt_len)  # llama.cpp decodes at the depth ours did
    reference = llama_cpp_decode(path, threads, args.tokens, prompt)
    if reference is None:
        print("  llama.cpp: skipped (llama_cpp does not import and no reference venv; "
              "`just reference` builds it)")
    else:
        print(f"  llama.cpp decode {reference:.1f} tok/s on {threads} threads; ours/llama.cpp "
              f"= {best / reference:.2f}x (goal 0.8x)")
        theirs = llama_cpp_prefill(path, threads, prompt)
        if theirs is not None:
            print(f"  llama.cpp prefill {args.prompt_len} tokens {theirs:.1f} tok/s warm on "
                  f"{threads} threads; ours ({best_variant}) / llama.cpp = "
                  f"{prefills[best_variant] / theirs:.2f}x (goal 0.5x)")
        if threads > 1 and 1 in ours[best_variant]:
            single = llama_cpp_decode(path, 1, args.tokens, prompt)
            if single is not None:
                print(f"  llama.cpp decode {single:.1f} tok/s on 1 thread; ours "
                      f"({best_variant}) on 1 thread / llama.cpp 1 thread = "
                      f"{ours[best_variant][1] / single:.2f}x")
    print(f"load average now {os.getloadavg()[0]:.1f}")
    return 0
