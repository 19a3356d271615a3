"""The tokenizer facts a GGUF file carries in its metadata, read without touching tensors.

Theory of operation: :func:`read_vocab` parses the file's header
(:func:`~swactor.model.gguf_header.read_local_header`: the key/value metadata and the
tensor table, never tensor data, vocabulary arrays read in bulk), picks the
``tokenizer.*`` keys and returns one immutable :class:`GgufVocab`. Defaults for
keys a file may omit follow llama.cpp's loader, so a file tokenizes here as it does there:

* ``tokenizer.ggml.model = "llama"`` (SentencePiece): BOS 1, EOS 2, UNK 0, a BOS is added
  and a space is prefixed to the text unless the file says otherwise;
* ``tokenizer.ggml.model = "gpt2"`` (byte-level BPE): no BOS added (except for the
  ``llama-bpe`` pre-tokenizer), no space prefix.

Token types are llama.cpp's (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
6 byte); a file without them has only normal tokens. Every failure — a missing or
unreadable file, a file that is not GGUF, a missing or mistyped key — is a
:class:`TokenizerError` naming the file and the key.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swactor.model.gguf_header import GgufHeaderError, NeedMoreBytes, read_local_header
from swactor.model.tokenizer_errors import TokenizerError, TokenizerFault


class TokenType(enum.IntEnum):
    """llama.cpp's ``tokenizer.ggml.token_type`` values."""

    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


KEY_MODEL = "tokenizer.ggml.model"
KEY_PRE = "tokenizer.ggml.pre"
KEY_TOKENS = "tokenizer.ggml.tokens"
KEY_TOKEN_TYPE = "tokenizer.ggml.token_type"
KEY_SCORES = "tokenizer.ggml.scores"
KEY_MERGES = "tokenizer.ggml.merges"
KEY_BOS = "tokenizer.ggml.bos_token_id"
KEY_EOS = "tokenizer.ggml.eos_token_id"
KEY_EOT = "tokenizer.ggml.eot_token_id"
KEY_UNK = "tokenizer.ggml.unknown_token_id"
KEY_ADD_BOS = "tokenizer.ggml.add_bos_token"
KEY_ADD_EOS = "tokenizer.ggml.add_eos_token"
KEY_ADD_SPACE_PREFIX = "tokenizer.ggml.add_space_prefix"
KEY_CHAT_TEMPLATE = "tokenizer.chat_template"

# Texts llama.cpp recognises as end-of-generation tokens; the first one present is the
# end-of-turn token when the file names none.
EOG_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<|eom_id|>",
)


@dataclass(frozen=True)
class GgufVocab:
    """Everything needed to build a tokenizer, as the GGUF file states it."""

    source: str
    model: str
    pre: str | None
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    scores: tuple[float, ...] | None
    merges: tuple[str, ...]
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    unk_id: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    chat_template: str | None

    @property
    def size(self) -> int:
        return len(self.tokens)


def read_vocab(path: str | Path) -> GgufVocab:
    """Read the tokenizer metadata of the GGUF file at ``path``."""
    return vocab_from_metadata(_read_metadata(Path(path)), str(path))


