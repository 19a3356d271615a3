"""Node identity: key file creation, permissions, derived node id, certificate."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key

from swactor.transport.errors import IdentityError, KeyFilePermissionsError
from swactor.transport.identity import NodeIdentity, node_id_from_certificate


def test_first_start_creates_0600_key_and_second_start_reloads_same_id(tmp_path: Path) -> None:
    path = tmp_path / "node.key"
    first = NodeIdentity.load_or_create(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    second = NodeIdentity.load_or_create(path)
    assert second.node_id == first.node_id


def test_node_id_is_sha256_prefix_of_raw_public_key_little_endian() -> None:
    ident = NodeIdentity.generate()
    raw = ident.private_key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    expected = int.from_bytes(hashlib.sha256(raw).digest()[:8], "little")
    assert ident.node_id == expected
    assert node_id_from_certificate(ident.certificate) == expected
    assert 0 <= ident.node_id < 1 << 64


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644])
def test_group_or_world_accessible_key_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "node.key"
    NodeIdentity.load_or_create(path)
    os.chmod(path, mode)
    with pytest.raises(KeyFilePermissionsError, match="chmod 600"):
        NodeIdentity.load_or_create(path)


def test_non_ed25519_key_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "node.key"
    key = generate_private_key(SECP256R1())
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    os.chmod(path, 0o600)
    with pytest.raises(IdentityError, match="not Ed25519"):
        NodeIdentity.load(path)


def test_garbage_key_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "node.key"
    path.write_bytes(b"not a key")
    os.chmod(path, 0o600)
    with pytest.raises(IdentityError, match="not an unencrypted PEM key"):
        NodeIdentity.load(path)


def test_distinct_keys_give_distinct_ids() -> None:
    assert NodeIdentity.generate().node_id != NodeIdentity.generate().node_id
