"""Node identity: one Ed25519 key pair per node, its `node_id`, its TLS certificate.

Theory of operation
-------------------
A node's identity is its Ed25519 private key, created on first start and stored as a
PKCS#8 PEM file with mode 0600. A key file that the group or others may read (or write)
is refused with `KeyFilePermissionsError`: a leaked key is a stolen identity.

`node_id` is derived from the raw 32-byte public key and nothing else:

    node_id = int.from_bytes(sha256(raw_public_key)[:8], "little")

so any peer can recompute it from the certificate presented in the TLS handshake. The
certificate itself is self-signed and carries no authority: trust comes from comparing the
derived id with the expected id (client side) or the allow-list (server side), and, where
the endpoint pins that id's full public key (a pool file), the certificate's raw key with
the pinned one, which `swactor.transport.endpoint` does on handshake completion. The
certificate is re-minted at every start (it is cheap), so only the key needs to persist.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.x509.oid import NameOID

from swactor.transport.errors import IdentityError, KeyFilePermissionsError

_CERT_VALIDITY = datetime.timedelta(days=3650)


def node_id_from_public_key(public_key: Ed25519PublicKey) -> int:
    """The u64 node id of a public key: first 8 bytes of sha256(raw key), little endian."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return int.from_bytes(hashlib.sha256(raw).digest()[:8], "little")


def node_id_from_certificate(certificate: x509.Certificate) -> int:
    """The node id a peer's certificate proves; `IdentityError` if its key is not Ed25519."""
    return node_id_from_public_key(_ed25519_key(certificate))


def raw_public_key_from_certificate(certificate: x509.Certificate) -> bytes:
    """The raw 32-byte Ed25519 key a peer's certificate carries (what a pin compares)."""
    return _ed25519_key(certificate).public_bytes(serialization.Encoding.Raw,
                                                  serialization.PublicFormat.Raw)


def _ed25519_key(certificate: x509.Certificate) -> Ed25519PublicKey:
    key = certificate.public_key()
    if not isinstance(key, Ed25519PublicKey):
        raise IdentityError(
            f"peer certificate carries a {type(key).__name__}, not an Ed25519 key"
        )
    return key


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """A node's key pair, derived id and self-signed certificate."""

    private_key: Ed25519PrivateKey
    certificate: x509.Certificate
    node_id: int

    @classmethod
    def from_private_key(cls, private_key: Ed25519PrivateKey) -> NodeIdentity:
        node_id = node_id_from_public_key(private_key.public_key())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"swactor-{node_id:016x}")])
        now = datetime.datetime.now(datetime.UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(private_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _CERT_VALIDITY)
            .sign(private_key, None)
        )
        return cls(private_key=private_key, certificate=certificate, node_id=node_id)

    @classmethod
    def generate(cls) -> NodeIdentity:
        """A fresh in-memory identity (tests, ephemeral nodes)."""
        return cls.from_private_key(Ed25519PrivateKey.generate())

    @classmethod
    def load_or_create(cls, path: Path) -> NodeIdentity:
        """Load the key at `path`, or create it (mode 0600) when the file does not exist."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return cls.load(path)
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        with os.fdopen(fd, "wb") as handle:
            handle.write(pem)
        return cls.from_private_key(key)

    @classmethod
    def load(cls, path: Path) -> NodeIdentity:
        """Load an existing key; refuse one the group or others can access."""
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
        except OSError as exc:
            raise IdentityError(f"node key {path}: {exc.strerror}") from exc
        if mode & 0o077:
            raise KeyFilePermissionsError(
                f"node key {path} has mode {mode:04o}; it must be readable by its owner "
                f"only (chmod 600 {path})"
            )
        try:
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        except (ValueError, TypeError) as exc:
            raise IdentityError(f"node key {path} is not an unencrypted PEM key") from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise IdentityError(f"node key {path} holds a {type(key).__name__}, not Ed25519")
        return cls.from_private_key(key)
