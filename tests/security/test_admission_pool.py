"""Pool admission against strangers, over real UDP on loopback.

The pool is pinned by a pool file (`swactor.membership.admission`): the orchestrator's
and two stage nodes' full public keys. Real `MembershipNode`s play the pool and the
orchestrator runs the real discovery (`PoolDiscovery`, the `pool_readiness` gate).

- A self-made key ground until its node id is below every pool node's (discovery takes
  the lowest ids) joins through the pool's seed and the orchestrator: it is never in
  any pinned member's view, never chosen as a stage, and every member that heard it
  refused it as `NotInPool`. The same stranger against an open pool is chosen: the
  attack is real, admission is what stops it.
- A foreign key claiming a pool node's id (its datagrams name the victim as sender and
  carry an alive update moving the victim's QUIC endpoint to the attacker's port) is
  refused by key; the victim is chosen with its own endpoint.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from swactor.membership import (
    BootHealth,
    ForgedMessage,
    ForgeryReason,
    MemberMeta,
    MembershipEvent,
    MembershipNode,
)
from swactor.membership.admission import Admission, PoolEntry, public_key_bytes
from swactor.membership.config import MEMBERLIST_LAN
from swactor.membership.messages import AliveUpdate, Sync
from swactor.membership.wire import Codec, Signer
from swactor.orchestrator.discovery import Pool, PoolDiscovery
from swactor.transport.identity import NodeIdentity
from swactor.wire import NodeId

pytestmark = pytest.mark.timeout(120)

CONFIG = MEMBERLIST_LAN.scaled(0.2)
SETTLE_S = 0.3
ATTACKER_QUIC = 6666


class Member:
    """A stage node's SWIM participant (Available, QUIC endpoint published)."""

    def __init__(self, identity: NodeIdentity, quic_port: int, seeds: list[tuple[str, int]],
                 allowed_keys: frozenset[bytes] | None) -> None:
        self.identity = identity
        self.forged: list[ForgedMessage] = []
        meta = MemberMeta("127.0.0.1", 0, quic_host="127.0.0.1", quic_port=quic_port,
                          boot_health=BootHealth.Available)
        self.node = MembershipNode(identity, CONFIG, meta, seeds=seeds,
                                   allowed_keys=allowed_keys, bind=("127.0.0.1", 0))
        self.node.add_listener(self._heard)
        self.node.start()

    def _heard(self, event: MembershipEvent) -> None:
        if isinstance(event, ForgedMessage):
            self.forged.append(event)

    @property
    def node_id(self) -> NodeId:
        return self.node.node_id


def ground_key(below: int) -> NodeIdentity:
    """A self-made key whose node id is below `below` (a few tries on average)."""
    for _ in range(10_000):
        identity = NodeIdentity.generate()
        if identity.node_id < below:
            return identity
    raise AssertionError("no small id found")


@contextmanager
def pool(pinned: bool) -> Iterator[tuple[Admission, NodeIdentity, list[Member]]]:
    orchestrator = NodeIdentity.generate()
    nodes = [NodeIdentity.generate() for _ in range(2)]
    admission = Admission.of([PoolEntry("orchestrator", public_key_bytes(orchestrator)),
                              *(PoolEntry("node", public_key_bytes(n)) for n in nodes)])
    keys = admission.keys if pinned else None
    seed = Member(nodes[0], 7001, [], keys)
    members = [seed, Member(nodes[1], 7002, [seed.node.address], keys)]
    try:
        yield admission, orchestrator, members
    finally:
        for member in members:
            member.node.stop(False)


async def discover(orchestrator: NodeIdentity, seed: tuple[str, int],
                   admission: Admission | None, attack: object) -> tuple[Pool, PoolDiscovery]:
    discovery = PoolDiscovery(orchestrator, ("127.0.0.1", 0), (seed,), 2, admission=admission,
                              settle_s=SETTLE_S, swim=CONFIG, warn=lambda _text: None)
    assert callable(attack)
    attack(discovery.address)
    return await discovery.wait(60), discovery


