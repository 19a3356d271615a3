"""The hand-written decode product (swactor.model.decode_gemv), both paths, against numpy
in float64 (the integer path: of the activations quantised as it documents), row for row
identical whatever the batch, the same on every x86-64 target, sliced for the replay pool."""

from __future__ import annotations

import ctypes
import platform
from pathlib import Path

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
from tests.model.c_targets import build, cpu_flags

pytestmark = pytest.mark.skipif(not Device.DEFAULT.startswith("CPU"),
                                reason="a CPU-device kernel")
TYPES = [Q.Q4_1, Q.Q8_0]
PATHS = ["float", "integer", "integer16"]


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


def _levels(qtype: Q) -> int:
    """The largest activation code of the integer path for a ``qtype`` matrix."""
    return 127 if decode_gemv.activation_bits(int(qtype)) == 8 else 32767


def _quantised(x: npt.NDArray[np.float32], levels: int) -> npt.NDArray[np.float64]:
    """``x`` as the integer path sees it: each block of 32 rounded (half to even) to
    ``q = x * (1 / d)`` with ``d = max|x| / levels`` in float32, then ``q * d``."""
    blocks = x.reshape(len(x), -1, 32)
    d = np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(levels)
    tiny = d < np.float32(2.0**-120)
    inverse = np.float32(1) / np.where(tiny, np.float32(1), d)
    codes = np.rint(blocks * np.where(tiny, np.float32(0), inverse))
    assert np.abs(codes).max() <= levels
    return (codes.astype(np.float64) * d.astype(np.float64)).reshape(x.shape)


@pytest.fixture(params=PATHS)
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The float path, the integer path (a target that has it), or the integer path with
    int16 activations for Q4_1 too."""
    integer = request.param != "float"
    monkeypatch.setattr(decode_gemv, "INTEGER", integer)
    monkeypatch.setattr(decode_gemv, "EIGHT_BIT", request.param == "integer")
    if integer and not decode_gemv.integer_path("CPU"):
        pytest.skip("the integer path is for x86-64 targets")
    return str(request.param)


@pytest.fixture
def small_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slices of 16 rows, so small products have several, and a last short one."""
    monkeypatch.setattr(decode_gemv, "SLICE_WEIGHTS", 16 * 96)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize(("batch", "rows", "cols"),
                         [(1, 40, 64), (2, 33, 32), (3, 77, 96), (4, 5, 576), (8, 61, 160)])
def test_every_row_is_the_product_of_the_files_weights(
        small_slices: None, path: str, qtype: Q, batch: int, rows: int, cols: int) -> None:
    matrix, weights = _matrix(qtype, rows, cols, seed=rows)
    x = _rows(batch, cols, seed=cols)
    got = _gemv(x, matrix)
    exact = x.astype(np.float64) @ weights.T
    levels = _levels(qtype)
    want = exact if path == "float" else _quantised(x, levels) @ weights.T
    assert got.shape == (batch, rows)
    scale = np.abs(x).astype(np.float64) @ np.abs(weights).T  # the sum's magnitude
    assert np.all(np.abs(got - want) <= 1e-6 * scale + 1e-30)
    if path != "float":  # each activation off by at most half a step of its block
        step = np.abs(x.reshape(batch, -1, 32)).max(axis=-1) / levels
        bound = np.repeat(step / 2, 32, axis=1) @ np.abs(weights).T
        assert np.all(np.abs(got - exact) <= bound + 1e-6 * scale)


def test_an_input_of_another_width_is_refused() -> None:
    matrix, _ = _matrix(Q.Q4_1, 16, 64, seed=1)
    with pytest.raises(ValueError, match=r"shape \(2, 32\) for a product over 64 columns"):
        decode_gemv.gemv(Tensor(_rows(2, 32, seed=2)), matrix)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_a_row_of_a_batch_is_its_one_row_product_bit_for_bit(small_slices: None, path: str,
                                                             qtype: Q) -> None:
    rows, cols = 45, 96  # slices of 16 rows: three, the last short
    matrix, _ = _matrix(qtype, rows, cols, seed=7)
    x = _rows(2 * decode_gemv.MAX_ROWS + 3, cols, seed=8)
    alone = np.concatenate([_gemv(x[r : r + 1], matrix) for r in range(len(x))])
    # past MAX_ROWS: float path two or three kernels, integer path groups in one kernel
    for batch in (2, 3, 4, 5, 8, decode_gemv.MAX_ROWS + 3, 2 * decode_gemv.MAX_ROWS,
                  2 * decode_gemv.MAX_ROWS + 3):
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
        small_slices: None, path: str) -> None:
    """Two products of one input in a JIT: each is cut into slices, the kernels declare
    their inputs read-only, so both products' slices form one phase of the replay, and
    two threads compute one thread's results bit for bit."""
    first, _ = _matrix(Q.Q4_1, 70, 96, seed=2)
    second, _ = _matrix(Q.Q8_0, 50, 96, seed=3)

    def step(x: Tensor) -> tuple[Tensor, Tensor]:
        products = decode_gemv.gemv(x, first), decode_gemv.gemv(x, second)
        Tensor.realize(*products)  # the integer path: both quantisations, then both
        return products

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
    assert [int(graph.kernels[i, 1]) for _, i in gemvs] == [5, 4]  # 16-row slices
    assert any(rows >= 9 for _, rows in graph.phases.tolist())  # both products together


