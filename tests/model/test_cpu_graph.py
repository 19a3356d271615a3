"""CpuGraph: a TinyJit replayed from one C loop computes what tinygrad's own replay does."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from tinygrad.device import Device
from tinygrad.engine.jit import TinyJit
from tinygrad.engine.realize import graph_cache
from tinygrad.tensor import Tensor
from tinygrad.uop.ops import UOp

from swactor.model.cpu_graph import CpuGraph, DirectReplay, use_cpu_graph

ROWS, COLS, CACHE = 96, 4096, 24


def _case(seed: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    history = rng.standard_normal((CACHE, ROWS)).astype(np.float32)
    return weight, history


def _step_fn(weight: Tensor, history: Tensor) -> Any:
    """A step with what decode has: a big product (threaded), a bound position, a slice."""

    def step(x: Tensor, pos: UOp) -> Tensor:
        # three kernels: [ROWS] from a 4096-wide reduce (split across threads), a sum over a
        # position-dependent prefix, and their combination
        h = (x * weight).sum(axis=1).relu().contiguous()
        past = history[0 : pos + 1].sum(axis=0).contiguous()
        return (h + past * 0.5).contiguous().realize()

    return step


def _reference(
    weight: npt.NDArray[np.float32], history: npt.NDArray[np.float32], x: Any, pos: int
) -> npt.NDArray[np.float64]:
    h = np.maximum(weight.astype(np.float64) @ x.astype(np.float64), 0.0)
    result: npt.NDArray[np.float64] = h + history[: pos + 1].astype(np.float64).sum(axis=0) * 0.5
    return result


@pytest.mark.skipif(not Device.DEFAULT.startswith("CPU"), reason="a CPU-device graph")
def test_graph_replay_matches_numpy_for_new_inputs_and_positions() -> None:
    weight, history = _case(1)
    step = TinyJit(_step_fn(Tensor(weight).realize(), Tensor(history).realize()))
    pos_var = UOp.variable("pos", 0, CACHE - 1)
    rng = np.random.default_rng(2)
    before = set(graph_cache)
    assert use_cpu_graph(True)
    try:
        for pos in [0, 1, 5, 2, 23, 9]:
            # a fresh input tensor each call: its buffer address changes between replays
            x = rng.standard_normal(COLS).astype(np.float32)
            out = step(Tensor(x).realize(), pos_var.bind(pos)).numpy()
            np.testing.assert_allclose(out, _reference(weight, history, x, pos), rtol=1e-4,
                                       atol=1e-3)
    finally:
        use_cpu_graph(False)
    graphs = [g for key, g in graph_cache.items() if key not in before]
    assert graphs and all(isinstance(g, CpuGraph) for g in graphs)
    # the product was split into core_id slices: the graph calls each slice
    assert sum(g.kernel_rows for g in graphs) > sum(len(g.calls) for g in graphs)


@pytest.mark.skipif(not Device.DEFAULT.startswith("CPU"), reason="a CPU-device graph")
def test_disabled_graph_leaves_the_jit_on_tinygrads_path() -> None:
    weight, history = _case(3)
    step = TinyJit(_step_fn(Tensor(weight).realize(), Tensor(history).realize()))
    pos_var = UOp.variable("pos", 0, CACHE - 1)
    before = set(graph_cache)
    use_cpu_graph(False)
    x = np.ones(COLS, np.float32)
    for pos in [0, 3, 4]:
        out = step(Tensor(x).realize(), pos_var.bind(pos)).numpy()
    np.testing.assert_allclose(out, _reference(weight, history, x, 4), rtol=1e-4, atol=1e-3)
    assert not [k for k in graph_cache if k not in before]


@pytest.mark.skipif(not Device.DEFAULT.startswith("CPU"), reason="a CPU-device graph")
def test_direct_replay_computes_what_the_jit_does() -> None:
    """Once the JIT replayed, DirectReplay over its kept input buffer gives what the JIT
    gives, for new input values and positions written between replays."""
    weight, history = _case(4)
    step = TinyJit(_step_fn(Tensor(weight).realize(), Tensor(history).realize()))
    pos_var = UOp.variable("pos", 0, CACHE - 1)
    kept = Tensor.zeros(COLS).contiguous().realize()
    view = np.frombuffer(kept.uop.buffer.as_memoryview(force_zero_copy=True), np.float32)
    rng = np.random.default_rng(5)
    assert use_cpu_graph(True)
    try:
        for pos in [0, 1, 2]:  # run, capture, replay
            out = step(kept, pos_var.bind(pos))
        assert step.captured is not None
        direct = DirectReplay.of(step.captured, (kept.uop.base,), frozenset({"pos"}))
        assert direct is not None
        # a variable the graph does not know is refused (the caller keeps TinyJit's path)
        assert DirectReplay.of(step.captured, (kept.uop.base,), frozenset()) is None
        for pos in [7, 3, 23, 0]:
            x = rng.standard_normal(COLS).astype(np.float32)
            view[:] = x
            direct.replay({"pos": pos})
            got = out.numpy().copy()
            np.testing.assert_allclose(got, _reference(weight, history, x, pos), rtol=1e-4,
                                       atol=1e-3)
            assert np.array_equal(got, step(kept, pos_var.bind(pos)).numpy())
    finally:
        use_cpu_graph(False)