def _read_metadata(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise TokenizerError(TokenizerFault.ModelUnreadable, f"{path}: no such model file")
    try:
        header, _ = read_local_header(path)
    except OSError as exc:
        raise TokenizerError(
            TokenizerFault.ModelUnreadable, f"{path}: cannot read ({exc.strerror or exc})"
        ) from exc
    except (NeedMoreBytes, GgufHeaderError) as exc:
        size = path.stat().st_size
        detail = "ends inside its header" if isinstance(exc, NeedMoreBytes) else str(exc)
        raise TokenizerError(
            TokenizerFault.MetadataInvalid,
            f"{path}: not a readable GGUF file, truncated or corrupt ({size} bytes; {detail})",
        ) from None
    return header.metadata


def vocab_from_fields(fields: Mapping[str, Any], source: str) -> GgufVocab:
    """Build a :class:`GgufVocab` from ``gguf.GGUFReader.fields``; ``source`` names the file."""
    metadata: dict[str, Any] = {}
    for key, field in fields.items():
        try:
            metadata[key] = field.contents()
        except (ValueError, IndexError, TypeError, UnicodeDecodeError) as exc:
            raise TokenizerError(
                TokenizerFault.MetadataInvalid, f"{source}: {key} unreadable ({exc})"
            ) from exc
    return vocab_from_metadata(metadata, source)


def vocab_from_metadata(metadata: Mapping[str, Any], source: str) -> GgufVocab:
    """Build a :class:`GgufVocab` from a header's metadata (plain values by key)."""
    reading = _FieldReader(metadata, source)
    model = reading.string(KEY_MODEL, required=True)
    assert model is not None
    tokens = tuple(reading.string_list(KEY_TOKENS, required=True) or ())
    n = len(tokens)
    if n == 0:
        raise TokenizerError(TokenizerFault.MetadataInvalid, f"{source}: {KEY_TOKENS} is empty")
    types = reading.int_list(KEY_TOKEN_TYPE)
    token_types = tuple(types) if types is not None else (int(TokenType.NORMAL),) * n
    if len(token_types) != n:
        raise TokenizerError(
            TokenizerFault.MetadataInvalid,
            f"{source}: {KEY_TOKEN_TYPE} has {len(token_types)} entries for {n} tokens",
        )
    scores_list = reading.float_list(KEY_SCORES)
    scores = tuple(scores_list) if scores_list is not None else None
    if scores is not None and len(scores) != n:
        raise TokenizerError(
            TokenizerFault.MetadataInvalid,
            f"{source}: {KEY_SCORES} has {len(scores)} entries for {n} tokens",
        )
    merges = tuple(reading.string_list(KEY_MERGES) or ())
    pre = reading.string(KEY_PRE)
    spm = model == "llama"
    default_add_bos = spm or pre in ("llama-bpe", "llama3", "llama-v3")
    bos = reading.token_id(KEY_BOS, n, default=1 if spm else None)
    eos = reading.token_id(KEY_EOS, n, default=2 if spm else None)
    unk = reading.token_id(KEY_UNK, n, default=0 if spm else None)
    eot = reading.token_id(KEY_EOT, n, default=None)
    if eot is None:
        where = {text: i for i, text in enumerate(tokens) if text in EOG_TEXTS}
        eot = next((where[text] for text in EOG_TEXTS if text in where), None)
    return GgufVocab(
        source=source,
        model=model,
        pre=pre,
        tokens=tokens,
        token_types=token_types,
        scores=scores,
        merges=merges,
        bos_id=bos,
        eos_id=eos,
        eot_id=eot,
        unk_id=unk,
        add_bos=reading.boolean(KEY_ADD_BOS, default=default_add_bos),
        add_eos=reading.boolean(KEY_ADD_EOS, default=False),
        add_space_prefix=reading.boolean(KEY_ADD_SPACE_PREFIX, default=spm),
        chat_template=reading.string(KEY_CHAT_TEMPLATE),
    )


class _FieldReader:
    """Typed access to header metadata that turns every surprise into a TokenizerError."""

    def __init__(self, metadata: Mapping[str, Any], source: str) -> None:
        self._metadata = metadata
        self._source = source

    def _contents(self, key: str, required: bool) -> Any:
        value = self._metadata.get(key)
        if value is None and required:
            raise TokenizerError(
                TokenizerFault.MetadataMissing, f"{self._source}: no {key} in metadata"
            )
        return value

    def _bad(self, key: str, want: str) -> TokenizerError:
        return TokenizerError(
            TokenizerFault.MetadataInvalid, f"{self._source}: {key} is not {want}"
        )

    def string(self, key: str, required: bool = False) -> str | None:
        value = self._contents(key, required)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self._bad(key, "a string")
        return value

    def string_list(self, key: str, required: bool = False) -> list[str] | None:
        value = self._contents(key, required)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._bad(key, "an array of strings")
        return value

    def int_list(self, key: str) -> list[int] | None:
        value = self._contents(key, False)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
            raise self._bad(key, "an array of integers")
        return [int(v) for v in value]

    def float_list(self, key: str) -> list[float] | None:
        value = self._contents(key, False)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, (int, float)) for v in value):
            raise self._bad(key, "an array of numbers")
        return [float(v) for v in value]

    def boolean(self, key: str, default: bool) -> bool:
        value = self._contents(key, False)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._bad(key, "a boolean")
        return value

    def token_id(self, key: str, n_tokens: int, default: int | None) -> int | None:
        value = self._contents(key, False)
        if value is None:
            return default if default is not None and default < n_tokens else None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._bad(key, "an integer")
        if not 0 <= value < n_tokens:
            raise TokenizerError(
                TokenizerFault.MetadataInvalid,
                f"{self._source}: {key} = {value} is outside the {n_tokens}-token vocabulary",
            )
        return value