def test_prefills_go_through_the_kernel_row_for_row(
        monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """A prefill product over Q4_1/Q8_0 blocks is this kernel (each row bit for bit its
    one-row product): at any length on the integer path, up to PREFILL_ROWS rows on the
    float path; a longer float-path one, or another block type, is the panel GEMM's."""
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
    long_rows = _rows(decode_gemv.PREFILL_ROWS + 16, 64, seed=7)
    long_out = StageRole._block_linear(role, Tensor(long_rows), matrix)  # type: ignore[arg-type]
    other, _ = _matrix(Q.Q5_0, 40, 64, seed=8)
    StageRole._block_linear(role, Tensor(x), other)  # type: ignore[arg-type]
    if path != "float":
        assert taken == [16]
        picks = [0, 1, 8, 47, 64, 72, decode_gemv.PREFILL_ROWS + 15]  # two chunks
        alone = np.concatenate([_gemv(long_rows[i : i + 1], matrix) for i in picks])
        assert np.array_equal(long_out.numpy()[picks], alone)
    else:
        assert taken == [decode_gemv.PREFILL_ROWS + 16, 16]


_TARGETS = {  # clang flags: the CPU flags (/proc/cpuinfo) they need
    "generic": (["-march=x86-64"], set()),
    "avx2": (["-march=x86-64-v3"], {"avx2", "fma"}),
    "avx-vnni": (["-march=x86-64-v3", "-mavxvnni"], {"avx2", "fma", "avx_vnni"}),
    "avx512-vnni": (["-march=x86-64-v4", "-mavx512vnni"],
                    {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}),
}


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                    reason="x86-64 targets")
@pytest.mark.parametrize("eight_bit", [True, False], ids=["int8", "int16"])
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_every_x86_target_computes_the_integer_path_alike(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, qtype: Q, eight_bit: bool) -> None:
    """The integer path's C built for each x86-64 level this CPU runs (no vector
    extension, AVX2, AVX-VNNI, AVX-512 VNNI): the same quantised words everywhere, and
    the same products bit for bit on every target with FMA (the integer sums are exact;
    the generic target rounds its unfused multiply-adds differently), all within float32
    rounding of numpy."""
    monkeypatch.setattr(decode_gemv, "EIGHT_BIT", eight_bit)
    if qtype == Q.Q8_0 and eight_bit:
        assert decode_gemv.activation_bits(int(qtype)) == 16  # Q8_0 keeps int16 codes
    bits = decode_gemv.activation_bits(int(qtype))
    rows, cols, batch = 37, 96, decode_gemv.MAX_ROWS + 3  # a group and a rest
    matrix, weights = _matrix(qtype, rows, cols, seed=3)
    x = _rows(batch, cols, seed=4)
    x[0, :32] = 0.0  # a zero block, and one too small to scale (zero codes)
    x[1, 32:64] *= np.float32(1e-38)
    q4 = qtype == Q.Q4_1
    words = decode_gemv.quant_words(cols, bits)
    per_slice = decode_gemv.slice_rows(rows, cols)
    slices = -(-rows // per_slice)
    fields = [np.ascontiguousarray(matrix.fields[f].numpy()) for f in
              (["qs", "d", "m"] if q4 else ["qs", "d"])]
    quant_c = ("void quant(int *p0, const float *p1) "
               + decode_gemv.quant_source(batch, cols, bits).format("p0", "p1"))
    arguments = ["float *p0", "const int *p1", "const void *p2", "const void *p3",
                 *(["const void *p4"] if q4 else []), "int core"]
    names = [a.split("*")[-1].split()[-1] for a in arguments]
    gemv_c = (f"void gemv({', '.join(arguments)}) "
              + decode_gemv.int_source(int(qtype), batch, cols, rows, per_slice).format(*names))
    have = cpu_flags()
    quantised: dict[str, npt.NDArray[np.int32]] = {}
    products: dict[str, npt.NDArray[np.float32]] = {}
    for target, (flags, needs) in _TARGETS.items():
        if not needs <= have:
            continue
        quant = build(quant_c, "quant_" + target, flags, tmp_path)
        gemv = build(gemv_c, "gemv_" + target, flags, tmp_path)
        q = np.zeros((batch, words), np.int32)
        quant.quant(q.ctypes.data_as(ctypes.c_void_p), x.ctypes.data_as(ctypes.c_void_p))
        out = np.full((batch, rows), np.nan, np.float32)
        for core in range(slices):
            gemv.gemv(out.ctypes.data_as(ctypes.c_void_p), q.ctypes.data_as(ctypes.c_void_p),
                      *(f.ctypes.data_as(ctypes.c_void_p) for f in fields), ctypes.c_int(core))
        quantised[target], products[target] = q, out
    assert "generic" in products
    assert all(np.array_equal(q, quantised["generic"]) for q in quantised.values())
    fused = [p for target, p in products.items() if target != "generic"]
    assert all(np.array_equal(p, fused[0]) for p in fused)
    native = fused[0] if fused else products["generic"]
    assert np.array_equal(native, _gemv(x, matrix))  # tinygrad's build, -march=native
    want = _quantised(x, _levels(qtype)) @ weights.T
    scale = np.abs(x).astype(np.float64) @ np.abs(weights).T
    for got in products.values():
        assert np.all(np.abs(got - want) <= 1e-6 * scale + 1e-30)
