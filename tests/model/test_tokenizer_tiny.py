"""Tokenizers built from tiny GGUF files the tests write: SentencePiece merges by score,
byte fallback, the llama-bpe and qwen2 presets, and the typed errors.

Expected ids are derived by hand in the comments from each vocabulary, never read back
from the code under test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from swactor import cli
from swactor.model.tokenizer import Tokenizer
from swactor.model.tokenizer_errors import TokenizerError, TokenizerFault

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6


def write_gguf(path: Path, **meta: Any) -> Path:
    """A GGUF file with tokenizer metadata only (no tensors)."""
    writer = gguf.GGUFWriter(path, "llama")
    if "model" in meta:
        writer.add_tokenizer_model(meta["model"])
    if "pre" in meta:
        writer.add_tokenizer_pre(meta["pre"])
    if "tokens" in meta:
        writer.add_token_list(meta["tokens"])
    if "types" in meta:
        writer.add_token_types(meta["types"])
    if "scores" in meta:
        writer.add_token_scores(meta["scores"])
    if "merges" in meta:
        writer.add_token_merges(meta["merges"])
    if "bos" in meta:
        writer.add_bos_token_id(meta["bos"])
    if "eos" in meta:
        writer.add_eos_token_id(meta["eos"])
    if "add_bos" in meta:
        writer.add_add_bos_token(meta["add_bos"])
    if "template" in meta:
        writer.add_chat_template(meta["template"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# --------------------------------------------------------------------- SentencePiece

# (text, type, score). Scores decide the merge order: the highest-scoring entry that two
# neighbouring symbols can form is merged first.
SPM_VOCAB: list[tuple[str, int, float]] = [
    ("<unk>", UNKNOWN, 0.0),  # 0
    ("<s>", CONTROL, 0.0),  # 1
    ("</s>", CONTROL, 0.0),  # 2
    ("<0x0A>", BYTE, 0.0),  # 3
    ("<0xC3>", BYTE, 0.0),  # 4
    ("<0xA9>", BYTE, 0.0),  # 5
    ("\u2581", NORMAL, -20.0),  # 6  "▁"
    ("h", NORMAL, -20.0),  # 7
    ("e", NORMAL, -20.0),  # 8
    ("l", NORMAL, -20.0),  # 9
    ("o", NORMAL, -20.0),  # 10
    ("w", NORMAL, -20.0),  # 11
    ("r", NORMAL, -20.0),  # 12
    ("d", NORMAL, -20.0),  # 13
    ("ll", NORMAL, -1.0),  # 14
    ("he", NORMAL, -2.0),  # 15
    ("\u2581w", NORMAL, -3.0),  # 16
    ("or", NORMAL, -4.0),  # 17
    ("\u2581he", NORMAL, -5.0),  # 18
    ("llo", NORMAL, -6.0),  # 19
    ("\u2581hello", NORMAL, -7.0),  # 20
    ("\u2581wor", NORMAL, -8.0),  # 21
    ("a", NORMAL, -20.0),  # 22
    ("b", NORMAL, -20.0),  # 23
    ("c", NORMAL, -20.0),  # 24
    ("ab", NORMAL, -1.0),  # 25
    ("bc", NORMAL, -0.5),  # 26
]


@pytest.fixture(scope="module")
def spm_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("spm") / "spm.gguf"
    return write_gguf(
        path,
        model="llama",
        tokens=[t for t, _, _ in SPM_VOCAB],
        types=[k for _, k, _ in SPM_VOCAB],
        scores=[s for _, _, s in SPM_VOCAB],
        bos=1,
        eos=2,
        template="{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}",
    )


@pytest.fixture(scope="module")
def spm(spm_path: Path) -> Tokenizer:
    return Tokenizer.from_gguf(spm_path)


def test_spm_merges_by_score(spm: Tokenizer) -> None:
    # "hello world" -> "▁hello▁world" (space prefix, spaces as ▁). Pairs by score:
    # ll(-1) -> he(-2) -> ▁w(-3) -> or(-4) -> ▁he(-5) -> llo(-6) -> ▁hello(-7) -> ▁wor(-8);
    # "▁worl" and "ld" are not in the vocabulary, so "l", "d" stay.
    assert spm.encode("hello world", add_bos=False) == [20, 21, 9, 13]
    # The file names no add_bos_token: a SentencePiece vocabulary adds BOS (llama.cpp).
    assert spm.encode("hello world") == [1, 20, 21, 9, 13]


def test_spm_higher_score_wins_over_leftmost(spm: Tokenizer) -> None:
    # "▁abc": "bc"(-0.5) outranks "ab"(-1) although "ab" is further left.
    assert spm.encode("abc", add_bos=False) == [6, 22, 26]


def test_spm_byte_fallback_and_round_trip(spm: Tokenizer) -> None:
    # "é" (C3 A9) and "\n" are not entries: they fall back to <0xC3><0xA9> and <0x0A>.
    ids = spm.encode("é\n", add_bos=False)
    assert ids == [6, 4, 5, 3]
    assert spm.decode(ids) == "é\n"
    assert spm.decode(spm.encode("hello world"), skip_special=True) == "hello world"


def test_spm_special_tokens(spm: Tokenizer) -> None:
    # "<s>" is a control token: one id when parsed; a space is prefixed after it.
    assert spm.encode("hello<s>hello", add_bos=False) == [20, 1, 20]
    assert spm.bos_id == 1 and spm.eos_id == 2 and spm.vocab_size == len(SPM_VOCAB)
    # Unparsed, its characters are not entries and fall back to <unk> (no byte tokens).
    unparsed = spm.encode("<s>", add_bos=False, parse_special=False)
    assert 1 not in unparsed


# ----------------------------------------------------------------- byte-level presets


def _byte_chars() -> list[str]:
    """GPT-2's byte-to-unicode map, written out independently of the code under test."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars: dict[int, str] = {b: chr(b) for b in keep}
    shifted = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + shifted)
            shifted += 1
    return [chars[b] for b in range(256)]


