"""The tokenizer of the real SmolLM2-135M GGUF (gpt2 BPE, ``smollm`` pre-tokenizer).

Checks are independent of the code under test: the pre-tokenizer split is compared with
the published smollm expressions run by the ``regex`` module, and the ids with a plain
rank-ordered BPE written here over the file's own merges.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import regex

from swactor import cli
from swactor.model.paths import default_model_path
from swactor.model.tokenizer import Tokenizer

MODEL = default_model_path()

# Needs the real model file: grouped with the other real-model tests.
pytestmark = pytest.mark.slow

# llama.cpp's smollm preset: every digit alone, then GPT-2's expression on each piece.
SMOLLM_DIGITS = r"\p{N}"
GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"

SAMPLES = [
    "hello world",
    "Hello, World! How are you?",
    "Crème brûlée, naïve façade, Ångström",
    "pi is 3.14159 and 2024-11-29 at 10:45",
    "emoji: 🤗🎉 👩‍💻 done",
    "   leading spaces and trailing   ",
    "line one\nline two\n\n\tindented\r\nwindows",
    "I'm sure they'll say it's fine, don't worry",
    "混合 text with 日本語 and Русский",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
]


def _split(pattern: str, pieces: list[str]) -> list[str]:
    """Split each piece at the matches of ``pattern``, keeping matches and the gaps."""
    out: list[str] = []
    for piece in pieces:
        at = 0
        for m in regex.finditer(pattern, piece):
            if m.start() > at:
                out.append(piece[at : m.start()])
            out.append(m.group(0))
            at = m.end()
        if at < len(piece):
            out.append(piece[at:])
    return out


def _bytes_to_unicode() -> dict[int, str]:
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    table = {b: chr(b) for b in keep}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


def _reference_bpe(tok: Tokenizer, text: str) -> list[int]:
    """Textbook GPT-2 BPE: cut with the published expressions, map bytes to characters,
    repeatedly merge the lowest-ranked adjacent pair."""
    ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(tok.vocab.merges)}
    ids_of = {t: i for i, t in enumerate(tok.vocab.tokens)}
    byte_char = _bytes_to_unicode()
    ids: list[int] = []
    for piece in _split(GPT2_RE, _split(SMOLLM_DIGITS, [text])):
        word = ["".join(byte_char[b] for b in ch.encode("utf-8")) for ch in piece]
        word = [c for chars in word for c in chars]
        while len(word) > 1:
            best = min(
                range(len(word) - 1),
                key=lambda i: ranks.get((word[i], word[i + 1]), 1 << 30),
            )
            if (word[best], word[best + 1]) not in ranks:
                break
            word[best : best + 2] = [word[best] + word[best + 1]]
        ids.extend(ids_of[w] for w in word)
    return ids


@pytest.fixture(scope="module")
def smollm() -> Tokenizer:
    if not MODEL.is_file():
        pytest.fail(f"{MODEL} is missing: run scripts/setup.sh")
    return Tokenizer.from_gguf(MODEL)


def test_metadata_facts(smollm: Tokenizer) -> None:
    assert smollm.vocab.model == "gpt2" and smollm.vocab.pre == "smollm"
    assert smollm.vocab_size == 49152
    assert smollm.token_text(smollm.bos_id or 0) == "<|im_start|>"
    assert smollm.token_text(smollm.eos_id or 0) == "<|im_end|>"
    assert smollm.add_bos is False


def test_hello_world_without_bos(smollm: Tokenizer) -> None:
    ids = smollm.encode("hello world", add_bos=False)
    assert [smollm.token_text(i) for i in ids] == ["hello", "\u0120world"]
    assert ids == [smollm.vocab.tokens.index("hello"), smollm.vocab.tokens.index("\u0120world")]
    # llama.cpp's llama_tokenize gives the same two ids for this file.
    assert ids == [28120, 905]
    # add_bos=None follows the file (add_bos_token = false); True prepends <|im_start|>.
    assert smollm.encode("hello world") == ids
    assert smollm.encode("hello world", add_bos=True) == [smollm.bos_id, *ids]


@pytest.mark.parametrize("text", SAMPLES)
def test_round_trip(smollm: Tokenizer, text: str) -> None:
    ids = smollm.encode(text)
    assert ids
    assert smollm.decode(ids) == text
    assert smollm.decode(smollm.encode(text, parse_special=False)) == text


@pytest.mark.parametrize("text", SAMPLES[:-1])
def test_split_follows_published_smollm_pattern(smollm: Tokenizer, text: str) -> None:
    assert smollm.pre_tokenize(text) == _split(GPT2_RE, _split(SMOLLM_DIGITS, [text]))


@pytest.mark.parametrize("text", SAMPLES[:-1])
def test_ids_match_reference_bpe(smollm: Tokenizer, text: str) -> None:
    assert smollm.encode(text, parse_special=False) == _reference_bpe(smollm, text)


def test_special_tokens_are_single_ids(smollm: Tokenizer) -> None:
    start = smollm.vocab.tokens.index("<|im_start|>")
    end = smollm.vocab.tokens.index("<|im_end|>")
    ids = smollm.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == start and ids[-1] == end
    assert ids[1:-1] == smollm.encode("user\nhi")
    plain = smollm.encode("<|im_start|>user\nhi<|im_end|>", parse_special=False)
    assert start not in plain and end not in plain
    assert end in smollm.eog_ids


def test_stream_never_emits_half_a_character(smollm: Tokenizer) -> None:
    text = "Tschüß 🤗 ok"
    ids = smollm.encode(text)
    stream = smollm.stream()
    pieces = [stream.push(i) for i in ids]
    assert "".join(pieces) + stream.flush() == text
    assert "\ufffd" not in "".join(pieces)
    # The emoji's four bytes span several tokens: the stream held some back ("").
    assert "" in pieces
    assert any("🤗" in p for p in pieces)


def test_stream_skips_control_tokens(smollm: Tokenizer) -> None:
    stream = smollm.stream()
    out = "".join(stream.push(i) for i in smollm.encode("hi<|im_end|>")) + stream.flush()
    assert out == "hi"


def test_chat_template(smollm: Tokenizer) -> None:
    messages = [{"role": "user", "content": "What is 2+2?"}]
    prompt = smollm.apply_chat_template(messages, add_generation_prompt=True)
    assert prompt.startswith("<|im_start|>system\n")
    assert prompt.endswith(
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    without = smollm.apply_chat_template(messages, add_generation_prompt=False)
    assert without + "<|im_start|>assistant\n" == prompt


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["tokenize", "--model", str(MODEL), "--json", "hello world"]) == 0
    assert json.loads(capsys.readouterr().out) == {"ids": [28120, 905]}


def test_cli_lines_like_llama_tokenize(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["tokenize", "--model", str(MODEL), "hello world<|im_end|>"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        " 28120 -> 'hello'",
        "   905 -> ' world'",
        "     2 -> '<|im_end|>'",
    ]


def test_cli_chat_and_no_special(smollm: Tokenizer, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["tokenize", "--model", str(MODEL), "--json", "--chat", "hi"]) == 0
    chat_ids = json.loads(capsys.readouterr().out)["ids"]
    start = smollm.vocab.tokens.index("<|im_start|>")
    # Ends with the generation prompt: <|im_start|> "ass" "istant" "\n".
    assert chat_ids[0] == start and chat_ids[-4] == start
    assert [smollm.token_text(i) for i in chat_ids[-3:]] == ["ass", "istant", "\u010a"]
    assert cli.main(["tokenize", "--model", str(MODEL), "--json", "--no-special",
                     "<|im_end|>"]) == 0
    assert 2 not in json.loads(capsys.readouterr().out)["ids"]


def test_cli_missing_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["tokenize", "--model", str(tmp_path / "nope.gguf"), "x"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1
    assert "ModelUnreadable" in captured.err and "nope.gguf" in captured.err
