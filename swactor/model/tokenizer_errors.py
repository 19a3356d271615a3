"""Typed tokenizer faults: every way building or using a tokenizer can fail.

Theory of operation: the vocabulary reader, the tokenizer and the chat-template renderer
never let a raw ``OSError``/``ValueError``/``jinja2`` exception escape. Each failure maps to
one :class:`TokenizerFault` and is raised as :class:`TokenizerError`, whose message names the
problem (file, metadata key, token id, template line) but never carries prompt text.
"""

from __future__ import annotations

import enum


class TokenizerFault(enum.Enum):
    """Why a tokenizer could not be built or could not do what was asked."""

    MODEL_UNREADABLE = "ModelUnreadable"
    METADATA_MISSING = "MetadataMissing"
    METADATA_INVALID = "MetadataInvalid"
    UNSUPPORTED_MODEL = "UnsupportedTokenizerModel"
    UNSUPPORTED_PRE_TOKENIZER = "UnsupportedPreTokenizer"
    TOKEN_ID_OUT_OF_RANGE = "TokenIdOutOfRange"
    TEXT_INVALID = "TextInvalid"
    CHAT_TEMPLATE_MISSING = "ChatTemplateMissing"
    CHAT_TEMPLATE_INVALID = "ChatTemplateInvalid"


class TokenizerError(Exception):
    """A tokenizer failure with a typed reason and a one-line detail."""

    def __init__(self, reason: TokenizerFault, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail
