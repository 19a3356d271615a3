"""A graph runner for tinygrad's CPU device: replay a TinyJit's kernels from one C loop.

Theory of operation. tinygrad's CPU device (0.14, without ``HCQ2``) has no graph: a
TinyJit replay walks its captured kernel list in Python, and each kernel launch
(parameter resolution, launch dims, a ctypes call per thread slice) costs 15-20 us. A
SmolLM2 decode step is ~730 kernels, so about half of the step was Python dispatch.

tinygrad lets a device batch a JIT's kernels into a *graph* (``Compiled.graph``, a
:class:`~tinygrad.engine.jit.GraphRunner` subclass; CUDA and Metal have one). ``CpuGraph``
is that for the CPU device:

* at construction it lays every kernel of the batch out as one row of a ``uint64`` table:
  the kernel's entry address, then its arguments (buffer addresses in the order of the
  program's globals, then its integer variables). A kernel that tinygrad split into
  ``core_id`` slices (the ``THREAD`` opt) gets one row per slice with ``core_id`` filled
  in, exactly as ``CPUProgram.__call__`` would call it;
* each replay patches only what can change between replays: the addresses of the JIT's
  input buffers and the values of bound symbolic variables (the decode position), each a
  precomputed set of table cells written with one numpy assignment;
* then one call into a tiny C function (compiled by tinygrad's own clang compiler and
  loaded like any CPU kernel) walks the table and calls every kernel in order, on the
  calling thread, so the semantics are those of tinygrad's sequential CPU execution.

Every kernel is called with the same number of ``uint64`` arguments (the batch's widest);
under the SysV x86-64 and AAPCS64 conventions extra trailing integer arguments are ignored
by the callee, and a 32-bit ``int`` parameter reads the low half of its register or stack
slot, which is how ``CPUProgram`` already passes ``ctypes.c_uint64`` values.

Batches with symbolic launch sizes, or programs from a renderer other than clang, are left
to tinygrad's per-kernel path (:meth:`CpuGraph.supports_uop` says no).

A JIT replayed through tinygrad still pays its own Python per call around the batches.
:class:`DirectReplay` skips that for a JIT made only of ``CpuGraph`` batches over fixed
input buffers (a role's decode step): inputs bound once, then per call the variables
written and each batch's loop run.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Mapping
from typing import Any, cast

import numpy as np
import numpy.typing as npt
from tinygrad.device import Buffer, Compiled, DepsTracker, Device, TinyELF
from tinygrad.engine.jit import CapturedJit, GraphRunner
from tinygrad.engine.realize import (
    get_call_arg_uops,
    get_graph_runtime,
    get_runtime,
    resolve_params,
    unwrap_multi,
)
from tinygrad.renderer import Estimates
from tinygrad.runtime.ops_cpu import CPUDevice, CPUProgram
from tinygrad.runtime.support.compiler_cpu import ClangCompiler
from tinygrad.uop import Ops
from tinygrad.uop.ops import UOp

_REPLAY_ENTRY = "swactor_replay"
_REPLAY_SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)


def _replay_source(width: int) -> str:
    """C for a loop that calls ``rows`` table entries of ``1 + width`` words each."""
    params = ", ".join(f"u64 a{i}" for i in range(width))
    args = ", ".join(f"row[{i + 1}]" for i in range(width))
    return (
        "typedef unsigned long long u64;\n"
        f"typedef void (*kernel_t)({params});\n"
        f"void {_REPLAY_ENTRY}(const u64 *table, long long rows) {{\n"
        "  for (long long r = 0; r < rows; r++) {\n"
        f"    const u64 *row = table + r * {width + 1};\n"
        f"    ((kernel_t)row[0])({args});\n"
        "  }\n"
        "}\n"
    )


@functools.cache
def _replay_loop(width: int) -> tuple[CPUProgram, Any]:
    """Compile and load the replay loop for ``width`` arguments (kept alive by the cache)."""
    device = cast(CPUDevice, Device["CPU"])
    compiler = device.renderer.compiler
    assert isinstance(compiler, ClangCompiler)
    lib = compiler.compile(_replay_source(width))
    program = CPUProgram(device, TinyELF(lib, _REPLAY_ENTRY, device.renderer.target, ()))
    return program, _REPLAY_SIGNATURE(program.addr)


def _is_clang_program(call: UOp) -> bool:
    program = call.src[0]
    if program.op is not Ops.PROGRAM:
        return False
    info = program.arg
    static_size = all(isinstance(d, int) for d in info.global_size)
    return static_size and info.target.renderer.upper() in ("CLANG", "")


class CpuGraph(GraphRunner):
    """Replay a batch of CPU kernels from one C loop (see the module docstring)."""

    def __init__(self, linear: UOp, input_uops: tuple[UOp, ...] = ()) -> None:
        self._runner_state(linear, input_uops)
        rows: list[list[int]] = []
        input_cells: dict[int, list[int]] = {}  # input slot -> flat table cells
        var_cells: dict[str, list[int]] = {}  # variable name -> flat table cells
        pending: list[tuple[list[int], list[tuple[int, int]], list[tuple[int, str]]]] = []
        for (_, program, bufs, device_vars), runtime, replace in zip(
            self.calls, self.runtimes, self.uop_replace, strict=True
        ):
            info = program.arg
            assert isinstance(runtime, CPUProgram)
            device = bufs[0].device
            words = [
                cast(int, bufs[g].get_buf(device).va_addr) for g in info.globals
            ]
            by_position = {g: i for i, g in enumerate(info.globals)}
            inputs = [(by_position[p], slot) for p, slot in replace if p in by_position]
            variables: list[tuple[int, str]] = []
            core_word = -1
            for index, var in enumerate(info.vars):
                word = len(info.globals) + index
                words.append(0)
                if var.expr == "core_id":
                    core_word = word
                elif var.expr in device_vars:
                    words[word] = device_vars[var.expr]
                else:
                    variables.append((word, var.expr))
            threads = int(info.global_size[0]) if core_word >= 0 else 1
            for thread in range(threads):
                row = [runtime.addr, *words]
                if core_word >= 0:
                    row[1 + core_word] = thread
                rows.append(row)
                pending.append((row, inputs, variables))
        self.width = max(1, max(len(row) - 1 for row in rows))
        stride = self.width + 1
        table: npt.NDArray[np.uint64] = np.zeros((len(rows), stride), dtype=np.uint64)
        for r, (row, inputs, variables) in enumerate(pending):
            table[r, : len(row)] = row
            for word, slot in inputs:
                input_cells.setdefault(slot, []).append(r * stride + 1 + word)
            for word, name in variables:
                var_cells.setdefault(name, []).append(r * stride + 1 + word)
        self.table = table
        self.flat = table.reshape(-1)
        self.input_cells = {s: np.array(c, dtype=np.intp) for s, c in input_cells.items()}
        self.var_cells = {n: np.array(c, dtype=np.intp) for n, c in var_cells.items()}
        self.kernel_rows = len(rows)
        self._program, self._replay = _replay_loop(self.width)

    def _runner_state(self, linear: UOp, input_uops: tuple[UOp, ...]) -> None:
        """What ``GraphRunner.__init__`` (tinygrad 0.14) sets up, less what this runner
        never reads: launch-dimension and variable replacement tables, and the batch's
        symbolic cost estimates, whose simplification is about a tenth of a warm stage's
        warm-up (the estimates feed only tinygrad's statistics counters)."""
        self.linear = linear.src[0]
        self.calls: list[tuple[int, UOp, list[Buffer], dict[str, int]]] = []
        self.runtimes: list[Any | None] = []
        self.uop_replace: list[list[tuple[int, int]]] = []
        for call in self.linear.src:
            replace = [(p, b.arg.slot) for p, b in enumerate(get_call_arg_uops(call))
                       if b.op is Ops.PARAM]
            for index, (bufs, device_vars) in enumerate(
                    unwrap_multi(call, resolve_params(call, input_uops))):
                self.calls.append((index, call.src[0], [b.ensure_allocated() for b in bufs],
                                   device_vars))
                program = call.src[0]
                self.runtimes.append(get_runtime(bufs[0].device, program)
                                     if program.op is Ops.PROGRAM else None)
                self.uop_replace.append(replace)
        self.vars: list[str] = []
        self.symbolic_dims: list[tuple[Any, ...]] = []
        self.var_vals_replace: dict[int, list[tuple[int, int]]] = {}
        self.launch_dims_replace: dict[int, tuple[int | None, int | None]] = {}
        self.launch_dims_base: dict[int, tuple[tuple[Any, ...], tuple[int, ...]]] = {}
        self.deps = DepsTracker()  # type: ignore[no-untyped-call]
        self.device = self.calls[0][2][0].device.split(":")[0]
        self.estimates = Estimates()

    @staticmethod
    def supports_uop(batch_devs: list[Compiled], new_call: UOp) -> bool:
        return _is_clang_program(new_call) and GraphRunner.supports_uop(batch_devs, new_call)

    def __call__(
        self, input_uops: tuple[UOp, ...], var_vals: dict[str, int], wait: bool = False
    ) -> float | None:
        self.bind_inputs(input_uops)
        self.replay(var_vals)
        return None

    def bind_inputs(self, input_uops: tuple[UOp, ...]) -> None:
        """Write the input buffers' addresses into the table."""
        for slot, cells in self.input_cells.items():
            buffer = cast(Buffer, input_uops[slot].buffer).ensure_allocated()
            self.flat[cells] = buffer.get_buf(buffer.device).va_addr

    def replay(self, var_vals: Mapping[str, int]) -> None:
        """Run every kernel with the variables ``var_vals`` and the inputs bound last."""
        for name, cells in self.var_cells.items():
            self.flat[cells] = var_vals[name]
        self._replay(self.table.ctypes.data, self.kernel_rows)


class DirectReplay:
    """A captured JIT replayed straight through its :class:`CpuGraph` batches.

    A TinyJit replay costs about a millisecond of Python per call besides the kernels
    (input checks, the executor's pattern matching per call, statistics with symbolic
    cost estimates). A JIT whose every call is a ``CpuGraph`` batch and whose inputs are
    fixed buffers it never writes (a decode step's kept input) is the same computation
    as: bind those inputs once, then per replay write the variables and run each batch's
    C loop. :meth:`of` says None for any other JIT (the caller keeps TinyJit's path).
    """

    def __init__(self, graphs: list[CpuGraph]) -> None:
        self.graphs = graphs

    @classmethod
    def of(cls, captured: CapturedJit[Any], inputs: tuple[UOp, ...],
           variables: frozenset[str]) -> DirectReplay | None:
        """The direct replay of ``captured`` (already run once, so its batches are built)
        over the fixed ``inputs`` with ``variables`` bound per replay; None when a call is
        not a CpuGraph batch, a batch has other variables, or the JIT writes an input."""
        if any(u in captured._written_uops for u in inputs):
            return None
        graphs: list[CpuGraph] = []
        for call in captured.linear.src:
            ast = call.src[0]
            if ast.op is not Ops.CUSTOM_FUNCTION or ast.arg != "graph":
                return None
            runner = get_graph_runtime(ast)
            if not isinstance(runner, CpuGraph) or not set(runner.var_cells) <= variables:
                return None
            graphs.append(runner)
        if not graphs:
            return None
        for graph in graphs:
            graph.bind_inputs(inputs)
        return cls(graphs)

    def replay(self, var_vals: Mapping[str, int]) -> None:
        for graph in self.graphs:
            graph.replay(var_vals)


def use_cpu_graph(enabled: bool) -> bool:
    """Let (or stop) tinygrad's CPU device batch JIT kernels into :class:`CpuGraph`.

    A JIT decides at capture (its second call) whether to batch, so a role sets this just
    before calling its JIT. Returns whether the graph is now in use: never when the CPU
    renderer is not clang's.
    """
    device = Device["CPU"]
    usable = isinstance(getattr(device.renderer, "compiler", None), ClangCompiler)
    device.graph = CpuGraph if enabled and usable else None
    return device.graph is CpuGraph
