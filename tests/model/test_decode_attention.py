"""The hand-written decode attention (swactor.model.decode_attention) against numpy in
float64: its outputs and cache writes, row for row identical whatever the batch, and
replayed from a TinyJit with the positions and slots as bound variables."""

from __future__ import annotations

import ctypes
import math
import platform
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from tinygrad.device import Device
from tinygrad.engine.jit import TinyJit
from tinygrad.engine.realize import get_graph_runtime
from tinygrad.tensor import Tensor
from tinygrad.uop import Ops
from tinygrad.uop.ops import UOp

from swactor.model import cpu_graph, decode_attention
from swactor.model.cpu_graph import CpuGraph
from tests.model.c_targets import build, cpu_flags

pytestmark = pytest.mark.skipif(not Device.DEFAULT.startswith("CPU"),
                                reason="a CPU-device kernel")
SLOTS, MAX_SEQ = 8, 40


@dataclass(frozen=True)
class Shape:
    heads: int
    kv: int
    hd: int
    rope_dim: int
    f16: bool

    @property
    def np_dtype(self) -> type[np.float16] | type[np.float32]:
        return np.float16 if self.f16 else np.float32


SHAPES = [
    Shape(9, 3, 64, 64, False),  # SmolLM2's blocks
    Shape(4, 2, 16, 16, True),  # an f16 cache
    Shape(4, 1, 64, 32, False),  # rotary embedding of half the features
    Shape(2, 1, 128, 128, True),
    Shape(4, 2, 6, 0, False),  # no rotary embedding; 2-lane sums
    Shape(3, 3, 12, 12, False),  # one head per group; 4-lane sums
    Shape(6, 1, 16, 16, True),  # a group of more heads than share one pass (4 + 2)
    Shape(4, 2, 8, 8, True),  # 8-lane sums: keys in blocks of 8
]


