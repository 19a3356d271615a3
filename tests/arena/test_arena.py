"""The memfd arena: sparse ceiling, seals, attach checks, sharing with a child process."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys

import pytest

from swactor.arena import ENV_ARENA_BYTES, ENV_ARENA_FD, Arena, ArenaError
from swactor.wire import ArenaFailure

GiB = 1 << 30


def test_create_is_sparse_sized_and_sealed() -> None:
    with Arena.create(4 * GiB) as arena:  # far more than this machine would give eagerly
        assert arena.size == os.fstat(arena.fd).st_size == 4 * GiB
        assert os.fstat(arena.fd).st_blocks == 0  # nothing allocated yet
        seals = fcntl.fcntl(arena.fd, fcntl.F_GET_SEALS)
        for seal in (fcntl.F_SEAL_SHRINK, fcntl.F_SEAL_GROW, fcntl.F_SEAL_SEAL):
            assert seals & seal
        with pytest.raises(PermissionError):
            os.ftruncate(arena.fd, GiB)  # a peer cannot shrink it under our mapping
        with pytest.raises(PermissionError):
            fcntl.fcntl(arena.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)
        arena.view[GiB : GiB + 5] = b"hello"
        assert bytes(arena.view[GiB : GiB + 5]) == b"hello"


def test_create_rejects_a_bad_ceiling() -> None:
    for size in (0, -4096, 4097):
        with pytest.raises(ArenaError) as info:
            Arena.create(size)
        assert info.value.reason is ArenaFailure.TruncateFailed


def test_child_attaches_through_pass_fds_and_env() -> None:
    with Arena.create(1 << 20) as arena:
        arena.view[4096:4101] = b"node!"
        code = (
            "from swactor.arena import Arena\n"
            "a = Arena.from_env()\n"
            "assert bytes(a.view[4096:4101]) == b'node!'\n"
            "a.view[8192:8198] = b'worker'\n"
            "a.close()\n"
        )
        subprocess.run(
            [sys.executable, "-c", code],
            pass_fds=[arena.fd],
            env=dict(os.environ, **arena.child_env()),
            check=True,
            timeout=60,
        )
        assert bytes(arena.view[8192:8198]) == b"worker"


def test_attach_checks_size_and_seals() -> None:
    with Arena.create(1 << 20) as arena:
        fd = os.dup(arena.fd)
        with pytest.raises(ArenaError) as info:
            Arena.attach(fd, 1 << 21)
        assert info.value.reason is ArenaFailure.MmapFailed
        other = Arena.attach(fd, 1 << 20)  # right size: maps, and owns the dup
        other.view[0:3] = b"abc"
        assert bytes(arena.view[0:3]) == b"abc"
        other.close()
    unsealed = os.memfd_create("unsealed", os.MFD_CLOEXEC)
    os.ftruncate(unsealed, 1 << 20)
    with pytest.raises(ArenaError) as info:
        Arena.attach(unsealed, 1 << 20)
    assert info.value.reason is ArenaFailure.SealFailed
    os.close(unsealed)
    with pytest.raises(ArenaError) as info:
        Arena.attach(987654, 4096)  # not an open fd
    assert info.value.reason is ArenaFailure.MmapFailed


def test_from_env_requires_both_variables() -> None:
    with pytest.raises(ArenaError) as info:
        Arena.from_env({ENV_ARENA_FD: "3"})
    assert info.value.reason is ArenaFailure.MmapFailed
    with pytest.raises(ArenaError):
        Arena.from_env({ENV_ARENA_FD: "x", ENV_ARENA_BYTES: "4096"})


def test_close_is_idempotent() -> None:
    arena = Arena.create(1 << 16)
    fd = arena.fd
    arena.close()
    arena.close()
    assert arena.closed
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(fd)
