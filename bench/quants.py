"""Decode tokens/s per quantisation type against llama.cpp on the same file and threads.

Theory of operation: the files are SmolLM2 requantised by llama.cpp's own quantiser
(`tests/model/llama_cpp_quants.py`, `just quants`: Q4_K_M, Q5_K_M, Q6_K, Q8_0, Q4_0,
Q3_K_S, Q2_K-pure, made once into the model cache), plus the shipped Q4_1. For each
file, one after another in this process: our single stage over all 30 blocks as a node holds it
(weights in blocks, f32; `bench.model.single_stage`: prefill ``--prompt-len`` positions,
then ``--tokens`` greedy decode steps, the median step after the first three, once with
the step's kernels on 1 thread and once on every CPU), then llama.cpp's decode on the
same file (`bench.model.llama_cpp_decode`, a subprocess in the reference venv) on 1
thread and on every CPU, and the ratios at equal thread counts. Wall-clock rates on a shared
machine move with its load between one measurement and the next, so the CPU time per
decode token is printed too, ours and llama.cpp's on 1 thread (each process's own CPU
time over the decode steps after the first three; ours on 1 thread), with their ratio:
llama.cpp's CPU
per token over ours, the speed ratio an idle core would show. The tensor types the file holds
are printed beside it (llama.cpp's `_M` mixes fall back to Q5_0/Q8_0 for SmolLM2's
576-wide rows, which are not a multiple of 256).

Without the reference venv (`just reference` builds it; CI does not) the files cannot be
made or timed against: the benchmark says so and measures nothing (exit status 0).
The machine is shared: the load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import os
import subprocess
from collections import Counter
from pathlib import Path

from gguf import GGUFReader

from bench.model import llama_cpp_decode, single_stage
from swactor.model.cpu_graph import cpu_count
from swactor.model.paths import default_model_path

_LLAMA_CPP_CPU = r"""
import sys, time, llama_cpp, numpy as np
path, n = sys.argv[1], int(sys.argv[2])
llm = llama_cpp.Llama(model_path=path, n_ctx=512, n_threads=1, verbose=False,
                      logits_all=True)
llm.eval(llm.tokenize(b"hello world", add_bos=False))
for i in range(n):
    if i == 3:
        start = time.process_time()
    llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
print((time.process_time() - start) / (n - 3) * 1e3)
"""


def llama_cpp_cpu_ms(path: Path, tokens: int) -> float | None:
    """llama.cpp's CPU milliseconds per decode token on 1 thread (reference venv)."""
    from tests.model.llama_cpp_quants import reference_python

    done = subprocess.run([str(reference_python()), "-c", _LLAMA_CPP_CPU, str(path),
                           str(max(tokens, 8))], capture_output=True, text=True, timeout=600,
                          check=False)
    if done.returncode != 0:
        return None
    return float(done.stdout.strip().splitlines()[-1])


def _types(path: Path) -> str:
    counts = Counter(t.tensor_type.name for t in GGUFReader(str(path)).tensors)
    return " ".join(f"{name}x{n}" for name, n in counts.most_common() if name != "F32")


def main(argv: list[str]) -> int:
    from tests.model.llama_cpp_quants import QUANT_KINDS, ensure_quant, reference_ready

    parser = argparse.ArgumentParser(prog="python -m bench quants",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--kinds", default=",".join(QUANT_KINDS),
                        help="comma-separated (default: every kind made)")
    args = parser.parse_args(argv)
    why_not = reference_ready()
    if why_not is not None:
        print(f"bench quants: skipped: {why_not}")
        return 0
    from tinygrad.device import Device

    threads = cpu_count()
    print(f"device {Device.DEFAULT}, {threads} CPUs, load average {os.getloadavg()[0]:.1f}; "
          f"ours: 1 stage, blocks, f32, median decode step of {args.tokens}")
    print(f"{'file':8s} {'MiB':>5s}  {'ours 1 thr':>10s}  {'llama.cpp 1 thr':>15s}  "
          f"{'ratio':>5s}  {f'ours {threads} thr':>10s}  {f'llama.cpp {threads} thr':>15s}  "
          f"{'ratio':>5s}  {'CPU ms/tok ours':>15s}  {'llama.cpp 1 thr':>15s}  {'ratio':>5s}  "
          "tensor types")
    files = [("Q4_1", default_model_path())]
    files += [(kind, ensure_quant(kind)) for kind in args.kinds.split(",")]
    settings = argparse.Namespace(tokens=args.tokens, prompt_len=args.prompt_len, beam=0,
                                  profile=False)
    for kind, path in files:
        run = single_stage(path, "f32:blocks", settings, sorted({1, threads}))
        ours = 1.0 / run.decode_s[1]
        ours_many = 1.0 / run.decode_s[threads]
        one = llama_cpp_decode(path, 1, args.tokens)
        many = llama_cpp_decode(path, threads, args.tokens) if threads > 1 else one
        cpu = llama_cpp_cpu_ms(path, args.tokens)
        if one is None or many is None or cpu is None:
            print(f"{kind:8s} llama.cpp failed on {path}")
            return 1
        print(f"{kind:8s} {path.stat().st_size / (1 << 20):5.0f}  {ours:10.1f}  {one:15.1f}  "
              f"{ours / one:5.2f}  {ours_many:10.1f}  {many:15.1f}  {ours_many / many:5.2f}  "
              f"{run.cpu_ms[1]:15.1f}  {cpu:15.1f}  {cpu / run.cpu_ms[1]:5.2f}  "
              f"{_types(path)}", flush=True)
    print(f"load average now {os.getloadavg()[0]:.1f}")
    return 0
