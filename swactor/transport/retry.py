"""Stateless address validation for the endpoint's server side (QUIC Retry, RFC 9000 §8.1).

Theory of operation
-------------------
An Initial packet's source address is not proven: anyone can send 1200 bytes with any
source. Before this endpoint builds any connection state for an Initial (a key share, a
certificate signature, buffers), it answers an Initial that carries no token with a Retry
packet holding a token, and builds the connection only for an Initial whose token it
issued to that very address (host and port) less than `lifetime` seconds ago. A sender
that spoofs its source never sees the token, so it costs this endpoint one HMAC and one
Retry packet (smaller than the 1200-byte Initial it answers: no amplification) and no
state at all.

The token is authenticated, not encrypted (everything in it was sent in the clear):

    version (1) | issued_ms (8, loop clock) | len(odcid) (1) | odcid | rscid (8) | tag (16)

`odcid` is the client's original destination connection id and `rscid` the source
connection id of our Retry (RFC 9000 §7.3: the server proves both in its transport
parameters). `tag` is HMAC-SHA256 over the address and everything before it, under a
key drawn at random when the endpoint starts (a restarted endpoint refuses old tokens:
the client's handshake then times out and its retry starts afresh).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
from dataclasses import dataclass

Address = tuple[str, int]
TOKEN_VERSION = 1
_TAG = 16
_HEAD = struct.Struct(">BQB")
MAX_CID = 20  # RFC 9000 §17.2: connection ids are at most 20 bytes
RSCID_LENGTH = 8


@dataclass(frozen=True, slots=True)
class ValidatedToken:
    """What a valid token proves: the client's original and our Retry's connection ids."""

    original_destination_cid: bytes
    retry_source_cid: bytes


class RetryTokenError(ValueError):
    """A token this endpoint did not issue to this address, or issued too long ago."""


class RetryTokens:
    """Issues and checks Retry tokens (module docstring)."""

    def __init__(self, lifetime: float, key: bytes | None = None) -> None:
        self.lifetime = lifetime
        self._key = key if key is not None else os.urandom(32)

    def issue(self, addr: Address, original_cid: bytes, retry_cid: bytes, now: float) -> bytes:
        if len(original_cid) > MAX_CID or len(retry_cid) != RSCID_LENGTH:
            raise ValueError("connection id of the wrong length")
        body = _HEAD.pack(TOKEN_VERSION, int(now * 1000), len(original_cid))
        body += original_cid + retry_cid
        return body + self._tag(addr, body)

    def check(self, addr: Address, token: bytes, now: float) -> ValidatedToken:
        """The ids the token carries; `RetryTokenError` naming why it is refused."""
        if len(token) < _HEAD.size + RSCID_LENGTH + _TAG:
            raise RetryTokenError(f"token of {len(token)} bytes is too short")
        version, issued_ms, odcid_len = _HEAD.unpack_from(token)
        if version != TOKEN_VERSION or odcid_len > MAX_CID:
            raise RetryTokenError("token of an unknown version")
        end = _HEAD.size + odcid_len + RSCID_LENGTH
        if len(token) != end + _TAG:
            raise RetryTokenError("token length does not match its contents")
        body, tag = token[:end], token[end:]
        if not hmac.compare_digest(tag, self._tag(addr, body)):
            raise RetryTokenError("token was not issued to this address by this endpoint")
        age = now - issued_ms / 1000
        if not -1.0 <= age <= self.lifetime:
            raise RetryTokenError(f"token expired ({age:.1f} s old)")
        odcid = body[_HEAD.size : _HEAD.size + odcid_len]
        return ValidatedToken(odcid, body[_HEAD.size + odcid_len :])

    def _tag(self, addr: Address, body: bytes) -> bytes:
        host, port = addr
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        packed = socket.inet_pton(family, host) + port.to_bytes(2, "big")
        return hmac.new(self._key, packed + body, hashlib.sha256).digest()[:_TAG]
