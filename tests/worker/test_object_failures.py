"""Each spec §37 ObjectFailure, provoked by a crafted record in a real worker.

One worker serves the whole module (its fault file, `swactor.faults`, fails the device
copies of object 666). Every case installs a fresh ingress ring for the bad record and a
fresh healthy ring beside it: the failure must surface as ObjectFailed naming the bad ring,
its edge and its port, and the worker must still load an object from the healthy ring.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from swactor.faults import ENV_FILE, arm
from swactor.ring import Ring
from swactor.testing.worker_rig import WorkerRig, float_spec, record, write_all
from swactor.wire import (
    OBJECT_MAGIC,
    ObjectFailed,
    ObjectFailure,
    ObjectLoaded,
    ObjectSpec,
    RingDirection,
    RingId,
    RingReadable,
    SequencePolicy,
)

_ring_ids = itertools.count(1)


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerRig]:
    fault_file = tmp_path_factory.mktemp("faults") / "faults.json"
    arm(fault_file, {"point": "worker.copy", "object_id": 666})
    rig = WorkerRig(arena_bytes=1 << 23, env={ENV_FILE: str(fault_file)})
    rig.initialize()
    try:
        yield rig
    finally:
        rig.close()


def raw_header(
    *, magic: int = OBJECT_MAGIC, version: int = 1, header_len: int = 40, object_id: int = 1,
    sequence: int = 0, extent: int = 8, flags: int = 0, reserved: int = 0,
) -> bytes:
    return struct.pack(
        "<IHHQQQII", magic, version, header_len, object_id, sequence, extent, flags, reserved
    )  # fmt: skip


def close_after(data: bytes) -> Callable[[WorkerRig, Ring], None]:
    def feed(rig: WorkerRig, ring: Ring) -> None:
        write_all(rig, ring, data)
        ring.close_producer()
        rig.send(RingReadable(RingId(ring.ring_id)))

    return feed


def plain(data: bytes) -> Callable[[WorkerRig, Ring], None]:
    def feed(rig: WorkerRig, ring: Ring) -> None:
        write_all(rig, ring, data)

    return feed


@dataclass(frozen=True)
class Case:
    reason: ObjectFailure
    feed: Callable[[WorkerRig, Ring], None]
    object_id: int | None
    sequence: int | None
    spec: ObjectSpec = field(default_factory=float_spec)
    loads_first: int = 0  #: valid records before the bad one


CASES = [
    Case(ObjectFailure.HeaderMalformed, plain(raw_header(header_len=48)), None, None),
    Case(ObjectFailure.HeaderMalformed, plain(raw_header(reserved=1)), None, None),
    Case(ObjectFailure.UnsupportedObjectVersion, plain(raw_header(version=2)), None, None),
    Case(ObjectFailure.UnsupportedObjectVersion, plain(raw_header(magic=0xDEADBEEF)), None, None),
    Case(ObjectFailure.ExtentExceedsMax, plain(record(3, 0, bytes(2048))), 3, 0, float_spec(1024)),
    Case(ObjectFailure.ExtentAlignmentInvalid, plain(record(4, 0, bytes(6))), 4, 0),
    Case(ObjectFailure.SequenceViolation, plain(record(5, 7, bytes(8))), 5, 7),
    Case(
        ObjectFailure.SequenceViolation,
        plain(record(6, 0, bytes(8)) + record(7, 0, bytes(8))),
        7, 0, float_spec(policy=SequencePolicy.Increasing), 1,
    ),
    Case(ObjectFailure.EofMidObject, close_after(record(8, 0, bytes(64))[:-10]), None, None),
    Case(ObjectFailure.EofMidObject, close_after(raw_header()[:17]), None, None),
    Case(
        ObjectFailure.DeviceAllocationFailed,
        plain(raw_header(object_id=9, extent=1 << 50)),
        9, 0, float_spec(1 << 50),
    ),
    Case(ObjectFailure.DeviceCopyFailed, plain(record(666, 0, bytes(256))), 666, 0),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.reason.value)
def test_crafted_record_fails_its_ring_only(worker: WorkerRig, case: Case) -> None:
    bad_id, good_id = next(_ring_ids), next(_ring_ids)
    bad = worker.add_ring(bad_id, RingDirection.Ingress, 4096, case.spec, edge_id=500 + bad_id,
                          port_id=900 + bad_id)  # fmt: skip
    good = worker.add_ring(good_id, RingDirection.Ingress, 4096)

    case.feed(worker, bad)
    for _ in range(case.loads_first):
        assert worker.expect(ObjectLoaded).ring_id == bad_id
    failed = worker.expect(ObjectFailed)
    assert failed.reason is case.reason
    assert (failed.ring_id, failed.edge_id, failed.port_id) == (bad_id, 500 + bad_id, 900 + bad_id)
    assert failed.object_id == case.object_id
    assert failed.sequence == case.sequence

    # The faulted ring stops consuming: a valid record behind the bad one stays unread.
    before = bad.consume
    write_all(worker, bad, record(1, 0, bytes(16)))
    # The healthy ring beside it is still served.
    write_all(worker, good, record(42, 0, bytes(32)))
    loaded = worker.expect(ObjectLoaded)
    assert (loaded.ring_id, loaded.object_id, loaded.extent) == (good_id, 42, 32)
    assert bad.consume == before
