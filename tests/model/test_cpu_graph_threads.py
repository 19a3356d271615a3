"""CpuGraph on the native replay pool: a kernel's thread slices run on several threads,
with a barrier between kernels, and compute bit for bit what one thread computes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from tinygrad.device import Device
from tinygrad.engine.jit import TinyJit
from tinygrad.helpers import Context
from tinygrad.tensor import Tensor
from tinygrad.uop.ops import UOp

from swactor.model import cpu_graph
from swactor.model.cpu_graph import (
    CpuGraph,
    DirectReplay,
    phases_of,
    trace_problems,
    use_cpu_graph,
)

ROWS, COLS, CACHE = 96, 4096, 24
SLICES = 3  # tinygrad cuts the product into 3 core_id slices with NUM_CPU_THREADS=4

pytestmark = [
    pytest.mark.skipif(not Device.DEFAULT.startswith("CPU"), reason="a CPU-device graph"),
    pytest.mark.skipif(not cpu_graph.NATIVE, reason="the native replay pool is not built"),
]


def _step_fn(weight: Tensor, history: Tensor) -> Any:
    """A product cut into thread slices, then kernels that read all of its output."""

    def step(x: Tensor, pos: UOp) -> Tensor:
        h = (x * weight).sum(axis=1).relu().contiguous()  # sliced: rows split by core_id
        past = history[0 : pos + 1].sum(axis=0).contiguous()
        total = (h * h).sum().reshape(1).contiguous()  # reads every slice's rows
        return (h + past * 0.5 + total).contiguous().realize()

    return step


Built = tuple[DirectReplay, npt.NDArray[np.float32], Tensor]


def _build() -> Built:
    """A captured step's DirectReplay, the numpy view of its kept input, its output."""
    rng = np.random.default_rng(11)
    weight = Tensor(rng.standard_normal((ROWS, COLS)).astype(np.float32)).realize()
    history = Tensor(rng.standard_normal((CACHE, ROWS)).astype(np.float32)).realize()
    step = TinyJit(_step_fn(weight, history))
    pos_var = UOp.variable("pos", 0, CACHE - 1)
    kept = Tensor.zeros(COLS).contiguous().realize()
    view = np.frombuffer(kept.uop.buffer.as_memoryview(force_zero_copy=True), np.float32)
    assert use_cpu_graph(True)
    try:
        # slices come from NUM_CPU_THREADS when the kernels are built (this machine's
        # CPU count by default): four makes the test's slicing the same everywhere
        with Context(NUM_CPU_THREADS=4):  # type: ignore[no-untyped-call]
            for pos in [0, 1, 2]:  # run, capture, replay
                out = step(kept, pos_var.bind(pos))
    finally:
        use_cpu_graph(False)
    assert step.captured is not None
    replay = DirectReplay.of(step.captured, (kept.uop.base,), frozenset({"pos"}))
    assert replay is not None
    return replay, view, out


@pytest.fixture
def direct() -> Iterator[Built]:
    threads = cpu_graph.threads()
    try:
        yield _build()
    finally:
        cpu_graph.set_threads(threads)


def _outputs(replay: DirectReplay, view: npt.NDArray[np.float32], out: Tensor, *,
             threads: int) -> list[npt.NDArray[np.float32]]:
    cpu_graph.set_threads(threads)
    rng = np.random.default_rng(12)
    results = []
    for pos in [5, 0, 23, 9, 17]:
        view[:] = rng.standard_normal(COLS).astype(np.float32)
        replay.replay({"pos": pos})
        results.append(out.numpy().copy())
    return results


def test_the_product_is_cut_into_slices(direct: Built) -> None:
    replay, _, _ = direct
    graphs: list[CpuGraph] = replay.graphs
    assert sum(g.sliced for g in graphs) >= 1
    assert max(int(g.kernels[:, 1].max()) for g in graphs) == SLICES


def test_threaded_replay_equals_one_thread_bit_for_bit(direct: Built) -> None:
    one = _outputs(*direct, threads=1)
    for threads in (2, 4):  # fewer threads than slices, and more
        many = _outputs(*direct, threads=threads)
        for a, b in zip(one, many, strict=True):
            assert np.array_equal(a, b)
    # and the figures are right, not merely equal: new inputs each replay
    assert not np.array_equal(one[0], one[1])


def test_workers_run_every_slice_once_behind_a_barrier(direct: Built) -> None:
    """With every slice left to the workers (the caller only waits), each slice runs
    exactly once, on a worker, and no kernel starts before the one before it ended; the
    output equals the sequential trace's bit for bit."""
    replay, view, out = direct
    graph = replay.graphs[0]
    view[:] = np.linspace(-1, 1, COLS, dtype=np.float32)
    cpu_graph.set_threads(3)
    expected = graph.trace({"pos": 7}, sequential=True)
    assert trace_problems(graph.phases, expected) == []
    reference = out.numpy().copy()
    shared = [r for first, n in graph.phases.tolist() if n > 1 for r in range(first, first + n)]
    assert len(shared) >= SLICES
    for _ in range(5):
        trace = graph.trace({"pos": 7}, share_all=True)
        assert trace_problems(graph.phases, trace) == []
        assert all(trace[r, 3] >= 1 for r in shared)  # run by workers
        assert np.array_equal(out.numpy(), reference)


