"""Block kernels against gguf-py's own numpy dequantisation (an independent reference)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as Q
from tinygrad.helpers import GlobalCounters

from swactor.model.block_kernels import block_matmul, dequant_expr, to_device, upload
from swactor.model.dequant import (
    BLOCK_TYPES,
    QuantMatrix,
    block_bytes,
    block_fields,
    quant_matrix,
    raw_from_fields,
)

# byte offsets of each type's f16 scale fields inside one block
# (F16/BF16: blocks of one weight, every value; as bf16 the f16 bit patterns are finite)
_F16_FIELDS = {Q.F16: (0,), Q.BF16: (0,), Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,),
               Q.Q5_1: (0, 2), Q.Q8_0: (0,), Q.Q2_K: (80, 82), Q.Q3_K: (108,),
               Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


def _random_blocks(qtype: Q, rows: int, cols: int, seed: int) -> npt.NDArray[np.uint8]:
    """Random bytes with finite f16 scales (of both signs, subnormals included): any such
    block is valid, and every code and 6-bit scale pattern occurs."""
    rng = np.random.default_rng(seed)
    block, size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
    for offset in _F16_FIELDS[qtype]:
        scale = rng.uniform(-2.0, 2.0, size=len(blocks)).astype(np.float16)
        scale[::7] = np.float16(3e-6)  # a subnormal f16
        blocks[:, offset : offset + 2] = scale.view(np.uint8).reshape(-1, 2)
    return blocks


@pytest.mark.parametrize("dtype", ["<f4", "<f2", "u1", "<i4"])
def test_upload_holds_the_values_and_runs_no_kernel(dtype: str) -> None:
    """Weights go to the device as a buffer tensor with their exact bytes, copied in
    without scheduling anything (read-only arrays too, like a file's mapped bytes)."""
    array = (np.arange(24) * 7 % 251).astype(dtype).reshape(2, 3, 4)
    array.flags.writeable = False
    kernels = GlobalCounters.kernel_count
    tensor = upload(array, "CPU")
    assert GlobalCounters.kernel_count == kernels
    assert tensor.uop.has_buffer_identity()
    assert tensor.shape == array.shape and tensor.numpy().dtype == array.dtype
    assert tensor.numpy().tobytes() == array.tobytes()


def test_block_types_are_the_issue_list() -> None:
    assert {Q(t).name for t in BLOCK_TYPES} == {"F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                                                "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                                                "Q6_K"}


@pytest.mark.parametrize("cpu_bits", [True, False], ids=["f16-bit-moves", "f16-cast"])
@pytest.mark.parametrize("qtype", sorted(_F16_FIELDS, key=int), ids=lambda q: q.name)
def test_dequant_expr_is_bit_identical_to_gguf_py(qtype: Q, cpu_bits: bool) -> None:
    rows, cols = 24, 768
    blocks = _random_blocks(qtype, rows, cols, seed=int(qtype))
    want = quants.dequantize(blocks, qtype).reshape(rows, cols)
    matrix = quant_matrix(blocks.reshape(-1), int(qtype), (rows, cols))
    assert matrix is not None
    got = dequant_expr(to_device(matrix, "CPU"), cpu_bits).numpy()
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("qtype", sorted(_F16_FIELDS, key=int), ids=lambda q: q.name)
def test_row_slices_permutations_and_stacks_keep_rows(qtype: Q) -> None:
    rows, cols = 12, 512
    a = quant_matrix(_random_blocks(qtype, rows, cols, 1).reshape(-1), int(qtype), (rows, cols))
    b = quant_matrix(_random_blocks(qtype, 4, cols, 2).reshape(-1), int(qtype), (4, cols))
    assert a is not None and b is not None
    order = np.random.default_rng(3).permutation(rows)
    joined = QuantMatrix.stack([a.permute_rows(order), b])
    want = np.concatenate([a.dense(np.float32)[order], b.dense(np.float32)])
    device = to_device(joined, "CPU")
    np.testing.assert_array_equal(dequant_expr(device, True).numpy(), want)
    np.testing.assert_array_equal(dequant_expr(device.row_slice(5, 9), True).numpy(),
                                  want[5:14])
    np.testing.assert_array_equal(joined.dense_rows(np.array([15, 0, 15]), np.float32),
                                  want[[15, 0, 15]])


@pytest.mark.parametrize("qtype", sorted(_F16_FIELDS, key=int), ids=lambda q: q.name)
def test_device_bytes_stay_near_the_file_bytes(qtype: Q) -> None:
    """Block arrays cost the file's bytes, plus 4 bytes per Q3_K/Q4_K/Q5_K super-block
    (6-bit scales unpacked): at most 1.04x."""
    rows, cols = 8, 1024
    matrix = quant_matrix(_random_blocks(qtype, rows, cols, 4).reshape(-1), int(qtype),
                          (rows, cols))
    assert matrix is not None
    stored = sum(a.nbytes for a in block_fields(matrix).values())
    assert matrix.nbytes <= stored <= 1.04 * matrix.nbytes
    assert to_device(matrix, "CPU").nbytes == stored


def test_other_types_and_shapes_have_no_block_form() -> None:
    raw = np.zeros(4 * 256 * 4, dtype=np.uint8)
    assert quant_matrix(raw, int(Q.F32), (4, 256)) is None
    assert quant_matrix(np.zeros(8 * 136, np.uint8), int(Q.IQ4_XS), (8, 256)) is None
    assert quant_matrix(np.zeros(8 * 22, np.uint8), int(Q.Q5_0), (8, 48)) is None
    assert quant_matrix(np.zeros(144, np.uint8), int(Q.Q4_K), (256,)) is None
    assert quant_matrix(np.zeros(100, np.uint8), int(Q.Q4_K), (1, 256)) is None


@pytest.mark.parametrize("qtype", sorted(_F16_FIELDS, key=int), ids=lambda q: q.name)
def test_the_fields_give_back_the_files_blocks(qtype: Q) -> None:
    """raw_from_fields inverts block_fields, for every row or chosen rows (the tied
    embedding lookup of a single stage reads the output matrix's fields)."""
    blocks = _random_blocks(qtype, 7, 512, 8)
    matrix = quant_matrix(blocks.reshape(-1), int(qtype), (7, 512))
    assert matrix is not None
    fields = block_fields(matrix)
    np.testing.assert_array_equal(raw_from_fields(int(qtype), fields), matrix.raw)
    rows = np.array([6, 0, 6, 3])
    picked = raw_from_fields(int(qtype), {k: v[rows] for k, v in fields.items()})
    np.testing.assert_array_equal(picked, blocks.reshape(7, -1)[rows])


@pytest.mark.parametrize("qtype", sorted(_F16_FIELDS, key=int), ids=lambda q: q.name)
def test_block_bytes_predicts_the_fields(qtype: Q) -> None:
    matrix = quant_matrix(_random_blocks(qtype, 3, 512, 5).reshape(-1), int(qtype), (3, 512))
    assert matrix is not None
    assert block_bytes(int(qtype), (3, 512)) == sum(
        a.nbytes for a in block_fields(matrix).values())


@pytest.mark.parametrize("qtype", sorted(_F16_FIELDS, key=int), ids=lambda q: q.name)
def test_prefill_product_keeps_no_dense_matrix(qtype: Q) -> None:
    """Off the CPU panel GEMM, the prefill product is one kernel per term, widening codes
    in registers: an extra kernel would be tinygrad materialising the dense matrix (it
    did, for K-quants, when the kernel read more than three buffers or the whole
    dequantised sum). Both paths compute the product."""
    from tinygrad.tensor import Tensor

    rows, cols, tokens = 64, 512, 16
    matrix = quant_matrix(_random_blocks(qtype, rows, cols, 6).reshape(-1), int(qtype),
                          (rows, cols))
    assert matrix is not None
    device = to_device(matrix, "CPU")
    x = Tensor(np.random.default_rng(7).standard_normal((tokens, cols)).astype(np.float32))
    x = x.realize()
    with_offset = qtype in (Q.Q4_1, Q.Q5_1, Q.Q2_K, Q.Q4_K, Q.Q5_K)
    # schedule_linear() takes the kernels out of the graph: count on a twin of it
    # cpu=False: tinygrad's own product (the CPU panel GEMM is tests/model/test_prefill_gemm)
    kernels = block_matmul(x, device, cpu=False).schedule_linear().src
    assert len(kernels) == (2 if with_offset else 1)
    want = x.numpy().astype(np.float64) @ matrix.dense(np.float32).astype(np.float64).T
    for cpu in (False, True):
        got = block_matmul(x, device, cpu=cpu).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
