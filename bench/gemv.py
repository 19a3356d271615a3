"""The decode kernel alone: float path against integer paths, per product, side by side.

Theory of operation
-------------------
:mod:`swactor.model.decode_gemv` has two paths for a Q4_1/Q8_0 block product: the float
path (each block widened to floats, ``B`` rows of f32 multiply-adds) and the integer
path (each activation row quantised per block once per product, then integer dot
products; x86-64 targets take it), whose Q4_1 products take int8 activation codes
(``decode_gemv.EIGHT_BIT``) or int16 ones, as Q8_0's always do. This benchmark times one
product of SmolLM2's real shapes (Q4_1 ``qkv`` 960x576, ``gate_up`` 3072x576, ``down``
576x1536, ``wo`` 576x576; the Q8_0 output head 49152x576; random codes) for ``B`` rows
(up to 8 a batched decode step's, more a prompt's), on one and two replay threads: the
products of two inputs are one TinyJit replayed through the CPU replay graph
(:class:`~swactor.model.cpu_graph.DirectReplay`: the kernels, their slices on the pool,
nothing else). Per configuration the median of ``--repeat`` timed runs of ``--calls``
replays, the three paths interleaved so they see the same machine load; then the ratios
float / int16 and int16 / int8 (above 1: the second is faster). The load average is
printed. One product replayed over and over keeps its weights in cache (all but the
head's), so this is the kernels' arithmetic; a decode step streams its weights from
memory (``bench batch`` measures the whole step).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
from gguf import GGMLQuantizationType as Q
from tinygrad.engine.jit import TinyJit
from tinygrad.tensor import Tensor

from swactor.model import cpu_graph, decode_gemv
from swactor.model.block_kernels import DeviceQuant, to_device
from swactor.model.cpu_graph import DirectReplay
from swactor.model.dequant import QuantMatrix

SHAPES = {  # name: (block type, rows, cols)
    "qkv": (Q.Q4_1, 960, 576),
    "gate_up": (Q.Q4_1, 3072, 576),
    "down": (Q.Q4_1, 576, 1536),
    "wo": (Q.Q4_1, 576, 576),
    "head": (Q.Q8_0, 49152, 576),
}
_BYTES = {Q.Q4_1: 20, Q.Q8_0: 34}  # bytes per block of 32 weights


def _matrix(qtype: Q, rows: int, cols: int, rng: np.random.Generator) -> DeviceQuant:
    """Random codes with small positive f16 scales (the speed does not depend on them)."""
    blocks = rows * cols // 32
    raw = rng.integers(0, 256, size=(blocks, _BYTES[qtype]), dtype=np.uint8)
    scales = np.full(blocks, 0.01, dtype=np.float16).view(np.uint8).reshape(blocks, 2)
    raw[:, 0:2] = scales
    if qtype == Q.Q4_1:
        raw[:, 2:4] = scales
    return to_device(QuantMatrix(int(qtype), (rows, cols), raw.reshape(rows, -1)), "CPU")


PATHS = {"float": (False, False), "int16": (True, False), "int8": (True, True)}
"""Paths side by side: (decode_gemv.INTEGER, decode_gemv.EIGHT_BIT)."""


def _replay(path: str, matrix: DeviceQuant, x: Tensor, y: Tensor) -> Callable[[], None]:
    """The products of two inputs (a JIT of one kernel is no replay graph) as a directly
    replayed JIT on the chosen path."""
    decode_gemv.INTEGER, decode_gemv.EIGHT_BIT = PATHS[path]

    def step(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
        return decode_gemv.gemv(a, matrix).realize(), decode_gemv.gemv(b, matrix).realize()

    jit = TinyJit(step)
    for _ in range(3):  # run, capture, replay
        jit(x, y)
    assert jit.captured is not None
    direct = DirectReplay.of(jit.captured, (x.uop.base, y.uop.base), frozenset())
    assert direct is not None, "the product did not replay through CpuGraph"
    return lambda: direct.replay({})


def _time(run: Callable[[], None], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        run()
    return (time.perf_counter() - start) / calls / 2 * 1e3  # two products per call


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench gemv", description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help="products to time")
    parser.add_argument("--sizes", default="1,4,8,64",
                        help="activation rows B (up to 512: past 8 a prefill's)")
    parser.add_argument("--threads", default="1,2", help="replay thread counts")
    parser.add_argument("--calls", type=int, default=20, help="replays per timed run")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs (median)")
    args = parser.parse_args(argv)
    shapes = args.shapes.split(",")
    if unknown := [s for s in shapes if s not in SHAPES]:
        parser.error(f"unknown shapes {unknown}; have {', '.join(SHAPES)}")
    sizes = [int(s) for s in args.sizes.split(",")]
    thread_counts = [int(t) for t in args.threads.split(",")]
    if min(sizes) < 1 or max(sizes) > 512 or min(thread_counts) < 1:
        parser.error("sizes in 1..512, threads >= 1")
    rng = np.random.default_rng(0)
    before = cpu_graph.threads(), decode_gemv.INTEGER, decode_gemv.EIGHT_BIT
    cpu_graph.use_cpu_graph(True)
    print(f"load average {os.getloadavg()[0]:.2f}; ms per product (median of "
          f"{args.repeat} x {args.calls}); ratios float / int16 and int16 / int8 (above 1: "
          "the second is faster; Q8_0 takes int16 codes on both integer paths)")
    print(f"{'product':<9}{'B':>4}{'threads':>8}" + "".join(f"{p:>9}" for p in PATHS)
          + f"{'f/i16':>7}{'i16/i8':>7}")
    try:
        for name in shapes:
            qtype, rows, cols = SHAPES[name]
            matrix = _matrix(qtype, rows, cols, rng)
            for batch in sizes:
                x, y = (Tensor(rng.standard_normal((batch, cols)).astype(np.float32)).realize()
                        for _ in range(2))
                runs = {path: _replay(path, matrix, x, y) for path in PATHS}
                for threads in thread_counts:
                    cpu_graph.set_threads(threads)
                    times: dict[str, list[float]] = {path: [] for path in PATHS}
                    for _ in range(args.repeat):
                        for path, run in runs.items():
                            times[path].append(_time(run, args.calls))
                    f, i16, i8 = (statistics.median(times[path]) for path in PATHS)
                    print(f"{name:<9}{batch:>4}{threads:>8}{f:>9.3f}{i16:>9.3f}{i8:>9.3f}"
                          f"{f / i16:>7.2f}{i16 / i8:>7.2f}", flush=True)
    finally:
        cpu_graph.use_cpu_graph(False)
        cpu_graph.set_threads(before[0])
        decode_gemv.INTEGER, decode_gemv.EIGHT_BIT = before[1], before[2]
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0
