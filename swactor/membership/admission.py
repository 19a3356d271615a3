"""Pool admission: the pool file that pins who may take part in a pool.

Theory of operation
-------------------
A SWIM pool is open to anyone who can send it UDP unless every participant checks who
is speaking. Every datagram and update is signed with its author's Ed25519 key
(`swactor.membership.wire`), so admission is a list of keys: the *pool file*, written
by the operator and copied to every machine of the pool (it holds public keys only;
no secret travels). One member per line::

    # ROLE          PUBLIC KEY (64 hex digits: the raw Ed25519 key, 256 bits)   NAME
    orchestrator    8f6c...e1                                                  orch
    node            1a2b...9c                                                  gpu-a

Blank lines and `#` comments are ignored; NAME is optional (a label for people). Roles:
`orchestrator` (the node trusts it to provision and stop stages; discovery never makes
it a stage) and `node` (a stage candidate). `swactor pool add FILE --key KEYFILE --role
node` appends a key's line (creating the key on first use); `swactor pool show FILE`
lists the members with their node ids.

What it pins. The full public key, not the 64-bit node id derived from it: a key is
admitted only if its 32 bytes are in the file. The membership layer drops every datagram
and update whose author is not admitted (`ForgeryReason.NotInPool`), so a foreign key
never enters the view; discovery then chooses stages only among the file's `node`
entries, so neither a foreign key nor the orchestrator's is planned on. The QUIC
endpoints of the node and the orchestrator pin the same keys (`pinned_keys`): a peer
whose certificate's key merely hashes to a member's node id is refused at the
handshake. Two keys whose node ids collide are refused when the file is loaded, so
inside a pool a node id names exactly one pinned key.

The file is bounded before it is parsed (`MAX_POOL_FILE_BYTES`, `MAX_POOL_MEMBERS`) and
every refusal is a `PoolFileError` naming the file, the line and the problem.

Without SWIM the pool is named on the command line (`swactor orchestrator --node
ID@HOST:PORT`, `swactor node --trust-orchestrator ID`) and the pool file is required
there too: a node id is only the first 64 bits of sha256 of a key. It names a key but
does not prove one, since a key whose hash starts with a given id can be ground (about
2^64 tries: costly, but within reach of a well-funded attacker), and without a pin the
QUIC handshake checks nothing more than that id (the AddressBook a node receives names
its peers by id only). So `--node` and `--trust-orchestrator` without `--pool` are refused
(`ID_ONLY_REFUSAL`).

An operator who really wants an open pool (any key that reaches SWIM may join and be
chosen as a stage; without SWIM, peers admitted by their node id alone) passes
`--open-pool` instead of `--pool`: the commands then warn (`OPEN_POOL_WARNING`,
`OPEN_IDS_WARNING`) and pass no admission.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from swactor.transport.identity import NodeIdentity, node_id_from_public_key
from swactor.wire import NodeId

ROLES = ("orchestrator", "node")
MAX_POOL_FILE_BYTES = 1 << 20
MAX_POOL_MEMBERS = 4096
OPEN_POOL_WARNING = ("--open-pool: this pool admits any key that can reach its SWIM port; "
                     "a stranger can join and be chosen as a stage (it would see prompts "
                     "and could forge output). Pin the pool with --pool FILE instead.")
OPEN_IDS_WARNING = ("--open-pool: peers are admitted by their 64-bit node id alone, a hash "
                    "prefix of their key and not proof of it: a key ground to match a "
                    "member's id would be taken for that member. Pin the pool with --pool "
                    "FILE instead.")
ID_ONLY_REFUSAL = ("admits peers by their 64-bit node id alone, which names a key but does "
                   "not prove it (a key whose sha256 starts with that id can be ground); "
                   "pin the pool's full public keys with --pool FILE (`swactor pool add`), "
                   "or pass --open-pool to accept the risk")
_HEX_KEY = re.compile(r"[0-9a-fA-F]{64}")
_NAME = re.compile(r"[A-Za-z0-9._@:/-]{1,64}")


class PoolFileError(ValueError):
    """A pool file that cannot be used; the message names the file, line and problem."""


def public_key_bytes(identity: NodeIdentity) -> bytes:
    """The raw 32-byte Ed25519 public key of an identity."""
    return identity.private_key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)


@dataclass(frozen=True, slots=True)
class PoolEntry:
    """One admitted key."""

    role: str
    public_key: bytes
    name: str = ""

    @property
    def node_id(self) -> NodeId:
        return NodeId(node_id_from_public_key(Ed25519PublicKey.from_public_bytes(
            self.public_key)))

    def line(self) -> str:
        return f"{self.role:<12} {self.public_key.hex()}" + (f" {self.name}" if self.name
                                                              else "")


@dataclass(frozen=True, slots=True)
class Admission:
    """The pinned pool: who may take part, and in which role (module doc)."""

    entries: tuple[PoolEntry, ...]
    source: str = "<pool>"

    def __post_init__(self) -> None:
        keys: set[bytes] = set()
        ids: dict[NodeId, PoolEntry] = {}
        for entry in self.entries:
            if entry.public_key in keys:
                raise PoolFileError(f"{self.source}: key {entry.public_key.hex()[:16]}... "
                                    "is listed twice")
            keys.add(entry.public_key)
            other = ids.get(entry.node_id)
            if other is not None:
                raise PoolFileError(f"{self.source}: two keys share node id "
                                    f"{int(entry.node_id):016x}: refused")
            ids[entry.node_id] = entry

    @classmethod
    def of(cls, entries: Iterable[PoolEntry], source: str = "<pool>") -> Admission:
        return cls(tuple(entries), source)

    @property
    def keys(self) -> frozenset[bytes]:
        """Every admitted public key (32 raw bytes each)."""
        return frozenset(e.public_key for e in self.entries)

    @property
    def pinned_keys(self) -> dict[int, bytes]:
        """Node id -> full public key of every member: what a QUIC endpoint pins
        (`QuicEndpoint.pinned`), so that a peer is admitted by its 32-byte key, not by
        the 64-bit id it hashes to."""
        return {int(e.node_id): e.public_key for e in self.entries}

    @property
    def member_ids(self) -> frozenset[NodeId]:
        """The node ids of every admitted key, any role."""
        return frozenset(e.node_id for e in self.entries)

    @property
    def stage_ids(self) -> frozenset[NodeId]:
        """The node ids that may be chosen as stages (role `node`)."""
        return frozenset(e.node_id for e in self.entries if e.role == "node")

    @property
    def orchestrator_ids(self) -> frozenset[NodeId]:
        return frozenset(e.node_id for e in self.entries if e.role == "orchestrator")

    def role_of(self, identity: NodeIdentity) -> str | None:
        """The role pinned for this identity's full key; None when it is not admitted."""
        raw = public_key_bytes(identity)
        return next((e.role for e in self.entries if e.public_key == raw), None)

    def require(self, identity: NodeIdentity, role: str) -> None:
        """PoolFileError unless this identity's key is pinned with `role`."""
        found = self.role_of(identity)
        if found != role:
            where = "is not in" if found is None else f"is pinned as {found!r} in"
            raise PoolFileError(
                f"this {role}'s key ({public_key_bytes(identity).hex()}) {where} the pool "
                f"file {self.source}; add it with `swactor pool add {self.source} --key "
                f"KEYFILE --role {role}`")


