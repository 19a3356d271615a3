"""Independent float64 numpy forward pass of a llama/qwen2 GGUF, for checking the tinygrad role.

It shares no code with ``swactor.model``: the whole file is read with ``gguf.GGUFReader``,
tensors are dequantised with ``gguf.quants.dequantize``, and rotary embedding is applied the
way llama.cpp does it for each architecture, on the weights as stored: llama rotates
adjacent pairs ``(2i, 2i+1)`` ("normal" rope), qwen2 rotates ``(i, i + d/2)`` ("neox").
The pass recomputes the whole sequence each call (no KV cache): slow, plain, obviously right.

``int8_inputs`` names block types whose products (all but the output's) take their input
rows quantised to int8 first, the way llama.cpp's CPU backend computes a Q4_1 product
against Q8_1 activations: per block of 32 values ``d = max|x| / 127`` and ``x`` becomes
``round(x / d) * d`` (half to even). The role does the same on x86-64 (its integer path);
a reference without it would differ from it by that quantisation, not by rounding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from gguf import GGUFReader, quants

F64 = npt.NDArray[np.float64]


def int8_rounded(x: F64) -> F64:
    """Rows ``x`` with each block of 32 values rounded to int8 codes of scale
    ``max|x| / 127`` (zero codes for an all-zero block), then scaled back."""
    blocks = x.reshape(*x.shape[:-1], -1, 32)
    d = np.abs(blocks).max(axis=-1, keepdims=True) / 127.0
    codes = np.rint(blocks / np.where(d > 0, d, 1.0))
    rounded: F64 = (codes * d).reshape(x.shape)
    return rounded


class NumpyLlama:
    def __init__(self, path: Path, int8_inputs: frozenset[str] = frozenset()) -> None:
        reader = GGUFReader(str(path))
        self.types = {t.name: t.tensor_type.name for t in reader.tensors}
        self.int8_inputs = int8_inputs
        meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tok")}
        self.arch = str(meta["general.architecture"])
        a = self.arch
        self.blocks = int(meta[f"{a}.block_count"])
        self.heads = int(meta[f"{a}.attention.head_count"])
        self.kv_heads = int(meta[f"{a}.attention.head_count_kv"])
        self.hidden = int(meta[f"{a}.embedding_length"])
        self.head_dim = self.hidden // self.heads
        self.rope_dim = int(meta.get(f"{a}.rope.dimension_count", self.head_dim))
        self.theta = float(meta.get(f"{a}.rope.freq_base", 10000.0))
        self.eps = float(meta[f"{a}.attention.layer_norm_rms_epsilon"])
        self.w: dict[str, F64] = {}
        for t in reader.tensors:
            values = quants.dequantize(t.data, t.tensor_type)
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            self.w[t.name] = np.asarray(values, dtype=np.float64).reshape(shape)
        if "output.weight" not in self.w:
            self.w["output.weight"] = self.w["token_embd.weight"]

    def _norm(self, x: F64, weight: F64) -> F64:
        normed: F64 = x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * weight
        return normed

    def _rope(self, x: F64) -> F64:
        """``x``: ``[tokens, heads, head_dim]`` at positions ``0..tokens-1``."""
        out = x.copy()
        d = self.rope_dim
        pos = np.arange(x.shape[0], dtype=np.float64)[:, None, None]
        for i in range(d // 2):
            angle = pos[..., 0] * self.theta ** (-2.0 * i / d)
            cos, sin = np.cos(angle), np.sin(angle)
            a, b = (2 * i, 2 * i + 1) if self.arch == "llama" else (i, i + d // 2)
            out[:, :, a] = x[:, :, a] * cos - x[:, :, b] * sin
            out[:, :, b] = x[:, :, a] * sin + x[:, :, b] * cos
        return out

    def _linear(self, x: F64, name: str) -> F64:
        """``x @ W.T`` for the block matrix ``name`` (its input int8-rounded where its type
        is in ``int8_inputs``)."""
        if self.types[name] in self.int8_inputs:
            x = int8_rounded(x)
        product: F64 = x @ self.w[name].T
        return product

    def hidden_states(self, tokens: list[int], start: int, end: int, x: F64 | None) -> F64:
        """Run blocks ``[start, end)`` over the whole sequence."""
        t = len(tokens)
        if x is None:
            x = self.w["token_embd.weight"][tokens]
        for layer in range(start, end):
            p = f"blk.{layer}."
            w = self.w
            n = self._norm(x, w[p + "attn_norm.weight"])
            q = self._linear(n, p + "attn_q.weight") + w.get(p + "attn_q.bias", 0.0)
            k = self._linear(n, p + "attn_k.weight") + w.get(p + "attn_k.bias", 0.0)
            v = self._linear(n, p + "attn_v.weight") + w.get(p + "attn_v.bias", 0.0)
            q = self._rope(q.reshape(t, self.heads, self.head_dim))
            k = self._rope(k.reshape(t, self.kv_heads, self.head_dim))
            v = v.reshape(t, self.kv_heads, self.head_dim)
            group = self.heads // self.kv_heads
            out = np.zeros((t, self.heads, self.head_dim))
            mask = np.triu(np.full((t, t), -np.inf), 1)
            for h in range(self.heads):
                s = q[:, h] @ k[:, h // group].T / np.sqrt(self.head_dim) + mask
                s = np.exp(s - s.max(-1, keepdims=True))
                out[:, h] = (s / s.sum(-1, keepdims=True)) @ v[:, h // group]
            x = x + self._linear(out.reshape(t, -1), p + "attn_output.weight")
            n = self._norm(x, w[p + "ffn_norm.weight"])
            g = self._linear(n, p + "ffn_gate.weight")
            u = self._linear(n, p + "ffn_up.weight")
            x = x + self._linear(g / (1.0 + np.exp(-g)) * u, p + "ffn_down.weight")
        return x

    def logits(self, tokens: list[int]) -> F64:
        """Logits of the last position of ``tokens``."""
        x = self.hidden_states(tokens, 0, self.blocks, None)
        last = self._norm(x[-1:], self.w["output_norm.weight"])
        result: Any = (last @ self.w["output.weight"].T)[0]
        return np.asarray(result, dtype=np.float64)
