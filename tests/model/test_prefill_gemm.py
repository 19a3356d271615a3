"""The CPU prefill GEMM (swactor.model.prefill_gemm) against numpy in float64, and cut
into slices for the replay pool bit for bit as in one piece."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants
from tinygrad.tensor import Tensor

from swactor.model import cpu_graph, prefill_gemm
from swactor.model.block_kernels import dequant_expr, to_device
from swactor.model.cpu_graph import CpuGraph
from swactor.model.dequant import QuantMatrix
from swactor.model.prefill_gemm import PANEL, ROW_BLOCK, panel_matmul, usable


def _product(tokens: int, rows: int, cols: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, cols)).astype(np.float32)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    got = panel_matmul(Tensor(x).realize(), Tensor(w).realize() * 1.0).numpy()
    return got, x.astype(np.float64) @ w.astype(np.float64).T


# token counts: whole register blocks, blocks plus a tail, fewer than one block's worth
@pytest.mark.parametrize("tokens", [16, 2 * ROW_BLOCK + 3, ROW_BLOCK - 1])
def test_every_token_row_and_panel_is_the_product(tokens: int) -> None:
    got, want = _product(tokens, 3 * PANEL, 40, seed=tokens)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_matrices_past_the_panel_limit_are_cut_into_row_groups(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 2 panels of 40 columns per group: 5 panels make groups of 64, 64 and 32 rows
    monkeypatch.setattr(prefill_gemm, "PANEL_LIMIT_BYTES", 4 * 40 * 2 * PANEL)
    got, want = _product(9, 5 * PANEL, 40, seed=3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_only_prompt_sized_cpu_products_with_whole_panels_use_it() -> None:
    assert usable("CPU", prefill_gemm.MIN_TOKENS, PANEL)
    assert not usable("CPU", prefill_gemm.MIN_TOKENS - 1, PANEL)  # decode rows
    assert not usable("CPU", 64, PANEL + 8)  # a partial panel
    assert not usable("NV", 64, PANEL)


def test_a_graph_of_products_holds_one_products_panels_at_a_time() -> None:
    """Each product's widened weights are transient: a JIT of four products in a chain
    allocates about one matrix's panels, not four (tinygrad scheduled every panels
    kernel first, and the memory plan kept all of them)."""
    from tinygrad.engine.jit import TinyJit
    from tinygrad.helpers import GlobalCounters

    rows = cols = 4 * PANEL  # square: each product's output is the next one's input
    tokens = 16
    panel_bytes = rows * cols * 4
    rng = np.random.default_rng(5)
    weights = [Tensor(rng.standard_normal((rows, cols)).astype(np.float32)).realize()
               for _ in range(4)]
    x = Tensor(rng.standard_normal((tokens, cols)).astype(np.float32)).realize()

    def chain(h: Tensor) -> Tensor:
        for w in weights:
            h = panel_matmul(h, w * 1.0) + 1.0
        return h.realize()

    jit = TinyJit(chain)
    before = GlobalCounters.mem_used
    for _ in range(3):
        jit(x)
    assert GlobalCounters.mem_used - before < 2 * panel_bytes


def test_an_input_of_another_width_is_refused() -> None:
    weights = Tensor.ones(PANEL, 64)
    with pytest.raises(ValueError, match=r"shape \(16, 32\) for a product over 64 columns"):
        panel_matmul(Tensor.ones(16, 32), weights)


def test_slices_compute_the_one_slice_product_bit_for_bit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Cut into slices of whole panels (here 2 panels each, the last one short), every
    output is the one computed by the product in one slice, bit for bit."""
    tokens, cols, rows = 2 * ROW_BLOCK + 3, 40, 5 * PANEL
    monkeypatch.setattr(prefill_gemm, "SLICE_MACS", 1 << 40)
    assert prefill_gemm.slice_panels(tokens, cols, rows) == 5
    whole, want = _product(tokens, rows, cols, seed=11)
    monkeypatch.setattr(prefill_gemm, "SLICE_MACS", 2 * tokens * cols * PANEL)
    assert prefill_gemm.slice_panels(tokens, cols, rows) == 2
    sliced, _ = _product(tokens, rows, cols, seed=11)
    assert np.array_equal(sliced, whole)
    np.testing.assert_allclose(sliced, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.skipif(not cpu_graph.NATIVE, reason="the native replay pool is not built")
def test_a_products_slices_replay_on_threads_as_on_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a JIT replayed through CpuGraph the product is one kernel of several slices, all
    in one phase (the pool's threads share them), and two threads compute one thread's
    results bit for bit."""
    from tinygrad.engine.jit import TinyJit
    from tinygrad.engine.realize import get_graph_runtime
    from tinygrad.uop import Ops

    tokens, cols, rows = 12, 64, 6 * PANEL
    monkeypatch.setattr(prefill_gemm, "SLICE_MACS", tokens * cols * PANEL)  # a panel each
    rng = np.random.default_rng(9)
    w = Tensor(rng.standard_normal((rows, cols)).astype(np.float32)).realize()
    x = Tensor(rng.standard_normal((tokens, cols)).astype(np.float32)).realize()
    jit = TinyJit(lambda x: panel_matmul(x, w * 1.0).realize())
    threads = cpu_graph.threads()
    try:
        assert cpu_graph.use_cpu_graph(True)
        for _ in range(3):  # run, capture, replay
            jit(x)
        cpu_graph.set_threads(1)
        one = jit(x).numpy().copy()
        cpu_graph.set_threads(2)
        two = jit(x).numpy().copy()
    finally:
        cpu_graph.use_cpu_graph(False)
        cpu_graph.set_threads(threads)
    assert np.array_equal(one, two)
    assert jit.captured is not None
    graphs = [get_graph_runtime(call.src[0]) for call in jit.captured.linear.src
              if call.src[0].op is Ops.CUSTOM_FUNCTION]
    found = [(g, i) for g in graphs if isinstance(g, CpuGraph)
             for i, name in enumerate(g.names) if name.startswith("prefill_gemm")]
    assert len(found) == 1
    graph, index = found[0]
    first, slices = (int(v) for v in graph.kernels[index])
    assert slices == 6
    assert any(start <= first and first + slices <= start + count
               for start, count in graph.phases.tolist())  # one phase: run side by side


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0], ids=lambda q: q.name)
def test_block_products_widen_panels_in_the_kernel_bit_for_bit(
        monkeypatch: pytest.MonkeyPatch, qtype: Q) -> None:
    """A Q4_1/Q8_0 product widens its panels inside its slices: the two-kernel product's
    numbers bit for bit (the same widened weights, the same sums), whatever the cut."""
    tokens, rows, cols = 2 * ROW_BLOCK + 3, 3 * PANEL, 96
    rng = np.random.default_rng(int(qtype))
    raw = quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype)
    matrix = to_device(QuantMatrix(int(qtype), (rows, cols), raw.reshape(rows, -1)), "CPU")
    x = Tensor(rng.standard_normal((tokens, cols)).astype(np.float32)).realize()
    assert prefill_gemm.widens_blocks(matrix.type_id, cols)
    two_kernels = panel_matmul(x, dequant_expr(matrix, cpu=True)).numpy()
    monkeypatch.setattr(prefill_gemm, "SLICE_MACS", tokens * cols * PANEL)  # a panel each
    fused = prefill_gemm.block_matmul(x, matrix.type_id, matrix.shape, matrix.fields).numpy()
    assert np.array_equal(fused, two_kernels)
    weights = quants.dequantize(raw, qtype).reshape(rows, cols).astype(np.float64)
    want = x.numpy().astype(np.float64) @ weights.T
    np.testing.assert_allclose(fused, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_only_q4_1_and_q8_0_panels_that_fit_the_stack_widen_in_the_kernel() -> None:
    assert prefill_gemm.widens_blocks(int(Q.Q8_0), 576)
    assert not prefill_gemm.widens_blocks(int(Q.Q6_K), 576)
    assert not prefill_gemm.widens_blocks(int(Q.Q4_1), 40)  # a partial block
    too_wide = prefill_gemm.WIDE_LIMIT // (4 * PANEL) + 32
    assert not prefill_gemm.widens_blocks(int(Q.Q4_1), too_wide)