def test_trace_problems_finds_skipped_and_raced_rows() -> None:
    phases = np.array([[0, 2], [2, 1]], dtype=np.int64)
    good = np.array([[1, 4, 1, 0, 0], [2, 3, 1, 1, 0], [5, 6, 1, 0, 0]], dtype=np.uint64)
    assert trace_problems(phases, good) == []
    skipped = good.copy()
    skipped[1, 2] = 0
    assert trace_problems(phases, skipped) == ["phase 0 row 1 ran 0 times"]
    raced = good.copy()
    raced[2, 0:2] = (3, 7)  # phase 1 started while phase 0's first row ran
    assert trace_problems(phases, raced) == ["phase 1 started before phase 0 ended"]


def test_phases_group_only_independent_kernels() -> None:
    """Consecutive kernels share a phase unless one writes what another reads or writes."""
    a, b, c, d = (0, 10), (10, 20), (20, 30), (30, 40)  # disjoint byte ranges

    def grouped(*accesses: list[tuple[tuple[int, int], bool]]) -> list[tuple[int, int]]:
        kernels = [(i, 1) for i in range(len(accesses))]
        return phases_of(kernels, [[(r[0], r[1], w) for r, w in k] for k in accesses])

    read_a_write_b = [(a, False), (b, True)]
    # disjoint outputs over one shared input: one phase
    assert grouped(read_a_write_b, [(a, False), (c, True)]) == [(0, 2)]
    # reads what the phase wrote / writes what it read / writes what it wrote: a new phase
    assert grouped(read_a_write_b, [(b, False), (c, True)]) == [(0, 1), (1, 1)]
    assert grouped(read_a_write_b, [(c, False), (a, True)]) == [(0, 1), (1, 1)]
    assert grouped(read_a_write_b, [(c, False), (b, True)]) == [(0, 1), (1, 1)]
    # a partial overlap counts; the new phase forgets the old one's ranges
    assert grouped(read_a_write_b, [((15, 25), False), (d, True)], [(a, True)]) == [(0, 1),
                                                                                  (1, 2)]
    # a sliced kernel's rows stay together and count as its slices
    assert phases_of([(0, 3), (3, 2)], [[(a[0], a[1], True)], [(b[0], b[1], True)]]) == [
        (0, 5)]


def test_fallback_loop_computes_the_same(direct: Built,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the native pool (an install from before it) a graph replays through the
    clang-compiled loop on one thread: the same outputs as the pool's."""
    expected = _outputs(*direct, threads=2)
    monkeypatch.setattr(cpu_graph, "NATIVE", False)
    replay, view, out = _build()
    assert not any(g._native for g in replay.graphs)
    got = _outputs(replay, view, out, threads=2)
    assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))


@pytest.mark.slow
@pytest.mark.soak
def test_smollm2_on_two_threads_computes_one_threads_logits_bit_for_bit() -> None:
    """A real stage (SmolLM2, all blocks, f32 from the file's blocks: the defaults):
    the prefill and 8 decode steps give the same logits, bit for bit, on 2 threads as
    on 1."""
    from swactor.model.gguf_range import GgufRangeReader
    from swactor.model.llama_role import StageRole
    from swactor.model.paths import default_model_path
    from swactor.model.source import LocalFileSource

    path = default_model_path()
    if not path.is_file():
        pytest.fail(f"{path} missing: run scripts/setup.sh")
    weights = GgufRangeReader(LocalFileSource(path)).load_stage(
        0, 30, is_first=True, is_last=True, dtype="f32", keep_blocks=True)
    role = StageRole(weights, max_seq_len=120, quantised=True)  # bench model's role
    prompt = np.array([1, 504, 3458, 22, 333, 4444], dtype=np.int32)
    logits: dict[int, list[npt.NDArray[np.float32]]] = {}
    default = cpu_graph.threads()
    try:
        for threads in (1, 2):
            cpu_graph.set_threads(threads)
            out = role.step(0, prompt)
            assert role.last_logits is not None
            logits[threads] = [role.last_logits.copy()]
            for sequence in range(1, 9):
                out = role.step(sequence, out)
                logits[threads].append(role.last_logits.copy())
    finally:
        cpu_graph.set_threads(default)
    assert all(np.array_equal(a, b) for a, b in zip(logits[1], logits[2], strict=True))