class Case:
    """Random rows, caches and rotary tables for one shape."""

    def __init__(self, shape: Shape, batch: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.shape = shape
        dims = (SLOTS, shape.kv, MAX_SEQ, shape.hd)
        self.cache_k = rng.standard_normal(dims).astype(shape.np_dtype)
        self.cache_v = rng.standard_normal(dims).astype(shape.np_dtype)
        width = (shape.heads + 2 * shape.kv) * shape.hd
        self.qkv = (rng.standard_normal((batch, width)) * 2).astype(np.float32)
        angles = rng.uniform(0, 6, (MAX_SEQ, max(1, shape.rope_dim // 2)))
        self.cos = np.cos(angles).astype(np.float32)
        self.sin = np.sin(angles).astype(np.float32)

    def run(self, positions: list[int], slots: list[int], rows: slice = slice(None)
            ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.generic],
                       npt.NDArray[np.generic]]:
        """The kernel over ``qkv[rows]``: its output and both caches after it."""
        shape = self.shape
        cache_k, cache_v = Tensor(self.cache_k.copy()).realize(), Tensor(self.cache_v.copy()
                                                                         ).realize()
        rope = ((Tensor(self.cos).realize(), Tensor(self.sin).realize())
                if shape.rope_dim else None)
        where = decode_attention.positions(positions, slots, "CPU")
        out = decode_attention.attend(Tensor(self.qkv[rows]).realize(), where, cache_k,
                                      cache_v, rope, heads=shape.heads, kv_heads=shape.kv,
                                      rope_dim=shape.rope_dim).numpy()
        return out, cache_k.numpy(), cache_v.numpy()

    def reference(self, positions: list[int], slots: list[int]
                  ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64],
                             npt.NDArray[np.float64]]:
        """numpy in float64: rotate, write the caches (in their dtype), attend."""
        shape = self.shape
        hd, heads, kv, half = shape.hd, shape.heads, shape.kv, shape.rope_dim // 2
        cache_k = self.cache_k.astype(np.float64)
        cache_v = self.cache_v.astype(np.float64)
        out = np.zeros((len(positions), heads * hd))

        def rotate(x: npt.NDArray[np.float32], pos: int) -> npt.NDArray[np.float64]:
            y = x.astype(np.float64)
            if half:
                c, s = self.cos[pos].astype(np.float64), self.sin[pos].astype(np.float64)
                x1, x2 = y[:half].copy(), y[half : 2 * half].copy()
                y[:half], y[half : 2 * half] = x1 * c - x2 * s, x2 * c + x1 * s
            return y

        for b, (pos, slot) in enumerate(zip(positions, slots, strict=True)):
            row = self.qkv[b]
            for g in range(kv):
                k = rotate(row[(heads + g) * hd : (heads + g + 1) * hd], pos)
                v = row[(heads + kv + g) * hd : (heads + kv + g + 1) * hd]
                cache_k[slot, g, pos] = k.astype(shape.np_dtype)
                cache_v[slot, g, pos] = v.astype(shape.np_dtype)
                for head in range(g * heads // kv, (g + 1) * heads // kv):
                    q = rotate(row[head * hd : (head + 1) * hd], pos)
                    scores = cache_k[slot, g, : pos + 1] @ q / math.sqrt(hd)
                    e = np.exp(scores - scores.max())
                    out[b, head * hd : (head + 1) * hd] = (e / e.sum()) @ cache_v[
                        slot, g, : pos + 1]
        return out, cache_k, cache_v


def _bits(array: npt.NDArray[np.generic]) -> npt.NDArray[np.uint8]:
    return np.ascontiguousarray(array).view(np.uint8)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s.heads}h{s.kv}kv{s.hd}"
                         f"r{s.rope_dim}{'f16' if s.f16 else 'f32'}")
@pytest.mark.parametrize("batch", [1, 2, 3, 5, 8])
def test_attention_matches_numpy(shape: Shape, batch: int) -> None:
    case = Case(shape, batch, seed=batch * 31 + shape.hd)
    rng = np.random.default_rng(batch)
    slots = rng.permutation(SLOTS)[:batch].tolist()
    # context lengths 1 (position 0), 17 (not a multiple of any vector width), the last
    positions = [[0, 16, MAX_SEQ - 1][b % 3] if b < 3 else int(rng.integers(0, MAX_SEQ))
                 for b in range(batch)]
    out, cache_k, cache_v = case.run(positions, slots)
    want, want_k, want_v = case.reference(positions, slots)
    assert np.abs(out - want).max() < 2e-5 * max(1.0, float(np.abs(want).max()))
    # the rotated keys as float32 arithmetic rounds them; the values copied exactly
    assert np.abs(cache_k.astype(np.float64) - want_k).max() < (
        2e-3 if shape.f16 else 2e-6)
    assert np.array_equal(cache_v.astype(np.float64), want_v)
    touched = np.zeros(cache_k.shape, dtype=bool)
    for pos, slot in zip(positions, slots, strict=True):
        touched[slot, :, pos] = True
    assert np.array_equal(_bits(cache_k[~touched]), _bits(case.cache_k[~touched]))


@pytest.mark.parametrize("shape", SHAPES[:2], ids=["f32", "f16"])
def test_each_row_is_the_row_alone(shape: Shape) -> None:
    batch = 8
    case = Case(shape, batch, seed=7)
    slots = [5, 0, 7, 2, 1, 6, 3, 4]
    positions = [0, 1, 15, 16, 17, 31, 38, 39]
    out, cache_k, cache_v = case.run(positions, slots)
    for b in range(batch):
        alone, alone_k, alone_v = case.run(positions[b : b + 1], slots[b : b + 1],
                                           slice(b, b + 1))
        assert np.array_equal(_bits(out[b]), _bits(alone[0])), f"row {b}"
        slot, pos = slots[b], positions[b]
        assert np.array_equal(_bits(cache_k[slot, :, pos]), _bits(alone_k[slot, :, pos]))
        assert np.array_equal(_bits(cache_v[slot, :, pos]), _bits(alone_v[slot, :, pos]))


def test_replayed_with_bound_positions_and_slots() -> None:
    """Through a TinyJit (CpuGraph on 2 threads), the rows' positions and slots bound
    per call: each replay attends where its variables say."""
    shape, batch = SHAPES[0], 3
    case = Case(shape, batch, seed=11)
    starts = [UOp.variable(f"start_pos{b}", 0, MAX_SEQ - 1) for b in range(batch)]
    slot_vars = [UOp.variable(f"slot{b}", 0, SLOTS - 1) for b in range(batch)]
    cache_k, cache_v = Tensor(case.cache_k.copy()).realize(), Tensor(case.cache_v.copy()
                                                                     ).realize()
    rope = (Tensor(case.cos).realize(), Tensor(case.sin).realize())
    qkv = Tensor(case.qkv).realize()

    def step(rows: Tensor, *variables: UOp) -> Tensor:
        where = decode_attention.positions(variables[:batch], variables[batch:], "CPU")
        return decode_attention.attend(rows, where, cache_k, cache_v, rope, heads=shape.heads,
                                       kv_heads=shape.kv, rope_dim=shape.rope_dim).realize()

    jit = TinyJit(step)
    previous = cpu_graph.threads()
    cpu_graph.use_cpu_graph(True)
    cpu_graph.set_threads(2)
    try:
        for call, positions in enumerate([[3, 0, 9], [4, 1, 10], [5, 2, 11], [30, 20, 39]]):
            slots = [[1, 4, 6], [1, 4, 6], [2, 5, 0], [7, 3, 2]][call]
            case.cache_k, case.cache_v = cache_k.numpy(), cache_v.numpy()
            out = jit(qkv, *(v.bind(x) for v, x in zip(starts + slot_vars, positions + slots,
                                                        strict=True))).numpy()
            want, want_k, _ = case.reference(positions, slots)
            assert np.abs(out - want).max() < 2e-5 * max(1.0, float(np.abs(want).max()))
            assert np.abs(cache_k.numpy() - want_k).max() < 2e-6
        assert jit.captured is not None
        graphs = [get_graph_runtime(call.src[0]) for call in jit.captured.linear.src
                  if call.src[0].op is Ops.CUSTOM_FUNCTION]
        slices = [int(g.kernels[i, 1]) for g in graphs if isinstance(g, CpuGraph)
                  for i, name in enumerate(g.names) if name.startswith("attend")]
        assert slices == [batch * shape.kv]  # one kernel, a slice per row and KV head
    finally:
        cpu_graph.set_threads(previous)
        cpu_graph.use_cpu_graph(False)


def test_usable_only_for_even_heads_on_clang_cpu() -> None:
    assert decode_attention.usable("CPU", 64, 2048)
    assert not decode_attention.usable("CPU", 63, 2048)
    assert not decode_attention.usable("CPU", 64, decode_attention.MAX_SCORES + 1)


def test_head_sets_bound_the_scores_on_the_stack() -> None:
    assert decode_attention.head_sets(6, MAX_SEQ) == [(0, 4), (4, 2)]  # SHAPES' last
    assert decode_attention.head_sets(3, 2048) == [(0, 3)]
    # a long context: one head's scores at a time
    assert decode_attention.head_sets(3, decode_attention.MAX_SCORES) == [(0, 1), (1, 1),
                                                                          (2, 1)]


@pytest.mark.parametrize("width", [2, 4, 8, 16])
def test_key_rows_put_each_pair_sum_under_its_key(width: int) -> None:
    """The shuffles of key_rows, followed label by label: row i, lane u ends up holding
    pair sum i of key u."""
    half = width // 2
    held = {f"p[{v}]": [(2 * v + lane // half, lane % half) for lane in range(width)]
            for v in range(half)}
    lines, rows = decode_attention.key_rows("p", "x", width)
    assert len(lines) == half * (width.bit_length() - 2)
    for line in lines:
        found = re.fullmatch(r"vf (\w+) = __builtin_shufflevector\((\S+), (\S+), (.*)\);",
                             line)
        assert found is not None, line
        both = held[found[2]] + held[found[3]]
        held[found[1]] = [both[int(i)] for i in found[4].split(",")]
    assert [held[row] for row in rows] == [[(u, i) for u in range(width)]
                                           for i in range(half)]


def _prompt(case: Case, tokens: int, keys: npt.NDArray[np.generic],
            values: npt.NDArray[np.generic]) -> npt.NDArray[np.float32]:
    """attend_prompt over ``case.qkv[:tokens]`` (row ``b`` rotated by ``case``'s table
    row ``b``) and the prompt's ``keys``/``values`` ``[kv, tokens, hd]``."""
    shape = case.shape
    rope = ((Tensor(case.cos[:tokens].copy()).realize(),
             Tensor(case.sin[:tokens].copy()).realize()) if shape.rope_dim else None)
    return decode_attention.attend_prompt(
        Tensor(case.qkv[:tokens].copy()).realize(), Tensor(keys.copy()).realize(),
        Tensor(values.copy()).realize(), rope, heads=shape.heads,
        rope_dim=shape.rope_dim).numpy()


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s.heads}h{s.kv}kv{s.hd}"
                         f"r{s.rope_dim}{'f16' if s.f16 else 'f32'}")
@pytest.mark.parametrize("tokens", [1, 5, 17, MAX_SEQ])
def test_prompt_attention_matches_numpy(shape: Shape, tokens: int) -> None:
    case = Case(shape, tokens, seed=tokens * 7 + shape.hd)
    keys, values = case.cache_k[3, :, :tokens], case.cache_v[3, :, :tokens]
    out = _prompt(case, tokens, keys, values)
    hd, heads, kv, half = shape.hd, shape.heads, shape.kv, shape.rope_dim // 2
    want = np.zeros((tokens, heads * hd))
    for b in range(tokens):
        for head in range(heads):
            q = case.qkv[b, head * hd : (head + 1) * hd].astype(np.float64)
            if half:
                c, s = case.cos[b].astype(np.float64), case.sin[b].astype(np.float64)
                x1, x2 = q[:half].copy(), q[half : 2 * half].copy()
                q[:half], q[half : 2 * half] = x1 * c - x2 * s, x2 * c + x1 * s
            g = head // (heads // kv)
            scores = keys[g, : b + 1].astype(np.float64) @ q / math.sqrt(hd)
            e = np.exp(scores - scores.max())
            want[b, head * hd : (head + 1) * hd] = (e / e.sum()) @ values[g, : b + 1].astype(
                np.float64)
    assert np.abs(out - want).max() < 2e-5 * max(1.0, float(np.abs(want).max()))


@pytest.mark.parametrize("shape", SHAPES[:3], ids=["f32", "f16", "half-rope"])
def test_a_prompt_row_attends_as_a_decode_row_at_its_position(shape: Shape) -> None:
    """Row ``b`` of a prompt is bit for bit the decode row at position ``b`` over a cache
    that holds the prompt's keys and values (the decode kernel writes them row by row);
    padding rows after the prompt change none of its rows."""
    tokens = 23
    case = Case(shape, tokens + 4, seed=5)
    cache_k, cache_v = Tensor(case.cache_k.copy()).realize(), Tensor(case.cache_v.copy()
                                                                     ).realize()
    rope = ((Tensor(case.cos).realize(), Tensor(case.sin).realize())
            if shape.rope_dim else None)
    decoded = []
    for b in range(tokens):
        where = decode_attention.positions([b], [2], "CPU")
        decoded.append(decode_attention.attend(
            Tensor(case.qkv[b : b + 1].copy()).realize(), where, cache_k, cache_v, rope,
            heads=shape.heads, kv_heads=shape.kv, rope_dim=shape.rope_dim).numpy()[0])
    written_k, written_v = cache_k.numpy()[2], cache_v.numpy()[2]
    out = _prompt(case, tokens, written_k[:, :tokens], written_v[:, :tokens])
    assert np.array_equal(_bits(out), _bits(np.stack(decoded)))
    # four more rows (the prompt padded): the prompt's rows are unchanged
    padded = _prompt(case, tokens + 4, written_k[:, : tokens + 4],
                     written_v[:, : tokens + 4])
    assert np.array_equal(_bits(padded[:tokens]), _bits(out))


def test_prompt_attention_refuses_keys_of_another_length() -> None:
    shape = SHAPES[0]
    case = Case(shape, 6, seed=1)
    with pytest.raises(ValueError, match="does not fit"):
        _prompt(case, 6, case.cache_k[0, :, :5], case.cache_v[0, :, :5])


_FMA_TARGETS = {  # clang flags: the CPU flags (/proc/cpuinfo) they need
    "avx2": (["-march=x86-64-v3"], {"avx2", "fma", "f16c"}),
    # the AVX-512 branch's C (plain vector extensions) built for AVX2: both branches
    # side by side on a machine without AVX-512
    "avx2-set-pass": (["-march=x86-64-v3", "-D__AVX512F__"], {"avx2", "fma", "f16c"}),
    "avx512": (["-march=x86-64-v4"], {"avx512f", "avx512bw", "avx512vl", "avx512dq"}),
}


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                    reason="x86-64 targets")
@pytest.mark.parametrize("prompt", [False, True], ids=["decode", "prompt"])
def test_every_x86_target_with_fma_attends_alike(tmp_path: Path, prompt: bool) -> None:
    """The kernel's C built for each x86-64 level with FMA this CPU runs (AVX2, where
    each head takes its own pass over the values, and AVX-512, where the head set takes
    one; and the AVX-512 branch built for AVX2): SmolLM2's block shape over an f16 cache
    gives the same outputs and cache writes bit for bit on each, and as tinygrad's own
    build (``-march=native``)."""
    shape = Shape(9, 3, 64, 64, True)
    positions, slots = [MAX_SEQ - 1, 17, 0], [1, 4, 6]
    case = Case(shape, MAX_SEQ if prompt else len(positions), seed=21)
    keys, values = case.cache_k[3], case.cache_v[3]  # a prompt's own [kv, T, hd]
    rows = MAX_SEQ if prompt else len(positions)
    source = decode_attention.attention_source(
        rows, shape.heads, shape.kv, shape.hd, shape.rope_dim, rows if prompt else MAX_SEQ,
        True, prompt=prompt)
    if prompt:
        arguments = ["float *p0", "const float *p1", "const float *p2", "const float *p3",
                     "unsigned short *p4", "unsigned short *p5", "int p6"]
    else:
        arguments = ["float *p0", "const float *p1", "const int *p2", "const float *p3",
                     "const float *p4", "unsigned short *p5", "unsigned short *p6", "int p7"]
    names = [a.split("*")[-1].split()[-1] for a in arguments]
    code = f"void attend({', '.join(arguments)}) " + source.format(*names)
    where = np.array(positions + slots, np.int32)
    have = cpu_flags()
    results: dict[str, list[npt.NDArray[np.generic]]] = {}
    for target, (flags, needs) in _FMA_TARGETS.items():
        if not needs <= have:
            continue
        kernel = build(code, f"attend_{target}", flags, tmp_path).attend
        out = np.full((rows, shape.heads * shape.hd), np.nan, np.float32)
        qkv = np.ascontiguousarray(case.qkv[:rows])
        cos, sin = case.cos[:rows].copy(), case.sin[:rows].copy()
        if prompt:
            ck, cv = keys[:, :rows].copy(), values[:, :rows].copy()
            buffers: list[npt.NDArray[np.generic]] = [out, qkv, cos, sin, ck, cv]
        else:
            ck, cv = case.cache_k.copy(), case.cache_v.copy()
            buffers = [out, qkv, where, case.cos, case.sin, ck, cv]
        pointers = [b.ctypes.data_as(ctypes.c_void_p) for b in buffers]
        for item in range(rows * shape.kv):
            kernel(*pointers, ctypes.c_int(item))
        results[target] = [out, ck, cv]
    assert {"avx2", "avx2-set-pass"} <= set(results) or not {"avx2", "fma", "f16c"} <= have
    native = (_prompt(case, rows, keys[:, :rows], values[:, :rows]),) if prompt else (
        case.run(positions, slots))
    for got in results.values():
        for mine, theirs in zip(got, native, strict=False):
            assert np.array_equal(_bits(mine), _bits(theirs))
