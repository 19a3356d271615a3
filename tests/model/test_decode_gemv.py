"""The hand-written decode product (swactor.model.decode_gemv) against numpy in float64,
row for row identical whatever the batch, and sliced for the replay pool."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants
from tinygrad.device import Device
from tinygrad.engine.jit import TinyJit
from tinygrad.tensor import Tensor

from swactor.model import cpu_graph, decode_gemv
from swactor.model.block_kernels import DeviceQuant, to_device
from swactor.model.cpu_graph import CpuGraph
from swactor.model.dequant import QuantMatrix

pytestmark = pytest.mark.skipif(not Device.DEFAULT.startswith("CPU"),
                                reason="a CPU-device kernel")
TYPES = [Q.Q4_1, Q.Q8_0]


def _matrix(qtype: Q, rows: int, cols: int, seed: int
            ) -> tuple[DeviceQuant, npt.NDArray[np.float64]]:
    """A random block matrix on the device and its weights as gguf-py dequantises them."""
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((rows, cols)).astype(np.float32)
    raw = quants.quantize(dense, qtype)
    weights = quants.dequantize(raw, qtype).reshape(rows, cols).astype(np.float64)
    blocks = QuantMatrix(int(qtype), (rows, cols), raw.reshape(rows, -1))
    return to_device(blocks, "CPU"), weights


def _rows(batch: int, cols: int, seed: int) -> npt.NDArray[np.float32]:
    return np.random.default_rng(seed).standard_normal((batch, cols)).astype(np.float32)


def _gemv(x: npt.NDArray[np.float32], matrix: DeviceQuant) -> npt.NDArray[np.float32]:
    got: npt.NDArray[np.float32] = decode_gemv.gemv(Tensor(x).realize(), matrix).numpy()
    return got


@pytest.fixture
def small_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slices of a few rows, so small products have several, and a last short one."""
    monkeypatch.setattr(decode_gemv, "SLICE_WEIGHTS", 24 * 96)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize(("batch", "rows", "cols"),
                         [(1, 40, 64), (2, 33, 32), (3, 77, 96), (4, 5, 576), (8, 61, 160)])
def test_every_row_is_the_product_of_the_files_weights(
        small_slices: None, qtype: Q, batch: int, rows: int, cols: int) -> None:
    matrix, weights = _matrix(qtype, rows, cols, seed=rows)
    x = _rows(batch, cols, seed=cols)
    got = _gemv(x, matrix)
    want = x.astype(np.float64) @ weights.T
    assert got.shape == (batch, rows)
    scale = np.abs(x).astype(np.float64) @ np.abs(weights).T  # the sum's magnitude
    assert np.all(np.abs(got - want) <= 1e-6 * scale + 1e-30)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_a_row_of_a_batch_is_its_one_row_product_bit_for_bit(small_slices: None,
                                                             qtype: Q) -> None:
    rows, cols = 45, 96  # slices of 24 rows: two, each with a tail past the interleave
    matrix, _ = _matrix(qtype, rows, cols, seed=7)
    x = _rows(decode_gemv.MAX_ROWS + 3, cols, seed=8)
    alone = np.concatenate([_gemv(x[r : r + 1], matrix) for r in range(len(x))])
    for batch in (2, 3, 4, 5, 8, decode_gemv.MAX_ROWS + 3):  # the last in two kernels
        together = _gemv(x[:batch], matrix)
        assert np.array_equal(together, alone[:batch]), batch


def test_only_cpu_q4_1_and_q8_0_products_of_whole_blocks_use_it() -> None:
    q4, _ = _matrix(Q.Q4_1, 8, 64, seed=1)
    q5, _ = _matrix(Q.Q5_1, 8, 64, seed=1)
    assert decode_gemv.usable("CPU", q4, 1)
    assert decode_gemv.usable("CPU", q4, decode_gemv.MAX_ROWS + 1)  # in groups
    assert not decode_gemv.usable("CPU", q5, 1)
    assert not decode_gemv.usable("NV", q4, 1)


