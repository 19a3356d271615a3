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
3. **llama.cpp** — when ``llama_cpp`` imports here, or the reference venv (built by
   ``just reference`` in ``~/.cache/swactor/venv-reference``) exists, its decode tokens/s
   on the same file and thread count, and the ratio (goal 0.8x); then its warm prefill of
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
llm = llama_cpp.Llama(model_path=path, n_ctx=512, n_threads=threads, verbose=False,
                      logits_all=True)  # else llm.scores stays zero (0.3.x): token 0 fed back
ids = llm.tokenize(b"hello world", add_bos=False)
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
# logits for the last position only, as a stage computes them
llm = llama_cpp.Llama(model_path=path, n_ctx=512, n_batch=512, n_threads=threads,
                      verbose=False)
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
    decode_s: float  # median step
    cpu_ms: float  # per decode step, all threads
    kernels: int | None
    decode_bytes: int  # weight bytes one decode step reads
    tokens: list[int]


def _decode_bytes(role: StageRole) -> int:
    """Weight bytes a decode step reads: every weight the role holds on the device (block
    matrices as held), not the host embedding (a row gather)."""
    weights, _ = role.memory_bytes()
    embedding = role.token_embd
    return weights - (0 if embedding is None else int(embedding.nbytes))


def single_stage(
    path: Path, variant: str, tokens: int, prompt_len: int, beam: int
) -> Run:
    dtype, weights_mode, *rest = variant.split(":")
    blocks = weights_mode == "blocks"
    reader = GgufRangeReader(LocalFileSource(path))
    t0 = time.perf_counter()
    weights = reader.load_stage(0, 30, is_first=True, is_last=True, dtype=dtype,
                                keep_blocks=blocks)
    role = StageRole(weights, max_seq_len=prompt_len + tokens + 8, beam=beam,
                     cpu_graph="nograph" not in rest, quantised=blocks)
    load_s = time.perf_counter() - t0
    prompt = np.array(_prompt(prompt_len), dtype=np.int32)
    t0 = time.perf_counter()
    role.step(0, prompt)
    cold_prefill_s = time.perf_counter() - t0
    role.step(0, prompt)  # the prefill JIT's capture
    t0 = time.perf_counter()
    out = role.step(0, prompt)  # replayed
    prefill_s = time.perf_counter() - t0
    steps: list[float] = []
    generated = [int(out[0])]
    cpu_start = 0.0
    for sequence in range(1, tokens + 1):
        if sequence == 4:
            cpu_start = time.process_time()
        t0 = time.perf_counter()
        out = role.step(sequence, out)
        steps.append(time.perf_counter() - t0)
        generated.append(int(out[0]))
    cpu_per_token = (time.process_time() - cpu_start) / max(1, tokens - 3)
    return Run(load_s, cold_prefill_s, prompt_len / prefill_s, statistics.median(steps[3:]),
               cpu_per_token * 1e3, role.decode_kernel_count(), _decode_bytes(role),
               generated)


def run_variant(
    path: Path, variant: str, args: argparse.Namespace, first_tokens: list[int] | None
) -> tuple[float, float, list[int]]:
    """Run ``variant`` ``--repeat`` times; print one line; return (decode tok/s, warm
    prefill tok/s, tokens)."""
    runs = [single_stage(path, variant, args.tokens, args.prompt_len, args.beam)
            for _ in range(args.repeat)]
    decode_s = statistics.median(r.decode_s for r in runs)
    prefill = statistics.median(r.prefill_tok_s for r in runs)
    cpu_ms = statistics.median(r.cpu_ms for r in runs)
    same = "" if first_tokens is None else (
        "; greedy tokens = first variant's" if runs[0].tokens == first_tokens
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
    return 1 / decode_s, prefill, runs[0].tokens


def reference_venv() -> Path:
    """Where ``just reference`` builds llama.cpp's binding (outside the checkout)."""
    configured = os.environ.get("SWACTOR_REFERENCE_VENV")
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "swactor" / "venv-reference"


def llama_cpp_decode(path: Path, threads: int, tokens: int) -> float | None:
    """llama.cpp's median decode tok/s on ``path`` with ``threads`` (None: not built)."""
    return _llama_cpp(_LLAMA_CPP_SCRIPT, [str(path), str(threads), str(tokens)])


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
    args = parser.parse_args(argv)
    if args.dtypes:
        args.variants = ",".join(f"{d}:{w}" for d in args.dtypes.split(",")
                                 for w in ("dense", "blocks"))
    path = default_model_path()
    if not path.is_file():
        print(f"bench model: {path} missing; run scripts/setup.sh", file=sys.stderr)
        return 1
    from tinygrad.device import Device

    threads = os.cpu_count() or 1
    print(f"device {Device.DEFAULT}, {threads} CPUs, load average {os.getloadavg()[0]:.1f}")
    bytes_per_stage(path)
    print(f"single stage, SmolLM2-135M (30 blocks), median of {args.repeat} runs, beam "
          f"{args.beam}:")
    ours: dict[str, float] = {}
    prefills: dict[str, float] = {}
    first_tokens: list[int] | None = None
    for variant in args.variants.split(","):
        ours[variant], prefills[variant], tokens = run_variant(path, variant, args,
                                                                first_tokens)
        first_tokens = first_tokens or tokens
    best_variant = max(ours, key=lambda v: ours[v])
    best = ours[best_variant]
    print(f"  fastest: {best_variant}")
    reference = llama_cpp_decode(path, threads, args.tokens)
    if reference is None:
        print("  llama.cpp: skipped (llama_cpp does not import and no reference venv; "
              "`just reference` builds it)")
    else:
        print(f"  llama.cpp decode {reference:.1f} tok/s on {threads} threads; ours/llama.cpp "
              f"= {best / reference:.2f}x (goal 0.8x)")
        theirs = llama_cpp_prefill(path, threads, _prompt(args.prompt_len))
        if theirs is not None:
            print(f"  llama.cpp prefill {args.prompt_len} tokens {theirs:.1f} tok/s warm on "
                  f"{threads} threads; ours ({best_variant}) / llama.cpp = "
                  f"{prefills[best_variant] / theirs:.2f}x (goal 0.5x)")
        if threads > 1:
            # tinygrad's CPU backend runs a step's kernels one after another on one core
            single = llama_cpp_decode(path, 1, args.tokens)
            if single is not None:
                print(f"  llama.cpp decode {single:.1f} tok/s on 1 thread (ours runs its kernels "
                      f"on one core); ours/llama.cpp 1 thread = {best / single:.2f}x")
    print(f"load average now {os.getloadavg()[0]:.1f}")
    return 0
