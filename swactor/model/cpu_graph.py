"""A graph runner for tinygrad's CPU device: replay a TinyJit's kernels from one C loop,
their thread slices on a small pool of threads.

Theory of operation. tinygrad's CPU device (0.14, without ``HCQ2``) has no graph: a
TinyJit replay walks its captured kernel list in Python, and each kernel launch
(parameter resolution, launch dims, a ctypes call per thread slice) costs 15-20 us. A
SmolLM2 decode step is ~730 kernels, so about half of the step was Python dispatch.

tinygrad lets a device batch a JIT's kernels into a *graph* (``Compiled.graph``, a
:class:`~tinygrad.engine.jit.GraphRunner` subclass; CUDA and Metal have one). ``CpuGraph``
is that for the CPU device:

* at construction it lays every kernel of the batch out as one row of a ``uint64`` table:
  the kernel's entry address, then its arguments (buffer addresses in the order of the
  program's globals, then its integer variables), zero-padded to a fixed width (4, 8,
  16, 32 or 64 words). A kernel that tinygrad split into ``core_id`` slices (the
  ``THREAD`` opt: tinygrad cuts a big enough kernel into up to ``NUM_CPU_THREADS``
  slices, the machine's CPU count) gets one row per slice with ``core_id`` filled in,
  exactly as ``CPUProgram.__call__`` would call it; ``kernels`` lists each kernel's first
  row and slice count;
* consecutive kernels are grouped into *phases* (:func:`phases_of`, ``phases``: first
  row and row count): a kernel joins the phase before it unless it writes memory a
  kernel of the phase reads or writes, or reads memory one of them writes. What a kernel
  touches is each global's buffer byte range (JIT inputs, whose buffers change between
  replays, a range of their own), written unless tinygrad saw the program only load from
  it (``ProgramInfo.ins`` and ``outs``; a global it neither loads nor stores, as in a
  custom kernel, counts as written: a custom kernel declares an input it only reads by
  loading one value of it in tinygrad's IR, as :mod:`swactor.model.decode_gemv` does).
  So the rows of a phase (the slices of one kernel, or several kernels over disjoint
  memory: the chunks of a product cut by rows, say) may run in any order or at once;
* each replay patches only what can change between replays: the addresses of the JIT's
  input buffers and the values of bound symbolic variables (the decode position), each a
  precomputed set of table cells written with one numpy assignment;
* then one call into C walks the phases in order. With the native replay pool
  (``native/replay.c``, the extension ``swactor.model._replay_cffi``; read the theory of
  operation in ``native/replay.h``) and more than one thread (:func:`set_threads`), the
  rows of a phase run in parallel on the calling thread and the pool's persistent worker
  threads, with a barrier before the next phase (it reads what earlier phases wrote).
  Each row computes exactly what it computes alone, from the same inputs, so the results
  are bit-identical to tinygrad's sequential CPU execution whatever the thread count.
  Waiting in the pool is bounded: a thread spins at most :data:`SPIN_NS` before it
  sleeps on a futex, and between replays the workers sleep, so an idle stage costs
  nothing and several stages sharing the cores never spin long against each other. One
  thread (or no native module: a stale install) runs the same walk on the calling thread
  (the native pool without workers, else a tiny loop compiled by tinygrad's own clang
  compiler and loaded like any CPU kernel).

Every kernel is called with the same number of ``uint64`` arguments (the batch's
padded width); under the SysV x86-64 and AAPCS64 conventions extra trailing integer
arguments are ignored by the callee, and a 32-bit ``int`` parameter reads the low half
of its register or stack slot, which is how ``CPUProgram`` already passes
``ctypes.c_uint64`` values.

Batches with symbolic launch sizes, or programs from a renderer other than clang, are left
to tinygrad's per-kernel path (:meth:`CpuGraph.supports_uop` says no).

A JIT replayed through tinygrad still pays its own Python per call around the batches.
:class:`DirectReplay` skips that for a JIT made only of ``CpuGraph`` batches over fixed
input buffers (a role's decode step): inputs bound once, then per call the variables
written and each batch's loop run.

:meth:`CpuGraph.trace` runs a batch once recording, per row, when it started and ended,
on which thread and for how long (``bench model --profile`` prints which kernels are
sliced and their share of a step; the tests check the barrier with it).
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
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

try:
    from swactor.model._replay_cffi import ffi as _ffi
    from swactor.model._replay_cffi import lib as _lib

    NATIVE = True
except ImportError:  # an install from before the native pool: one thread, the clang loop
    NATIVE = False

_REPLAY_ENTRY = "swactor_replay"
_REPLAY_SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)
_WIDTHS = (4, 8, 16, 32, 64)  # argument words a table row holds (replay.h)
TRACE_WORDS = 5  # per row: start, end, runs, thread, nanoseconds (replay.h)
SHARE_ALL = 1  # replay flag: the caller leaves every row of a multi-row phase to workers
GROUP_KERNELS = True
"""Whether consecutive independent kernels replay as one phase (:func:`phases_of`)."""
SPIN_NS = 50_000
"""How long a replay thread spins for the next phase (a worker) or for rows in flight
(the caller) before it sleeps on a futex."""


def cpu_count() -> int:
    """CPUs this process may run on (tinygrad's ``NUM_CPU_THREADS`` default)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class _Pool:
    """The process's replay pools: for ``threads``, the caller and ``threads - 1`` native
    workers (none: the sequential walk), made on first use and kept (a benchmark
    switches between counts; an unused pool's workers sleep)."""

    def __init__(self) -> None:
        self.threads = cpu_count()
        self._handles: dict[int, Any] = {}
        self._lock = threading.Lock()

    def handle(self) -> Any:
        """The native pool for the configured thread count (``ffi.NULL`` for one)."""
        threads = self.threads
        made = self._handles.get(threads)
        if made is not None:
            return made
        with self._lock:
            if threads not in self._handles:
                workers = threads - 1
                made = _lib.replay_pool_new(workers, SPIN_NS) if workers else _ffi.NULL
                if made == _ffi.NULL and workers:
                    raise OSError(f"cannot start {workers} replay worker threads")
                self._handles[threads] = made
            return self._handles[threads]

    def forget(self) -> None:
        """After ``fork``: the child has none of the parent's worker threads."""
        self._handles = {}


_POOL = _Pool()
if NATIVE:
    os.register_at_fork(after_in_child=_POOL.forget)


def set_threads(threads: int) -> int:
    """Run the rows of a phase on ``threads`` threads in all (the caller and ``threads -
    1`` workers; 1: every row on the caller, as tinygrad does). Returns the count in
    force: 1 without the native pool."""
    if threads < 1:
        raise ValueError(f"threads {threads} < 1")
    _POOL.threads = threads if NATIVE else 1
    return _POOL.threads


def threads() -> int:
    """The thread count replays use (:func:`set_threads`; default the CPU count)."""
    return _POOL.threads if NATIVE else 1


def pool_stats() -> dict[str, int]:
    """The pool's counts since it started (``native/replay.h``): replays, those shared
    with the workers (the rest ran on the caller alone, backing off after a stall),
    stalls, rows the workers ran; zeros for one thread."""
    keys = ("replays", "shared", "stalls", "worker_rows")
    if not NATIVE or _POOL.threads == 1:
        return dict.fromkeys(keys, 0)
    out = _ffi.new("uint64_t[]", len(keys))
    _lib.replay_pool_stats(_POOL.handle(), out)
    return {key: int(out[i]) for i, key in enumerate(keys)}


@dataclass(frozen=True)
class KernelTime:
    """One kernel of a traced replay: its name, slices and the sum of its slices' times
    (nanoseconds; in a sequential trace, the kernel's share of the step)."""

    name: str
    slices: int
    ns: int


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


Access = tuple[int, int, bool]
"""A memory range a kernel touches: ``[start, end)`` and whether it may write there."""


def phases_of(kernels: list[tuple[int, int]], accesses: list[list[Access]]
              ) -> list[tuple[int, int]]:
    """Consecutive kernels grouped into phases of mutually independent rows: a kernel
    joins the phase before it unless it writes where the phase reads or writes, or reads
    where the phase writes. ``kernels`` are (first row, slices), rows consecutive;
    returns (first row, rows) per phase."""
    phases: list[tuple[int, int]] = []
    reads: list[tuple[int, int]] = []
    writes: list[tuple[int, int]] = []
    for (first, slices), touched in zip(kernels, accesses, strict=True):

        def clash(start: int, end: int, ranges: list[tuple[int, int]]) -> bool:
            return any(start < e and s < end for s, e in ranges)

        joins = bool(phases) and not any(
            clash(s, e, writes) or (write and clash(s, e, reads)) for s, e, write in touched)
        if joins:
            start, rows = phases[-1]
            phases[-1] = (start, rows + slices)
        else:
            phases.append((first, slices))
            reads, writes = [], []
        for s, e, write in touched:
            (writes if write else reads).append((s, e))
    return phases


def trace_problems(phases: npt.NDArray[np.int64], trace: npt.NDArray[np.uint64]) -> list[str]:
    """What a :meth:`CpuGraph.trace` shows wrong, if anything: a row (slice) that ran
    other than once, or a phase whose first row started before every row of the phase
    before it had ended (no barrier)."""
    problems = []
    previous_end = 0
    for index, (first, rows) in enumerate(phases.tolist()):
        part = trace[first : first + rows]
        for offset, runs in enumerate(part[:, 2].tolist()):
            if runs != 1:
                problems.append(f"phase {index} row {offset} ran {runs} times")
        if part[:, 2].all():
            if int(part[:, 0].min()) < previous_end:
                problems.append(f"phase {index} started before phase {index - 1} ended")
            previous_end = int(part[:, 1].max())
    return problems


def _accesses(info: Any, bufs: list[Buffer], device: str, inputs: dict[int, int]
              ) -> list[Access]:
    """The memory a kernel touches: each global's buffer bytes, written unless tinygrad
    saw the kernel only load from it (``ProgramInfo.ins`` less ``outs``; a global it
    neither loads nor stores, as a custom kernel's, counts as written). A JIT input,
    whose buffer changes between replays, is a range of its own below address 0."""
    found: list[Access] = []
    read_only = set(info.ins) - set(info.outs)
    for g in info.globals:
        slot = inputs.get(g)
        if slot is not None:
            start = -2 * (slot + 1)
            found.append((start, start + 1, g not in read_only))
            continue
        buffer = bufs[g]
        start = cast(int, buffer.get_buf(device).va_addr)
        found.append((start, start + max(1, buffer.nbytes), g not in read_only))
    return found


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
        kernels: list[tuple[int, int]] = []  # first row, slices
        accesses: list[list[Access]] = []  # per kernel: the memory it touches
        self.names: list[str] = []
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
            accesses.append(_accesses(info, bufs, device, dict(replace)))
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
            kernels.append((len(rows), threads))
            self.names.append(str(info.function_name))
            for thread in range(threads):
                row = [runtime.addr, *words]
                if core_word >= 0:
                    row[1 + core_word] = thread
                rows.append(row)
                pending.append((row, inputs, variables))
        widest = max(1, max(len(row) - 1 for row in rows))
        self.width = next((w for w in _WIDTHS if w >= widest), widest)
        stride = self.stride = self.width + 1
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
        self.kernels: npt.NDArray[np.int64] = np.array(kernels, dtype=np.int64).reshape(-1, 2)
        self.sliced = int(np.count_nonzero(self.kernels[:, 1] > 1))  # kernels cut in slices
        grouped = phases_of(kernels, accesses) if GROUP_KERNELS else kernels
        self.phases: npt.NDArray[np.int64] = np.array(grouped, dtype=np.int64).reshape(-1, 2)
        self._native = NATIVE and self.width in _WIDTHS
        if self._native:
            self._table_ptr = _ffi.cast("uint64_t *", self.table.ctypes.data)
            self._phases_ptr = _ffi.cast("int64_t *", self.phases.ctypes.data)
        else:
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
        if self._native:
            self._run(_POOL.handle(), 0, _ffi.NULL)
        else:
            self._replay(self.table.ctypes.data, self.kernel_rows)

    def _run(self, pool: Any, flags: int, trace: Any) -> None:
        code = _lib.replay_run(pool, self._table_ptr, self.kernel_rows, self.stride,
                               self._phases_ptr, len(self.phases), flags, trace)
        if code != 0:
            raise RuntimeError(f"replay refused a table of {self.kernel_rows} rows, stride "
                               f"{self.stride}")

    def trace(self, var_vals: Mapping[str, int], *, sequential: bool = False,
              share_all: bool = False) -> npt.NDArray[np.uint64]:
        """Replay once as :meth:`replay` does, recording per table row (slice)
        ``TRACE_WORDS`` words: start and end order (one counter per replay, from 1), how
        many times it ran, the thread (0 the caller, 1.. workers) and nanoseconds.
        ``sequential`` runs every slice on the caller; ``share_all`` leaves every slice
        of a sliced kernel to the workers (tests: the cross-thread path each time)."""
        if not self._native:
            raise RuntimeError("tracing needs the native replay pool (swactor.model."
                               "_replay_cffi; `just setup` builds it)")
        for name, cells in self.var_cells.items():
            self.flat[cells] = var_vals[name]
        trace = np.zeros((self.kernel_rows, TRACE_WORDS), dtype=np.uint64)
        pool = _ffi.NULL if sequential else _POOL.handle()
        self._run(pool, SHARE_ALL if share_all else 0,
                  _ffi.cast("uint64_t *", trace.ctypes.data))
        return trace

    def kernel_times(self, trace: npt.NDArray[np.uint64]) -> list[KernelTime]:
        """Each kernel's name, slices and time summed over its slices in a :meth:`trace`."""
        return [KernelTime(name, slices, int(trace[first : first + slices, 4].sum()))
                for name, (first, slices) in zip(self.names, self.kernels.tolist(),
                                                  strict=True)]


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