async def eventually(check: object, timeout_s: float = 10.0) -> None:
    assert callable(check)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_a_small_id_stranger_is_chosen_from_an_open_pool() -> None:
    with pool(pinned=False) as (_admission, orchestrator, members):
        stranger_identity = ground_key(min(int(m.node_id) for m in members))
        strangers: list[Member] = []
        found, _ = await discover(orchestrator, members[0].node.address, None,
                                  lambda address: strangers.append(Member(
                                      stranger_identity, ATTACKER_QUIC,
                                      [members[0].node.address, address], None)))
        try:
            chosen = [int(m.node_id) for m in found.members]
            assert stranger_identity.node_id in chosen  # the attack works without admission
        finally:
            await found.stop()
            for stranger in strangers:
                stranger.node.stop(False)


async def test_a_small_id_stranger_cannot_join_a_pinned_pool_nor_be_chosen() -> None:
    with pool(pinned=True) as (admission, orchestrator, members):
        stranger_identity = ground_key(min(int(m.node_id) for m in members))
        strangers: list[Member] = []
        found, _ = await discover(orchestrator, members[0].node.address, admission,
                                  lambda address: strangers.append(Member(
                                      stranger_identity, ATTACKER_QUIC,
                                      [members[0].node.address, address], None)))
        try:
            stranger = NodeId(stranger_identity.node_id)
            assert sorted(int(m.node_id) for m in found.members) == sorted(
                int(m.node_id) for m in members)
            assert {m.port for m in found.members} == {7001, 7002}
            # the stranger kept trying; the seed refused it by key, typed
            await eventually(lambda: any(f.claimed == stranger
                                         and f.reason is ForgeryReason.NotInPool
                                         for f in members[0].forged))
            for view in (found.node.view(), *(m.node.view() for m in members)):
                assert stranger not in view
        finally:
            await found.stop()
            for s in strangers:
                s.node.stop(False)


def claim(attacker: NodeIdentity, victim: NodeId, incarnation: int) -> list[bytes]:
    """Datagrams signed by `attacker`'s own key that claim to come from `victim` and move
    its QUIC endpoint to the attacker's port."""
    signer = Signer(attacker.private_key)
    signer.node_id = victim  # speak for the victim, with our own key
    meta = MemberMeta("127.0.0.1", 9, quic_host="127.0.0.1", quic_port=ATTACKER_QUIC,
                      boot_health=BootHealth.Available)
    return Codec(signer).encode(Sync(victim, True, (AliveUpdate(victim, incarnation, meta),)))


async def test_a_foreign_key_claiming_a_pool_id_is_refused_and_the_victim_kept() -> None:
    with pool(pinned=True) as (admission, orchestrator, members):
        victim = members[1].node_id
        attacker = NodeIdentity.generate()
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sent = 0

        def attack(orchestrator_address: tuple[str, int]) -> None:
            nonlocal sent
            for target in (members[0].node.address, orchestrator_address):
                for incarnation in (50, 1_000):
                    for datagram in claim(attacker, victim, incarnation):
                        sock.sendto(datagram, target)
                        sent += 1

        try:
            found, _ = await discover(orchestrator, members[0].node.address, admission,
                                      attack)
            try:
                attack(found.node.address)  # once more after the gate, for good measure
                assert sent > 0
                by_id = {m.node_id: m for m in found.members}
                assert by_id[victim].port == 7002  # not the attacker's endpoint
                # refused by key, before the body naming the victim is read: the report
                # names the id the attacker's key derives
                claimants = {victim, NodeId(attacker.node_id)}
                await eventually(lambda: any(f.claimed in claimants
                                             for f in members[0].forged))
                reasons = {f.reason for f in members[0].forged if f.claimed in claimants}
                assert reasons <= {ForgeryReason.NotInPool, ForgeryReason.NodeIdMismatch}
                await asyncio.sleep(0.5)
                seen = members[0].node.view()[victim]
                assert seen.meta.quic_port == 7002 and seen.incarnation < 50
            finally:
                await found.stop()
        finally:
            sock.close()