def _graphs(jit: TinyJit) -> list[CpuGraph]:  # type: ignore[type-arg]
    from tinygrad.engine.realize import get_graph_runtime
    from tinygrad.uop import Ops

    assert jit.captured is not None
    found = []
    for call in jit.captured.linear.src:
        if call.src[0].op is Ops.CUSTOM_FUNCTION:
            runner = get_graph_runtime(call.src[0])
            if isinstance(runner, CpuGraph):
                found.append(runner)
    return found


@pytest.mark.skipif(not cpu_graph.NATIVE, reason="the native replay pool is not built")
def test_slices_and_products_over_one_input_replay_together_on_threads(
        small_slices: None) -> None:
    """Two products of one input in a JIT: each is cut into slices, the kernels declare
    their inputs read-only, so both products' slices form one phase of the replay, and
    two threads compute one thread's results bit for bit."""
    first, _ = _matrix(Q.Q4_1, 70, 96, seed=2)
    second, _ = _matrix(Q.Q8_0, 50, 96, seed=3)

    def step(x: Tensor) -> tuple[Tensor, Tensor]:
        return decode_gemv.gemv(x, first).realize(), decode_gemv.gemv(x, second).realize()

    jit = TinyJit(step)
    threads = cpu_graph.threads()
    x = Tensor(_rows(3, 96, seed=4)).realize()
    try:
        assert cpu_graph.use_cpu_graph(True)
        for _ in range(3):  # run, capture, replay
            jit(x)
        cpu_graph.set_threads(1)
        one = [t.numpy().copy() for t in jit(x)]
        cpu_graph.set_threads(2)
        two = [t.numpy().copy() for t in jit(x)]
    finally:
        cpu_graph.use_cpu_graph(False)
        cpu_graph.set_threads(threads)
    assert all(np.array_equal(a, b) for a, b in zip(one, two, strict=True))
    graphs = _graphs(jit)
    gemvs = [(g, i) for g in graphs for i, name in enumerate(g.names) if "gemv" in name]
    assert len(gemvs) == 2
    graph = gemvs[0][0]
    assert [int(graph.kernels[i, 1]) for _, i in gemvs] == [3, 3]  # 24-row slices
    assert any(rows >= 6 for _, rows in graph.phases.tolist())  # both products together


def test_short_prefills_go_through_the_kernel_row_for_row(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A prefill product of at most PREFILL_ROWS rows over Q4_1/Q8_0 blocks is the decode
    kernel (each row bit for bit its one-row product); a longer one, or another block
    type, is the panel GEMM's block product."""
    from types import SimpleNamespace

    from swactor.model import llama_role
    from swactor.model.llama_role import StageRole

    matrix, _ = _matrix(Q.Q4_1, 40, 64, seed=5)
    role = SimpleNamespace(_cpu=True, device=Device.DEFAULT)
    x = _rows(16, 64, seed=6)
    out = StageRole._block_linear(role, Tensor(x), matrix).numpy()  # type: ignore[arg-type]
    alone = np.concatenate([_gemv(x[i : i + 1], matrix) for i in range(16)])
    assert np.array_equal(out, alone)

    taken: list[int] = []
    monkeypatch.setattr(llama_role, "block_matmul",
                        lambda x, blocks, cpu: taken.append(int(x.shape[0])) or x)
    long_rows = Tensor(_rows(decode_gemv.PREFILL_ROWS + 16, 64, seed=7))
    StageRole._block_linear(role, long_rows, matrix)  # type: ignore[arg-type]
    other, _ = _matrix(Q.Q5_0, 40, 64, seed=8)
    StageRole._block_linear(role, Tensor(x), other)  # type: ignore[arg-type]
    assert taken == [decode_gemv.PREFILL_ROWS + 16, 16]
