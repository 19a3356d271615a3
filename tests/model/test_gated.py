"""The hand-written gated activation (swactor.model.gated) against numpy in float64: its
values, including where the exponential overflows or underflows, each row
bit-identical whatever rows share the kernel, and replayed on threads from a TinyJit."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from tinygrad.device import Device
from tinygrad.engine.jit import TinyJit
from tinygrad.engine.realize import get_graph_runtime
from tinygrad.tensor import Tensor
from tinygrad.uop import Ops

from swactor.model import cpu_graph, gated
from swactor.model.cpu_graph import CpuGraph

pytestmark = pytest.mark.skipif(not Device.DEFAULT.startswith("CPU"),
                                reason="a CPU-device kernel")


def _rows(rows: int, ffn: int, seed: int, scale: float = 4.0) -> npt.NDArray[np.float32]:
    return (np.random.default_rng(seed).standard_normal((rows, 2 * ffn)) * scale
            ).astype(np.float32)


def _want(gate_up: npt.NDArray[np.float32], ffn: int) -> npt.NDArray[np.float64]:
    g, u = gate_up[:, :ffn].astype(np.float64), gate_up[:, ffn:].astype(np.float64)
    with np.errstate(over="ignore"):
        return g / (1.0 + np.exp(-g)) * u


def _bits(array: npt.NDArray[np.generic]) -> npt.NDArray[np.uint8]:
    return np.ascontiguousarray(array).view(np.uint8)


@pytest.mark.parametrize(("rows", "ffn"), [(1, 1536), (3, 64), (8, 16), (5, 1536)])
def test_matches_numpy(rows: int, ffn: int) -> None:
    gate_up = _rows(rows, ffn, seed=rows * 7 + ffn)
    out = gated.silu_mul(Tensor(gate_up), ffn).numpy()
    want = _want(gate_up, ffn)
    assert out.shape == (rows, ffn) and out.dtype == np.float32
    # a few float32 roundings of the result: the exponential about one ulp, then one
    # addition, a division and a product
    assert np.all(np.abs(out - want) <= 4e-7 * np.abs(want) + 1e-37)


def test_where_the_exponential_leaves_its_range() -> None:
    """``-g`` past 88 (exp taken as infinite) and below -87.34 (exp taken as 0): silu is
    then ``-0`` and ``g`` itself; zeros stay signed zeros times ``u``."""
    ffn = 16
    gate = np.array([0.0, -0.0, 1e-30, -1e-30, 87.3, 87.4, 88.0, 89.0, 200.0, 1e30,
                     -87.3, -87.4, -88.0, -89.0, -200.0, -1e30], dtype=np.float32)
    up = np.full(ffn, 1.5, dtype=np.float32)
    gate_up = np.concatenate([gate, up])[None, :]
    out = gated.silu_mul(Tensor(gate_up), ffn).numpy()[0]
    want = _want(gate_up, ffn)[0]
    assert np.all(np.isfinite(out))
    big = gate >= 87.4  # exp(-g) below 2**-126: silu(g) = g exactly
    assert np.array_equal(out[big], (gate[big] * np.float32(1.5)))
    assert np.array_equal(_bits(out[:2]), _bits(np.array([0.0, -0.0], dtype=np.float32)))
    moderate = np.abs(gate) < 87.0
    assert np.all(np.abs(out[moderate] - want[moderate]) <= 4e-7 * np.abs(want[moderate]))
    # g <= -88: the true value is below 1e-36 in magnitude; past -88 exactly -0
    assert np.all(np.abs(out[gate <= -88.0]) < 1e-36)
    assert np.array_equal(_bits(out[gate < -88.0]), _bits(np.full(3, -0.0, np.float32)))


def test_each_row_is_the_row_alone() -> None:
    ffn, rows = 1536, 8
    gate_up = _rows(rows, ffn, seed=3)
    out = gated.silu_mul(Tensor(gate_up), ffn).numpy()
    for r in range(rows):
        alone = gated.silu_mul(Tensor(gate_up[r : r + 1]), ffn).numpy()
        assert np.array_equal(_bits(out[r]), _bits(alone[0])), f"row {r}"


def test_replayed_on_threads_a_slice_per_row() -> None:
    """Through a TinyJit (CpuGraph on 2 threads): every replay computes the rows it is
    given, one kernel with a slice per row."""
    ffn, rows = 64, 5
    source = Tensor(_rows(rows, ffn, seed=5)).realize()
    # doubled first (exact): a graph holds two kernels at least
    jit = TinyJit(lambda x: gated.silu_mul((x * 2).contiguous(), ffn).realize())
    previous = cpu_graph.threads()
    cpu_graph.use_cpu_graph(True)
    cpu_graph.set_threads(2)
    try:
        for call in range(4):
            gate_up = _rows(rows, ffn, seed=50 + call)
            source.assign(Tensor(gate_up)).realize()
            out = jit(source).numpy()
            want = _want(gate_up * 2, ffn)
            assert np.all(np.abs(out - want) <= 4e-7 * np.abs(want) + 1e-37), f"call {call}"
        assert jit.captured is not None
        graphs = [get_graph_runtime(call.src[0]) for call in jit.captured.linear.src
                  if call.src[0].op is Ops.CUSTOM_FUNCTION]
        slices = [int(g.kernels[i, 1]) for g in graphs if isinstance(g, CpuGraph)
                  for i, name in enumerate(g.names) if name.startswith("silu_mul")]
        assert slices == [rows]
    finally:
        cpu_graph.set_threads(previous)
        cpu_graph.use_cpu_graph(False)


def test_usable_only_for_whole_vectors_on_clang_cpu() -> None:
    assert gated.usable("CPU", 1536)
    assert not gated.usable("CPU", 1544)
    with pytest.raises(ValueError, match="not \\[rows, 2 \\* 16\\]"):
        gated.silu_mul(Tensor(np.zeros((2, 30), dtype=np.float32)), 16)
