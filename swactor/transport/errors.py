"""Typed errors of the transport layer; each names the problem it reports."""

from __future__ import annotations


class TransportError(Exception):
    """Base of every error raised by `swactor.transport`."""


class IdentityError(TransportError):
    """A node key file is missing, unreadable, malformed or not Ed25519."""


class KeyFilePermissionsError(IdentityError):
    """A node key file is readable or writable by the group or others."""


class TransportConfigError(TransportError):
    """A transport setting is outside its allowed range."""


class PeerRejectedError(TransportError):
    """A peer failed identity verification; carries the id it proved (None: no cert)."""

    def __init__(self, peer_node_id: int | None, reason: str) -> None:
        shown = "no certificate" if peer_node_id is None else f"node {peer_node_id:#018x}"
        super().__init__(f"peer rejected ({shown}): {reason}")
        self.peer_node_id = peer_node_id
        self.reason = reason


class ConnectionLostError(TransportError):
    """The QUIC connection closed while an operation depended on it."""


class ControlError(TransportError):
    """A control-channel message was malformed, unauthorised or timed out."""
