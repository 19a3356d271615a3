"""The CPU prefill GEMM (swactor.model.prefill_gemm) against numpy in float64."""

from __future__ import annotations

import numpy as np
import pytest
from tinygrad.tensor import Tensor

from swactor.model import prefill_gemm
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

    rows, cols, tokens = 4 * PANEL, 256, 16
    panel_bytes = rows * cols * 4
    rng = np.random.default_rng(5)
    weights = [Tensor(rng.standard_normal((rows, cols)).astype(np.float32)).realize()
               for _ in range(4)]
    x = Tensor(rng.standard_normal((tokens, cols)).astype(np.float32)).realize()

    def chain(h: Tensor) -> Tensor:
        for w in weights:
            h = panel_matmul(h, w * 1.0)[:, :cols] + 1.0
        return h.realize()

    jit = TinyJit(chain)
    before = GlobalCounters.mem_used
    for _ in range(3):
        jit(x)
    assert GlobalCounters.mem_used - before < 2 * panel_bytes
