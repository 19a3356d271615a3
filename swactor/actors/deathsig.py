"""Make a child process die with its parent: `PR_SET_PDEATHSIG` through ctypes.

`die_with_parent(parent_pid)` returns a `preexec_fn` for `subprocess`/asyncio: it runs in
the forked child before `exec`, asks the kernel (prctl(2) `PR_SET_PDEATHSIG`) to send
SIGKILL when the parent thread exits, and then closes the race where the parent died
between fork and prctl by checking that the parent pid is still the one that forked us.
The setting survives `execve` (for non-setuid programs). libc is loaded at import time
so that the child does no dynamic loading after fork.

The kernel sends the signal when the *thread* that forked the child exits: spawn from the
event-loop thread, which lives as long as the process does.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1

_libc: ctypes.CDLL | None = None
if sys.platform.startswith("linux"):
    _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class DeathSignalUnavailable(OSError):
    """This platform has no PR_SET_PDEATHSIG (not Linux)."""


def die_with_parent(
    parent_pid: int, signum: int = signal.SIGKILL
) -> Callable[[], None]:
    """A preexec_fn: deliver `signum` to the child when `parent_pid` exits."""
    if _libc is None:
        raise DeathSignalUnavailable("PR_SET_PDEATHSIG needs Linux")
    prctl = _libc.prctl

    def preexec() -> None:
        if prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
            os._exit(127)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os.kill(os.getpid(), signum)
            os._exit(127)

    return preexec
