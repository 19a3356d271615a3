"""Text <-> token ids for a GGUF model, built from the file's own vocabulary.

Theory of operation
-------------------
:meth:`Tokenizer.from_gguf` reads the ``tokenizer.*`` metadata (:mod:`swactor.model.vocab`)
and builds a Hugging Face ``tokenizers`` model (Rust core) from it:

* ``gpt2`` (byte-level BPE): a ``BPE`` model over the file's tokens and merges, behind the
  pre-tokenizer preset ``tokenizer.ggml.pre`` names (:mod:`swactor.model.pretokenize`);
* ``llama`` (SentencePiece BPE): a ``BPE`` model with byte fallback (``<0xNN>`` tokens)
  whose merges are derived from the scores — every way to cut a vocabulary entry into
  two vocabulary entries is a merge, ranked by the entry's score, highest first — which is
  the order in which llama.cpp's SentencePiece tokenizer joins neighbouring symbols.
  Spaces become ``▁`` and, when ``add_space_prefix`` holds, a ``▁`` is prefixed to each
  text fragment that starts the input or follows a special token, as llama.cpp does.

Any other ``tokenizer.ggml.model`` is refused with ``UnsupportedTokenizerModel``.

Encoding follows llama.cpp's ``llama_tokenize``: with ``parse_special`` the text is first
partitioned around every control, user-defined and unknown token's text (longest first),
each becoming its own id; without it only user-defined tokens are cut out. The remaining
fragments go through the BPE model. ``add_bos=None`` follows ``add_bos_token``.

Decoding maps each id to its bytes (:meth:`Tokenizer.token_bytes`): byte-level tokens
through the inverse GPT-2 byte map, ``<0xNN>`` tokens to their byte, ``▁`` to a space,
control/user-defined tokens to their text, unused tokens to nothing. A token may end in
the middle of a UTF-8 character; :class:`StreamDecoder` holds such bytes back until the
character is complete, so a stream never prints half a character.
"""

from __future__ import annotations

import codecs
import functools
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HfTokenizer
from tokenizers import models

from swactor.model.pretokenize import preset_for
from swactor.model.tokenizer_errors import TokenizerError, TokenizerFault
from swactor.model.vocab import (
    EOG_TEXTS,
    GgufVocab,
    TokenType,
    read_vocab,
    vocab_from_fields,
    vocab_from_metadata,
)

SPM_SPACE = "\u2581"  # "▁", SentencePiece's visible space

_SPECIAL_TYPES = frozenset({TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNKNOWN})
_ALWAYS_SPLIT_TYPES = frozenset({TokenType.USER_DEFINED})
_TEXT_PIECE_TYPES = frozenset({TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNKNOWN})
_SILENT_TYPES = frozenset({TokenType.CONTROL, TokenType.UNKNOWN})


@functools.cache
def _gpt2_unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's byte-to-unicode map: printable bytes map to themselves, the other
    68 bytes to code points 256 and up, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


