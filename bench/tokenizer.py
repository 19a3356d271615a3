"""Tokenizer benchmark on the embedded SmolLM2: load time, encode/decode throughput.

Theory of operation: one run reads the real GGUF's vocabulary, builds the tokenizer, then
encodes one mixed text (prose, code, digits, accents, emoji) with our tokenizer (Rust BPE
from ``tokenizers``) and with a textbook pure-Python rank-ordered BPE over the same merges
and pre-tokenizer cut, side by side, printing tokens/s and the ratio, and checking that both
produced the same ids. Decode and streaming decode are timed on the ids produced.

When llama.cpp's Python binding (``llama_cpp``, never a swactor dependency) can be imported
— e.g. run with ``PYTHONPATH``/a venv that has it — the same text and a set of probe strings
(special tokens parsed and not) are also tokenized by llama.cpp: the ids must be identical,
and its speed is printed as a ratio. Without it that column is skipped with a note.
"""

from __future__ import annotations

import argparse
import importlib
import time
from pathlib import Path
from typing import Any

import regex

from swactor.model.paths import default_model_path
from swactor.model.tokenizer import Tokenizer
from swactor.model.vocab import read_vocab

_GPT2_RE = regex.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)")
_DIGIT_RE = regex.compile(r"\p{N}")

_PARAGRAPH = (
    "The quick brown fox jumps over the lazy dog; naïve café owners in Zürich said "
    "it's 3.14159 times better. def f(x): return x**2 + 42  # émoji 🤗🎉\n"
    "Multi-line\n\n\tindented text, with    runs of spaces and 2024-11-29 dates.\n"
)


def _split(pattern: regex.Pattern[str], pieces: list[str]) -> list[str]:
    out: list[str] = []
    for piece in pieces:
        at = 0
        for m in pattern.finditer(piece):
            if m.start() > at:
                out.append(piece[at : m.start()])
            out.append(m.group(0))
            at = m.end()
        if at < len(piece):
            out.append(piece[at:])
    return out


class _ReferenceBpe:
    """Pure-Python GPT-2 BPE with the smollm cut, for comparison only."""

    def __init__(self, tok: Tokenizer) -> None:
        self.ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(tok.vocab.merges)}
        self.ids = {t: i for i, t in enumerate(tok.vocab.tokens)}
        keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
        table = {b: chr(b) for b in keep}
        shifted = 0
        for b in range(256):
            if b not in table:
                table[b] = chr(256 + shifted)
                shifted += 1
        self.byte_char = table

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        never = 1 << 30
        for piece in _split(_GPT2_RE, _split(_DIGIT_RE, [text])):
            word = [self.byte_char[b] for b in piece.encode("utf-8")]
            while len(word) > 1:
                best = min(
                    range(len(word) - 1),
                    key=lambda i: self.ranks.get((word[i], word[i + 1]), never),
                )
                if (word[best], word[best + 1]) not in self.ranks:
                    break
                word[best : best + 2] = [word[best] + word[best + 1]]
            out.extend(self.ids[w] for w in word)
        return out


_PROBES = [
    "hello world",
    " leading space",
    "digits 1234567890 and 3.14159",
    "I'M sure they'LL say it's fine",
    "Crème brûlée, naïve façade 😀🤗👩‍💻 中文 日本語",
    "tabs\t\tand\r\nnewlines\n\n\n  end  ",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
]


def _llama_cpp(model: Path) -> Any | None:
    """llama.cpp's tokenizer for ``model`` through its Python binding, if importable."""
    try:
        binding = importlib.import_module("llama_cpp")
    except ImportError:
        return None
    return binding.Llama(str(model), vocab_only=True, verbose=False)


def _compare_with_llama_cpp(tok: Tokenizer, model: Path, text: str, ours: float) -> bool:
    llama = _llama_cpp(model)
    if llama is None:
        print("  llama.cpp: binding not importable (llama-cpp-python, in its own venv) "
              "- column skipped")
        return True
    t0 = time.perf_counter()
    theirs_ids = llama.tokenize(text.encode("utf-8"), add_bos=False, special=False)
    theirs = _timed("encode (llama.cpp)", time.perf_counter() - t0, len(theirs_ids), "tok")
    same = tok.encode(text, add_bos=False, parse_special=False) == list(theirs_ids)
    for probe in _PROBES:
        for special in (True, False):
            for bos in (True, False):
                ours_ids = tok.encode(probe, add_bos=None if bos else False,
                                      parse_special=special)
                ref = list(llama.tokenize(probe.encode("utf-8"), add_bos=bos, special=special))
                if ours_ids != ref:
                    same = False
                    print(f"  DIFFER (special={special}, bos={bos}) on probe "
                          f"#{_PROBES.index(probe)}: ours {ours_ids[:12]} llama.cpp {ref[:12]}")
    print(f"  ids identical to llama.cpp: {same}; encode speed ratio ours/llama.cpp: "
          f"{ours / theirs:.2f}x")
    return same


def _timed(label: str, seconds: float, count: int, unit: str) -> float:
    rate = count / seconds if seconds > 0 else float("inf")
    print(f"  {label:<34} {seconds * 1e3:9.1f} ms  {rate:14,.0f} {unit}/s")
    return rate


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench tokenizer")
    parser.add_argument("--model", type=Path, default=default_model_path())
    parser.add_argument("--repeat", type=int, default=200, help="paragraph copies to encode")
    args = parser.parse_args(argv)
    if not args.model.is_file():
        print(f"bench tokenizer: {args.model} is missing (run scripts/setup.sh)")
        return 2

    t0 = time.perf_counter()
    vocab = read_vocab(args.model)
    t1 = time.perf_counter()
    tok = Tokenizer(vocab)
    t2 = time.perf_counter()
    print(f"model {args.model.name}: {vocab.size} tokens, {len(vocab.merges)} merges")
    print(f"  read metadata (gguf_header)        {(t1 - t0) * 1e3:9.1f} ms")
    print(f"  build tokenizer                    {(t2 - t1) * 1e3:9.1f} ms")

    text = _PARAGRAPH * args.repeat
    print(f"text: {len(text.encode('utf-8')):,} bytes")
    t0 = time.perf_counter()
    ids = tok.encode(text, parse_special=False)
    ours = _timed("encode (ours, tokenizers BPE)", time.perf_counter() - t0, len(ids), "tok")
    reference = _ReferenceBpe(tok)
    t0 = time.perf_counter()
    ref_ids = reference.encode(text)
    theirs = _timed("encode (pure-Python reference BPE)", time.perf_counter() - t0,
                    len(ref_ids), "tok")
    print(f"  ids identical: {ids == ref_ids}; encode speed ratio ours/reference: "
          f"{ours / theirs:.1f}x")
    same_as_llama = _compare_with_llama_cpp(tok, args.model, text, ours)

    t0 = time.perf_counter()
    decoded = tok.decode(ids)
    _timed("decode", time.perf_counter() - t0, len(ids), "tok")
    stream = tok.stream()
    t0 = time.perf_counter()
    streamed = "".join(stream.push(i) for i in ids) + stream.flush()
    _timed("stream decode (one id at a time)", time.perf_counter() - t0, len(ids), "tok")
    print(f"  round trip exact: {decoded == text and streamed == text}")
    return 0 if ids == ref_ids and decoded == text and same_as_llama else 1