def pool_of(orchestrator: NodeIdentity, nodes: Iterable[NodeIdentity],
            source: str = "<pool>") -> Admission:
    """The pool of one orchestrator and these stage nodes, each pinned by its full public
    key: what `swactor pool add` writes for them (in-process pools and tests)."""
    return Admission.of((PoolEntry("orchestrator", public_key_bytes(orchestrator)),
                         *(PoolEntry("node", public_key_bytes(n)) for n in nodes)), source)


def parse_pool(text: str, source: str = "<pool>") -> Admission:
    """Parse pool-file text (module doc); PoolFileError names the line and problem."""
    entries: list[PoolEntry] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{number}"
        fields = line.split()
        if len(fields) not in (2, 3):
            raise PoolFileError(f"{where}: expected ROLE PUBLIC_KEY [NAME], got "
                                f"{len(fields)} fields")
        role, key = fields[0], fields[1]
        name = fields[2] if len(fields) == 3 else ""
        if role not in ROLES:
            raise PoolFileError(f"{where}: role {role[:32]!r} is not one of {', '.join(ROLES)}")
        if not _HEX_KEY.fullmatch(key):
            raise PoolFileError(f"{where}: the public key must be 64 hex digits (the raw "
                                "Ed25519 key); a 16-digit node id is not enough to pin a "
                                "member")
        if name and not _NAME.fullmatch(name):
            raise PoolFileError(f"{where}: name {name[:32]!r} has characters outside "
                                "[A-Za-z0-9._@:/-] or is longer than 64")
        try:
            Ed25519PublicKey.from_public_bytes(bytes.fromhex(key))
        except ValueError:
            raise PoolFileError(f"{where}: not an Ed25519 public key") from None
        entries.append(PoolEntry(role, bytes.fromhex(key), name))
        if len(entries) > MAX_POOL_MEMBERS:
            raise PoolFileError(f"{source}: more than {MAX_POOL_MEMBERS} members")
    if not entries:
        raise PoolFileError(f"{source}: no members (expected lines ROLE PUBLIC_KEY [NAME])")
    return Admission.of(entries, source)


def load_pool(path: Path) -> Admission:
    """Read and parse a pool file, bounded before it is read (module doc)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_POOL_FILE_BYTES + 1)
    except OSError as error:
        raise PoolFileError(f"pool file {path}: {error.strerror}") from None
    if len(data) > MAX_POOL_FILE_BYTES:
        raise PoolFileError(f"pool file {path}: larger than {MAX_POOL_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise PoolFileError(f"pool file {path}: not UTF-8 text") from None
    return parse_pool(text, str(path))


def add_member(path: Path, identity: NodeIdentity, role: str, name: str = "") -> PoolEntry:
    """Append `identity`'s key to the pool file (created if missing); PoolFileError if it is
    already listed or the result would not load."""
    if role not in ROLES:
        raise PoolFileError(f"role {role!r} is not one of {', '.join(ROLES)}")
    entry = PoolEntry(role, public_key_bytes(identity), name)
    existing = load_pool(path).entries if path.exists() else ()
    Admission.of((*existing, entry), str(path))  # refuses a duplicate key or id
    header = "" if path.exists() else ("# swactor pool file: ROLE PUBLIC_KEY [NAME] per line "
                                        "(swactor pool add)\n")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    with os.fdopen(fd, "a") as handle:
        handle.write(header + entry.line() + "\n")
    return entry


def swim_allow_list(admission: Admission | None) -> frozenset[bytes] | None:
    """The `allowed_keys` a SWIM participant checks every sender and author against: the
    pool's full public keys (None: an open pool)."""
    return None if admission is None else admission.keys