class Tokenizer:
    """A GGUF model's tokenizer: ``encode``, ``decode``, streaming decode, chat template."""

    def __init__(self, vocab: GgufVocab) -> None:
        self._vocab = vocab
        self._types = vocab.token_types  # raw values; token_type() names them
        self._spm = vocab.model == "llama"
        if vocab.model == "gpt2":
            self._hf = _build_byte_level_bpe(vocab)
        elif self._spm:
            self._hf = _build_sentencepiece_bpe(vocab)
        else:
            raise TokenizerError(
                TokenizerFault.UnsupportedTokenizerModel,
                f"{vocab.source}: tokenizer model {vocab.model!r} is not supported "
                "(supported: gpt2, llama)",
            )
        special_values = {int(t) for t in _SPECIAL_TYPES}
        specials = [i for i, t in enumerate(self._types) if t in special_values]
        # Longest text first, as llama.cpp partitions; ties by id for a stable order.
        specials.sort(key=lambda i: (-len(vocab.tokens[i]), i))
        self._specials: tuple[tuple[str, int, bool], ...] = tuple(
            (vocab.tokens[i], i, _token_type(self._types[i]) in _ALWAYS_SPLIT_TYPES)
            for i in specials
            if vocab.tokens[i]
        )
        eog = {i for i, text in enumerate(vocab.tokens) if text in EOG_TEXTS}
        eog.update(i for i in (vocab.eos_id, vocab.eot_id) if i is not None)
        self._eog_ids = frozenset(eog)
        # each id's bytes, worked out on first use: a command that encodes a few words
        # should not pay for the whole vocabulary
        self._pieces: list[bytes | None] = [None] * vocab.size

    # ----------------------------------------------------------------- construction

    @classmethod
    def from_gguf(cls, path: str | Path) -> Tokenizer:
        """Build the tokenizer described by the GGUF file at ``path`` (metadata only).

        The result is kept per process (an orchestrator tokenizes the prompt and decodes
        the stream with one), keyed by the file's resolved path, size and modification
        time.
        """
        from swactor.model.source import is_url

        if is_url(path):
            return cls.from_url(str(path))
        file = Path(path)
        try:
            stat = file.stat()
        except OSError:
            return cls(read_vocab(file))  # read_vocab raises the typed error
        return _cached_tokenizer(str(file.resolve()), stat.st_size, stat.st_mtime_ns)

    @classmethod
    def from_url(cls, url: str) -> Tokenizer:
        """Build from the header of the GGUF at an http(s) URL, read by byte ranges."""
        from swactor.model.errors import WeightsError
        from swactor.model.gguf_range import read_header
        from swactor.model.source import HttpRangeSource

        try:
            source = HttpRangeSource(url)
            header, _ = read_header(source, source.size())
        except WeightsError as error:
            raise TokenizerError(TokenizerFault.ModelUnreadable, str(error)) from None
        return cls.from_metadata(header.metadata, url)

    @classmethod
    def from_fields(cls, fields: dict[str, Any], source: str) -> Tokenizer:
        """Build from ``gguf.GGUFReader.fields`` someone already parsed; ``source`` names
        the file in errors."""
        return cls(vocab_from_fields(fields, source))

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], source: str) -> Tokenizer:
        """Build from a parsed header's metadata (``GgufHeader.metadata``)."""
        return cls(vocab_from_metadata(metadata, source))

    # ------------------------------------------------------------------- properties

    @property
    def vocab(self) -> GgufVocab:
        return self._vocab

    @property
    def vocab_size(self) -> int:
        return self._vocab.size

    @property
    def bos_id(self) -> int | None:
        return self._vocab.bos_id

    @property
    def eos_id(self) -> int | None:
        return self._vocab.eos_id

    @property
    def eot_id(self) -> int | None:
        """End-of-turn token (``<|im_end|>`` and the like), when the vocabulary has one."""
        return self._vocab.eot_id

    @property
    def eog_ids(self) -> frozenset[int]:
        """Ids that end generation: EOS, the end-of-turn token and every token whose text
        llama.cpp treats as end of generation (``<|im_end|>``, ``<|endoftext|>``, ...)."""
        return self._eog_ids

    @property
    def add_bos(self) -> bool:
        return self._vocab.add_bos

    @property
    def chat_template(self) -> str | None:
        return self._vocab.chat_template

    def token_text(self, token_id: int) -> str:
        """The vocabulary entry for ``token_id`` as the file spells it (``Ġworld``)."""
        self._check_id(token_id)
        return self._vocab.tokens[token_id]

    def token_type(self, token_id: int) -> TokenType:
        self._check_id(token_id)
        return _token_type(self._types[token_id])

    def is_special(self, token_id: int) -> bool:
        """Control or unknown tokens: the ones a plain-text decode leaves out."""
        return self.token_type(token_id) in _SILENT_TYPES

    # --------------------------------------------------------------------- encoding

    def encode(
        self,
        text: str,
        add_bos: bool | None = None,
        parse_special: bool = True,
        add_eos: bool | None = None,
    ) -> list[int]:
        """Token ids for ``text``; ``None`` flags follow the file's ``add_*_token``."""
        want_bos = self._vocab.add_bos if add_bos is None else add_bos
        want_eos = self._vocab.add_eos if add_eos is None else add_eos
        ids: list[int] = []
        if want_bos:
            ids.append(self._required(self.bos_id, "BOS"))
        prefix_space = self._spm and self._vocab.add_space_prefix
        previous_special = True
        for fragment in self._partition(text, parse_special):
            if isinstance(fragment, int):
                ids.append(fragment)
                previous_special = True
                continue
            if self._spm:
                if prefix_space and previous_special:
                    fragment = " " + fragment
                fragment = fragment.replace(" ", SPM_SPACE)
            ids.extend(self._encode_fragment(fragment))
            previous_special = False
        if want_eos:
            ids.append(self._required(self.eos_id, "EOS"))
        return ids

    def pre_tokenize(self, text: str) -> list[str]:
        """The pieces the pre-tokenizer cuts ``text`` into, as slices of ``text`` (BPE only;
        a SentencePiece vocabulary does not pre-tokenize and returns ``[text]``)."""
        pre = self._hf.pre_tokenizer
        if pre is None:
            return [text] if text else []
        return [text[start:end] for _, (start, end) in pre.pre_tokenize_str(text)]

    def _encode_fragment(self, fragment: str) -> list[int]:
        try:
            encoding = self._hf.encode(fragment, add_special_tokens=False)
        except (UnicodeEncodeError, TypeError) as exc:
            raise TokenizerError(
                TokenizerFault.TextInvalid,
                f"text cannot be encoded as UTF-8 ({exc.__class__.__name__})",
            ) from exc
        return list(encoding.ids)

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Cut special-token texts out of ``text``, longest first, as llama.cpp does."""
        fragments: list[str | int] = [text] if text else []
        for special_text, special_id, always in self._specials:
            if not (parse_special or always):
                continue
            cut: list[str | int] = []
            for fragment in fragments:
                if isinstance(fragment, int) or special_text not in fragment:
                    cut.append(fragment)
                    continue
                parts = fragment.split(special_text)
                for index, part in enumerate(parts):
                    if index:
                        cut.append(special_id)
                    if part:
                        cut.append(part)
            fragments = cut
        return fragments

    # --------------------------------------------------------------------- decoding

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes ``token_id`` stands for (may be part of a UTF-8 character)."""
        self._check_id(token_id)
        piece = self._pieces[token_id]
        if piece is None:
            piece = self._pieces[token_id] = self._piece(token_id)
        return piece

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """The text for ``ids``; bytes that are not valid UTF-8 become U+FFFD."""
        stream = StreamDecoder(self, skip_special=skip_special)
        return "".join(stream.push(i) for i in ids) + stream.flush()

    def stream(self, skip_special: bool = True) -> StreamDecoder:
        """An incremental decoder for generated ids (see :class:`StreamDecoder`)."""
        return StreamDecoder(self, skip_special=skip_special)

    def _piece(self, token_id: int) -> bytes:
        text = self._vocab.tokens[token_id]
        kind = _token_type(self._types[token_id])
        if kind in _TEXT_PIECE_TYPES:
            return text.encode("utf-8")
        if kind is TokenType.BYTE and self._spm:
            return _byte_token_value(text)
        if kind not in (TokenType.NORMAL, TokenType.BYTE):
            return b""  # unused/undefined tokens print nothing, as in llama.cpp
        if self._spm:
            return text.replace(SPM_SPACE, " ").encode("utf-8")
        table = _gpt2_unicode_to_byte()
        return b"".join(
            bytes([table[ch]]) if ch in table else ch.encode("utf-8") for ch in text
        )

    # ---------------------------------------------------------------- chat template

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, str]],
        add_generation_prompt: bool = True,
    ) -> str:
        """Render the file's ``tokenizer.chat_template`` for ``messages``."""
        if self.chat_template is None:
            raise TokenizerError(
                TokenizerFault.ChatTemplateMissing,
                f"{self._vocab.source}: no tokenizer.chat_template in metadata",
            )
        from swactor.model.chat import render_chat  # jinja2: loaded only for templates

        return render_chat(
            self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self._text_or_empty(self.bos_id),
            eos_token=self._text_or_empty(self.eos_id),
        )

    # ---------------------------------------------------------------------- helpers

    @property
    def strips_leading_space(self) -> bool:
        """True when encoding prefixed a space that decoding must take off again."""
        return self._spm and self._vocab.add_space_prefix

    def _text_or_empty(self, token_id: int | None) -> str:
        return "" if token_id is None else self._vocab.tokens[token_id]

    def _required(self, token_id: int | None, what: str) -> int:
        if token_id is None:
            raise TokenizerError(
                TokenizerFault.MetadataMissing,
                f"{self._vocab.source}: a {what} token is required but the file names none",
            )
        return token_id

    def _check_id(self, token_id: int) -> None:
        if not 0 <= token_id < self._vocab.size:
            raise TokenizerError(
                TokenizerFault.TokenIdOutOfRange,
                f"token id {token_id} is outside the {self._vocab.size}-token vocabulary",
            )


