"""A weight file whose digest does not match the plan's `sha256`: the stage fails with
WeightLoadFailed naming the expected and the actual digest, and the worker is never asked
to load it; the file the plan names by digest loads.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from swactor.model.errors import WeightsError, WeightsFault
from swactor.model.source import local_sha256, verify_sha256
from swactor.node.stage_worker_ports import WorkerStagePorts
from swactor.wire import GgufSource, GgufSourceKind, RunFaultError, RunFaultReason
from tests.model.tiny_gguf import write_tiny_gguf
from tests.node.test_stage_worker_ports import TINY, provision_for, run_ports, settle


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    return write_tiny_gguf(tmp_path / "tiny.gguf", TINY)


def test_a_file_that_is_not_the_plans_is_refused_naming_both_digests(gguf: Path) -> None:
    right = hashlib.sha256(gguf.read_bytes()).hexdigest()
    with gguf.open("r+b") as handle:  # one byte of a tensor changes: same header, same size
        handle.seek(-1, os.SEEK_END)
        last = handle.read(1)
        handle.seek(-1, os.SEEK_END)
        handle.write(bytes([last[0] ^ 0x01]))
    actual = hashlib.sha256(gguf.read_bytes()).hexdigest()
    provision = provision_for(gguf, source=GgufSource(GgufSourceKind.LocalPath, str(gguf),
                                                      sha256=right))

    async def body(ports: WorkerStagePorts, worker: list[Any], stage: list[Any]) -> None:
        with pytest.raises(RunFaultError) as raised:
            await ports.load_weights(provision)
        assert raised.value.reason is RunFaultReason.WeightLoadFailed
        assert right in str(raised.value) and actual in str(raised.value)
        with pytest.raises(RunFaultError):
            await ports.configure_role(provision)
        await settle()
        assert worker == [] and stage == []  # the worker never loads the file

    run_ports(gguf, body)


def test_the_file_the_plan_names_loads(gguf: Path) -> None:
    right = hashlib.sha256(gguf.read_bytes()).hexdigest()
    provision = provision_for(gguf, source=GgufSource(GgufSourceKind.LocalPath, str(gguf),
                                                      sha256=right))

    async def body(ports: WorkerStagePorts, worker: list[Any], stage: list[Any]) -> None:
        await ports.load_weights(provision)
        await ports.configure_role(provision)
        await settle()
        assert len(worker) == 1 and len(stage) == 2

    run_ports(gguf, body)


def test_a_changed_file_is_hashed_again(gguf: Path) -> None:
    """The digest is remembered per (device, inode, size, mtime): rewriting the file in
    place is seen."""
    first = local_sha256(gguf)
    assert first == hashlib.sha256(gguf.read_bytes()).hexdigest()
    data = bytearray(gguf.read_bytes())
    data[-1] ^= 0xFF
    gguf.write_bytes(bytes(data))
    os.utime(gguf, ns=(1, 1))
    with pytest.raises(WeightsError) as raised:
        verify_sha256(gguf, first)
    assert raised.value.reason is WeightsFault.DigestMismatch
    assert first in str(raised.value)
    assert hashlib.sha256(bytes(data)).hexdigest() in str(raised.value)

