"""Typed tokenizer faults: every way building or using a tokenizer can fail.

Theory of operation: the vocabulary reader, the tokenizer and the chat-template renderer
never let a raw ``OSError``/``ValueError``/``jinja2`` exception escape. Each failure maps to
one :class:`TokenizerFault` and is raised as :class:`TokenizerError`, whose message names the
problem (file, metadata key, token id, template line) but never carries prompt text.
"""

from __future__ import annotations

import enum

from swactor.wire.errors import ReasonError


class TokenizerFault(enum.Enum):
    """Why a tokenizer could not be built or could not do what was asked."""

    ModelUnreadable = "ModelUnreadable"
    MetadataMissing = "MetadataMissing"
    MetadataInvalid = "MetadataInvalid"
    UnsupportedTokenizerModel = "UnsupportedTokenizerModel"
    UnsupportedPreTokenizer = "UnsupportedPreTokenizer"
    TokenIdOutOfRange = "TokenIdOutOfRange"
    TextInvalid = "TextInvalid"
    ChatTemplateMissing = "ChatTemplateMissing"
    ChatTemplateInvalid = "ChatTemplateInvalid"


class TokenizerError(ReasonError[TokenizerFault]):
    """A tokenizer failure with a typed reason and a one-line detail."""