def _bpe_file(tmp_path: Path, pre: str) -> Path:
    chars = _byte_chars()
    space = chars[ord(" ")]
    words = ["he", "ll", "hell", "hello", space + "w", "or", space + "wor", "ld", space + "world"]
    merges = ["h e", "l l", "he ll", "hell o", f"{space} w", "o r", f"{space}w or", "l d",
              f"{space}wor ld"]
    extra_words = ["<|end|>", "quick"]  # "quick" is an entry no merge can build
    tokens = chars + words + extra_words
    types = [NORMAL] * (len(chars) + len(words)) + [CONTROL, NORMAL]
    return write_gguf(
        tmp_path / f"{pre}.gguf", model="gpt2", pre=pre, tokens=tokens, types=types,
        merges=merges, eos=len(chars) + len(words), bos=len(chars) + len(words),
    )


# The published expressions, transcribed independently for the `regex` module.
LLAMA3_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPLIT_SAMPLES = [
    "Hello world",
    "I'M here, they'LL see 1234567 items!",
    "  two  spaces\n\n\tand tabs   ",
    "naïve café 😀 x2",
    "a\r\nb\n\n\nc",
]


def _regex_pieces(pattern: str, text: str) -> list[str]:
    return [m.group(0) for m in regex.finditer(pattern, text)]


@pytest.mark.parametrize(("pre", "pattern"), [("llama-bpe", LLAMA3_RE), ("qwen2", QWEN2_RE)])
@pytest.mark.parametrize("text", SPLIT_SAMPLES)
def test_preset_split_matches_published_pattern(
    tmp_path: Path, pre: str, pattern: str, text: str
) -> None:
    tok = Tokenizer.from_gguf(_bpe_file(tmp_path, pre))
    assert tok.pre_tokenize(text) == _regex_pieces(pattern, text)


def test_digit_grouping_differs_between_presets(tmp_path: Path) -> None:
    llama = Tokenizer.from_gguf(_bpe_file(tmp_path, "llama-bpe"))
    qwen = Tokenizer.from_gguf(_bpe_file(tmp_path, "qwen2"))
    assert llama.pre_tokenize("1234567") == ["123", "456", "7"]
    assert qwen.pre_tokenize("1234567") == list("1234567")


def test_byte_level_bpe_ids(tmp_path: Path) -> None:
    tok = Tokenizer.from_gguf(_bpe_file(tmp_path, "qwen2"))
    n = 256
    # "hello" merges h e -> he, l l -> ll, he ll -> hell, hell o -> hello (id n+3);
    # " world" merges to "Ġworld" (id n+8).
    assert tok.encode("hello world") == [n + 3, n + 8]
    assert tok.decode([n + 3, n + 8]) == "hello world"
    # "<|end|>" is a control token: one id when parsed, bytes otherwise.
    assert tok.encode("hello<|end|>") == [n + 3, n + 9]
    assert n + 9 not in tok.encode("hello<|end|>", parse_special=False)


def test_llama_bpe_ignores_merges_for_whole_entries(tmp_path: Path) -> None:
    llama = Tokenizer.from_gguf(_bpe_file(tmp_path, "llama-bpe"))
    qwen = Tokenizer.from_gguf(_bpe_file(tmp_path, "qwen2"))
    quick = 256 + 10
    # No merge builds "quick"; llama-bpe takes an entry that matches a whole piece as is.
    assert llama.encode("quick", add_bos=False) == [quick]
    # The first 256 entries are the byte characters in byte order: id == byte value.
    assert qwen.encode("quick") == [ord(c) for c in "quick"]
    # llama-bpe adds BOS unless the file says otherwise; qwen2 does not.
    assert llama.encode("quick")[0] == llama.bos_id
    assert qwen.add_bos is False


# ------------------------------------------------------------------------ errors


def test_unsupported_tokenizer_model(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "bert.gguf", model="bert", tokens=["[PAD]", "a"])
    with pytest.raises(TokenizerError) as caught:
        Tokenizer.from_gguf(path)
    assert caught.value.reason is TokenizerFault.UnsupportedTokenizerModel
    assert "'bert'" in str(caught.value)


def test_unsupported_pre_tokenizer(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "f.gguf", model="gpt2", pre="falcon", tokens=["a", "b", "ab"],
                      merges=["a b"])
    with pytest.raises(TokenizerError) as caught:
        Tokenizer.from_gguf(path)
    assert caught.value.reason is TokenizerFault.UnsupportedPreTokenizer
    assert "'falcon'" in str(caught.value)


def test_missing_vocabulary(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "novocab.gguf", model="gpt2", pre="qwen2")
    with pytest.raises(TokenizerError) as caught:
        Tokenizer.from_gguf(path)
    assert caught.value.reason is TokenizerFault.MetadataMissing
    assert "tokenizer.ggml.tokens" in str(caught.value)


def test_missing_and_garbage_files(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError) as missing:
        Tokenizer.from_gguf(tmp_path / "absent.gguf")
    assert missing.value.reason is TokenizerFault.ModelUnreadable
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"this is not a gguf file at all" * 4)
    with pytest.raises(TokenizerError) as bad:
        Tokenizer.from_gguf(garbage)
    assert bad.value.reason is TokenizerFault.MetadataInvalid