class StreamDecoder:
    """Turns ids into text one id at a time, never emitting half a UTF-8 character.

    ``push`` returns the text completed by this id (possibly ``""``); ``flush`` returns
    what is left at the end (an incomplete character becomes U+FFFD). With
    ``skip_special`` control tokens (EOS, ``<|im_end|>``) add nothing.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._strip_space = tokenizer.strips_leading_space

    def push(self, token_id: int) -> str:
        piece = self._tokenizer.token_bytes(token_id)
        special = self._tokenizer.is_special(token_id)
        if special and self._skip_special:
            return ""
        if self._strip_space and not special:
            self._strip_space = False
            if piece.startswith(b" "):
                piece = piece[1:]
        return self._utf8.decode(piece, final=False)

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


@functools.lru_cache(maxsize=4)
def _cached_tokenizer(path: str, size: int, mtime_ns: int) -> Tokenizer:
    del size, mtime_ns  # part of the cache key only
    return Tokenizer(read_vocab(path))


def _token_type(value: int) -> TokenType:
    try:
        return TokenType(value)
    except ValueError:
        return TokenType.UNDEFINED


def _byte_token_value(text: str) -> bytes:
    """``<0x0A>`` -> ``b"\\n"``; anything else is taken as literal text."""
    if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
        try:
            return bytes([int(text[3:5], 16)])
        except ValueError:
            pass
    return text.encode("utf-8")


def _vocab_map(vocab: GgufVocab) -> dict[str, int]:
    """Text -> id; when a text repeats, the later id wins, as in llama.cpp."""
    return {text: index for index, text in enumerate(vocab.tokens)}


def _build_byte_level_bpe(vocab: GgufVocab) -> HfTokenizer:
    preset = preset_for(vocab.pre, vocab.source)
    if not vocab.merges:
        raise TokenizerError(
            TokenizerFault.MetadataMissing, f"{vocab.source}: gpt2 tokenizer without merges"
        )
    token_ids = _vocab_map(vocab)
    merges: list[tuple[str, str]] = []
    for line in vocab.merges:
        cut = line.find(" ", 1)
        if cut < 0:
            raise TokenizerError(
                TokenizerFault.MetadataInvalid,
                f"{vocab.source}: merge #{len(merges)} has no separating space",
            )
        left, right = line[:cut], line[cut + 1 :]
        if left in token_ids and right in token_ids and left + right in token_ids:
            merges.append((left, right))
    model = models.BPE(token_ids, merges, ignore_merges=preset.ignore_merges)
    hf = HfTokenizer(model)
    hf.pre_tokenizer = preset.build()
    return hf


def _build_sentencepiece_bpe(vocab: GgufVocab) -> HfTokenizer:
    if vocab.scores is None:
        raise TokenizerError(
            TokenizerFault.MetadataMissing,
            f"{vocab.source}: llama (SentencePiece) tokenizer without tokenizer.ggml.scores",
        )
    token_ids = _vocab_map(vocab)
    ranked: list[tuple[float, int, int, str, str]] = []
    for index, text in enumerate(vocab.tokens):
        if _token_type(vocab.token_types[index]) not in (TokenType.NORMAL, TokenType.USER_DEFINED):
            continue
        for cut in range(1, len(text)):
            left, right = text[:cut], text[cut:]
            if left in token_ids and right in token_ids:
                ranked.append((-vocab.scores[index], index, cut, left, right))
    ranked.sort()
    merges = [(left, right) for _, _, _, left, right in ranked]
    unk = vocab.tokens[vocab.unk_id] if vocab.unk_id is not None else None
    model = models.BPE(token_ids, merges, unk_token=unk, byte_fallback=True, fuse_unk=False)
    return HfTokenizer(model)
