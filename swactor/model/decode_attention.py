"""Decode and prompt attention on CPU: one hand-written C kernel per block for all rows.

Theory of operation. A decode step of ``B`` rows (``B = 1``: one sequence) gives each
block's attention the rows' fused Q/K/V product ``qkv`` ``[B, (heads + 2 kv) hd]``;
row ``b`` sits at position ``pos_b`` of KV slot ``slot_b`` (distinct slots). Written as
tinygrad expressions, each row's attention is a graph of its own (its slot and position
are bound variables): about nine small kernels per row and block (rotary embedding of q
and k, the two cache writes, scores, max, exponentials, sum, product with the values).
Here it is one tinygrad custom kernel on the clang renderer per block for all rows,
cut into ``B * kv`` slices (the ``core_id`` variable, as in
:mod:`swactor.model.decode_gemv`: the replay pool runs the slices of a block on several
threads). Slice ``(b, g)`` (row ``b``, KV head ``g``):

* rotates k of head ``g`` (half-split rotary embedding over the first ``rope_dim``
  features, the cosines and sines of ``pos_b`` read from the role's tables) and writes
  it and v into the slot's caches ``[slots, kv, max_seq_len, hd]`` at ``pos_b``, in the
  cache dtype (f16 rounded to nearest even);
* for the group's query heads (heads ``g * group .. g * group + group - 1``), in sets
  of at most :data:`HEAD_SET` that share each pass over the cache (:func:`head_sets`):
  rotates each q, then scores ``s_t = (q . k_t) * (1 / sqrt(hd))`` over the cached keys
  ``t = 0 .. pos_b`` (read back from the cache once per set, so f16 keys are the rounded
  ones; widened by the target's f16 conversion where it has one, F16C or AArch64, else
  by integer bit moves, the same value for every finite f16). Each dot product is a
  ``W``-lane running sum over ``hd``, then its lane pairs ``a[i] + a[i + W / 2]`` added
  in order; for the keys in whole blocks of ``W`` the pair sums of two keys are one
  vector add, and shuffles (:func:`key_rows`) gather them into rows, one per ``i``, whose
  lanes are the block's keys, added in that order: the same additions as one key's
  scalar tree. ``m = max s_t``, ``e_t = exp(s_t - m)`` (Cody-Waite reduction and
  Cephes' polynomial, about one ulp; below ``2**-126`` it is 0; ``W`` scores per vector,
  the rest one by one by the same statements), ``out = (sum_t e_t v_t) / sum_t e_t``
  with ``W``-lane running sums over ``t`` in order. With 32 vector registers (AVX-512)
  each value is loaded once for the set; with 16 (AVX2) the set's running sums (three
  heads of 64 features: 24 AVX2 registers) would be stored and reloaded at every
  value, so each head takes its own pass over the values, with the same statements.

Every slice runs the same statements whatever ``B``, its slice number or thread, so a
row of a ``B``-row step is bit-identical to the one-row step of that row (the one-row
decode uses this kernel with ``B = 1``). A row's positions and slots reach the kernel
through a small ``int32 [2 B]`` input (:func:`positions`: the positions then the slots,
one kernel per step from the bound variables), shared by every block. The kernel loads
one value of each input it only reads in tinygrad's IR (qkv, positions, rotary tables),
so the replay graph knows it only reads them; the caches and the output count as
written.

Measured on SmolLM2-135M Q4_1 (one stage of all 30 blocks, 9 heads, 3 KV heads,
``hd`` 64, 8 slots), 2 replay threads, a 2-core x86-64 machine. Per row and step at
position 20 (each kernel's best time over sequential traces): the tinygrad expressions
run 270 attention kernels, 0.85 ms, of which the scores and the product with the values
are 0.77 ms (15 and 11 us per block: reductions over a symbolic length that tinygrad
leaves scalar); this kernel runs 30. A decode step of 1 row runs 445 kernels instead of
684, one of 8 rows 444 instead of 2603, and building the 2-, 4- and 8-row decode graphs
takes 21 s instead of 264 s. The 30 blocks' attention of a 4-row step (f16 cache,
replayed in one thread, best of 7 rounds of 20 replays, 2-core AMD EPYC with AVX-512)
takes 1.6 ms at position 24, mostly the replay's own cost, and 2.5 ms at position 200;
with each key's pair sums gathered into the rows by scalar stores instead of shuffles,
3.2 ms; with one pass per head, each key's tree in scalar code and each exponential
alone, 4.8 ms. A prompt's attention on AVX2 (2-core AMD EPYC, one block's slices run one
after another on one thread, f16 keys and values): 512 rows 6.3 ms with one pass over
the values per head, 9.1 ms with one for the set; 2048 rows 101 against 143 ms. Over 30
blocks on two threads that is about 40% of a long prompt's prefill: a 1900-token
prompt's warm prefill of the whole model takes 3.3-3.5 s with a pass per head, 3.7-4.0 s
with one per set (best of 5, two runs each, taking turns). Of the 101 ms (perf, by C
line) the scores take about 60%, the sums over the values 30%, the exponentials 7%; sets
of 1 or 2 heads make the scores slower (116 and 118 ms), since each key is then widened
from f16 once per set.

A prompt's attention on CPU (:func:`attend_prompt`, the role's CPU prefill graph) is
the same kernel in ``prompt`` mode: slice ``(b, g)`` is prompt row ``b`` at position
``b``, its "cache" the prompt's own keys and values ``[kv, T, hd]`` (rotated and
rounded to the cache dtype by the graph), which it only reads, attending to rows
``0 .. b`` with the statements above. So a prompt row's attention is bit for bit that
of a decode row at its position over a cache holding the prompt's keys and values,
whatever the padding after it; only the causal half of the scores is computed.

Used on a CPU device whose renderer is clang with an even ``hd`` (:func:`usable`);
elsewhere the role keeps the tinygrad expression (``LlamaRole._attend``). The scores of
a set of heads live on the stack (:data:`MAX_SCORES` floats at most), so a role whose
``max_seq_len`` passes :data:`MAX_SCORES` keeps the expression too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tinygrad.device import Device
from tinygrad.dtype import DType, dtypes
from tinygrad.renderer.cstyle import ClangRenderer
from tinygrad.tensor import Tensor
from tinygrad.uop import Ops
from tinygrad.uop.ops import KernelInfo, UOp

from swactor.model.c_kernel import c_template, first_element

ENABLED = True
"""Whether CPU decode attention takes this kernel (benchmarks switch it off to compare
with the tinygrad expression side by side)."""
MAX_SCORES = 1 << 16
"""Most scores a slice holds on the stack (256 KiB): the positions of a set of heads."""
_LANES = (16, 8, 4, 2)


HEAD_SET = 4
"""Most query heads of a group one pass over the cached keys and values serves."""
# exp(x) for x >= -87.33654 (exp(x) >= 2**-126: the result is normal; below, 0), the
# statements every score runs, in scalar code or in vectors of scores: n = round(x / ln 2)
# (1.5 * 2**23 rounds to an integer), r = x - n ln 2 in two steps (Cody-Waite), exp(r) by
# Cephes' expf polynomial, times 2**n in the bits
_POLY = (
    "{t} n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;",
    "{t} r = x - n * 0.693359375f;",
    "r = r - n * -2.12194440e-4f;",
    "{t} p = ({t})(1.9875691500e-4f);",
    "p = p * r + 1.3981999507e-3f;",
    "p = p * r + 8.3334519073e-3f;",
    "p = p * r + 4.1665795894e-2f;",
    "p = p * r + 1.6666665459e-1f;",
    "p = p * r + 5.0000001201e-1f;",
    "p = p * (r * r) + r + 1.0f;",
)


def exp_in_place(scores: str, maximum: str, width: int) -> list[str]:
    """C replacing ``scores[t]`` (``t = 0 .. pos``) by ``exp(scores[t] - maximum)``:
    ``width`` scores per vector, the last ``(pos + 1) % width`` one by one, every score
    the same statements."""
    vector = [line.format(t="vf") for line in _POLY]
    scalar = [line.format(t="float") for line in _POLY]
    return [
        "{",
        "  int t = 0;",
        f"  for (; t + {width} <= pos + 1; t += {width}) {{",
        f"    vf x = *(vf *)({scores} + t) - {maximum};",
        *(f"    {line}" for line in vector),
        "    vi bits = (__builtin_convertvector(n, vi) + 127) << 23;",
        "    vf e = p * (vf)bits;",
        f"    *(vf *)({scores} + t) = (vf)((vi)e & (vi)(x >= -87.33654f));",
        "  }",
        "  for (; t <= pos; t++) {",
        f"    float x = {scores}[t] - {maximum}, e = 0.0f;",
        "    if (x >= -87.33654f) {",
        *(f"      {line}" for line in scalar),
        "      unsigned bits = (unsigned)((int)n + 127) << 23;",
        "      float scale2; __builtin_memcpy(&scale2, &bits, 4);",
        "      e = p * scale2;",
        "    }",
        f"    {scores}[t] = e;",
        "  }",
        "}",
    ]


def key_rows(pairs: str, prefix: str, width: int) -> tuple[list[str], list[str]]:
    """C shuffling the ``width / 2`` vectors ``pairs[v]`` (lane ``i`` the pair sum ``i``
    of key ``2 v``, lane ``width / 2 + i`` that of key ``2 v + 1``) into rows: the
    statements, and the names of the rows (row ``i``: lane ``u`` the pair sum ``i`` of
    key ``u``). Each of ``log2(width) - 1`` steps shuffles vectors ``v`` and ``v ^ 2**b``
    to trade bit ``b`` of the vector number for bit ``b`` of the lane (the last step also
    puts the keys in order)."""
    half = width // 2
    layout = [[(2 * v + lane // half, lane % half) for lane in range(width)]
              for v in range(half)]
    names = [f"{pairs}[{v}]" for v in range(half)]
    lines: list[str] = []
    steps = width.bit_length() - 2
    for b in range(steps):
        bit = 1 << b
        if b == steps - 1:
            target = [[(u, i) for u in range(width)] for i in range(half)]
        else:
            target = [[layout[(v & ~bit) | (lane & bit)][(lane & ~bit) | (v & bit)]
                       for lane in range(width)] for v in range(half)]
        fresh = []
        for v in range(half):
            first, second = layout[v & ~bit], layout[v | bit]
            index = [first.index(label) if label in first else width + second.index(label)
                     for label in target[v]]
            name = f"{prefix}{b}_{v}"
            lines.append(f"vf {name} = __builtin_shufflevector({names[v & ~bit]}, "
                         f"{names[v | bit]}, {', '.join(map(str, index))});")
            fresh.append(name)
        layout, names = target, fresh
    return lines, names


def head_sets(group: int, max_seq_len: int) -> list[tuple[int, int]]:
    """The sets of a group's query heads that share a pass over the cache (first head,
    count): at most :data:`HEAD_SET` heads, and their scores (``max_seq_len`` floats each)
    within :data:`MAX_SCORES` floats on the stack."""
    size = max(1, min(group, HEAD_SET, MAX_SCORES // max_seq_len))
    return [(first, min(size, group - first)) for first in range(0, group, size)]


def usable(device: str, head_dim: int, max_seq_len: int) -> bool:
    """Whether decode attention on ``device`` runs through this kernel."""
    if not ENABLED or head_dim % 2 or max_seq_len > MAX_SCORES or not device.startswith("CPU"):
        return False
    return isinstance(Device[device].renderer, ClangRenderer)


def lanes(head_dim: int) -> int:
    """The vector width ``W`` of the dot products and running sums: the widest of 16, 8,
    4, 2 dividing ``head_dim``."""
    return next(w for w in _LANES if head_dim % w == 0)


def positions(starts: Sequence[UOp | int], slots: Sequence[UOp | int], device: str
              ) -> Tensor:
    """The kernel's ``int32 [2 B]`` input: the rows' positions then their slots (bound
    variables or constants)."""
    if all(isinstance(v, int) for v in (*starts, *slots)):
        return Tensor([*starts, *slots], dtype=dtypes.int32, device=device).realize()
    values = [Tensor(v, dtype=dtypes.int32, device=device) if isinstance(v, int)
              else Tensor(v, device=device).cast(dtypes.int32) for v in (*starts, *slots)]
    return Tensor.stack(*values).contiguous()


def attention_source(batch: int, heads: int, kv_heads: int, head_dim: int, rope_dim: int,
                     max_seq_len: int, cache_f16: bool, prompt: bool = False) -> str:
    """The C statement of one slice (a ``str.format`` template over the output, ``qkv``,
    the positions, the cosine and sine tables when ``rope_dim`` is not 0, the key and
    value caches, then the slice index).

    ``prompt``: the slice is row ``b`` of a prompt of ``batch`` rows at position ``b``
    (:func:`attend_prompt`): no positions input, the "caches" are the prompt's own keys
    and values ``[kv, batch, hd]`` (``max_seq_len`` is ``batch``), already rotated and
    written, which the slice only reads."""
    hd, group, half = head_dim, heads // kv_heads, rope_dim // 2
    width = lanes(hd)
    chunks = hd // width
    pointer = (4 if rope_dim else 2) if prompt else (5 if rope_dim else 3)
    cache_t = "unsigned short" if cache_f16 else "float"

    def load(ptr: str) -> str:
        if not cache_f16:
            return f"(*(const vf *)({ptr}))"
        return f"wide(*(const vh *)({ptr}))"

    def store(dst: str, value: str) -> str:
        if not cache_f16:
            return f"{dst} = {value};"
        return (f"{{ __fp16 h_ = {value}; unsigned short u_; __builtin_memcpy(&u_, &h_, 2);"
                f" {dst} = u_; }}")

    def rotate(src: str, dst: str, store_fn: bool) -> list[str]:
        put = store if store_fn else (lambda d, v: f"{d} = {v};")
        lines = [f"for (int i = 0; i < {half}; i++) {{",
                 f"  float x1 = {src}[i], x2 = {src}[{half} + i];",
                 "  " + put(f"{dst}[i]", "x1 * c[i] - x2 * s[i]"),
                 "  " + put(f"{dst}[{half} + i]", "x2 * c[i] + x1 * s[i]"),
                 "}"] if half else []
        lines.append(f"for (int i = {rope_dim}; i < {hd}; i++) " + put(f"{dst}[i]", f"{src}[i]"))
        return lines

    def head_set(first: int, count: int) -> list[str]:
        """Heads ``first .. first + count - 1`` of the group side by side: each cached
        key and value loaded once for all of them, each head's sums the same statements
        as alone."""
        heads_ = range(count)
        lines = ["{"]
        for h in heads_:
            lines += [f"  const float *qs{h} = row + (g * {group} + {first + h}) * {hd};",
                      f"  float q{h}[{hd}] __attribute__((aligned(64)));",
                      *(f"  {line}" for line in rotate(f"qs{h}", f"q{h}", False)),
                      f"  float sc{h}[pos + 1];"]
        half_w = width // 2

        def keys(t: str) -> list[str]:
            return [f"const {cache_t} *kt = ck + (base + {t}) * {hd};",
                    " ".join(f"vf k{j} = {load(f'kt + {j * width}')};"
                             for j in range(chunks))]

        def dot(h: int) -> list[str]:
            return [f"vf a = k0 * *(const vf *)q{h};",
                    *(f"a += k{j} * *(const vf *)(q{h} + {j * width});"
                      for j in range(1, chunks))]

        # keys in blocks of `width`, two at a time: the lane pairs a[i] + a[i + width / 2]
        # of both keys in one vector add (lanes i, then width / 2 + i), then shuffles
        # turn those vectors into rows, one per i, whose lanes are the block's keys: the
        # rest of each key's tree (the pair sums added in order) runs on the rows
        lo = ", ".join(str(i) for i in [*range(half_w), *range(width, width + half_w)])
        hi = ", ".join(str(i) for i in [*range(half_w, width),
                                        *range(width + half_w, 2 * width)])
        lines.append("  int t = 0;")
        for h in heads_:
            lines += [f"  vf mv{h} = (vf)(-__builtin_inff());"]
        lines += [f"  for (; t + {width} <= pos + 1; t += {width}) {{",
                  *(f"    vf pairs{h}[{half_w}];" for h in heads_),
                  f"    for (int u = 0; u < {width}; u += 2) {{",
                  "      " + " ".join(f"vf a{h}_0, a{h}_1;" for h in heads_)]
        for side in (0, 1):
            lines += ["      {", *(f"        {line}" for line in keys(f"t + u + {side}"))]
            for h in heads_:
                lines += ["        {", *(f"          {line}" for line in dot(h)),
                          f"          a{h}_{side} = a;", "        }"]
            lines.append("      }")
        lines += [f"      pairs{h}[u >> 1] = __builtin_shufflevector(a{h}_0, a{h}_1, {lo}) + "
                  f"__builtin_shufflevector(a{h}_0, a{h}_1, {hi});" for h in heads_]
        lines.append("    }")
        for h in heads_:
            shuffles, rows = key_rows(f"pairs{h}", f"x{h}_", width)
            chain = rows[0]
            for row in rows[1:]:
                chain = f"({chain} + {row})"
            lines += [*(f"    {line}" for line in shuffles),
                      f"    vf d{h} = {chain} * {scale};",
                      f"    *(vf *)(sc{h} + t) = d{h};",
                      f"    mv{h} = __builtin_elementwise_max(mv{h}, d{h});"]
        lines.append("  }")
        for h in heads_:
            lines += [f"  float m{h} = -__builtin_inff();",
                      f"  for (int i = 0; i < {width}; i++) "
                      f"m{h} = mv{h}[i] > m{h} ? mv{h}[i] : m{h};"]
        lines += ["  for (; t <= pos; t++) {", *(f"    {line}" for line in keys("t"))]
        for h in heads_:
            lines += ["    {",
                      *(f"      {line}" for line in dot(h)),
                      f"      float d = ({tree}) * {scale};",
                      f"      sc{h}[t] = d;",
                      f"      m{h} = d > m{h} ? d : m{h};",
                      "    }"]
        lines.append("  }")
        for h in heads_:
            lines += [f"  float sum{h} = 0.0f;",
                      "  " + " ".join(f"vf o{h}_{j} = (vf)(0.0f);" for j in range(chunks))]
        for h in heads_:
            lines += [f"  {line}" for line in exp_in_place(f"sc{h}", f"m{h}", width)]

        def weigh(set_: Sequence[int]) -> list[str]:
            """The loop adding ``e_t v_t`` into the running sums of heads ``set_``, each
            value loaded once for them."""
            return ["  for (int t = 0; t <= pos; t++) {",
                    *(f"    sum{h} += sc{h}[t];" for h in set_),
                    f"    const {cache_t} *vt = cv + (base + t) * {hd};",
                    "    " + " ".join(f"vf v{j} = {load(f'vt + {j * width}')};"
                                      for j in range(chunks)),
                    *(f"    o{h}_{j} += sc{h}[t] * v{j};" for h in set_ for j in range(chunks)),
                    "  }"]

        # 32 vector registers hold the set's running sums (12 vectors for three heads
        # of 64 features); 16 do not, and sums spilled on every value cost more than
        # loading each value once per head
        lines += ["#if defined(__AVX512F__)", *weigh(heads_), "#else",
                  *(line for h in heads_ for line in weigh([h])), "#endif"]
        for h in heads_:
            lines += [f"  {{ float *dst = out + (long)b * {heads * hd} + (g * {group} + "
                      f"{first + h}) * {hd};",
                      *(f"    *(vf *)(dst + {j * width}) = o{h}_{j} / sum{h};"
                        for j in range(chunks)),
                      "  }"]
        lines.append("}")
        return lines

    tree = " + ".join(f"(a[{i}] + a[{i + width // 2}])" for i in range(width // 2))
    scale = f"{1.0 / math.sqrt(hd)!r}f"
    body = [
        "{",
        f"typedef float vf __attribute__((ext_vector_type({width}), aligned(4)));",
        f"typedef int vi __attribute__((ext_vector_type({width}), aligned(4)));",
        *([f"typedef unsigned short vh __attribute__((ext_vector_type({width}), aligned(2)));",
           # the target's f16 conversion instruction where it has one (F16C, AArch64),
           # else integer bit moves: the same value for every finite f16
           "#if defined(__F16C__) || defined(__aarch64__)",
           f"typedef __fp16 vhf __attribute__((ext_vector_type({width})));",
           "#define wide(h) __builtin_convertvector((vhf)(h), vf)",
           "#else",
           f"typedef unsigned int vu __attribute__((ext_vector_type({width})));",
           "#define wide(h) ((vf)((((__builtin_convertvector((h), vu)) & 0x8000u) << 16) | "
           "(((__builtin_convertvector((h), vu)) & 0x7fffu) << 13)) * 0x1p112f)",
           "#endif"]
          if cache_f16 else []),
        "float *out = @0;",
        "const float *qkv = @1;",
        *([] if prompt else ["const int *where = (const int *)(@2);"]),
        *([f"const float *cosr = @{pointer - 2};", f"const float *sinr = @{pointer - 1};"]
          if rope_dim else []),
        f"{cache_t} *ck = ({cache_t} *)(@{pointer});",
        f"{cache_t} *cv = ({cache_t} *)(@{pointer + 1});",
        f"int item = (int)(@{pointer + 2});",
        f"int b = item / {kv_heads}, g = item - b * {kv_heads};",
        *(["int pos = b;"] if prompt else [f"int pos = where[b], slot = where[{batch} + b];"]),
        f"const float *row = qkv + (long)b * {(heads + 2 * kv_heads) * hd};",
        (f"long base = (long)g * {batch};" if prompt else
         f"long base = ((long)slot * {kv_heads} + g) * {max_seq_len};"),
        *([f"const float *c = cosr + (long)pos * {half}, *s = sinr + (long)pos * {half};"]
          if rope_dim else []),
        *([] if prompt else [
            "{",
            f"  const float *k = row + ({heads} + g) * {hd};",
            f"  const float *v = row + ({heads + kv_heads} + g) * {hd};",
            f"  {cache_t} *kd = ck + (base + pos) * {hd};",
            f"  {cache_t} *vd = cv + (base + pos) * {hd};",
            *(f"  {line}" for line in rotate("k", "kd", True)),
            f"  for (int i = 0; i < {hd}; i++) " + store("vd[i]", "v[i]"),
            "}",
            "__asm__ volatile(\"\" ::: \"memory\");  /* the cache rows above are read below */",
        ]),
        *(line for first, count in head_sets(group, max_seq_len)
          for line in head_set(first, count)),
        *(["#undef wide"] if cache_f16 else []),
        "}",
    ]
    return c_template(body, pointer + 3)


def attend(qkv: Tensor, where: Tensor, cache_k: Tensor, cache_v: Tensor,
           rope: tuple[Tensor, Tensor] | None, *, heads: int, kv_heads: int,
           rope_dim: int) -> Tensor:
    """Decode rows ``qkv`` ``[B, (heads + 2 kv) hd]`` (float32) at the positions and
    slots ``where`` (:func:`positions`): their keys and values go into the caches
    ``[slots, kv, max_seq_len, hd]`` (f32 or f16), and the result is the attention
    output ``float32 [B, heads * hd]`` (before the output projection). ``rope``: the
    cosine and sine tables ``[max_seq_len, rope_dim / 2]`` (None when ``rope_dim`` is 0)."""
    batch = int(qkv.shape[0])
    _, kv, max_seq_len, hd = (int(n) for n in cache_k.shape)
    if kv != kv_heads or int(qkv.shape[1]) != (heads + 2 * kv_heads) * hd:
        raise ValueError(f"qkv {tuple(qkv.shape)} does not fit {heads} heads, {kv_heads} "
                         f"KV heads of {hd}")
    cache_dtype: DType = cache_k.dtype
    code = attention_source(batch, heads, kv_heads, hd, rope_dim, max_seq_len,
                            cache_dtype == dtypes.float16)
    items = batch * kv_heads
    tables = list(rope) if rope_dim and rope is not None else []

    def kernel(out: UOp, rows: UOp, at: UOp, *rest: UOp) -> UOp:
        core = UOp.variable("core_id", 0, items - 1, dtypes.int, param=True)
        pointers = (*(first_element(u) for u in (out, rows, at, *rest)), core)
        # a plain load of each input's first element, unused: ProgramInfo then lists
        # them as read (the caches, written, are not loaded)
        reads = tuple(first_element(u).load() for u in (rows, at, *rest[: len(tables)]))
        body = UOp(Ops.CUSTOM, src=(*pointers, *reads), arg=code)
        sink: UOp = body.sink(arg=KernelInfo(
            name=f"attend_{batch}_{heads}_{kv_heads}_{hd}", opts_to_apply=()))
        return sink

    out = Tensor.empty(batch, heads * hd, dtype=dtypes.float32, device=qkv.device)
    return out.custom_kernel(qkv.float().contiguous(), where, *tables, cache_k, cache_v,
                             fxn=kernel)[0]


def attend_prompt(qkv: Tensor, keys: Tensor, values: Tensor,
                  rope: tuple[Tensor, Tensor] | None, *, heads: int, rope_dim: int) -> Tensor:
    """Causal attention of a prompt's rows ``qkv`` ``[T, (heads + 2 kv) hd]`` (float32,
    row ``b`` at position ``b``) over its own ``keys`` and ``values`` ``[kv, T, hd]``
    (rotated, in the cache dtype, as the slot's cache will hold them): row ``b`` attends
    to rows ``0 .. b``, by the statements a decode row at position ``b`` runs (the
    slice ``(b, g)`` of :func:`attention_source` with ``prompt``, which only reads the
    keys and values). The result is ``float32 [T, heads * hd]`` (before the output
    projection). A row's result depends on rows ``0 .. b`` only, never on the rows after
    it, so padding rows change nothing before them. ``rope``: each row's cosines and
    sines ``[T, rope_dim / 2]`` (None when ``rope_dim`` is 0)."""
    tokens = int(qkv.shape[0])
    kv_heads, length, hd = (int(n) for n in keys.shape)
    if length != tokens or int(qkv.shape[1]) != (heads + 2 * kv_heads) * hd:
        raise ValueError(f"qkv {tuple(qkv.shape)} does not fit {heads} heads over keys "
                         f"{tuple(keys.shape)}")
    code = attention_source(tokens, heads, kv_heads, hd, rope_dim, tokens,
                            keys.dtype == dtypes.float16, prompt=True)
    items = tokens * kv_heads
    tables = list(rope) if rope_dim and rope is not None else []

    def kernel(out: UOp, rows: UOp, *rest: UOp) -> UOp:
        core = UOp.variable("core_id", 0, items - 1, dtypes.int, param=True)
        pointers = (*(first_element(u) for u in (out, rows, *rest)), core)
        # a plain load of each input's first element, unused: ProgramInfo then lists
        # them as read (the kernel writes only its output)
        reads = tuple(first_element(u).load() for u in (rows, *rest))
        body = UOp(Ops.CUSTOM, src=(*pointers, *reads), arg=code)
        sink: UOp = body.sink(arg=KernelInfo(
            name=f"attend_prompt_{tokens}_{heads}_{kv_heads}_{hd}", opts_to_apply=()))
        return sink

    out = Tensor.empty(tokens, heads * hd, dtype=dtypes.float32, device=qkv.device)
    return out.custom_kernel(qkv.float().contiguous(), *tables, keys, values,
                             fxn=kernel)[0]