def test_truncated_file(spm_path: Path, tmp_path: Path) -> None:
    data = spm_path.read_bytes()
    for keep in (10, len(data) // 3, len(data) // 2):
        cut = tmp_path / f"cut{keep}.gguf"
        cut.write_bytes(data[:keep])
        with pytest.raises(TokenizerError) as caught:
            Tokenizer.from_gguf(cut)
        assert caught.value.reason is TokenizerFault.MetadataInvalid
        assert str(cut) in str(caught.value)


def test_token_id_out_of_range(spm: Tokenizer) -> None:
    with pytest.raises(TokenizerError) as caught:
        spm.decode([len(SPM_VOCAB)])
    assert caught.value.reason is TokenizerFault.TokenIdOutOfRange


def test_chat_template_renders(spm: Tokenizer) -> None:
    messages = [{"role": "user", "content": "hello"}]
    assert spm.apply_chat_template(messages) == "[user]hello[assistant]"
    assert spm.apply_chat_template(messages, add_generation_prompt=False) == "[user]hello"


def test_chat_template_missing_and_broken(tmp_path: Path) -> None:
    bare = Tokenizer.from_gguf(_bpe_file(tmp_path, "qwen2"))
    with pytest.raises(TokenizerError) as missing:
        bare.apply_chat_template([{"role": "user", "content": "hi"}])
    assert missing.value.reason is TokenizerFault.ChatTemplateMissing
    path = write_gguf(
        tmp_path / "t.gguf", model="llama", tokens=[t for t, _, _ in SPM_VOCAB],
        types=[k for _, k, _ in SPM_VOCAB], scores=[s for _, _, s in SPM_VOCAB],
        template="{% for m in messages %}{{ m.content.__class__ }}{% endfor %}",
    )
    sandboxed = Tokenizer.from_gguf(path)
    with pytest.raises(TokenizerError) as unsafe:
        sandboxed.apply_chat_template([{"role": "user", "content": "hi"}])
    assert unsafe.value.reason is TokenizerFault.ChatTemplateInvalid


# --------------------------------------------------------------------------- CLI


def test_cli_json_on_tiny_model(spm_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Same derivation as test_spm_merges_by_score, with the BOS the file implies.
    assert cli.main(["tokenize", "--model", str(spm_path), "--json", "hello world"]) == 0
    assert json.loads(capsys.readouterr().out) == {"ids": [1, 20, 21, 9, 13]}
    assert cli.main(["tokenize", "--model", str(spm_path), "--no-bos", "abc"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "     6 -> ' '",
        "    22 -> 'a'",
        "    26 -> 'bc'",
    ]


def test_cli_unsupported_model_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_gguf(tmp_path / "bert.gguf", model="bert", tokens=["[PAD]", "a"])
    assert cli.main(["tokenize", "--model", str(path), "x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "UnsupportedTokenizerModel" in err


# ------------------------------------------------------------------- properties


@pytest.fixture(scope="module")
def byte_bpe(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return Tokenizer.from_gguf(_bpe_file(tmp_path_factory.mktemp("bpe"), "qwen2"))


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=40))
def test_byte_level_round_trip_and_stream(byte_bpe: Tokenizer, text: str) -> None:
    ids = byte_bpe.encode(text, parse_special=False)
    assert byte_bpe.decode(ids) == text
    stream = byte_bpe.stream(skip_special=False)
    chunks = [stream.push(i) for i in ids]
    # Every chunk is whole characters: no replacement character, nothing left over.
    assert "\ufffd" not in "".join(chunks) or "\ufffd" in text
    assert "".join(chunks) + stream.flush() == text
    assert stream.flush() == ""


@settings(max_examples=150, deadline=None)
@given(text=st.text(alphabet=st.sampled_from("helowrdabc é\n😀"), max_size=30))
def test_sentencepiece_round_trip(spm: Tokenizer, text: str) -> None:
    ids = spm.encode(text, add_bos=False)
    # Characters outside the vocabulary and its byte tokens become <unk> (id 0).
    if 0 not in ids:
        assert spm.decode(ids) == text


def test_from_parsed_fields_and_template_globals(tmp_path: Path) -> None:
    template = (
        "{{ bos_token }}{% for m in messages %}{{ m['content'] | tojson }}{% endfor %}"
        "{% if strftime_now('%Y') | int < 2000 %}{{ raise_exception('clock') }}{% endif %}"
        "{% if messages | length > 1 %}{{ raise_exception('one message only') }}{% endif %}"
    )
    path = write_gguf(
        tmp_path / "t.gguf", model="llama", tokens=[t for t, _, _ in SPM_VOCAB],
        types=[k for _, k, _ in SPM_VOCAB], scores=[s for _, _, s in SPM_VOCAB],
        template=template,
    )
    tok = Tokenizer.from_fields(dict(gguf.GGUFReader(path).fields), str(path))
    assert tok.encode("hello world") == [1, 20, 21, 9, 13]
    assert tok.apply_chat_template([{"role": "user", "content": 'say "hi"'}]) == (
        '<s>"say \\"hi\\""'
    )
    two = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(TokenizerError) as refused:
        tok.apply_chat_template(two)
    assert refused.value.reason is TokenizerFault.ChatTemplateInvalid
    assert "one message only" in str(refused.value)
